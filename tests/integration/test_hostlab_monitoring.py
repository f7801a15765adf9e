"""Monitoring across hostlab's six hosts (Debian 12, where the hosts get the pyhpc
environment and so pyhpc's exporters), as on real hosts: Prometheus on ctl scrapes
node_exporter on every host, pyhpc's Slurm exporter on login and a job exporter on each
compute host, each at the host's own address (monitoring.listen default: the
default-route address on the pyhpc-hostlab network), none on every interface; a compute
host that stops makes ExporterDown fire for it within minutes, and SlurmNodeDown once
slurmctld has marked the node down (hostlab's definition sets slurmd_timeout, 60 s,
and alert_for, 30 s); started again, the node returns (ReturnToService=2) and the
alerts resolve. Passed on hostlab: 4 tests in 17 min (before alert_for was set).
"""
from __future__ import annotations

import json
from typing import Any

import pytest

# pytest puts this directory on sys.path (rootdir-relative, no package).
from test_hostlab import COMPUTE, HOSTLAB, SKIP, _run, address, on, run_on
from test_hostlab_life import converge, node_states, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

HOSTS = ("ctl", "db", "login", *COMPUTE)
PORTS = {"node": 9100, "slurm": 9810, "jobs": 9811, "prometheus": 9090}
#: Asks ctl's Prometheus from the login host (Python's standard library: no curl needed),
#: over TLS checked against the monitoring CA, with the admins' password (root's there).
ASK = ("import base64, ssl, sys, urllib.request; "
       "pw = open('/etc/pyhpc/secrets/prometheus-admin.password').read().strip(); "
       "auth = base64.b64encode(('admin:' + pw).encode()).decode(); "
       "req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Basic ' + auth}); "
       "ctx = ssl.create_default_context(cafile='/etc/pyhpc/monitoring/ca.crt'); "
       "print(urllib.request.urlopen(req, timeout=10, context=ctx).read().decode())")


def api(path: str) -> Any:
    body = json.loads(on("login", "python3", "-I", "-c", ASK,
                         f"https://{address('ctl')}:{PORTS['prometheus']}/api/v1/{path}"))
    assert body["status"] == "success", body
    return body["data"]


def firing(name: str, **labels: str) -> list[dict[str, str]]:
    return [a["labels"] for a in api("alerts")["alerts"] if a["state"] == "firing"
            and a["labels"]["alertname"] == name
            and all(a["labels"].get(k) == v for k, v in labels.items())]


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    converge("bookworm")
    return {}


def test_prometheus_on_ctl_scrapes_every_host_at_its_own_address(cluster: dict[str, Any]) -> None:
    targets = wait_for("every target up", lambda: (
        t if (t := api("targets")["activeTargets"]) and all(x["health"] == "up" for x in t)
        else None))
    by_job: dict[str, set[tuple[str, str]]] = {}
    for target in targets:
        by_job.setdefault(target["labels"]["job"], set()).add(
            (target["labels"]["instance"], target["scrapeUrl"]))
    assert by_job["node"] == {(h, f"https://{address(h)}:9100/metrics") for h in HOSTS}
    assert by_job["jobs"] == {(h, f"https://{address(h)}:9811/metrics") for h in COMPUTE}
    assert by_job["slurm"] == {("login", f"https://{address('login')}:9810/metrics")}


def test_no_host_listens_on_every_interface(cluster: dict[str, Any]) -> None:
    for host in HOSTS:
        rows = [line.split() for line in on(host, "ss", "-Hltn").splitlines()]
        for port in PORTS.values():
            local = {r[3] for r in rows if r[3].rsplit(":", 1)[-1] == str(port)}
            assert local <= {f"{address(host)}:{port}"}, (host, local)


def test_the_exporters_run_as_slurm_units(cluster: dict[str, Any]) -> None:
    assert on("login", "systemctl", "show", "--property=User", "--value",
              "pyhpc-slurm-exporter.service") == "slurm"
    for host in COMPUTE:
        assert run_on(host, "systemctl", "is-active", "pyhpc-job-exporter.service").returncode == 0


def test_a_stopped_compute_host_fires_exporter_down_then_slurm_node_down(
        cluster: dict[str, Any]) -> None:
    host = COMPUTE[-1]
    _run([*HOSTLAB, "podman", "stop", host], timeout=180)
    try:
        wait_for(f"ExporterDown for {host}", lambda: firing("ExporterDown", instance=host),
                 timeout=4 * 60, every=10)
        down = wait_for(f"SlurmNodeDown for {host}", lambda: firing("SlurmNodeDown", node=host),
                        timeout=15 * 60, every=15)
        assert down[0]["state"] in ("down", "fail", "failing")
    finally:
        _run([*HOSTLAB, "podman", "start", host], timeout=180)
    wait_for(f"{host} back in service", lambda: node_states().get(host) == "idle", timeout=600)
    wait_for("its alerts resolved", lambda: not firing("ExporterDown", instance=host), timeout=300)
