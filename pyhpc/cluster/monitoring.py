"""How the cluster is watched, as the definition says: the ``monitoring`` section (the
monitoring role: Prometheus, node_exporter, pyhpc's exporters, the job-end record).

Parsed here, validated before any host changes, re-exported by :mod:`pyhpc.cluster`.
Where everything listens is one policy for the whole cluster, never every interface:
``loopback`` (the lab, one host) or, on hosts, the cluster network in CIDR form (each
host's one address in it). Never the default-route address: on a login host that is the
public one, and Prometheus' series name every job's user and account.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from pyhpc.cluster.schema import ConfigError, boolean, check_keys, integer
from pyhpc.errors import echo

MONITORING_KEYS = {
    "enabled": "true (default) or false: Prometheus, node_exporter and pyhpc's exporters",
    "listen": "where Prometheus and the exporters listen: loopback (mode lab, the only choice "
              "there) or, with mode hosts (required there), the cluster network such as "
              "10.0.0.0/16 (each host's one address in it)",
    "prometheus_port": "Prometheus' port (default 9090)",
    "node_exporter_port": "node_exporter's port on every host (default 9100)",
    "slurm_exporter_port": "pyhpc's Slurm exporter's port (default 9810)",
    "job_exporter_port": "pyhpc's job exporter's port on compute hosts (default 9811)",
    "alertmanager": "true or false (default): Alertmanager beside Prometheus",
    "alertmanager_port": "Alertmanager's port (default 9093)",
    "retention": "how long Prometheus keeps samples, e.g. 15d (default)",
    "scrape_interval": "how often Prometheus scrapes every target, e.g. 15s (default)",
    "alert_for": "one wait for every alert before it fires, e.g. 30s (absent: each alert's own)",
    "job_records": "true (default): slurmctld stores each job's summary when it ends "
                   "(EpilogSlurmctld, a Python start per job)",
}
PORTS = ("prometheus_port", "node_exporter_port", "slurm_exporter_port", "job_exporter_port",
         "alertmanager_port")
BOUNDS: dict[str, tuple[int, int]] = dict.fromkeys(PORTS, (1024, 65535))
#: slurmctld, slurmd and slurmdbd (the slurm role's ports).
SLURM_PORTS = (6817, 6818, 6819)
#: A Prometheus duration of one unit, and its bounds in seconds per key.
DURATION = re.compile(r"([1-9][0-9]{0,5})(s|m|h|d|w|y)")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
DURATION_BOUNDS: dict[str, tuple[int, int, str]] = {
    "retention": (3600, 10 * 365 * 86400, "1h to 10y"),
    "scrape_interval": (1, 300, "1s to 5m"),
    "alert_for": (1, 86400, "1s to 1d"),
}


@dataclass(frozen=True)
class Monitoring:
    """The ``monitoring`` section, normalised (every default filled in)."""

    enabled: bool = True
    listen: str = "loopback"
    prometheus_port: int = 9090
    node_exporter_port: int = 9100
    slurm_exporter_port: int = 9810
    job_exporter_port: int = 9811
    alertmanager: bool = False
    alertmanager_port: int = 9093
    retention: str = "15d"
    scrape_interval: str = "15s"
    alert_for: str | None = None
    job_records: bool = True


def duration(where: str, value: Any) -> str:
    """A Prometheus duration of one unit (``30s``, ``15d``) within the key's bounds."""
    key = where.rsplit(".", 1)[-1]
    low, high, rule = DURATION_BOUNDS[key]
    match = DURATION.fullmatch(value) if isinstance(value, str) else None
    seconds = int(match.group(1)) * UNIT_S[match.group(2)] if match else -1
    if not low <= seconds <= high:
        raise ConfigError(f"{where}: {echo(value)} is not allowed; use a number and one unit "
                          f"of s, m, h, d, w, y, from {rule}")
    return str(value)


def listen(value: Any, mode: str, enabled: bool = True) -> str:
    """The listen policy: ``loopback`` in the lab, the cluster network on hosts."""
    where = "monitoring.listen"
    if value == "loopback" or (mode == "lab" and value is None):
        if mode == "hosts":
            raise ConfigError(f"{where}: loopback is for mode lab; on hosts Prometheus scrapes "
                              "every host over the network: name the cluster network in CIDR "
                              "form (e.g. 10.0.0.0/16)")
        return "loopback"
    if mode == "lab":
        raise ConfigError(f"{where}: mode lab runs Prometheus and every exporter on this one "
                          f"host: only loopback (127.0.0.1), got {echo(value)}")
    if value is None and not enabled:
        return ""
    if value is None or value == "default":
        raise ConfigError(f"{where}: mode hosts needs the cluster network in CIDR form (e.g. "
                          "10.0.0.0/16): each host's address in it, never the default-route "
                          "one, which is public on a login host")
    try:
        network = ipaddress.ip_network(value, strict=True) if isinstance(value, str) else None
    except ValueError:
        network = None
    if network is None or "/" not in str(value):
        raise ConfigError(f"{where}: {echo(value)} is not allowed; name the cluster "
                          "network in CIDR form (e.g. 10.0.0.0/16)")
    if network.prefixlen == 0 or network.is_loopback or network.is_unspecified:
        raise ConfigError(f"{where}: {value} would take every address or only loopback; name "
                          "the cluster network (e.g. 10.0.0.0/16)")
    return str(network)


def _ports(data: dict[str, Any], alertmanager: bool, lab_ports: range) -> dict[str, int]:
    ports = {key: integer(f"monitoring.{key}", data.get(key, getattr(Monitoring, key)), BOUNDS)
             for key in PORTS}
    used = {k: v for k, v in ports.items() if alertmanager or k != "alertmanager_port"}
    for key, port in used.items():
        where = f"monitoring.{key}"
        other = [k for k, p in used.items() if p == port and k != key]
        if other:
            raise ConfigError(f"{where}: {port} is also monitoring.{other[0]}; each "
                              "listener needs a port of its own")
        if port in SLURM_PORTS:
            raise ConfigError(f"{where}: {port} is one of Slurm's ports "
                              f"({', '.join(map(str, SLURM_PORTS))})")
        if port in lab_ports:
            raise ConfigError(f"{where}: {port} is an emulated slurmd's port "
                              f"({lab_ports.start}-{lab_ports.stop - 1})")
    return ports


def parse_monitoring(data: Any, mode: str, lab_ports: range) -> Monitoring:
    """``monitoring``: absent (every default) or a mapping of :data:`MONITORING_KEYS`.
    ``lab_ports``: the emulated slurmd's ports (empty in mode hosts)."""
    data = {} if data is None else data
    check_keys("monitoring", data, MONITORING_KEYS, ())
    alertmanager = boolean("monitoring.alertmanager", data.get("alertmanager", False))
    alert_for = data.get("alert_for")
    enabled = boolean("monitoring.enabled", data.get("enabled", True))
    return Monitoring(
        enabled=enabled,
        listen=listen(data.get("listen"), mode, enabled),
        alertmanager=alertmanager,
        retention=duration("monitoring.retention", data.get("retention", "15d")),
        scrape_interval=duration("monitoring.scrape_interval",
                                 data.get("scrape_interval", "15s")),
        alert_for=None if alert_for is None else duration("monitoring.alert_for", alert_for),
        job_records=boolean("monitoring.job_records", data.get("job_records", True)),
        **_ports(data, alertmanager, lab_ports),
    )
