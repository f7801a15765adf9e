"""``pyhpc admin upgrade queue save|restore``: the job queue across Slurm's unsupported
jump (22.05 -> 24.11), where the new slurmctld does not read the old StateSaveLocation.

save, as root on the controller: a maintenance reservation on every node, so no job
starts; every pending job recorded (script, user, directory, options) and held; running
jobs waited for until the deadline, then a pyhpc train job requeued and held (it resumes
from its checkpoint), any other cancelled, both recorded. restore: every recorded job
submitted again as its user (a job pyhpc submitted through submitit with ``pyhpc
resubmit``), dependencies remapped, user holds put back, the reservation removed. Both
may run again: save records a job once, restore submits a job once
(:mod:`pyhpc.admin.queue_store`). save also records the first job id no old job had
(slurmctld's next one, above every id in accounting): the deploy sets FirstJobId from it,
and restore refuses a slurmctld that started empty below it. docs/admin/upgrades.md says
what each step does.
"""
from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyhpc import files, paths
from pyhpc.admin import queue_store as store
from pyhpc.admin.queue_record import (
    NO_VAL,
    QueueError,
    SavedJob,
    dependency_of,
    environment,
    held_by,
    options_of,
    remap,
    sbatch_args,
)
from pyhpc.slurm import queue_control as ctl
from pyhpc.slurm import records, slurm
from pyhpc.slurm.rows import number

#: Seconds between two looks at the queue while running jobs are waited for.
POLL_S = 2.0
#: The longest deadline save takes.
DEADLINE_MAX_S = 7 * 86400
UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
#: States of a job that holds nodes: save waits for these to end.
RUNNING = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING")
#: Largest pyhpc job record read to tell a pyhpc train job.
RECORD_LIMIT = 64 * 1024


def deadline_seconds(text: str) -> int:
    """``90``, ``90s``, ``10m``, ``2h`` or ``1d`` in seconds, from 0 to 7 days."""
    match = re.fullmatch(r"([0-9]{1,7})([smhd]?)", text.strip()) if isinstance(text, str) else None
    seconds = int(match.group(1)) * UNIT_S[match.group(2)] if match else -1
    if not 0 <= seconds <= DEADLINE_MAX_S:
        raise QueueError(f"--deadline: {text[:20]!r} is not allowed; give seconds, or a number "
                         "and one unit of s, m, h, d, from 0 to 7d", "--deadline")
    return seconds


def _state(job: dict[str, Any]) -> str:
    value = job.get("job_state")
    return str(value[0] if isinstance(value, list) and value else value or "")


def _job_id(job: dict[str, Any]) -> str:
    return str(number(job.get("job_id")) or "")


def _label(job: dict[str, Any]) -> str:
    """The id scancel takes: a running array task's ``ARRAY_TASK`` (its raw id may be the
    array's own, and that cancels every task)."""
    array, task = number(job.get("array_job_id")), number(job.get("array_task_id"))
    return f"{array}_{task}" if array and task is not None and task < NO_VAL else _job_id(job)


def pyhpc_kind(job: dict[str, Any]) -> tuple[str, str]:
    """(kind, submit folder) of a job pyhpc submitted through submitit, from the record
    pyhpc kept in the user's folder (the job's output pattern names it: FOLDER/%j_0_log.out);
    ("", "") for any other job. The record counts only if it is a regular file of the job's
    owner (never through a link) naming this job and folder: a user can make only their own
    job look like one."""
    out = job.get("standard_output")
    job_id = _job_id(job)
    if not isinstance(out, str) or not out.startswith("/") or not job_id:
        return "", ""
    folder = os.path.dirname(out)
    fh, _ = files.try_open_regular(records.records_dir(folder) / f"{job_id}.json")
    if fh is None:
        return "", ""
    with fh:
        if os.fstat(fh.fileno()).st_uid != number(job.get("user_id")):
            return "", ""
        data = fh.read(RECORD_LIMIT + 1)
    try:
        record = json.loads(data)
    except ValueError:
        return "", ""
    if not isinstance(record, dict) or record.get("job_id") != job_id or \
            record.get("kind") not in records.CALL_KINDS or \
            folder not in (record.get("folder"), record.get("job_folder")):
        return "", ""
    return str(record["kind"]), str(record["folder"])


def _record(job: dict[str, Any], fate: str, state: Path) -> SavedJob:
    """One job of the queue as the record keeps it (its script and stored environment,
    from StateSaveLocation ``state``, read now)."""
    job_id = _job_id(job)
    kind, folder = pyhpc_kind(job)
    env, umask = environment(ctl.environment(job_id, state) or [])
    return SavedJob(job_id, str(job.get("user_name") or ""), number(job.get("user_id")) or 0,
                    str(job.get("current_working_directory") or "/"),
                    number(job.get("submit_time")) or 0, fate,
                    ctl.batch_script(job_id) if job.get("batch_flag") else "",
                    options_of(job), dependency_of(job), held_by(job), folder, kind, env, umask)


def _hold_pending(jobs: list[dict[str, Any]], saved: dict[str, SavedJob], top: Path,
                  state: Path) -> None:
    """Record each pending job not recorded yet, then hold it (an admin's hold: its user
    cannot release it during the upgrade)."""
    for job in jobs:
        job_id = _job_id(job)
        if _state(job) != "PENDING" or not job_id:
            continue
        if job_id not in saved:
            saved[job_id] = _record(job, "held", state)
            store.write_job(top, saved[job_id])
        if job.get("state_reason") != "JobHeldAdmin":
            ctl.hold(job_id)


def _at_deadline(jobs: list[dict[str, Any]], saved: dict[str, SavedJob], top: Path,
                 state: Path) -> None:
    """Each running job recorded, then requeued and held (pyhpc train) or cancelled."""
    for job in jobs:
        job_id = _job_id(job)
        if _state(job) not in ("RUNNING", "SUSPENDED") or job_id in saved:
            continue
        task = _label(job) != job_id
        saved[job_id] = _record(job, "cancelled", state)
        if saved[job_id].pyhpc_kind == "train" and not task:
            saved[job_id] = replace(saved[job_id], fate="requeued")
        store.write_job(top, saved[job_id])
        if saved[job_id].fate == "requeued":
            ctl.requeue_hold(job_id)
        else:
            slurm.cancel([_label(job)])


def _refresh(jobs: list[dict[str, Any]], saved: dict[str, SavedJob], top: Path) -> None:
    """After the running jobs: each held job's dependencies still to be met and submit
    time (a requeue gives a new one), as slurmctld has them now."""
    for job in jobs:
        old = saved.get(_job_id(job))
        if old is None or _state(job) != "PENDING":
            continue
        dep, submit = dependency_of(job), number(job.get("submit_time")) or 0
        if (dep, submit) != (old.dependency, old.submit):
            saved[old.job_id] = replace(old, dependency=dep, submit=submit)
            store.write_job(top, saved[old.job_id])


def above_accounting(state: dict[str, Any]) -> int:
    """The first job id above every id in accounting, at least the one an earlier run
    recorded. Where slurmdbd does not answer (being upgraded), an earlier run's stands;
    with none, one line and nothing changed."""
    earlier = int(state[store.FIRST_JOB_ID])
    conf = ctl.config()
    if conf.get("AccountingStorageType") == "accounting_storage/none":
        return earlier
    try:
        first = max(earlier, ctl.highest_accounted_id() + 1)
    except slurm.SlurmError as exc:
        if earlier:
            return earlier
        raise QueueError(f"accounting: {exc}; save needs the highest job id in accounting "
                         "once, so that new jobs start above it: run it while slurmdbd "
                         "answers", "accounting") from None
    # slurmctld's counter goes back to FirstJobId after MaxJobId: once it has, old jobs
    # hold ids up to the top, and no id is above all of them.
    top = conf.get("MaxJobId", "")
    if top.isdigit() and first >= int(top):
        raise QueueError(f"MaxJobId: accounting holds job ids up to {first - 1}, slurmctld's "
                         f"MaxJobId ({top}): its job ids have wrapped, and no id is above every "
                         "old job's; purge or archive the old job records (sacctmgr archive "
                         "dump), then save (nothing was changed)", "MaxJobId")
    return first


def job_ids(state: dict[str, Any]) -> dict[str, int]:
    """save.json's ids, with slurmctld's next job id now: the lowest id safe for the new
    slurmctld's jobs (FirstJobId), and that next id (restore tells by it whether
    slurmctld kept its state)."""
    next_id = ctl.config_number(ctl.config(), "NEXT_JOB_ID")
    return {store.FIRST_JOB_ID: max(state[store.FIRST_JOB_ID], next_id),
            "next_job_id": max(state["next_job_id"], next_id)}


def check_job_ids(state: dict[str, Any], conf: dict[str, str]) -> None:
    """Refused where slurmctld started without its state and below the recorded first
    job id: its new jobs would take ids old jobs have in accounting, in users' folders
    and in jobstats' files. A slurmctld that kept its state counts on from where save saw
    it, and passes: its FirstJobId below that, or the recorded id itself, which the deploy
    sets while the record is there (an upgrade rolled back before the controller moved)."""
    floor = state[store.FIRST_JOB_ID]
    next_id = ctl.config_number(conf, "NEXT_JOB_ID")
    first = ctl.config_number(conf, "FirstJobId")
    kept = next_id >= state["next_job_id"] and (state["next_job_id"] > first or first >= floor)
    if floor and next_id < floor and not kept:
        raise QueueError(f"FirstJobId: slurmctld's next job id is {next_id}, below {floor}, the "
                         f"first id no old job had; set FirstJobId={floor} in slurm.conf (the "
                         "deploy does, from this record) and restart slurmctld, then restore "
                         "(nothing was submitted)", "FirstJobId")


def save(deadline: str | None, where: Path = paths.UPGRADE_QUEUE,
         clock: Callable[[], float] = time.time,
         sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Empty the queue of running jobs by ``deadline`` (from now; None: the deadline an
    earlier run set) and record every job (see the module's docstring); returns the
    record's path, the reservation and the jobs."""
    seconds = None if deadline is None else deadline_seconds(deadline)
    store.check_root()
    if os.path.lexists(where / store.RESTORED):
        raise QueueError(f"record: {where} holds a queue restore brought back already; move it "
                         "aside (it is that upgrade's log), then save", "record")
    if seconds is None and not store.read_save(where)["deadline_at"]:
        raise QueueError("--deadline: required on the first save (how long running jobs may "
                         "go on: seconds, or a number and s, m, h or d, up to 7d)", "--deadline")
    accounted = above_accounting(store.read_save(where))
    top = store.make(where)
    state = store.read_save(top)
    state[store.FIRST_JOB_ID] = max(state[store.FIRST_JOB_ID], accounted)
    if ctl.blocked() and not state["reservation_made"]:
        raise QueueError(f"reservation: {ctl.RESERVATION} exists and this record did not make "
                         "it; pyhpc changes only what it made (delete it with scontrol "
                         "delete, or keep it and take it out of this name)", "reservation")
    began = clock()
    saved = store.read_jobs(top)
    state.update(saved=False, started_at=state["started_at"] or int(began),
                 deadline_at=state["deadline_at"] if seconds is None else int(began) + seconds)
    store.write_save(top, state)
    if ctl.block():
        state["reservation_made"] = True
        store.write_save(top, state)
    state_dir = ctl.state_dir()
    while True:
        jobs = ctl.jobs()
        _hold_pending(jobs, saved, top, state_dir)
        if not any(_state(j) in RUNNING for j in jobs):
            break
        if clock() >= state["deadline_at"]:
            _at_deadline(jobs, saved, top, state_dir)
        sleep(POLL_S)
    _refresh(jobs, saved, top)
    state.update(job_ids(state), saved=True)
    store.write_save(top, state)
    return {"record": str(top), "reservation": ctl.RESERVATION,
            "seconds": round(clock() - began, 1), "first_job_id": state[store.FIRST_JOB_ID],
            "jobs": [_row(s) for s in sorted(saved.values(), key=lambda s: int(s.job_id))]}


def _row(s: SavedJob, new: str | None = None, note: str = "") -> dict[str, Any]:
    row: dict[str, Any] = {"job_id": s.job_id, "user": s.user, "name": s.options.get("name", ""),
                           "fate": s.fate, "held": s.held}
    if new is not None or note:
        row.update(new_job_id=new, note=note)
    return row


def _still_there(s: SavedJob, job: dict[str, Any] | None) -> bool:
    """Whether slurmctld still holds the very job save held (no state was lost): the same
    id, user, name, directory and submit time, pending."""
    return job is not None and _state(job) == "PENDING" and (
        job.get("user_name"), job.get("name") or "", job.get("current_working_directory"),
        number(job.get("submit_time"))) == (s.user, s.options.get("name", ""), s.cwd, s.submit)


def _again(s: SavedJob, new_ids: dict[str, str]) -> tuple[str, str]:
    """Submit ``s`` again as its user; (new id, note)."""
    dep, missing = remap(s.dependency, new_ids)
    note = (f"held: its dependency on {', '.join(missing)} names a job not resubmitted"
            if missing else "")
    if s.pyhpc_folder:
        new = ctl.resubmit_as(s.user, s.job_id, s.pyhpc_folder)
        if dep:
            ctl.set_dependency(new, dep)
        if s.held == "user" or missing:
            ctl.user_hold(new)
    else:
        new = ctl.submit_as(s.user, s.script, sbatch_args(s, dep, s.held == "user" or
                                                          bool(missing)),
                            s.environment, s.umask)
    if s.held == "admin":
        ctl.hold(new)
    return new, note


def _back(s: SavedJob, live: dict[str, dict[str, Any]], restored: dict[str, str],
          top: Path) -> dict[str, Any]:
    """One recorded job brought back (or why not), recorded in restored.json at once."""
    if s.fate == "cancelled":
        return _row(s, None, "cancelled at save's deadline: not resubmitted")
    if s.job_id in restored:
        return _row(s, restored[s.job_id], "restored earlier")
    if not s.script and not s.pyhpc_folder:
        return _row(s, None, "an interactive job (salloc, srun): its user starts it again")
    if _still_there(s, live.get(s.job_id)):
        ctl.release(s.job_id)
        if s.held == "user":
            ctl.user_hold(s.job_id)
        elif s.held == "admin":
            ctl.hold(s.job_id)
        new, note = s.job_id, "kept: slurmctld still had it, released"
    else:
        new, note = _again(s, restored)
    restored[s.job_id] = new
    store.write_restored(top, restored)
    return _row(s, new, note)


def restore(where: Path = paths.UPGRADE_QUEUE,
            clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Bring every recorded job back (see the module's docstring); returns old -> new ids."""
    top = store.existing(where)
    state = store.read_save(top)
    saved = store.read_jobs(top)
    restored = store.read_restored(top)
    if not state["saved"]:
        raise QueueError("record: save did not finish (running jobs were still waited for); "
                         "run pyhpc admin upgrade queue save again first", "record")
    check_job_ids(state, ctl.config())
    began = clock()
    made = ctl.block()  # nothing starts until every job is back with its holds
    live = {_job_id(j): j for j in ctl.jobs()}
    rows = [_back(s, live, restored, top) for s in sorted(saved.values(), key=lambda s: int(s.job_id))]
    if made or state["reservation_made"]:
        ctl.unblock()
    return {"record": str(top), "seconds": round(clock() - began, 1), "jobs": rows,
            "restored": dict(restored)}


def text(done: dict[str, Any], restoring: bool = False) -> str:
    """The admin's table: one job a line, old -> new ids after a restore."""
    lines = []
    for r in done["jobs"]:
        held = f", held by its {r['held']}" if r["held"] else ""
        if restoring:
            lines.append(f"{r['job_id']} -> {r['new_job_id'] or '-'}\t{r['user']}\t{r['name']}"
                         + (f"\t{r['note']}" if r["note"] else ""))
        else:
            lines.append(f"{r['job_id']}\t{r['user']}\t{r['name']}\t{r['fate']}{held}")
    head = (f"restored {sum(1 for r in done['jobs'] if r['new_job_id'])} of "
            f"{len(done['jobs'])} recorded jobs in {done['seconds']} s; record {done['record']}"
            if restoring else
            f"saved {len(done['jobs'])} jobs in {done['seconds']} s into {done['record']}; no "
            f"job starts while reservation {done['reservation']} is there (restore removes it); "
            f"the new slurmctld's FirstJobId: {done['first_job_id']} (the deploy sets it)")
    return "\n".join([head, *lines])
