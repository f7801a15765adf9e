"""``pyhpc admin restore``: the accounting database back from this host's newest good backup.

For the db host after its loss: deployed anew (``make deploy``: MariaDB, slurmdbd, an
empty job table), then restored. It refuses a database whose job table holds any job, so
that nothing recorded is overwritten. Before anything changes the backup is verified (its
checksums, and its dump loaded into a scratch database: :func:`pyhpc.admin.backup.verify`);
then slurmdbd stops, the dump replaces the tables, slurmdbd starts again, and slurmctld
sends it the records it queued meanwhile. The directory and the files are restored by hand
(docs/admin/backups.md).
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from pyhpc.admin import backup
from pyhpc.cluster import Cluster
from pyhpc.errors import PyhpcError


class RestoreError(PyhpcError):
    """A restore is refused or fails; nothing was overwritten where it was refused."""

    def __init__(self, message: str) -> None:
        super().__init__(f"restore: {message}", "restore")


#: systemd's unit where it is PID 1, else the lab's init script.
SLURMDBD = {"systemd": ["systemctl", "{verb}", "slurmdbd"],
            "sysv": ["service", "pyhpc-slurmdbd", "{verb}"]}


def _manager() -> str:
    return "systemd" if Path("/run/systemd/system").is_dir() else "sysv"


def _slurmdbd(verb: str) -> None:
    argv = [part.format(verb=verb) for part in SLURMDBD[_manager()]]
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


def restore(cluster: Cluster, name: str | None = None) -> dict[str, Any]:
    """Restore this host's accounting database from backup ``name`` (default: this host's
    newest good one); returns what was done."""
    if os.geteuid() != 0:
        raise RestoreError("run as root")
    database = backup.conf_value(backup.SLURMDBD_CONF, "StorageLoc")
    if not database:
        raise RestoreError(f"this host runs no slurmdbd ({backup.SLURMDBD_CONF} has "
                          "no StorageLoc): run it on the db host")
    held = jobs_held(cluster, database)
    if held:
        raise RestoreError(f"the accounting database {database} already holds "
                          f"{held} jobs; restore only onto a new, empty host (nothing was "
                          "changed)")
    checked = backup.verify(cluster, name)
    if "jobs" not in checked:
        raise RestoreError(f"{checked['name']} holds no accounting dump")
    folder = Path(cluster.backup.path if cluster.backup else "") / checked["name"]
    started = time.monotonic()
    _slurmdbd("stop")
    try:
        backup.feed(["mysql", database], folder / "accounting.sql.gz", backup.DUMP_END)
    finally:
        _slurmdbd("start")
    return {"name": checked["name"], "database": database, "jobs": jobs_held(cluster, database),
            "seconds": round(time.monotonic() - started, 3)}
