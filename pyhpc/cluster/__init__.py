"""The cluster definition: one YAML file, validated here and nowhere else.

Ansible calls ``python -m pyhpc cluster validate --json FILE`` before it changes
any host and deploys from the normalised JSON it prints; the CLI and the job
submission code load the same file through :func:`load`.
"""
from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pyhpc import validate, yamlio
from pyhpc.cluster.backup import BACKUP_KEYS, Backup, parse_backup
from pyhpc.cluster.controller import CONTROLLER_KEYS, Controller, parse_controller
from pyhpc.cluster.monitoring import MONITORING_KEYS, Monitoring, parse_monitoring
from pyhpc.cluster.schema import (
    MAX_ITEMS,
    MAX_NODES,
    ConfigError,
    boolean,
    check_keys,
    choice,
    integer,
    listing,
    name,
    names,
)
from pyhpc.cluster.users import (
    ACCOUNT_KEYS,
    DIRECTORY_KEYS,
    DIRECTORY_SECRET,
    Account,
    Directory,
    Limits,
    parse_accounts,
    parse_directory,
)
from pyhpc.errors import echo

__all__ = ["ACCOUNT_KEYS", "BACKUP_KEYS", "CONTROLLER_KEYS", "DIRECTORY_KEYS", "DIRECTORY_SECRET",
           "MAX_NODES", "MONITORING_KEYS",
           "Account", "Backup", "Cluster", "ConfigError", "Controller", "Directory", "JupyterHub", "Limits",
           "Monitoring", "Node", "Partition", "listing", "load", "parse"]


MODES = ("lab", "hosts")
RUNTIMES = ("podman", "apptainer", "enroot")
GPU_DETECT = ("files", "nvml")
#: Slurm tuning profiles (slurm.conf): Slurm's defaults, or SchedMD's high-throughput guide.
TUNINGS = ("default", "high_throughput")

TOP_KEYS = {
    "name": "cluster name (lower-case letters, digits, '-', '_')",
    "mode": f"one of {', '.join(MODES)}",
    "accounting": "true or false",
    "container_runtime": f"one of {', '.join(RUNTIMES)}",
    "tuning": f"one of {', '.join(TUNINGS)} (slurm.conf; docs/tuning.md)",
    "slurmd_timeout": "seconds without word from a node's slurmd before slurmctld marks it "
                      "DOWN (slurm.conf SlurmdTimeout; default 300)",
    "controller": "slurmctld's state directory and the backup controller's wait: "
                  "state_save_location, timeout",
    "lab": "settings for mode: lab",
    "nodes": "list of node groups",
    "partitions": "list of partitions",
    "accounts": "list of accounts",
    "directory": "the user directory (LDAP): empty for pyhpc's own, or an existing one's uri, "
                 "base_dn, bind_dn, bind_password_file, ca_file",
    "monitoring": "Prometheus and pyhpc's exporters: enabled, listen, ports, retention, "
                  "alertmanager, scrape_interval, alert_for, job_records",
    "jupyterhub": "JupyterHub on the first login host (notebook servers as Slurm jobs): "
                  "enabled, port, idle_timeout_min, hostname, tls_cert, tls_key",
    "backup": "backups of accounting, the directory, munge's key, the secrets and Slurm's "
              "configuration: path, kind, interval, keep (docs/admin/backups.md)",
}
LAB_KEYS = {"slurmd_base_port": "first port of the emulated slurmd daemons"}
NODE_KEYS = {
    "name": "node name, or name prefix when count is given",
    "count": "number of nodes named <name>1..<name>N",
    "cpus": "CPUs per node",
    "memory_mb": "memory per node in MiB",
    "gpus": "GPUs per node",
    "gpu_type": "GPU type for GRES (e.g. h100)",
    "gpu_detect": f"one of {', '.join(GPU_DETECT)}",
}
PARTITION_KEYS = {
    "name": "partition name",
    "nodes": "list of node names",
    "default": "true for the default partition",
    "max_time": "time limit, Slurm syntax (e.g. 1-00:00:00 or UNLIMITED)",
}
HUB_KEYS = {
    "enabled": "true (the default) runs the hub; false stops a deployed one",
    "port": "the HTTPS port browsers reach the hub at (default 8000)",
    "idle_timeout_min": "minutes after which an idle notebook server is stopped (default 60)",
    "hostname": "the name browsers reach the hub at (the URL on workshop sheets, the generated "
                "certificate); default: localhost in mode lab, else the login host's name",
    "tls_cert": "absolute path, on the login host, of the admin's own certificate (PEM, "
                "with its chain); absent: a CA the deploy generates signs one",
    "tls_key": "absolute path, on the login host, of that certificate's key",
}
#: Bounds of every number in a definition, next to the keys above.
BOUNDS: dict[str, tuple[int, int]] = {
    "count": (1, 1024),
    "cpus": (1, 4096),
    "memory_mb": (1, 64 << 20),  # 64 TiB
    "gpus": (0, 16),
    "slurmd_base_port": (1024, 65535),
    # Unprivileged: the proxy runs as the hub's own user.
    "port": (1024, 65535),
    "idle_timeout_min": (1, 7 * 24 * 60),
    # Slurm reads the value as a 16-bit count of seconds; below 10 a busy node flaps.
    "slurmd_timeout": (10, 65533),
}
#: Ports the hub keeps for itself on the login host (its API, the proxy's API) and
#: Slurm's daemons (slurmctld, slurmd, slurmdbd): the hub's public port is none of them.
#: The hub's API and the proxy's are on privileged ports (below 1024), which only the hub
#: (given CAP_NET_BIND_SERVICE alone) may bind: no other user can take them while the hub
#: restarts and answer the servers' token checks, or learn the proxy's token.
HUB_API_PORT = 881
PROXY_API_PORT = 801
#: The hub's "my jobs" page (pyhpc.monitor.my_jobs_page), a service the hub starts: privileged
#: for the same reason.
MY_JOBS_PORT = 882
HUB_OWN_PORTS = {HUB_API_PORT: "the hub's API", PROXY_API_PORT: "the proxy's API",
                 MY_JOBS_PORT: "the hub's my-jobs page",
                 6817: "slurmctld", 6818: "slurmd", 6819: "slurmdbd"}
MAX_PORT = 65535
#: mode lab: all nodes' declared memory together is at most this many times this machine's
#: RAM. It only tells Slurm how many jobs fit a node (config_overrides); nothing reserves it
#: and lab jobs use a fraction of it, so overcommit is intended. Beyond 4x, jobs using just a
#: quarter of their share would exhaust the machine: a typo, not a lab.
LAB_MEMORY_FACTOR = 4
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int = 0
    gpu_type: str | None = None
    gpu_detect: str = "files"
    port: int = 6818


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    default: bool = False
    max_time: str = "UNLIMITED"


@dataclass(frozen=True)
class JupyterHub:
    """The hub on the first login host; every user's notebook server is a Slurm job."""

    enabled: bool = True
    port: int = 8000
    idle_timeout_min: int = 60
    hostname: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None


@dataclass(frozen=True)
class Cluster:
    name: str
    mode: str
    accounting: bool
    container_runtime: str
    nodes: tuple[Node, ...]
    partitions: tuple[Partition, ...]
    accounts: tuple[Account, ...] = field(default_factory=tuple)
    directory: Directory | None = None
    tuning: str = "default"
    slurmd_timeout: int = 300
    monitoring: Monitoring = field(default_factory=Monitoring)
    jupyterhub: JupyterHub | None = None
    backup: Backup | None = None
    controller: Controller = field(default_factory=Controller)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def partition(self, name: str) -> Partition:
        for part in self.partitions:
            if part.name == name:
                return part
        allowed = listing([p.name for p in self.partitions])
        raise ConfigError(f"partition: unknown partition {echo(name)}; allowed: {allowed}")

    @property
    def default_partition(self) -> Partition:
        return next(p for p in self.partitions if p.default)

    def partition_gpus(self, name: str) -> int:
        """GPUs per node that every node of the partition has (0 if any has none)."""
        return min(self.node(n).gpus for n in self.partition(name).nodes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(where: str, value: Any) -> int:
    return integer(where, value, BOUNDS)


def _nodes(data: Any, mode: str, base_port: int) -> tuple[Node, ...]:
    if not isinstance(data, list) or not data or len(data) > MAX_ITEMS:
        raise ConfigError(f"nodes: must be a non-empty list of at most {MAX_ITEMS} node groups")
    nodes: list[Node] = []
    for i, group in enumerate(data):
        where = f"nodes[{i}]"
        check_keys(where, group, NODE_KEYS, ("name", "cpus", "memory_mb"))
        prefix = name(f"{where}.name", group["name"], None if "count" in group else "node")
        count = _int(f"{where}.count", group["count"]) if "count" in group else None
        if len(nodes) + (count or 1) > MAX_NODES:
            raise ConfigError(f"{where}.count: the definition would have more than "
                              f"{MAX_NODES} nodes")
        node_names = [f"{prefix}{k}" for k in range(1, count + 1)] if count else [prefix]
        gpu_type = group.get("gpu_type")
        template = Node(
            name=prefix,
            cpus=_int(f"{where}.cpus", group["cpus"]),
            memory_mb=_int(f"{where}.memory_mb", group["memory_mb"]),
            gpus=_int(f"{where}.gpus", group.get("gpus", 0)),
            gpu_type=None if gpu_type is None else name(f"{where}.gpu_type", gpu_type,
                                                         "gres_type"),
            gpu_detect=choice(f"{where}.gpu_detect", group.get("gpu_detect", "files"),
                               GPU_DETECT),
        )
        for node_name in node_names:
            name(f"{where}.name", node_name, "node")  # with its number, still a valid name
            port = base_port + len(nodes) if mode == "lab" else 6818
            nodes.append(replace(template, name=node_name, port=port))
    last = base_port + len(nodes) - 1
    if mode == "lab" and last > MAX_PORT:
        raise ConfigError(f"lab.slurmd_base_port: {base_port} + {len(nodes)} nodes goes past port "
                          f"{MAX_PORT} (the last node would get {last}); allowed: "
                          f"{BOUNDS['slurmd_base_port'][0]} to {MAX_PORT + 1 - len(nodes)}")
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise ConfigError(f"nodes: duplicate node name {node.name!r}")
        seen.add(node.name)
    if mode == "lab" and any(n.gpu_detect == "nvml" for n in nodes):
        raise ConfigError("nodes.gpu_detect: 'nvml' needs real GPUs; mode: lab allows only 'files'")
    return tuple(nodes)


def machine_memory_mb(meminfo: Path = MEMINFO) -> int | None:
    """This machine's RAM (MemTotal) in MiB; None where the kernel does not say (not Linux)."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        words = value.split()  # "24684096 kB"
        if key == "MemTotal" and words and words[0].isdigit():
            return int(words[0]) // 1024
    return None


def _check_lab_memory(nodes: tuple[Node, ...], ram_mb: int | None) -> None:
    """mode lab runs every node here: their declared memory must not be far beyond this RAM."""
    total = sum(n.memory_mb for n in nodes)
    if ram_mb is not None and total > LAB_MEMORY_FACTOR * ram_mb:
        raise ConfigError(f"nodes.memory_mb: the {len(nodes)} lab nodes declare {total} MiB "
                          f"together, more than {LAB_MEMORY_FACTOR} x this machine's {ram_mb} "
                          f"MiB (MemTotal), where mode lab runs them all; allowed: at most "
                          f"{LAB_MEMORY_FACTOR * ram_mb} MiB in all")


def _partitions(data: Any, node_names: set[str]) -> tuple[Partition, ...]:
    if not isinstance(data, list) or not data or len(data) > MAX_ITEMS:
        raise ConfigError(f"partitions: must be a non-empty list of at most {MAX_ITEMS}")
    parts: list[Partition] = []
    for i, part in enumerate(data):
        where = f"partitions[{i}]"
        check_keys(where, part, PARTITION_KEYS, ("name", "nodes"))
        part_name = name(f"{where}.name", part["name"], "partition")
        members = names(f"{where}.nodes", part["nodes"])
        if not members:
            raise ConfigError(f"{where}.nodes: must name at least one node")
        for member in members:
            if member not in node_names:
                raise ConfigError(
                    f"{where}.nodes: unknown node {member!r}; known nodes: "
                    f"{listing(sorted(node_names))}"
                )
        max_time = part.get("max_time", "UNLIMITED")
        validate.time_limit(f"{where}.max_time", max_time, error=ConfigError, unlimited=True)
        if part_name in (p.name for p in parts):
            raise ConfigError(f"{where}.name: duplicate partition name {part_name!r}")
        parts.append(Partition(part_name, tuple(members),
                               boolean(f"{where}.default", part.get("default", False)), max_time))
    defaults = [p.name for p in parts if p.default]
    if len(defaults) > 1:
        raise ConfigError(f"partitions.default: only one partition may be default, got {defaults}")
    if not defaults:
        first = parts[0]
        parts[0] = Partition(first.name, first.nodes, True, first.max_time)
    return tuple(parts)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _jupyterhub(data: Any, nodes: tuple[Node, ...], mode: str, accounting: bool,
                directory: Directory | None) -> JupyterHub | None:
    """``jupyterhub``: absent (no hub), or its settings; an enabled hub needs the directory
    (its users log in with their directory password) and accounting (only users with an
    association may log in)."""
    if data is None:
        return None
    check_keys("jupyterhub", data, HUB_KEYS, ())
    hub = JupyterHub(
        enabled=boolean("jupyterhub.enabled", data.get("enabled", True)),
        port=_int("jupyterhub.port", data.get("port", 8000)),
        idle_timeout_min=_int("jupyterhub.idle_timeout_min", data.get("idle_timeout_min", 60)),
        hostname=None if data.get("hostname") is None
        else name("jupyterhub.hostname", data["hostname"], kind="host"),
        tls_cert=None if data.get("tls_cert") is None
        else name("jupyterhub.tls_cert", data["tls_cert"], kind="abspath"),
        tls_key=None if data.get("tls_key") is None
        else name("jupyterhub.tls_key", data["tls_key"], kind="abspath"))
    if hub.hostname is not None and _is_address(hub.hostname):
        raise ConfigError(f"jupyterhub.hostname: {hub.hostname} is an address; each user's "
                          f"server has its own origin, <user>.<hostname>, so the hub needs a "
                          "DNS name with a wildcard record (*.<hostname>)")
    if (hub.tls_cert is None) != (hub.tls_key is None):
        missing, given = ("tls_key", "tls_cert") if hub.tls_key is None else ("tls_cert", "tls_key")
        raise ConfigError(f"jupyterhub.{missing}: required with jupyterhub.{given} (the "
                          "admin's certificate and its key go together)")
    taken = dict(HUB_OWN_PORTS)
    if mode == "lab":
        taken.update({n.port: f"the lab's slurmd of {n.name}" for n in nodes})
    if hub.port in taken:
        raise ConfigError(f"jupyterhub.port: {hub.port} is taken by {taken[hub.port]}; "
                          f"allowed: {BOUNDS['port'][0]} to {MAX_PORT} but "
                          f"{listing([str(p) for p in sorted(HUB_OWN_PORTS)])}"
                          + (" and the lab's slurmd ports" if mode == "lab" else ""))
    if hub.enabled and directory is None:
        raise ConfigError("jupyterhub.enabled: the hub needs a directory (its users log in "
                          "with their directory password); add directory: {} or set "
                          "jupyterhub.enabled: false")
    if hub.enabled and not accounting:
        raise ConfigError("jupyterhub.enabled: the hub needs accounting: true (only users "
                          "with a Slurm association may log in)")
    return hub


def parse(data: Any, ram_mb: int | None = None) -> Cluster:
    """Validate a loaded YAML document and return the normalised cluster.

    ``ram_mb``: the RAM, in MiB, that a mode-lab definition must fit (default: this
    machine's, as the lab runs every node here; unknown off Linux, then not checked).
    """
    check_keys("cluster", data, TOP_KEYS, ("name", "nodes", "partitions"))
    mode = choice("mode", data.get("mode", "hosts"), MODES)
    lab = data.get("lab", {})
    check_keys("lab", lab, LAB_KEYS, ())
    base_port = _int("lab.slurmd_base_port", lab.get("slurmd_base_port", 17001))
    nodes = _nodes(data["nodes"], mode, base_port)
    if mode == "lab":
        _check_lab_memory(nodes, machine_memory_mb() if ram_mb is None else ram_mb)
    cluster_name = name("name", data["name"], "cluster")
    accounting = boolean("accounting", data.get("accounting", True))
    directory = parse_directory(data.get("directory"), cluster_name)
    return Cluster(
        name=cluster_name,
        mode=mode,
        accounting=accounting,
        container_runtime=choice("container_runtime",
                                  data.get("container_runtime", "podman"), RUNTIMES),
        nodes=nodes,
        partitions=_partitions(data["partitions"], {n.name for n in nodes}),
        accounts=parse_accounts(data.get("accounts", []), MAX_ITEMS),
        directory=directory,
        tuning=choice("tuning", data.get("tuning", "default"), TUNINGS),
        slurmd_timeout=_int("slurmd_timeout", data.get("slurmd_timeout", 300)),
        monitoring=parse_monitoring(data.get("monitoring"), mode,
                                    range(base_port, base_port + len(nodes)) if mode == "lab"
                                    else range(0)),
        jupyterhub=_jupyterhub(data.get("jupyterhub"), nodes, mode, accounting, directory),
        backup=parse_backup(data.get("backup"), mode),
        controller=parse_controller(data.get("controller")),
    )


def load(path: str | Path, ram_mb: int | None = None) -> Cluster:
    """Read and validate a cluster definition file (``ram_mb`` as for :func:`parse`)."""
    return parse(yamlio.load(path, "cluster definition", error=ConfigError), ram_mb)
