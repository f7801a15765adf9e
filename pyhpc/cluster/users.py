"""Who uses the cluster, as the definition says: accounts with their users and per-user
limits, and the user directory (LDAP) that holds the users.

Parsed here, validated before any host changes, re-exported by :mod:`pyhpc.cluster`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyhpc import validate
from pyhpc.cluster.schema import MAX_NODES, ConfigError, boolean, check_keys, integer, name, names

ACCOUNT_KEYS = {"name": "account name", "users": "list of user names",
                "limits": "per-user limits: jobs, submitted_jobs, nodes, gpus"}
LIMIT_KEYS = {
    "jobs": "jobs each user of the account runs at once (Slurm MaxJobs)",
    "submitted_jobs": "jobs each user may have queued and running (MaxSubmitJobs)",
    "nodes": "distinct nodes each user's running jobs hold together (GrpTRES node)",
    "gpus": "GPUs each user's running jobs hold together (GrpTRES gres/gpu)",
}
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
BOUNDS: dict[str, tuple[int, int]] = {
    # Below 1000: system accounts (Debian's SYS_UID_MAX is 999).
    "uid_min": (1000, 2**31 - 2),
    "uid_max": (1000, 2**31 - 2),
    "jobs": (1, 100_000),
    "submitted_jobs": (1, 1_000_000),
    "nodes": (1, MAX_NODES),
    "gpus": (0, 16 * MAX_NODES),
}
#: Ids no directory user or group may get: Debian's global allocations (60000-64999), its
#: reserved ones and systemd's dynamic users (up to 65519), nobody and nogroup (65534) and
#: 65535 ((uid_t) -1 of 16-bit calls).
SYSTEM_IDS = (60000, 65535)


@dataclass(frozen=True)
class Limits:
    """Per-user limits of an account; ``None``: no limit."""

    jobs: int | None = None
    submitted_jobs: int | None = None
    nodes: int | None = None
    gpus: int | None = None


@dataclass(frozen=True)
class Account:
    name: str
    users: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)


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


def _limits(where: str, data: Any) -> Limits:
    check_keys(where, data, LIMIT_KEYS, ())
    values = {k: integer(f"{where}.{k}", v, BOUNDS) for k, v in data.items()}
    limits = Limits(**values)
    if limits.jobs and limits.submitted_jobs and limits.submitted_jobs < limits.jobs:
        raise ConfigError(f"{where}.submitted_jobs: {limits.submitted_jobs} is below "
                          f"{where}.jobs {limits.jobs} (queued counts running jobs too); "
                          f"allowed: {limits.jobs} to {BOUNDS['submitted_jobs'][1]}")
    return limits


def parse_accounts(data: Any, max_items: int) -> tuple[Account, ...]:
    if not isinstance(data, list) or len(data) > max_items:
        raise ConfigError(f"accounts: must be a list of at most {max_items}")
    accounts: list[Account] = []
    for i, acct in enumerate(data):
        where = f"accounts[{i}]"
        check_keys(where, acct, ACCOUNT_KEYS, ("name",))
        acct_name = name(f"{where}.name", acct["name"], "account")
        if acct_name in (a.name for a in accounts):
            raise ConfigError(f"{where}.name: duplicate account name {acct_name!r}")
        users = names(f"{where}.users", acct.get("users", []), kind="user")
        accounts.append(Account(acct_name, tuple(users),
                                _limits(f"{where}.limits", acct.get("limits", {}))))
    return tuple(accounts)


def _id_range(data: Any) -> tuple[int, int]:
    """``uid_min``..``uid_max``: ordered, and clear of :data:`SYSTEM_IDS`."""
    uid_min = integer("directory.uid_min", data.get("uid_min", 20000), BOUNDS)
    uid_max = integer("directory.uid_max", data.get("uid_max", uid_min + 9999), BOUNDS)
    if uid_max < uid_min:
        raise ConfigError(f"directory.uid_max: {uid_max} is below directory.uid_min {uid_min}")
    low, high = SYSTEM_IDS
    if uid_min <= high and uid_max >= low:
        raise ConfigError(f"directory.uid_max: the range {uid_min}-{uid_max} reaches into "
                          f"{low}-{high} (ids Debian and systemd reserve, nobody and nogroup "
                          f"65534); allowed: a range within 1000-{low - 1} or from {high + 1}")
    return uid_min, uid_max


def parse_directory(data: Any, cluster_name: str) -> Directory | None:
    """``directory``: absent (no directory), ``{}`` (pyhpc's slapd) or an existing one."""
    if data is None:
        return None
    check_keys("directory", data, DIRECTORY_KEYS, ())
    external = "uri" in data
    for key in ("base_dn", "bind_dn", "bind_password_file", "ca_file"):
        if external and key != "ca_file" and key not in data:
            raise ConfigError(f"directory.{key}: required with directory.uri "
                              f"({DIRECTORY_KEYS[key]})")
        if not external and key in ("bind_dn", "bind_password_file", "ca_file") and key in data:
            raise ConfigError(f"directory.{key}: only with directory.uri (pyhpc's own "
                              "directory makes its own admin and secret)")
    base_dn = name("directory.base_dn", data.get("base_dn", f"dc={cluster_name},dc=pyhpc"),
                   kind="dn")
    uid_min, uid_max = _id_range(data)
    local = tuple(names("directory.local_users", data.get("local_users", ["root"]), kind="user"))
    if not external:
        if not all(part.startswith("dc=") for part in base_dn.split(",")):
            raise ConfigError(f"directory.base_dn: {base_dn!r}: pyhpc's own directory takes a "
                              "base of dc= parts only (e.g. dc=lab,dc=pyhpc)")
        return Directory(True, base_dn, f"cn=admin,{base_dn}", DIRECTORY_SECRET,
                         uid_min=uid_min, uid_max=uid_max, local_users=local)
    uri = name("directory.uri", data["uri"], kind="ldap_uri")
    start_tls = boolean("directory.start_tls", data.get("start_tls", False))
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
    return Directory(False, base_dn, name("directory.bind_dn", data["bind_dn"], kind="dn"),
                     name("directory.bind_password_file", data["bind_password_file"],
                          kind="abspath"),
                     uri=uri, ca_file=ca_file, start_tls=start_tls, uid_min=uid_min,
                     uid_max=uid_max, local_users=local)
