"""``pyhpc admin restore``: what this host holds, back from its newest good backup.

For a host after its loss, deployed anew (``make deploy``), then restored. Its parts
(:data:`PARTS`): ``accounting`` where slurmdbd's configuration names a database, the
``directory`` where pyhpc's slapd serves ``base_dn`` (:mod:`pyhpc.admin.restore_directory`);
``only`` picks one. Each refuses, before anything changes, a host that holds data: a job
table with a job, a directory with an entry a deploy does not make. Then the backup is
verified (its checksums, its dump loaded into a scratch database, its directory through
``slapadd -u``: :func:`pyhpc.admin.backup.verify`). Accounting: slurmdbd stops, the dump
replaces the tables, slurmdbd starts again, and slurmctld sends it the records it queued
meanwhile. A new host's deploy holds slurmdbd stopped (:data:`pyhpc.admin.backup.HOLD`)
until this load: then it starts and is enabled at boot. The files are restored by hand
(docs/admin/backups.md).
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from pyhpc.admin import backup, restore_directory
from pyhpc.cluster import Cluster
from pyhpc.errors import PyhpcError


class RestoreError(PyhpcError):
    """A restore is refused or fails; nothing was overwritten where it was refused."""

    def __init__(self, message: str) -> None:
        super().__init__(f"restore: {message}", "restore")


#: What a restore can bring back, in the order it does, and each part's file in a backup.
PARTS = ("accounting", "directory")
FILES = {"accounting": "accounting.sql.gz", "directory": restore_directory.PART}
#: Each daemon's command: systemd's unit where it is PID 1, else the lab's init script.
SERVICES = {"slurmdbd": {"systemd": ["systemctl", "{verb}", "slurmdbd"],
                         "sysv": ["service", "pyhpc-slurmdbd", "{verb}"]},
            "slapd": {"systemd": ["systemctl", "{verb}", "slapd"],
                      "sysv": ["service", "slapd", "{verb}"]}}
#: slurmdbd started at boot again, once a held one is released (the deploy turned it off).
SLURMDBD_AT_BOOT = {"systemd": ["systemctl", "enable", "slurmdbd"],
                    "sysv": ["update-rc.d", "pyhpc-slurmdbd", "enable"]}


def _manager() -> str:
    return "systemd" if Path("/run/systemd/system").is_dir() else "sysv"


def service(name: str, verb: str) -> None:
    """Start or stop daemon ``name`` (:data:`SERVICES`) the way this host runs it."""
    _command([part.format(verb=verb) for part in SERVICES[name][_manager()]])


def _command(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RestoreError(f"{' '.join(argv)} failed: "
                          f"{(proc.stderr or proc.stdout).strip()[-200:]}")


def jobs_held(cluster: Cluster, database: str) -> int:
    """Rows of the job table in ``database`` (0 where the table does not exist yet)."""
    table = f"{cluster.name}_job_table"
    found = backup.mysql(f"SELECT COUNT(*) FROM information_schema.tables WHERE "
                          f"table_schema = '{database}' AND table_name = '{table}'").split()
    if found != ["1"]:
        return 0
    return int(backup.mysql(f"SELECT COUNT(*) FROM `{table}`", database).split()[0])


def _accounting(cluster: Cluster) -> str | None:
    """The accounting database this host holds (slurmdbd's StorageLoc), if any."""
    return backup.conf_value(backup.SLURMDBD_CONF, "StorageLoc") if cluster.accounting else None


def _held(cluster: Cluster, only: str | None) -> dict[str, Any]:
    """The parts to restore (``only``, else every one this host holds): part -> where."""
    here: dict[str, Any] = {}
    if only in (None, "accounting") and (database := _accounting(cluster)):
        here["accounting"] = database
    if only in (None, "directory") and cluster.directory is not None \
            and (db := restore_directory.served(cluster.directory)) is not None:
        here["directory"] = db
    if only == "accounting" and not here:
        raise RestoreError(f"this host runs no slurmdbd ({backup.SLURMDBD_CONF} has "
                          "no StorageLoc): run it on the db host")
    if only == "directory" and not here:
        raise RestoreError("this host runs no pyhpc slapd serving the definition's "
                          "directory.base_dn: run it on the directory host")
    if not here:
        raise RestoreError("this host holds neither the accounting database nor pyhpc's "
                          "directory: run it on the db host or the directory host")
    return here


def restore(cluster: Cluster, name: str | None = None,
            only: str | None = None) -> dict[str, Any]:
    """Restore what this host holds (``only``: that part of :data:`PARTS`) from backup
    ``name`` (default: this host's newest good one); returns what was done."""
    if os.geteuid() != 0:
        raise RestoreError("run as root")
    if only is not None and only not in PARTS:
        raise RestoreError(f"--only: {only!r} is not a part; allowed: {', '.join(PARTS)}")
    here = _held(cluster, only)
    if "accounting" in here:
        held = jobs_held(cluster, here["accounting"])
        if held:
            raise RestoreError(f"the accounting database {here['accounting']} already holds "
                              f"{held} jobs; restore only onto a new, empty host"
                              + (", or --only directory" if "directory" in here else "")
                              + " (nothing was changed)")
    now: list[str] = []
    if "directory" in here:
        assert cluster.directory is not None
        here["directory"], now = restore_directory.check(cluster.directory)
    checked = backup.verify(cluster, name)
    folder = Path(cluster.backup.path if cluster.backup else "") / checked["name"]
    missing = [p for p in here if not (folder / FILES[p]).exists()]
    if missing:
        rest = [p for p in here if p not in missing]
        raise RestoreError(f"{checked['name']} holds no {' and no '.join(FILES[p] for p in missing)}"
                          "; name a backup that does (pyhpc admin backup list)"
                          + (f", or --only {rest[0]}" if rest else "") + " (nothing was changed)")
    done: dict[str, Any] = {"name": checked["name"], "parts": list(here)}
    if "accounting" in here:
        done["accounting"] = _load_accounting(cluster, here["accounting"], folder)
    if "directory" in here:
        try:
            done["directory"] = _load_directory(cluster, here["directory"], folder, now)
        except PyhpcError as exc:
            if "accounting" not in done:
                raise
            raise RestoreError(f"accounting was restored from {checked['name']}; the "
                              f"directory was not: {str(exc).removeprefix('restore: ')}") \
                from None
    return done


def _load_directory(cluster: Cluster, db: restore_directory.Database, folder: Path,
                    now: list[str]) -> dict[str, Any]:
    """The directory's part; ``now``: the DNs the database held before (the deploy's)."""
    assert cluster.directory is not None
    base_dn = cluster.directory.base_dn
    ldif = folder / restore_directory.PART
    seconds = restore_directory.load(db, ldif, base_dn, lambda verb: service("slapd", verb))
    kept = {restore_directory.norm_dn(dn) for dn in restore_directory.backup_dns(ldif)}
    return {"base_dn": base_dn, "entries": len(kept), "seconds": round(seconds, 3),
            "not_in_backup": [dn for dn in now if restore_directory.norm_dn(dn) not in kept]}


def _load_accounting(cluster: Cluster, database: str, folder: Path) -> dict[str, Any]:
    """The accounting part. A slurmdbd the deploy held (:data:`backup.HOLD`) starts only on
    the loaded dump: on its empty database it would drop the records slurmctld queued."""
    held = backup.HOLD.exists()
    started = time.monotonic()
    service("slurmdbd", "stop")
    loaded = False
    try:
        backup.feed(["mysql", database], folder / FILES["accounting"], backup.DUMP_END)
        loaded = True
        if held:
            # Before the start: a slurmdbd that then fails to start is the next deploy's
            # to start, on the tables loaded here.
            backup.HOLD.unlink()
    finally:
        if loaded or not held:
            service("slurmdbd", "start")
    if held:
        _command(SLURMDBD_AT_BOOT[_manager()])
    return {"database": database, "jobs": jobs_held(cluster, database),
            "seconds": round(time.monotonic() - started, 3), "released": held}
