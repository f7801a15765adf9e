"""Who reads the monitoring on the lab (issue 51 item 6), as two directory users: user1's
jobs, and user2 trying to read them.

Before the fix user2 read every job's user and account from Prometheus' API and from
each exporter's /metrics (plain HTTP on 127.0.0.1, no access control), and the deploy's
readiness check (one TCP connect) passed against a port user2 had bound while the
exporter restarted. Now every daemon answers over TLS only: Prometheus to a password
(root's, or a service's), the exporters to Prometheus' client certificate; user1 gets
their own job's figures through pyhpc-jobstats-query (sudo, as prometheus) and user2 gets
none of them; the readiness check names the squatter and fails.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_directory import as_user, sh
from test_monitoring import PYHPC, submit, until

from pyhpc import cluster, paths
from pyhpc.monitor import prometheus

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

LAB = cluster.load(paths.LAB_CLUSTER).monitoring
PROMETHEUS = f"https://127.0.0.1:{LAB.prometheus_port}"
EXPORTERS = {"node_exporter": LAB.node_exporter_port, "pyhpc-slurm-exporter":
             LAB.slurm_exporter_port, "pyhpc-job-exporter": LAB.job_exporter_port}
TLS = Path("/etc/pyhpc/monitoring")
READY = "/usr/local/sbin/pyhpc-monitoring-ready"
QUERY = "sudo -n -u prometheus /usr/local/sbin/pyhpc-jobstats-query"
#: user2's squatter: listens on the port and answers every request 200, as any server would.
SQUAT = ("import http.server, sys\n"
         "class H(http.server.BaseHTTPRequestHandler):\n"
         "    def do_GET(self):\n"
         "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
         "    def log_message(self, *a): pass\n"
         "s = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H)\n"
         "print('bound', flush=True)\n"
         "s.serve_forever()\n")


def admin_query(promql: str) -> list[dict[str, Any]]:
    """Prometheus' query API as an admin (root reads the admins' password)."""
    req, context = prometheus.request(f"{PROMETHEUS}/api/v1/query?"
                                      + urllib.parse.urlencode({"query": promql}))
    with urllib.request.urlopen(req, timeout=10, context=context) as answer:
        data: list[dict[str, Any]] = json.loads(answer.read())["data"]["result"]
    return data


@pytest.fixture(scope="module")
def running() -> Iterator[dict[str, Any]]:
    """A job of user1's, running, whose user and account Prometheus has (as an admin sees)."""
    job = submit("user1", "--cpus-per-task=1", "sleep 60")
    try:
        held = until(f"job {job}'s labels in Prometheus", lambda: admin_query(
            f'cgroup_cpus{{jobid="{job}"}}'), timeout=60)
        assert held[0]["metric"]["user"] == "user1", held
        start = int(sh("date", "+%s").stdout) - 120
        yield {"job": job, "start": start}
    finally:
        sh("scancel", job, check=False)


def test_user2_reads_no_job_labels_from_prometheus(running: dict[str, Any]) -> None:
    series = f"{PROMETHEUS}/api/v1/series?match[]=cgroup_cpus"
    for how in ("", f"--cacert {TLS / 'ca.crt'}", "-k", "-k -u prometheus:guess"):
        proc = as_user("user2", f"curl -s -m 10 {how} {shlex.quote(series)}", check=False)
        assert "user1" not in proc.stdout and '"account"' not in proc.stdout, (how, proc.stdout)
    plain = as_user("user2", f"curl -s -m 10 {shlex.quote(series.replace('https', 'http'))}",
                    check=False)
    assert "user1" not in plain.stdout and "HTTPS server" in plain.stdout
    denied = as_user("user2", f"curl -s -m 10 -o /dev/null -w '%{{http_code}}' "
                              f"--cacert {TLS / 'ca.crt'} {shlex.quote(series)}", check=False)
    assert denied.stdout == "401"


def test_user2_scrapes_no_exporter(running: dict[str, Any]) -> None:
    for name, port in EXPORTERS.items():
        for how in ("", "-k", f"--cacert {TLS / 'ca.crt'}"):
            proc = as_user("user2", f"curl -s -m 10 {how} https://127.0.0.1:{port}/metrics",
                           check=False)
            assert proc.returncode != 0 and "user1" not in proc.stdout, (name, how, proc)
        plain = as_user("user2", f"curl -s -m 10 http://127.0.0.1:{port}/metrics", check=False)
        assert "user1" not in plain.stdout and "# TYPE" not in plain.stdout, (name, plain)


def test_the_keys_and_passwords_are_no_users() -> None:
    for path in (*TLS.glob("*.key"), *TLS.glob("*.password"),
                 *Path("/etc/pyhpc/secrets").glob("prometheus-*.password")):
        proc = as_user("user2", f"cat {shlex.quote(str(path))}", check=False)
        assert proc.returncode != 0 and proc.stdout == "", path
    modes = {p.name: sh("stat", "--format=%a %U %G", str(p)).stdout.split()
             for p in sorted(TLS.iterdir())}
    assert modes["prometheus.key"] == ["640", "root", "prometheus"]
    assert modes["exporter.key"] == ["640", "root", "slurm"]
    assert modes["record.password"] == ["640", "root", "slurm"]
    # The hub's my-jobs page (tests/integration/test_my_jobs.py): the hub's user alone.
    assert modes["hub.password"] == modes["hub.json"] == ["640", "root", "pyhpc-hub"]
    assert modes["ca.crt"] == ["644", "root", "root"]


def test_the_owner_gets_their_own_jobs_figures_and_another_user_none(
        running: dict[str, Any]) -> None:
    job, start = running["job"], running["start"]
    now = int(sh("date", "+%s").stdout)
    mine = json.loads(as_user("user1", f"{QUERY} {job} {start} {now}").stdout)
    assert isinstance(mine["host_mem_peak_bytes"], int) and mine["host_mem_peak_bytes"] > 0
    theirs = json.loads(as_user("user2", f"{QUERY} {job} {start} {now}").stdout)
    assert theirs == {"gpu": None, "host_mem_peak_bytes": None}
    # Nothing but a job id and two times: sudo refuses anything else before it runs.
    for extra in (f"{job} {start} {now} --prometheus http://127.0.0.1:1",
                  f"{job};id {start} {now}"):
        refused = as_user("user1", f"{QUERY} {extra}", check=False)
        assert refused.returncode != 0 and refused.stdout == "", extra
    # pyhpc jobstats for the owner, while the job runs (no job-end record yet): the cgroup's
    # peak memory from Prometheus, through the query.
    data = json.loads(as_user("user1", f"{PYHPC} jobstats {job} --json").stdout)
    assert data["user"] == "user1" and isinstance(data["mem_peak_bytes"], int), data


def test_the_cluster_report_is_for_admins() -> None:
    """It shows every user's jobs: user1 gets one line, exit 2, and no page."""
    out = "/tmp/pyhpc-report-user1-refused"
    proc = as_user("user1", f"rm -rf {out}; {PYHPC} report --cluster --since 1h --html {out}",
                   check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc
    assert "refused the query (401" in proc.stderr and proc.stdout == ""
    assert not Path(out).exists()


def ready(service: str, port: int, owner: str) -> subprocess.CompletedProcess[str]:
    """The deploy's readiness check of a pyhpc exporter (tasks/exporters.yml's argv)."""
    return sh(READY, f"--name={service}", f"--owner={owner}", f"--ca={TLS / 'ca.crt'}",
              f"--cert={TLS / 'monitoring.crt'}", f"--key={TLS / 'prometheus.key'}",
              "--timeout=20", f"https://127.0.0.1:{port}/favicon.ico", check=False)


def test_a_squatter_on_an_exporters_port_fails_the_deploys_readiness_check() -> None:
    """user2 binds the job exporter's port while it restarts. The old check, one TCP
    connect, took the squatter for the exporter; the deploy's check now names it and
    fails at once, and the exporter, which cannot bind, is not taken as running."""
    service, port = "pyhpc-job-exporter", LAB.job_exporter_port
    sh("service", service, "stop")
    squatter = subprocess.Popen(
        ["su", "-", "user2", "-c", f"exec python3 -c {shlex.quote(SQUAT)} {port}"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "bound"
        sh("service", service, "start")
        # What the deploy checked before (pyhpc.deploy.wait_for: bash's /dev/tcp): it passes.
        assert sh("bash", "-c", f"</dev/tcp/127.0.0.1/{port}", check=False).returncode == 0
        proc = ready(service, port, "slurm")
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc
        assert proc.stderr.startswith(f"pyhpc-monitoring-ready: port {port} is held by user2, "
                                      "not slurm: not pyhpc-job-exporter"), proc.stderr
    finally:
        squatter.terminate()
        squatter.wait(timeout=30)
        sh("service", service, "restart")
    assert ready(service, port, "slurm").returncode == 0
