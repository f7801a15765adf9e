"""Where, how often and how many backups of the cluster's state: the ``backup`` section.

Parsed here, validated before any host changes, re-exported by :mod:`pyhpc.cluster`. The
backup role runs ``pyhpc admin backup now`` on that schedule (:mod:`pyhpc.admin.backup`).
Backups must survive the host they are of: in mode hosts ``path`` is on a mounted share
(the nfs role's, or one the admin mounts there), which the role checks on each host; mode
lab has one host, so a local directory is its only choice.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pyhpc.cluster.schema import ConfigError, check_keys, integer, name
from pyhpc.errors import echo

KINDS = ("local", "share")
BACKUP_KEYS = {
    "kind": "local (mode lab: the only choice there, and its default) or share (mode "
            "hosts: the only choice there, and its default: a backup on the host it is of "
            "is lost with that host)",
    "path": "absolute directory the backups land in (root's, 0700). mode lab: a local "
            "directory, the only choice there; mode hosts: a mounted share (not a host's own "
            "root filesystem), which every backed-up host writes to",
    "interval": "how often: a number and one unit of m, h or d, from 15m to 7d (default 1d)",
    "keep": "how many backups of each host to keep, 1 to 365 (default 7); older ones that "
            "pyhpc made are removed",
}
BOUNDS: dict[str, tuple[int, int]] = {"keep": (1, 365)}
INTERVAL = re.compile(r"([1-9][0-9]{0,4})(m|h|d)")
UNIT_S = {"m": 60, "h": 3600, "d": 86400}
#: 15 minutes to 7 days: more often loads the database for little; less often loses a week.
INTERVAL_S = (15 * 60, 7 * 86400)
#: Directories a backup must never land in: the system's own, and trees users write.
FORBIDDEN = ("/", "/etc", "/usr", "/bin", "/sbin", "/lib", "/boot", "/dev", "/proc", "/sys",
             "/run", "/tmp", "/var", "/var/tmp", "/home", "/root", "/opt/pyhpc")


@dataclass(frozen=True)
class Backup:
    """The ``backup`` section, normalised; ``interval_s`` is ``interval`` in seconds."""

    path: str
    kind: str = "local"
    interval: str = "1d"
    interval_s: int = 86400
    keep: int = 7


def interval_seconds(where: str, value: Any) -> int:
    """``15m``, ``6h``, ``1d``: seconds, within :data:`INTERVAL_S`."""
    match = INTERVAL.fullmatch(value) if isinstance(value, str) else None
    seconds = int(match.group(1)) * UNIT_S[match.group(2)] if match else -1
    if not INTERVAL_S[0] <= seconds <= INTERVAL_S[1]:
        raise ConfigError(f"{where}: {echo(value)} is not allowed; use a number and one unit "
                          "of m, h or d, from 15m to 7d")
    return seconds


def directory_path(where: str, value: Any, example: str = "/var/backups/pyhpc") -> str:
    """An absolute directory of its own: no . or .. parts, none of :data:`FORBIDDEN`
    (nor below the trees users write or the kernel's)."""
    path = name(where, value, kind="abspath")
    parts = path.rstrip("/").split("/")
    if ".." in parts or "." in parts:
        raise ConfigError(f"{where}: {echo(value)} is not allowed; name the directory "
                          "without . or .. parts")
    norm = "/".join(parts) or "/"
    for bad in FORBIDDEN:
        if norm == bad or (bad in ("/home", "/tmp", "/var/tmp", "/opt/pyhpc", "/proc", "/sys",
                                   "/dev", "/run") and norm.startswith(bad + "/")):
            raise ConfigError(f"{where}: {norm} is not allowed; a directory of its own, "
                              "outside the system's directories and the trees users write "
                              f"(/home, /tmp, /opt/pyhpc), e.g. {example}")
    return norm


def _kind(value: Any, mode: str) -> str:
    own = "local" if mode == "lab" else "share"
    if value is None or value == own:
        return own
    if value not in KINDS:
        raise ConfigError(f"backup.kind: {echo(value)} is not allowed; allowed: "
                          f"{', '.join(KINDS)} (mode {mode}: {own} only)")
    if mode == "lab":
        raise ConfigError("backup.kind: mode lab has one host, so a local directory is the "
                          "only choice; allowed: local")
    raise ConfigError("backup.kind: a local directory would be on the host backed up, and "
                      "lost with it; mode hosts allows only share (a mounted share at "
                      "backup.path)")


def parse_backup(data: Any, mode: str) -> Backup | None:
    """``backup``: absent (no backups) or a mapping of :data:`BACKUP_KEYS` (``path``
    required)."""
    if data is None:
        return None
    check_keys("backup", data, BACKUP_KEYS, ("path",))
    interval = data.get("interval", "1d")
    return Backup(path=directory_path("backup.path", data["path"]),
                  kind=_kind(data.get("kind"), mode),
                  interval=interval,
                  interval_s=interval_seconds("backup.interval", interval),
                  keep=integer("backup.keep", data.get("keep", 7), BOUNDS))
