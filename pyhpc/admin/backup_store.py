"""The backup directory: each backup's name, manifest and marker, listing, checking, pruning.

One backup is a directory ``<host>-<YYYYmmddTHHMMSSZ>`` (UTC) in the definition's
``backup.path``, root's, 0700, holding its compressed parts (0600), ``pyhpc-backup.json``
(what it is: the marker that pyhpc made it) and ``MANIFEST.sha256`` (``sha256sum -c``
reads it). It is written under a ``.partial-`` name and renamed when complete, so a
backup that is listed is whole. Pruning removes only directories that have the name,
the marker and this host's name: never anything pyhpc did not make.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pyhpc.errors import PyhpcError

MARKER = "pyhpc-backup.json"
MANIFEST = "MANIFEST.sha256"
STAMP = "%Y%m%dT%H%M%SZ"
NAME = re.compile(r"(?P<host>[a-z0-9][a-z0-9-]{0,62})-(?P<stamp>[0-9]{8}T[0-9]{6}Z)")
PARTIAL = ".partial-"
MANIFEST_LINE = re.compile(r"(?P<sum>[0-9a-f]{64})  (?P<name>[a-z][a-z0-9._-]{0,63})")
#: Largest marker or manifest read back (they are a few hundred bytes).
SMALL = 1 << 16


class BackupError(PyhpcError):
    """A backup cannot be taken, read or checked; the message says which and why."""

    def __init__(self, message: str) -> None:
        super().__init__(f"backup: {message}", "backup")


@dataclass(frozen=True)
class Entry:
    """One backup found in the directory."""

    name: str
    host: str
    time: datetime
    size: int
    ok: bool
    problem: str = ""

    def row(self) -> dict[str, object]:
        return {"name": self.name, "host": self.host, "time": self.time.isoformat(),
                "size": self.size, "ok": self.ok, "problem": self.problem}


def backup_name(host: str, when: datetime) -> str:
    return f"{host}-{when.astimezone(UTC).strftime(STAMP)}"


def parse_name(name: str) -> tuple[str, datetime] | None:
    match = NAME.fullmatch(name)
    if not match:
        return None
    when = datetime.strptime(match.group("stamp"), STAMP).replace(tzinfo=UTC)
    return match.group("host"), when


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_text(folder: Path, names: list[str]) -> str:
    """``sha256sum`` lines of ``names`` in ``folder``, sorted by name."""
    return "".join(f"{sha256(folder / n)}  {n}\n" for n in sorted(names))


def _read_small(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        return fh.read(SMALL).decode()


def check(folder: Path) -> str:
    """'' when every file the manifest lists holds its checksum, and the folder holds only
    those, the manifest and regular files; else what is wrong, in a few words."""
    try:
        lines = _read_small(folder / MANIFEST).splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        return f"no readable manifest ({exc})"
    listed: dict[str, str] = {}
    for line in lines:
        match = MANIFEST_LINE.fullmatch(line)
        if not match:
            return "the manifest has a line that is not '<sha256>  <name>'"
        listed[match.group("name")] = match.group("sum")
    if MARKER not in listed:
        return f"the manifest does not list {MARKER}"
    present = {p.name for p in folder.iterdir()} - {MANIFEST}
    if present != set(listed):
        extra, missing = sorted(present - set(listed)), sorted(set(listed) - present)
        return f"files differ from the manifest (missing: {missing}, not listed: {extra})"
    for name, want in sorted(listed.items()):
        path = folder / name
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return f"{name} is not a regular file"
        if sha256(path) != want:
            return f"{name} does not match its checksum (corrupt or truncated)"
    return ""


def marker(folder: Path) -> dict[str, object] | None:
    """The marker's fields where it says pyhpc made this backup, else None."""
    try:
        data = json.loads(_read_small(folder / MARKER))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("made_by") == "pyhpc" else None


def _ours(root: Path, name: str) -> tuple[str, datetime] | None:
    """Host and time of ``root/name`` where it is a real directory pyhpc made, else None."""
    parsed = parse_name(name)
    if parsed is None:
        return None
    try:
        if not stat.S_ISDIR(os.lstat(root / name).st_mode):
            return None
    except OSError:
        return None
    found = marker(root / name)
    return parsed if found is not None and found.get("host") == parsed[0] else None


def _size(folder: Path) -> int:
    return sum(os.lstat(p).st_size for p in folder.iterdir())


def entries(root: Path, host: str | None = None) -> list[Entry]:
    """Every backup pyhpc made in ``root`` (of ``host`` only, when given), oldest first."""
    found: list[Entry] = []
    for name in sorted(os.listdir(root)):
        parsed = _ours(root, name)
        if parsed is None or (host is not None and parsed[0] != host):
            continue
        problem = check(root / name)
        found.append(Entry(name, parsed[0], parsed[1], _size(root / name), not problem,
                           problem))
    return sorted(found, key=lambda e: (e.time, e.name))


def doomed(found: list[Entry], keep: int) -> list[Entry]:
    """What pruning removes of one host's backups (oldest first): everything older than the
    oldest of the newest ``keep`` good ones. A bad backup newer than that stays, to look at;
    with fewer than ``keep`` good ones nothing goes."""
    good = [e for e in found if e.ok]
    if len(good) <= keep:
        return []
    oldest_kept = good[-keep]
    return [e for e in found if (e.time, e.name) < (oldest_kept.time, oldest_kept.name)]


def prune(root: Path, host: str, keep: int) -> list[str]:
    """Remove this host's backups beyond ``keep`` good ones, and its partial ones left by an
    interrupted run; returns the names removed."""
    removed = []
    for entry in doomed(entries(root, host), keep):
        shutil.rmtree(root / entry.name)
        removed.append(entry.name)
    for name in sorted(os.listdir(root)):
        # .partial-<name>.<random>, as pyhpc.admin.backup.now names it
        if name.startswith(f"{PARTIAL}{host}-") \
                and parse_name(name[len(PARTIAL):].rsplit(".", 1)[0]) \
                and stat.S_ISDIR(os.lstat(root / name).st_mode):
            shutil.rmtree(root / name)
            removed.append(name)
    return removed


#: A scheduler's tick runs a little late or early: a backup is due this much before
#: ``backup.interval`` has passed (so a 15 min interval on a 15 min tick never skips one).
SLACK_S = 300


def due(newest: Entry | None, interval_s: int, now: float) -> bool:
    """Whether a backup is due: none yet, or the newest good one older than the interval
    (less :data:`SLACK_S`)."""
    return newest is None or now - newest.time.timestamp() >= interval_s - SLACK_S


def newest_good(root: Path, host: str | None = None) -> Entry | None:
    good = [e for e in entries(root, host) if e.ok]
    return good[-1] if good else None
