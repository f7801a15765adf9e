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

from pyhpc.cluster.schema import ConfigError, boolean, check_keys, choice, integer
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
    "grafana": "false (default) or a mapping of deb, or apt_repo and apt_key, and port: "
               "Grafana on the monitoring server with pyhpc's dashboards",
}
GRAFANA_KEYS = {
    "deb": "Grafana's .deb on the control node: an absolute path named "
           "PACKAGE_VERSION_ARCH.deb (Debian ships no Grafana)",
    "apt_repo": "one apt line with an absolute keyring, \"deb [signed-by=/etc/apt/keyrings/"
                "grafana.gpg] URI SUITE [COMPONENT...]\"",
    "apt_key": "with apt_repo: the keyring on the control node, copied to the line's "
               "signed-by path (absent: already on the monitoring server)",
    "package": "with apt_repo: grafana (default) or grafana-enterprise",
    "port": "Grafana's port (default 3000)",
}
#: The Debian package names of Grafana's own builds.
GRAFANA_PACKAGES = ("grafana", "grafana-enterprise")
#: The nvidia role's patterns: an apt line with its keyring, a .deb as Debian names it.
APT_LINE = re.compile(r"deb \[[^]]*signed-by=/[^] ]+[^]]*\] \S+ \S+( \S+)*")
DEB_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+_[^_/]+_[a-z0-9-]+\.deb")
PORTS = ("prometheus_port", "node_exporter_port", "slurm_exporter_port", "job_exporter_port",
         "alertmanager_port")
BOUNDS: dict[str, tuple[int, int]] = dict.fromkeys((*PORTS, "port"), (1024, 65535))
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
class Grafana:
    """``monitoring.grafana``: where its package comes from (``deb`` or ``apt_repo``)."""

    deb: str | None = None
    apt_repo: str | None = None
    apt_key: str | None = None
    package: str = "grafana"
    port: int = 3000


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
    grafana: Grafana | None = None


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


def seconds(where: str, value: Any) -> int:
    """A duration :func:`duration` allows, in seconds."""
    match = DURATION.fullmatch(duration(where, value))
    assert match is not None  # duration() matched it
    return int(match.group(1)) * UNIT_S[match.group(2)]


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


def _path(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\n" in value:
        raise ConfigError(f"{where}: {echo(value)} is not allowed; an absolute path on the "
                          "control node")
    return value


def parse_grafana(data: Any) -> Grafana | None:
    """``monitoring.grafana``: false or absent (none), or where its package comes from.
    The files themselves are checked on the control node by the role's preflight."""
    where = "monitoring.grafana"
    if data is None or data is False:
        return None
    if not isinstance(data, dict) or not ("deb" in data) ^ ("apt_repo" in data):
        raise ConfigError(f"{where}: Debian ships no Grafana: name its package, either deb "
                          "(a .deb on the control node) or apt_repo (and apt_key), not both; "
                          f"got {echo(data)}")
    check_keys(where, data, GRAFANA_KEYS, ())
    port = integer(f"{where}.port", data.get("port", 3000), BOUNDS)
    if "deb" in data:
        for key in ("apt_key", "package"):
            if key in data:
                raise ConfigError(f"{where}.{key}: only with apt_repo; deb names its package")
        deb = _path(f"{where}.deb", data["deb"])
        if not DEB_NAME.fullmatch(deb.rsplit("/", 1)[-1]):
            raise ConfigError(f"{where}.deb: {echo(deb)} is not named PACKAGE_VERSION_ARCH.deb "
                              "(dpkg-name renames it)")
        return Grafana(deb=deb, port=port)
    line = data["apt_repo"]
    if not isinstance(line, str) or not APT_LINE.fullmatch(line):
        raise ConfigError(f"{where}.apt_repo: {echo(line)} is not allowed; "
                          f"{GRAFANA_KEYS['apt_repo']}")
    keyring = None if data.get("apt_key") is None else _path(f"{where}.apt_key", data["apt_key"])
    package = choice(f"{where}.package", data.get("package", "grafana"), GRAFANA_PACKAGES)
    return Grafana(apt_repo=line, apt_key=keyring, package=package, port=port)


def _ports(data: dict[str, Any], alertmanager: bool, grafana: Grafana | None,
           lab_ports: range) -> dict[str, int]:
    ports = {key: integer(f"monitoring.{key}", data.get(key, getattr(Monitoring, key)), BOUNDS)
             for key in PORTS}
    used = {k: v for k, v in ports.items() if alertmanager or k != "alertmanager_port"}
    if grafana is not None:
        used["grafana.port"] = grafana.port
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
    grafana = parse_grafana(data.get("grafana"))
    return Monitoring(
        enabled=enabled,
        listen=listen(data.get("listen"), mode, enabled),
        alertmanager=alertmanager,
        retention=duration("monitoring.retention", data.get("retention", "15d")),
        scrape_interval=duration("monitoring.scrape_interval",
                                 data.get("scrape_interval", "15s")),
        alert_for=None if alert_for is None else duration("monitoring.alert_for", alert_for),
        job_records=boolean("monitoring.job_records", data.get("job_records", True)),
        grafana=grafana,
        **_ports(data, alertmanager, grafana, lab_ports),
    )
