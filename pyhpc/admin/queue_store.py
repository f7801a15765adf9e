"""The queue record's files, under :data:`pyhpc.paths.UPGRADE_QUEUE` on the controller.

``save.json`` says what save changed (the reservation it made), how far it got, and the
first job id safe for the new slurmctld (:data:`FIRST_JOB_ID`);
``jobs/<id>.json`` holds one job each (:class:`~pyhpc.admin.queue_record.SavedJob`);
``restored.json`` maps each old id restore resubmitted to its new one, written after each
submission, so a second restore submits nothing twice. The directory is root's, 0700, each
file 0600, written atomically without following a link (:mod:`pyhpc.files`); a file is read
back only if it is root's, private, and of the shape pyhpc wrote.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pyhpc import files
from pyhpc.admin.queue_record import QueueError, SavedJob, from_json, to_json

JOBS = "jobs"
SAVE = "save.json"
RESTORED = "restored.json"
#: Largest record file read back (a batch script is at most 4 MB in Slurm's default).
LIMIT = 8 * 1024 * 1024
SAVE_KEYS = {"reservation_made": bool, "saved": bool, "deadline_at": int, "started_at": int,
             "first_job_id": int, "next_job_id": int}
#: save.json's key for the lowest job id safe for the new slurmctld's jobs; the slurm role
#: reads it on the primary controller and sets slurm.conf's FirstJobId from it.
FIRST_JOB_ID = "first_job_id"
#: Keys a record written before they existed lacks (read as 0: nothing recorded).
LATER_KEYS = (FIRST_JOB_ID, "next_job_id")


def check_root() -> None:
    if os.geteuid() != 0:
        raise QueueError("user: run as root on the controller (the record holds every "
                         "user's jobs, and Slurm takes holds and requeues from root only)",
                         "user")


def make(where: Path) -> Path:
    """The record directory, created 0700 (and its jobs/): refused unless root's alone."""
    check_root()
    try:
        top = files.make_dir(where, "record", mode=0o700)
        files.make_dir(top / JOBS, "record", mode=0o700)
    except files.FileError as exc:
        raise QueueError(str(exc)) from None
    return top


def existing(where: Path) -> Path:
    """The record directory as save left it; one line when there is none."""
    check_root()
    if not os.path.lexists(where / SAVE):
        raise QueueError(f"record: no queue record in {where} (pyhpc admin upgrade queue save "
                         "makes it)", "record")
    try:
        return files.safe_dir(where, "record", writable=False)
    except files.FileError as exc:
        raise QueueError(str(exc)) from None


def _read(path: Path) -> Any:
    try:
        return json.loads(files.read_owned(path, LIMIT, "record"))
    except files.FileError as exc:
        raise QueueError(str(exc)) from None
    except ValueError:
        raise QueueError(f"record: {path} is not JSON; not a pyhpc queue record",
                         "record") from None


def _write(path: Path, data: Any) -> None:
    files.write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n", "record", 0o600)


def read_save(top: Path) -> dict[str, Any]:
    """``save.json``, checked; a fresh one where there is none yet."""
    path = top / SAVE
    if not os.path.lexists(path):
        return {"reservation_made": False, "saved": False, "deadline_at": 0, "started_at": 0,
                FIRST_JOB_ID: 0, "next_job_id": 0}
    data = _read(path)
    if isinstance(data, dict):
        data = {**dict.fromkeys(LATER_KEYS, 0), **data}
    if not isinstance(data, dict) or set(data) != set(SAVE_KEYS) or not all(
            isinstance(data[k], t) and not (t is int and isinstance(data[k], bool))
            for k, t in SAVE_KEYS.items()):
        raise QueueError(f"record: {path} is not a pyhpc queue record (keys: "
                         f"{', '.join(SAVE_KEYS)})", "record")
    return data


def write_save(top: Path, data: dict[str, Any]) -> None:
    _write(top / SAVE, data)


def write_job(top: Path, saved: SavedJob) -> None:
    _write(top / JOBS / f"{saved.job_id}.json", to_json(saved))


def read_jobs(top: Path) -> dict[str, SavedJob]:
    """Every recorded job, by old id; a file that is not one is one line."""
    out = {}
    for name in sorted(os.listdir(top / JOBS)):
        if name.startswith("."):
            continue  # an interrupted atomic write's temp file
        if not re.fullmatch(r"[0-9]{1,10}\.json", name):
            raise QueueError(f"record: {top / JOBS / name} is not a job's record file", "record")
        saved = from_json(_read(top / JOBS / name), str(top / JOBS / name))
        if f"{saved.job_id}.json" != name:
            raise QueueError(f"record: {top / JOBS / name} holds job {saved.job_id}", "record")
        out[saved.job_id] = saved
    return out


def read_restored(top: Path) -> dict[str, str]:
    """Old id -> new id of the jobs restore has brought back (empty before)."""
    path = top / RESTORED
    if not os.path.lexists(path):
        return {}
    data = _read(path)
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v.isdigit() for k, v in data.items()):
        raise QueueError(f"record: {path} is not a map of old to new job ids", "record")
    return data


def write_restored(top: Path, restored: dict[str, str]) -> None:
    _write(top / RESTORED, dict(sorted(restored.items(), key=lambda kv: int(kv[0]))))
