"""The definition's ``monitoring`` section: its defaults per mode, and every refusal in one
line naming the key (pyhpc/cluster/monitoring.py)."""
from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from pyhpc import cluster, paths
from pyhpc.cluster import ConfigError, Monitoring
from pyhpc.cluster.monitoring import Grafana

LAB = paths.LAB_CLUSTER
EXAMPLE = paths.ROOT / "ansible" / "inventories" / "example" / "cluster.yml"
LAB_RAM_MB = 24 * 1024


def definition(path: Any, **monitoring: Any) -> dict[str, Any]:
    data = copy.deepcopy(yaml.safe_load(path.read_text()))
    if monitoring:
        data["monitoring"] = {**data.get("monitoring", {}), **monitoring}
    return data


def parse(path: Any, **monitoring: Any) -> Monitoring:
    return cluster.parse(definition(path, **monitoring), LAB_RAM_MB).monitoring


def test_absent_section_is_on_with_the_usual_ports_and_per_mode_listen() -> None:
    hosts = definition(EXAMPLE)
    hosts["monitoring"] = {"listen": "10.0.0.0/16"}
    lab = definition(LAB)
    lab.pop("monitoring")
    assert cluster.parse(hosts).monitoring == Monitoring(listen="10.0.0.0/16")
    assert cluster.parse(lab, LAB_RAM_MB).monitoring == Monitoring(listen="loopback")
    got = cluster.parse(hosts).monitoring
    assert (got.prometheus_port, got.node_exporter_port, got.slurm_exporter_port,
            got.job_exporter_port, got.alertmanager, got.retention) == (9090, 9100, 9810, 9811,
                                                                        False, "15d")


def test_the_labs_section_samples_often_and_alerts_within_a_minute() -> None:
    lab = cluster.load(LAB, LAB_RAM_MB).monitoring
    assert (lab.enabled, lab.listen, lab.scrape_interval, lab.alert_for, lab.job_records) == \
        (True, "loopback", "5s", "30s", True)
    ddl = cluster.load(paths.ROOT / "ansible" / "inventories" / "lab" / "ddl256.yml",
                       LAB_RAM_MB).monitoring
    assert ddl.enabled and not ddl.job_records


def test_the_section_reaches_the_json_ansible_deploys_from() -> None:
    data = cluster.parse(definition(EXAMPLE, listen="10.0.0.0/16", alertmanager=True)).to_dict()
    assert data["monitoring"]["listen"] == "10.0.0.0/16"
    assert data["monitoring"]["alertmanager"] is True
    assert data["monitoring"]["alert_for"] is None


@pytest.mark.parametrize("network", ["10.0.0.0/16", "192.168.7.0/24", "fd00:1::/64"])
def test_a_cluster_network_in_cidr_form_is_kept(network: str) -> None:
    assert parse(EXAMPLE, listen=network).listen == network


DEB = "/srv/debs/grafana_11.3.0_amd64.deb"
REPO = "deb [signed-by=/etc/apt/keyrings/grafana.gpg] https://apt.grafana.com stable main"

BAD = [
    # (definition, section keys, text the message must contain)
    (EXAMPLE, {"colour": 1}, "monitoring.colour: unknown key; allowed: alert_for, alertmanager"),
    (EXAMPLE, {"enabled": "yes"}, "monitoring.enabled: must be true or false, got 'yes'"),
    (EXAMPLE, {"listen": "loopback"}, "monitoring.listen: loopback is for mode lab; on hosts "
                                      "Prometheus scrapes every host over the network"),
    (LAB, {"listen": "default"}, "monitoring.listen: mode lab runs Prometheus and every exporter "
                                 "on this one host: only loopback (127.0.0.1), got 'default'"),
    (LAB, {"listen": "0.0.0.0/0"}, "monitoring.listen: mode lab runs Prometheus"),
    # Issue 51 item 6: never the default-route address (public on a login host).
    (EXAMPLE, {"listen": None}, "monitoring.listen: mode hosts needs the cluster network in "
                                "CIDR form (e.g. 10.0.0.0/16): each host's address in it, never "
                                "the default-route one"),
    (EXAMPLE, {"listen": "default"}, "monitoring.listen: mode hosts needs the cluster network"),
    (EXAMPLE, {"listen": "0.0.0.0"}, "monitoring.listen: '0.0.0.0' is not allowed; name the "
                                     "cluster network in CIDR form"),
    (EXAMPLE, {"listen": "::"}, "monitoring.listen: '::' is not allowed"),
    (EXAMPLE, {"listen": "eth0"}, "monitoring.listen: 'eth0' is not allowed"),
    (EXAMPLE, {"listen": "10.0.0.1/16"}, "monitoring.listen: '10.0.0.1/16' is not allowed"),
    (EXAMPLE, {"listen": "0.0.0.0/0"}, "monitoring.listen: 0.0.0.0/0 would take every address"),
    (EXAMPLE, {"listen": "::/0"}, "monitoring.listen: ::/0 would take every address"),
    (EXAMPLE, {"listen": "127.0.0.0/8"}, "monitoring.listen: 127.0.0.0/8 would take every "
                                         "address or only loopback"),
    (EXAMPLE, {"prometheus_port": 80}, "monitoring.prometheus_port: must be an integer from "
                                       "1024 to 65535, got 80"),
    (EXAMPLE, {"job_exporter_port": "9811"}, "monitoring.job_exporter_port: must be an integer"),
    (EXAMPLE, {"node_exporter_port": 9090}, "monitoring.prometheus_port: 9090 is also "
                                            "monitoring.node_exporter_port; each listener"),
    (EXAMPLE, {"alertmanager": True, "alertmanager_port": 9811},
     "monitoring.job_exporter_port: 9811 is also monitoring.alertmanager_port"),
    (EXAMPLE, {"slurm_exporter_port": 6818}, "monitoring.slurm_exporter_port: 6818 is one of "
                                             "Slurm's ports (6817, 6818, 6819)"),
    (LAB, {"job_exporter_port": 17003}, "monitoring.job_exporter_port: 17003 is an emulated "
                                        "slurmd's port (17001-17004)"),
    (EXAMPLE, {"retention": "15 days"}, "monitoring.retention: '15 days' is not allowed; use a "
                                        "number and one unit of s, m, h, d, w, y, from 1h to 10y"),
    (EXAMPLE, {"retention": "30m"}, "monitoring.retention: '30m' is not allowed"),
    (EXAMPLE, {"scrape_interval": "1h"}, "monitoring.scrape_interval: '1h' is not allowed; use "
                                         "a number and one unit of s, m, h, d, w, y, from 1s to 5m"),
    (EXAMPLE, {"scrape_interval": 15}, "monitoring.scrape_interval: 15 is not allowed"),
    (EXAMPLE, {"alert_for": "0s"}, "monitoring.alert_for: '0s' is not allowed"),
    (EXAMPLE, {"job_records": 1}, "monitoring.job_records: must be true or false, got 1"),
    # Grafana: Debian ships none, so its package is named, one way only.
    (LAB, {"grafana": True}, "monitoring.grafana: Debian ships no Grafana: name its package, "
                             "either deb (a .deb on the control node) or apt_repo"),
    (LAB, {"grafana": {"port": 3000}}, "monitoring.grafana: Debian ships no Grafana"),
    (LAB, {"grafana": {"deb": DEB, "apt_repo": REPO}}, "or apt_repo (and apt_key), not both"),
    (LAB, {"grafana": {"deb": DEB, "colour": 1}}, "monitoring.grafana.colour: unknown key; "
                                                  "allowed: apt_key, apt_repo, deb, package, port"),
    (LAB, {"grafana": {"deb": "grafana_11.3.0_amd64.deb"}},
     "monitoring.grafana.deb: 'grafana_11.3.0_amd64.deb' is not allowed; an absolute path on "
     "the control node"),
    (LAB, {"grafana": {"deb": "/srv/grafana.deb"}}, "monitoring.grafana.deb: '/srv/grafana.deb' "
                                                    "is not named PACKAGE_VERSION_ARCH.deb"),
    (LAB, {"grafana": {"deb": DEB, "apt_key": "/k.gpg"}},
     "monitoring.grafana.apt_key: only with apt_repo; deb names its package"),
    (LAB, {"grafana": {"apt_repo": "deb https://apt.grafana.com stable main"}},
     "monitoring.grafana.apt_repo: 'deb https://apt.grafana.com stable main' is not allowed; "
     "one apt line with an absolute keyring"),
    (LAB, {"grafana": {"apt_repo": REPO, "apt_key": "keys/grafana.gpg"}},
     "monitoring.grafana.apt_key: 'keys/grafana.gpg' is not allowed; an absolute path"),
    (LAB, {"grafana": {"apt_repo": REPO, "package": "grafana-oss"}},
     "monitoring.grafana.package: 'grafana-oss' is not allowed; allowed: grafana, "
     "grafana-enterprise"),
    (LAB, {"grafana": {"deb": DEB, "port": 9090}}, "monitoring.prometheus_port: 9090 is also "
                                                   "monitoring.grafana.port"),
    (LAB, {"grafana": {"deb": DEB, "port": 80}}, "monitoring.grafana.port: must be an integer "
                                                 "from 1024 to 65535, got 80"),
]


@pytest.mark.parametrize(("path", "section", "message"), BAD,
                         ids=[f"{b[0].parent.name}-{b[1]}" for b in BAD])
def test_a_bad_section_is_refused_in_one_line_naming_the_key(path: Any, section: dict[str, Any],
                                                            message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(path, **section)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_alertmanager_port_counts_only_with_the_alertmanager() -> None:
    assert parse(EXAMPLE, alertmanager_port=9811).job_exporter_port == 9811


def test_the_lab_ports_are_those_of_its_own_nodes() -> None:
    """A monitoring port just past the lab's last slurmd is fine."""
    assert parse(LAB, job_exporter_port=17005).job_exporter_port == 17005


def test_grafana_is_off_unless_its_package_is_named() -> None:
    assert parse(LAB).grafana is None and parse(LAB, grafana=False).grafana is None
    assert parse(LAB, grafana={"deb": DEB}).grafana == Grafana(deb=DEB)
    got = parse(LAB, grafana={"apt_repo": REPO, "apt_key": "/srv/keys/grafana.gpg", "port": 3001})
    assert got.grafana == Grafana(apt_repo=REPO, apt_key="/srv/keys/grafana.gpg", port=3001)
    data = cluster.parse(definition(LAB, grafana={"deb": DEB}), LAB_RAM_MB).to_dict()
    assert data["monitoring"]["grafana"] == {"deb": DEB, "apt_repo": None, "apt_key": None,
                                             "package": "grafana", "port": 3000}
