"""The cluster definition: one YAML file, validated here and nowhere else.

Ansible calls ``python -m pyhpc cluster validate --json FILE`` before it changes
any host and deploys from the normalised JSON it prints; the CLI and the job
submission code load the same file through :func:`load`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pyhpc import validate, yamlio
from pyhpc.errors import PyhpcError, echo


class ConfigError(PyhpcError):
    """The cluster definition is invalid; the message names the key."""


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
    "lab": "settings for mode: lab",
    "nodes": "list of node groups",
    "partitions": "list of partitions",
    "accounts": "list of accounts",
    "directory": "the user directory (LDAP): empty for pyhpc's own, or an existing one's uri, "
                 "base_dn, bind_dn, bind_password_file, ca_file",
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
ACCOUNT_KEYS = {"name": "account name", "users": "list of user names"}
DIRECTORY_KEYS = {
    "uri": "an existing directory's ldaps:// (or ldap:// with start_tls) URI; absent: pyhpc "
           "runs slapd",
    "base_dn": "base DN of the directory (default for pyhpc's own: dc=<cluster name>,dc=pyhpc)",
    "bind_dn": "DN that adds and removes entries",
    "bind_password_file": "absolute path of the file holding bind_dn's password (0600)",
    "ca_file": "absolute path of the CA certificate that signed the directory's certificate",
    "start_tls": "true: StartTLS on an ldap:// URI",
    "uid_min": "first uid (and gid) number pyhpc gives directory users and groups",
    "uid_max": "last uid (and gid) number",
    "local_users": "users who stay local accounts, never directory entries (default [root])",
}
#: Where pyhpc's own directory keeps its admin password (on its host and the login hosts).
DIRECTORY_SECRET = "/etc/pyhpc/secrets/ldap_admin_password"
#: Hosts a plaintext ldap:// URI may name: the directory is this machine.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
#: Bounds of every number in a definition, next to the keys above.
BOUNDS: dict[str, tuple[int, int]] = {
    "count": (1, 1024),
    "cpus": (1, 4096),
    "memory_mb": (1, 64 << 20),  # 64 TiB
    "gpus": (0, 16),
    "slurmd_base_port": (1024, 65535),
    "uid_min": (1000, 2**31 - 2),
    "uid_max": (1000, 2**31 - 2),
}
#: Nodes in one definition, all groups together.
MAX_NODES = 4096
#: Entries in one list (partitions, accounts, users of an account).
MAX_ITEMS = 4096
MAX_PORT = 65535
#: mode lab: all nodes' declared memory together is at most this many times this machine's
#: RAM. It only tells Slurm how many jobs fit a node (config_overrides); nothing reserves it
#: and lab jobs use a fraction of it, so overcommit is intended. Beyond 4x, jobs using just a
#: quarter of their share would exhaust the machine: a typo, not a lab.
LAB_MEMORY_FACTOR = 4
MEMINFO = Path("/proc/meminfo")


def listing(names: list[str], most: int = 12) -> str:
    """``a, b, c``, or the first ``most`` names and how many there are in all."""
    if len(names) <= most:
        return ", ".join(names)
    return f"{', '.join(names[:most])}, ... ({len(names)} in all)"


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
class Account:
    name: str
    users: tuple[str, ...] = ()


@dataclass(frozen=True)
class Directory:
    """The user directory. ``managed``: pyhpc runs slapd; else clients of ``uri``."""

    managed: bool
    base_dn: str
    bind_dn: str
    bind_password_file: str
    uri: str | None = None
    ca_file: str | None = None
    start_tls: bool = False
    uid_min: int = 20000
    uid_max: int = 29999
    local_users: tuple[str, ...] = ("root",)

    def users(self, accounts: tuple[Account, ...]) -> list[str]:
        """The accounts' users that belong in the directory (sorted, without local ones)."""
        return sorted({u for a in accounts for u in a.users} - set(self.local_users))


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


def _check_keys(where: str, data: Any, allowed: dict[str, str], required: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            shown = key if isinstance(key, str) and key.isidentifier() and len(key) <= 40 \
                else echo(key)
            raise ConfigError(
                f"{where}.{shown}: unknown key; allowed: {', '.join(sorted(allowed))}"
            )
    for key in required:
        if key not in data:
            raise ConfigError(f"{where}.{key}: required key is missing ({allowed[key]})")


def _int(where: str, value: Any) -> int:
    return validate.integer(where, value, *BOUNDS[where.rsplit(".", 1)[-1]], error=ConfigError,
                            text=False)


def _choice(where: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{where}: {echo(value)} is not allowed; allowed: {', '.join(allowed)}")
    return value


def _name(where: str, value: Any, kind: str = "slurm") -> str:
    return validate.name(where, value, kind, error=ConfigError)


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false, got {value!r}")
    return value


def _names(where: str, value: Any, kind: str = "slurm") -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise ConfigError(f"{where}: must be a list of at most {MAX_ITEMS} names, "
                          f"got {echo(value)}")
    names = [_name(f"{where}[{i}]", v, kind) for i, v in enumerate(value)]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"{where}[{i}]: duplicate name {name!r}")
    return names


def _nodes(data: Any, mode: str, base_port: int) -> tuple[Node, ...]:
    if not isinstance(data, list) or not data or len(data) > MAX_ITEMS:
        raise ConfigError(f"nodes: must be a non-empty list of at most {MAX_ITEMS} node groups")
    nodes: list[Node] = []
    for i, group in enumerate(data):
        where = f"nodes[{i}]"
        _check_keys(where, group, NODE_KEYS, ("name", "cpus", "memory_mb"))
        name = _name(f"{where}.name", group["name"])
        count = _int(f"{where}.count", group["count"]) if "count" in group else None
        if len(nodes) + (count or 1) > MAX_NODES:
            raise ConfigError(f"{where}.count: the definition would have more than "
                              f"{MAX_NODES} nodes")
        names = [f"{name}{k}" for k in range(1, count + 1)] if count else [name]
        gpu_type = group.get("gpu_type")
        template = Node(
            name=name,
            cpus=_int(f"{where}.cpus", group["cpus"]),
            memory_mb=_int(f"{where}.memory_mb", group["memory_mb"]),
            gpus=_int(f"{where}.gpus", group.get("gpus", 0)),
            gpu_type=None if gpu_type is None else _name(f"{where}.gpu_type", gpu_type),
            gpu_detect=_choice(f"{where}.gpu_detect", group.get("gpu_detect", "files"),
                               GPU_DETECT),
        )
        for node_name in names:
            _name(f"{where}.name", node_name)  # with its number, still a valid name
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
        _check_keys(where, part, PARTITION_KEYS, ("name", "nodes"))
        name = _name(f"{where}.name", part["name"])
        members = _names(f"{where}.nodes", part["nodes"])
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
        if name in (p.name for p in parts):
            raise ConfigError(f"{where}.name: duplicate partition name {name!r}")
        parts.append(Partition(name, tuple(members),
                               _bool(f"{where}.default", part.get("default", False)), max_time))
    defaults = [p.name for p in parts if p.default]
    if len(defaults) > 1:
        raise ConfigError(f"partitions.default: only one partition may be default, got {defaults}")
    if not defaults:
        first = parts[0]
        parts[0] = Partition(first.name, first.nodes, True, first.max_time)
    return tuple(parts)


def _accounts(data: Any) -> tuple[Account, ...]:
    if not isinstance(data, list) or len(data) > MAX_ITEMS:
        raise ConfigError(f"accounts: must be a list of at most {MAX_ITEMS}")
    accounts: list[Account] = []
    for i, acct in enumerate(data):
        where = f"accounts[{i}]"
        _check_keys(where, acct, ACCOUNT_KEYS, ("name",))
        name = _name(f"{where}.name", acct["name"])
        if name in (a.name for a in accounts):
            raise ConfigError(f"{where}.name: duplicate account name {name!r}")
        users = _names(f"{where}.users", acct.get("users", []), "user")
        accounts.append(Account(name, tuple(users)))
    return tuple(accounts)


def _directory(data: Any, cluster_name: str) -> Directory | None:
    """``directory``: absent (no directory), ``{}`` (pyhpc's slapd) or an existing one."""
    if data is None:
        return None
    _check_keys("directory", data, DIRECTORY_KEYS, ())
    external = "uri" in data
    for key in ("base_dn", "bind_dn", "bind_password_file", "ca_file"):
        if external and key != "ca_file" and key not in data:
            raise ConfigError(f"directory.{key}: required with directory.uri "
                              f"({DIRECTORY_KEYS[key]})")
        if not external and key in ("bind_dn", "bind_password_file", "ca_file") and key in data:
            raise ConfigError(f"directory.{key}: only with directory.uri (pyhpc's own "
                              "directory makes its own admin and secret)")
    base_dn = validate.name("directory.base_dn", data.get("base_dn", f"dc={cluster_name},dc=pyhpc"),
                            "dn", error=ConfigError)
    uid_min = _int("directory.uid_min", data.get("uid_min", 20000))
    uid_max = _int("directory.uid_max", data.get("uid_max", uid_min + 9999))
    if uid_max < uid_min:
        raise ConfigError(f"directory.uid_max: {uid_max} is below directory.uid_min {uid_min}")
    local = tuple(_names("directory.local_users", data.get("local_users", ["root"]), "user"))
    if not external:
        if not all(part.startswith("dc=") for part in base_dn.split(",")):
            raise ConfigError(f"directory.base_dn: {base_dn!r}: pyhpc's own directory takes a "
                              "base of dc= parts only (e.g. dc=lab,dc=pyhpc)")
        return Directory(True, base_dn, f"cn=admin,{base_dn}", DIRECTORY_SECRET,
                         uid_min=uid_min, uid_max=uid_max, local_users=local)
    uri = validate.name("directory.uri", data["uri"], "ldap_uri", error=ConfigError)
    start_tls = _bool("directory.start_tls", data.get("start_tls", False))
    ca_file = data.get("ca_file")
    if ca_file is not None:
        validate.name("directory.ca_file", ca_file, "abspath", error=ConfigError)
    host = uri.split("://", 1)[1].rstrip("/").rsplit(":", 1)[0]
    if uri.startswith("ldap://") and not start_tls and host not in LOCAL_HOSTS:
        raise ConfigError(f"directory.uri: {uri!r} sends binds and passwords in plaintext to "
                          f"{host}; use ldaps:// or directory.start_tls: true, with "
                          "directory.ca_file")
    if (uri.startswith("ldaps://") or start_tls) and ca_file is None:
        raise ConfigError("directory.ca_file: required for TLS to the directory (the CA "
                          "certificate that signed its certificate)")
    return Directory(False, base_dn,
                     validate.name("directory.bind_dn", data["bind_dn"], "dn", error=ConfigError),
                     validate.name("directory.bind_password_file", data["bind_password_file"],
                                   "abspath", error=ConfigError),
                     uri=uri, ca_file=ca_file, start_tls=start_tls, uid_min=uid_min,
                     uid_max=uid_max, local_users=local)


def parse(data: Any, ram_mb: int | None = None) -> Cluster:
    """Validate a loaded YAML document and return the normalised cluster.

    ``ram_mb``: the RAM, in MiB, that a mode-lab definition must fit (default: this
    machine's, as the lab runs every node here; unknown off Linux, then not checked).
    """
    _check_keys("cluster", data, TOP_KEYS, ("name", "nodes", "partitions"))
    mode = _choice("mode", data.get("mode", "hosts"), MODES)
    lab = data.get("lab", {})
    _check_keys("lab", lab, LAB_KEYS, ())
    base_port = _int("lab.slurmd_base_port", lab.get("slurmd_base_port", 17001))
    nodes = _nodes(data["nodes"], mode, base_port)
    if mode == "lab":
        _check_lab_memory(nodes, machine_memory_mb() if ram_mb is None else ram_mb)
    name = _name("name", data["name"])
    return Cluster(
        name=name,
        mode=mode,
        accounting=_bool("accounting", data.get("accounting", True)),
        container_runtime=_choice("container_runtime",
                                  data.get("container_runtime", "podman"), RUNTIMES),
        nodes=nodes,
        partitions=_partitions(data["partitions"], {n.name for n in nodes}),
        accounts=_accounts(data.get("accounts", [])),
        directory=_directory(data.get("directory"), name),
        tuning=_choice("tuning", data.get("tuning", "default"), TUNINGS),
    )


def load(path: str | Path, ram_mb: int | None = None) -> Cluster:
    """Read and validate a cluster definition file (``ram_mb`` as for :func:`parse`)."""
    return parse(yamlio.load(path, "cluster definition", error=ConfigError), ram_mb)
