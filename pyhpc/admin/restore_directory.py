"""The directory part of ``pyhpc admin restore``: pyhpc's slapd gets ``base_dn`` back from a
backup's ``directory.ldif.gz`` (a ``slapcat`` of it).

Where slapd keeps that database is read from its configuration (cn=config, ``slapcat -n 0``),
whether slapd runs or not. A directory holding anything a deploy does not make is refused
(:func:`foreign`): a new host's deploy makes the base (slapd's package), ``ou=people``,
``ou=groups``, the uid and gid counters and the definition's users (no password) and groups
(``pyhpc directory sync``); a workshop's participants, a password, an admin's own entry are
data. The load: slapd stops, its database directory is set aside, ``slapadd`` fills a new
empty one (the old one's owner and mode), slapd starts and answers; then the old
one is removed. On any failure the old one is put back and slapd started again.
"""
from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pyhpc.admin import backup, owner
from pyhpc.admin.backup_store import BackupError
from pyhpc.admin.directory import COUNTER, forget_cached, parse_ldif
from pyhpc.cluster import Directory
from pyhpc.errors import PyhpcError

PART = "directory.ldif.gz"
#: Set aside during the load, beside the database directory: ``<dir>.pyhpc-replaced``.
ASIDE = ".pyhpc-replaced"
#: How long slapd may take to answer on its socket after it starts.
ANSWER_S = 30.0


class DirectoryRestoreError(PyhpcError):
    """The directory's restore is refused or failed (the message says what was changed)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"restore: {message}", "restore")


def norm_dn(dn: str) -> str:
    """A DN compared as slapd does for these names: case and spaces around ',' and '='."""
    return ",".join("=".join(p.strip() for p in rdn.split("=", 1))
                    for rdn in dn.split(",")).lower()


@dataclass(frozen=True)
class Database:
    """One database of slapd's configuration: its base and the directory of its files."""

    suffix: str
    directory: Path


def databases(config_ldif: str) -> list[Database]:
    """The databases of ``slapcat -n 0`` output that have a base and a directory."""
    return [Database(e["olcSuffix"][0], Path(e["olcDbDirectory"][0]))
            for e in parse_ldif(config_ldif) if e.get("olcSuffix") and e.get("olcDbDirectory")]


def _slapcat(args: list[str], config: Path) -> str:
    proc = subprocess.run([backup.tool("slapcat"), "-F", str(config), "-o", "ldif-wrap=no",
                           *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise DirectoryRestoreError(f"slapcat {' '.join(args)} failed: "
                                    f"{lines[-1] if lines else proc.returncode}")
    return proc.stdout


def served(d: Directory, config: Path = backup.SLAPD_CONFIG) -> Database | None:
    """The database in which this host's slapd serves ``d.base_dn``; None where this host
    has no slapd configuration or none of its databases is the base."""
    if not d.managed or not config.is_dir():
        return None
    found = [db for db in databases(_slapcat(["-n", "0", "-a", "(olcSuffix=*)"], config))
             if norm_dn(db.suffix) == norm_dn(d.base_dn)]
    return found[0] if found else None


def foreign(d: Directory, entries: Iterable[dict[str, list[str]]]) -> list[str]:
    """The DNs of ``entries`` (the directory now) that a new host's deploy does not make."""
    base = norm_dn(d.base_dn)
    made = {base, f"ou=people,{base}", f"ou=groups,{base}",
            *(f"cn={name},{base}" for name in COUNTER.values())}
    found = []
    for entry in entries:
        dn = entry.get("dn", [""])[0]
        at, classes = norm_dn(dn), {c.lower() for c in entry.get("objectClass", [])}
        ours = entry.get("description", []) == [owner.DEFINITION]
        if at in made:
            continue
        if ours and at.endswith(f",ou=people,{base}") and "posixaccount" in classes \
                and "userPassword" not in entry:
            continue
        if ours and at.endswith(f",ou=groups,{base}") and "posixgroup" in classes:
            continue
        found.append(dn)
    return found


def backup_dns(ldif: Path) -> list[str]:
    """The DNs a backup's ldif holds, in its order (``dn::`` ones decoded)."""
    with gzip.open(ldif, "rt", encoding="utf-8", errors="replace") as fh:
        return [e["dn"][0] for e in parse_ldif("\n\n".join(
            line.rstrip("\n") for line in fh if line.startswith("dn:")))]


def check(d: Directory, config: Path = backup.SLAPD_CONFIG) -> tuple[Database, list[str]]:
    """Before any change: the database to restore into, and the DNs it holds now (each one
    a deploy makes); refused where it holds anything else."""
    db = served(d, config)
    if db is None:
        raise DirectoryRestoreError(f"this host's slapd serves no database for "
                                    f"{d.base_dn} ({config}): run it on the directory host")
    # slapcat cannot open a database that has no files yet (emptied by hand): none is empty.
    empty = db.directory.is_dir() and not any(db.directory.iterdir())
    now = [] if empty else parse_ldif(_slapcat(["-b", d.base_dn], config))
    other = foreign(d, now)
    if other:
        shown = ", ".join(other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
        raise DirectoryRestoreError(f"the directory {d.base_dn} already holds {len(other)} "
                                    f"entries a deploy does not make ({shown}); restore only "
                                    "onto a new host's directory (nothing was changed)")
    return db, [e["dn"][0] for e in now if e.get("dn")]


def _answers(base_dn: str, wait_s: float = ANSWER_S) -> bool:
    """Whether slapd answers for the base on its local socket (root, no password)."""
    deadline = time.monotonic() + wait_s
    while True:
        proc = subprocess.run([backup.tool("ldapsearch"), "-Q", "-Y", "EXTERNAL", "-H",
                               "ldapi:///", "-LLL", "-s", "base", "-b", base_dn, "1.1"],
                              capture_output=True, text=True, check=False)
        if proc.returncode == 0 or time.monotonic() > deadline:
            return proc.returncode == 0
        time.sleep(0.2)


def _fill(folder: Path, like: os.stat_result, ldif: Path, base_dn: str, config: Path) -> None:
    """Create ``folder`` empty, with ``like``'s owner and mode, and slapadd ``ldif`` into it."""
    folder.mkdir(mode=0o700)
    os.chown(folder, like.st_uid, like.st_gid)
    folder.chmod(like.st_mode & 0o7777)
    try:
        backup.feed(["slapadd", "-q", "-F", str(config), "-b", base_dn], ldif)
    except BackupError as exc:
        raise DirectoryRestoreError(str(exc).removeprefix('backup: ')) from None
    for path in folder.iterdir():
        os.chown(path, like.st_uid, like.st_gid, follow_symlinks=False)


def load(db: Database, ldif: Path, base_dn: str, service: Callable[[str], None],
         config: Path = backup.SLAPD_CONFIG, answers: Callable[[str], bool] = _answers,
         ) -> float:
    """Replace ``db``'s files by ``ldif``'s entries, slapd stopped (``service("stop")``) for
    the seconds returned; on failure the old files are back and slapd started again."""
    folder = db.directory
    aside = folder.with_name(folder.name + ASIDE)
    if os.path.lexists(aside):
        raise DirectoryRestoreError(f"{aside} is there (a restore that stopped half-way?): "
                                    "look at it, remove it, run the restore again (nothing "
                                    "was changed)")
    like = folder.stat()
    started = time.monotonic()
    service("stop")
    running = False
    try:
        os.rename(folder, aside)
    except OSError as exc:
        service("start")
        raise DirectoryRestoreError(f"cannot set {folder} aside ({exc.strerror}); nothing "
                                    "was changed") from None
    try:
        _fill(folder, like, ldif, base_dn, config)
        service("start")
        running = True
        if not answers(base_dn):
            raise DirectoryRestoreError(f"slapd does not answer for {base_dn} after the load")
    except (PyhpcError, OSError) as exc:
        _put_back(folder, aside, service, running)
        why = exc.strerror if isinstance(exc, OSError) else str(exc).removeprefix("restore: ")
        raise DirectoryRestoreError(f"{why}; the directory's database is back as it "
                                    "was") from None
    except BaseException:
        _put_back(folder, aside, service, running)
        raise
    seconds = time.monotonic() - started
    shutil.rmtree(aside)
    forget_cached()
    return seconds


def _put_back(folder: Path, aside: Path, service: Callable[[str], None],
              running: bool) -> None:
    """The set-aside database back in its place, and slapd started on it."""
    if running:
        with contextlib.suppress(PyhpcError):
            service("stop")
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(aside, folder)
    service("start")
