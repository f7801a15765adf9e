"""What pyhpc keeps of each job it submits, so that ``pyhpc resubmit`` can submit the same
work again: one private record per job, ``<folder>/records/<job id>.json`` (0600), in a
directory that passed the one directory check (:func:`pyhpc.files.make_dir`).

A record holds the kind of job, its id, when pyhpc submitted it (this host's clock: it
tells the job's run from a later job that reuses the id), the directory it was
submitted from, and what it takes to submit it again: the checked job spec's fields,
and the script (content-addressed in ``pyhpc-jobs/scripts``, with its SHA-256) or, for a
submitit job, the job's own folder, which holds submitit's ``<id>_submitted.pkl``. A
record is read back only if it is a regular file of this user's that nobody else can
read or write.
"""
from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyhpc import files, validate
from pyhpc.errors import PyhpcError

#: The folder, under the submit folder, that holds the records.
RECORDS = "records"
#: Jobs submitted as a script with sbatch, and through submitit.
SCRIPT_KINDS = ("template", "script")
CALL_KINDS = ("function", "train", "bench")
#: Largest record read back.
LIMIT = 64 * 1024
#: Parts of a submitit folder that Slurm or submitit fill in per job.
JOB_TAGS = ("%j", "%t", "%A", "%a")


class RecordError(PyhpcError):
    """A job record is missing, not ours, not private, or not a pyhpc job record."""


def fixed_part(folder: str | Path) -> Path:
    """The part of a submit folder before its first per-job tag (``pyhpc-jobs/%j``:
    ``pyhpc-jobs``)."""
    parts = Path(folder).parts
    fixed = list(itertools.takewhile(lambda p: not any(t in p for t in JOB_TAGS), parts))
    return Path(*fixed) if fixed else Path(".")


def records_dir(folder: str | Path) -> Path:
    return fixed_part(folder) / RECORDS


def prepare(folder: str | Path) -> Path:
    """The records folder, created private (before a submission: a folder pyhpc may not
    write stops it before anything reaches Slurm)."""
    return files.make_dir(records_dir(folder), arg="folder")


def write(folder: str | Path, record: Mapping[str, Any]) -> Path:
    """Write ``record`` (kind, job_id, submitted, cwd and what its kind needs) as
    ``records/<job_id>.json``, 0600 whatever --group-readable says."""
    job_id = validate.name("job_id", record["job_id"], "job_id", error=RecordError)
    path = prepare(folder) / f"{job_id}.json"
    files.write_text(path, json.dumps(dict(record), indent=1, sort_keys=True) + "\n", "folder",
                     mode=0o600)
    return path


def read(folder: str | Path, job_id: str) -> dict[str, Any]:
    """The record of ``job_id`` under ``folder``, checked; one :class:`RecordError` line
    when there is none or it is not one pyhpc wrote for this user."""
    where = files.safe_dir(records_dir(folder), arg="folder", writable=False)
    path = where / f"{job_id}.json"
    if not os.path.lexists(path):
        raise RecordError(f"job: no record of job {job_id} in {where} (pyhpc keeps one for "
                          "each job it submits; --folder names the submit folder it used)", "job")
    try:
        record = json.loads(files.read_owned(path, LIMIT, "record"))
    except ValueError:
        raise RecordError(f"record: {path} is not JSON; not a pyhpc job record") from None
    return check(record, job_id, path)


def _text(record: Mapping[str, Any], key: str, path: Path, absolute: bool = False) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value or (absolute and not os.path.isabs(value)):
        what = "an absolute path" if absolute else "a string"
        raise RecordError(f"record: {path}: {key} is not {what}; not a pyhpc job record")
    return value


def check(record: Any, job_id: str, path: Path) -> dict[str, Any]:
    """``record`` if it has the fields its kind needs, of the right types."""
    if not isinstance(record, dict):
        raise RecordError(f"record: {path} is not a pyhpc job record")
    kind = record.get("kind")
    if kind not in SCRIPT_KINDS + CALL_KINDS:
        raise RecordError(f"record: {path}: kind {kind!r} is not allowed; allowed: "
                          f"{', '.join(SCRIPT_KINDS + CALL_KINDS)}")
    if record.get("job_id") != job_id:
        raise RecordError(f"record: {path} is the record of job {record.get('job_id')!r}, "
                          f"not of {job_id}")
    submitted = record.get("submitted")
    if not isinstance(submitted, int) or isinstance(submitted, bool) or submitted < 0:
        raise RecordError(f"record: {path}: submitted is not a time; not a pyhpc job record")
    _text(record, "cwd", path, absolute=True)
    spec = record.get("spec")
    if not (spec is None and kind in SCRIPT_KINDS) and not isinstance(spec, dict):
        raise RecordError(f"record: {path}: spec is not a job spec; not a pyhpc job record")
    if kind in SCRIPT_KINDS:
        _text(record, "script", path, absolute=True)
        _text(record, "sha256", path)
        only = record.get("only")
        if only is not None and not (isinstance(only, list) and all(isinstance(o, str)
                                                                     for o in only)):
            raise RecordError(f"record: {path}: only is not a list of fields")
    else:
        for key in ("folder", "job_folder", "pickle"):
            _text(record, key, path, absolute=True)
    return record


def noted(folder: str | Path, ids: Sequence[str]) -> dict[str, int]:
    """When pyhpc submitted each of ``ids``, from their records under ``folder`` where
    there are readable ones of this user's (the others are left out, silently: this
    only helps to tell a lost job from one never submitted)."""
    out: dict[str, int] = {}
    for job_id in ids:
        try:
            out[job_id] = read(folder, job_id.split("_")[0])["submitted"]
        except PyhpcError:
            continue
    return out
