"""``pyhpc resubmit JOB``: submit the same work again, from the job's record.

A script or template job is sbatch'ed again: the copy of its script kept when it was
submitted (content-addressed, checked against its SHA-256), with the same options
(worked out again from the recorded job spec, checked against today's cluster). A
submitit job (a function, ``pyhpc train``, ``pyhpc bench``) is submitted again from the
call submitit pickled in the job's own folder, with an executor built from the recorded
spec; the pickle is loaded only from a folder that passes the one directory check and
only if it is a file of this user's that nobody else can write: nothing is unpickled
from a place another user can write. Both run from the directory the job was submitted
from, so a training run finds its run directory, and resumes from its checkpoint.

Only a job that was LOST or failed to start is submitted again, unless forced: anything
else might run twice.
"""
from __future__ import annotations

import contextlib
import hashlib
import pickle
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from pyhpc import files, validate
from pyhpc.cluster import Cluster
from pyhpc.errors import PyhpcError
from pyhpc.slurm import jobspec, records, submit, watch
from pyhpc.slurm.jobspec import JobSpec, check

#: States after which a job is submitted again without --force.
AGAIN = ("LOST", "BOOT_FAIL")
#: Largest pickle loaded (submitit's call and its arguments).
PICKLE_LIMIT = 256 * 1024 * 1024


class ResubmitError(PyhpcError):
    """The job cannot, or may not, be submitted again; the message says why."""


def resubmit(job_id: str, folder: str | Path = submit.DEFAULT_FOLDER, force: bool = False,
             cluster: Cluster | None = None, reservation: str | None = None) -> dict[str, Any]:
    """Submit job ``job_id`` again from its record under ``folder``; returns the new job's
    id, the id it replaces and its kind. Refused (one line) for a job that is neither LOST
    nor failed to start, unless ``force``. ``note``: why no record of the new job was kept
    (its submit directory is no longer the user's alone). ``reservation``: the one to run
    in instead of the one the job asked for (none asked: the caller's one active one now)."""
    job_id = validate.name("job_id", job_id, "job_id", error=ResubmitError)
    if reservation is not None:
        reservation = jobspec.check_value("reservation", reservation)
    record = records.read(folder, job_id)
    if not force:
        state = watch.inspect([job_id], "sacct", {job_id: record["submitted"]})[0][job_id]
        if state not in AGAIN:
            raise ResubmitError(f"job: {job_id} is {state}, and pyhpc resubmits a job that was "
                                "LOST or failed to start (BOOT_FAIL); add --force to submit "
                                "it again all the same", "job")
    the_cluster = submit.cluster_or_default(cluster)
    cwd = Path(record["cwd"])
    if not cwd.is_dir():
        raise ResubmitError(f"job: {job_id} was submitted from {cwd}, which is no longer a "
                            "directory", "job")
    with contextlib.chdir(cwd):
        if record["kind"] in records.SCRIPT_KINDS:
            new, note = _script_again(record, the_cluster, reservation)
        else:
            new, note = _call_again(record, the_cluster, reservation)
    result = {"job_id": new, "replaces": job_id, "kind": record["kind"]}
    if note:
        result["note"] = note
    return result


def _spec(record: dict[str, Any]) -> JobSpec | None:
    """The recorded job spec, checked again by the caller; None for a template's."""
    spec = record.get("spec")
    if spec is None:
        return None
    known = {f.name for f in fields(JobSpec)}
    if not set(spec) <= known:
        raise ResubmitError(f"record: job {record['job_id']}'s spec has fields "
                            f"{', '.join(sorted(set(spec) - known))}, not job spec fields")
    return JobSpec(**spec)


def _script_again(record: dict[str, Any], cluster: Cluster,
                  reservation: str | None = None) -> tuple[str, str]:
    """sbatch the script kept at submission again, with the same options (``reservation``
    instead of the one asked for)."""
    script = Path(record["script"])
    data = files.read_owned(script, submit.SCRIPT_LIMIT, "script", private=False)
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise ResubmitError(f"script: {script} is no longer the script job {record['job_id']} "
                            "ran (its SHA-256 differs); submit it with pyhpc submit")
    spec = _spec(record)
    checked = check(spec, cluster) if spec else None
    only = set(record["only"]) if record.get("only") is not None else None
    options = [o for o in (jobspec.sbatch_args(checked, only) if checked else [])
               if not (reservation and o.startswith("--reservation="))]
    asked = reservation or (record.get("reservation") if checked is None else None)
    if isinstance(asked, str):
        options.append(f"--reservation={jobspec.check_value('reservation', asked)}")
    job_id, note = submit.sbatch_recorded(script, data, script.name.rsplit("-", 1)[0], options,
                                          cluster, {
        "kind": record["kind"], "template": record.get("template"),
        "spec": asdict(checked) if checked else None, "only": record.get("only"),
        "reservation": asked if checked is None else None, "replaces": record["job_id"]})
    return job_id, note


def _call_again(record: dict[str, Any], cluster: Cluster,
                reservation: str | None = None) -> tuple[str, str]:
    """Submit the call submitit pickled for the job again, with the recorded spec (and
    ``reservation`` instead of the one asked for)."""
    folder = files.safe_dir(record["job_folder"], arg="folder", writable=False)
    pickled = Path(record["pickle"])
    if pickled.parent != Path(record["job_folder"]) or not pickled.name.endswith("_submitted.pkl"):
        raise ResubmitError(f"record: {pickled} is not submitit's pickle in the job's folder "
                            f"{record['job_folder']}")
    data = files.read_owned(folder / pickled.name, PICKLE_LIMIT, "folder", private=False)
    delayed = pickle.loads(data)  # checked above: the user's own file in the user's own folder
    if type(delayed).__name__ != "DelayedSubmission":
        raise ResubmitError(f"folder: {pickled} holds no submitit call")
    spec = _spec(record)
    assert spec is not None  # records.check: a call's record has a spec
    if reservation is not None:
        spec = replace(spec, reservation=reservation)
    job = submit.submit_spec(delayed.function, check(spec, cluster), record["folder"], cluster,
                             delayed.args, delayed.kwargs, kind=record["kind"],
                             replaces=record["job_id"])
    return str(job.job_id), ""
