"""LOST: a job slurmctld accepted and then lost, while accounting still holds it open.

slurmctld saves its job state in batches (at most every 5 s, compiled in). If its host
dies in between, the jobs accepted since the last save are gone after the restart
("Purged files for defunct batch JobId=N"), while slurmdbd already has their submit and
start records: ``sacct`` shows them PENDING or RUNNING forever, and slurmctld, having
restored its id counter from the saved state, can give their ids to new jobs.

A job is LOST only when it cannot be a record that merely lags:

(a) slurmctld does not know the job, or knows a job of that id with another submit time
    than the run pyhpc follows (a new job that reuses the id);
(b) accounting's record of that run is open (PENDING, RUNNING or SUSPENDED), or accounting
    has no record of it at all while pyhpc knows it was accepted (the watch saw it, or
    pyhpc's job record says when it was submitted): slurmctld sends accounting a job's
    first record from memory too, so a crash right after a burst can take both (seen on
    the lab: SIGKILL 1.3 s after the burst left no record of the lost jobs);
(c) it was submitted before slurmctld's boot time (``scontrol show config``);
(d) slurmctld holds no accounting message still unsent (``sdiag``: DBD Agent queue
    size 0), so no end record is on its way.

(c) and (d) are asked, one call each, only when some job meets (a) and (b). Each user
sees only their own jobs under PrivateData=jobs, and nothing here needs more: boot time
and sdiag are every user's. A record an admin closed with ``pyhpc doctor --fix-runaway``
reads COMPLETED afterwards; the doctor's ledger of its owner's jobs
(:data:`pyhpc.paths.RUNAWAY_LEDGERS`, which only they and root can read) names it by id
and submit time, so it is still LOST here.
"""
from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyhpc import files, paths
from pyhpc.errors import PyhpcError
from pyhpc.slurm import slurm
from pyhpc.slurm.rows import JobRow, OpenRecord, stamp

#: A job or array task: (job id, task id, or None for a plain job).
Key = tuple[str, str | None]
#: Accounting's states of a run that has not ended and could be lost.
OPEN = ("PENDING", "RUNNING", "SUSPENDED")
#: A run pyhpc knows was accepted of which accounting has no record at all (its state in
#: a candidate for :func:`judge`; its submit time is the one pyhpc saw or noted).
UNRECORDED = "UNRECORDED"
#: A job id that neither slurmctld nor accounting knows, of a job pyhpc has no note of
#: (never submitted, or accepted and lost with its records before pyhpc saw it).
NOT_FOUND = "NOT_FOUND"
#: States in which accounting closes one run of a job that Slurm runs again (requeue,
#: preemption with requeue, a failed node with --requeue): the next record is the same job.
RERUN = ("REQUEUED", "PREEMPTED", "NODE_FAIL")
#: How far a submit time pyhpc noted itself (the job record's clock) may be from Slurm's.
SKEW_S = 120
#: Largest ledger read (about 100,000 fixed jobs).
LEDGER_LIMIT = 16 * 1024 * 1024


@dataclass(frozen=True)
class Lost:
    """Why a job is LOST: its run's submit time, the controller's boot time (0: unknown),
    and what accounting says; ``closed_at``: when an admin closed the record (0: unknown),
    None when nobody did."""

    job: str
    submit: int
    boot: int
    state: str
    closed_at: int | None = None


class LostError(PyhpcError):
    """A job was lost; ``states`` holds every watched job's last state."""

    def __init__(self, message: str, states: Mapping[str, str]) -> None:
        super().__init__(message, "job")
        self.states = dict(states)


def label(key: Key) -> str:
    """``42``, ``42_3``, or a pending range's ``7_[2-5]``."""
    job, task = key
    if task is None:
        return job
    return f"{job}_[{task.split('#')[0]}]" if "#" in task else f"{job}_{task}"


def incarnation(records: Sequence[JobRow], expected: int | None) -> JobRow | None:
    """Of one job's (or task's) accounting records, the run pyhpc follows: the record
    submitted at ``expected`` (the submit time first seen; nearest within SKEW_S), else
    the newest, then on through the runs a requeue started. None: no record of that run."""
    runs = sorted(records, key=lambda r: r.submit)
    if not runs:
        return None
    at = len(runs) - 1
    if expected and any(r.submit for r in runs):
        near = [i for i, r in enumerate(runs) if r.submit and abs(r.submit - expected) <= SKEW_S]
        if not near:
            return None
        at = min(near, key=lambda i: abs(runs[i].submit - expected))
    while runs[at].state in RERUN and at + 1 < len(runs):
        at += 1
    return runs[at]


def is_ours(row: JobRow, record: JobRow | None) -> bool:
    """Whether squeue's ``row`` is the run accounting's ``record`` describes: the same
    submit time (or one unknown), or a later run of a job whose record a requeue closed."""
    if record is None or not row.submit or not record.submit or row.submit == record.submit:
        return True
    return record.state in RERUN and row.submit > record.submit


def judge(candidates: Mapping[Key, JobRow]) -> dict[Key, Lost]:
    """Of runs that meet (a) and (b), the LOST ones: (c) and (d), one Slurm call each,
    made only when needed. A record without a submit time is never LOST."""
    # REQUEUED here is the newest run (incarnation moves past one a later run follows): a
    # job slurmctld lost between its requeue and its next run (seen in make bench-crash).
    waiting = {k: r for k, r in candidates.items()
               if r.state in (*OPEN, "REQUEUED", UNRECORDED) and r.submit > 0}
    if not waiting:
        return {}
    try:
        boot = slurm.boot_time()
    except slurm.SlurmError:
        return {}  # the controller does not answer now: ask again at the next poll
    before = {k: r for k, r in waiting.items() if r.submit < boot}
    if not before or slurm.agent_queue() != 0:
        return {}
    return {k: Lost(label(k), r.submit, boot, r.state) for k, r in before.items()}


def ledger_path(uid: int | None) -> Path:
    """The ledger of the jobs of user ``uid`` (None: a user this host does not know)."""
    return paths.RUNAWAY_LEDGERS / f"{'unknown' if uid is None else uid}.jsonl"


def ledger_files(uid: int | None = None) -> list[Path]:
    """The ledgers user ``uid`` (default: this user) reads: their own; root reads every
    user's."""
    uid = os.geteuid() if uid is None else uid
    if uid != 0:
        return [ledger_path(uid)]
    try:
        names = sorted(os.listdir(paths.RUNAWAY_LEDGERS))
    except OSError:
        return []
    return [paths.RUNAWAY_LEDGERS / n for n in names if n.endswith(".jsonl")]


def ledger(uid: int | None = None) -> dict[tuple[str, int], dict[str, Any]]:
    """The doctor's ledger rows user ``uid`` (default: this user) reads, by (job id, submit
    time); a ledger is read only if it is a regular file of root's (or this user's) that
    nobody else can write (a missing one, or any other, counts as empty)."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for path in ledger_files(uid):
        out.update(ledger_rows(path))
    return out


def ledger_rows(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The rows of one ledger (see :func:`ledger`)."""
    fh, _ = files.try_open_regular(path)
    if fh is None:
        return {}
    with fh:
        info = os.fstat(fh.fileno())
        if info.st_uid not in (0, os.geteuid()) or stat.S_IMODE(info.st_mode) & 0o022:
            return {}
        data = fh.read(LEDGER_LIMIT)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for line in data.decode(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("submit"), int):
            out[(str(entry.get("job", "")).split("_")[0], entry["submit"])] = entry
    return out


def closed(records: Mapping[Key, JobRow]) -> dict[Key, Lost]:
    """Records accounting calls COMPLETED that the doctor's ledger lists as closed runaway
    records (same job id, same submit time): LOST. The ledger is read only if needed."""
    done = {k: r for k, r in records.items() if r.state == "COMPLETED" and r.submit > 0}
    entries = ledger() if done else {}
    out = {}
    for key, row in done.items():
        entry = entries.get((key[0], row.submit))
        if entry is not None:
            out[key] = Lost(label(key), row.submit, _int(entry.get("boot")), "COMPLETED",
                            _int(entry.get("fixed_at")))
    return out


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def ledger_line(record: OpenRecord, boot: int, now: float | None = None) -> str:
    """One ledger line for a record the doctor is about to close."""
    return json.dumps({"job": record.job, "user": record.user, "submit": record.submit,
                       "boot": boot, "fixed_at": int(time.time() if now is None else now)},
                      sort_keys=True) + "\n"


def message(lost: Iterable[Lost]) -> str:
    """One line: which job, that slurmctld restarted before saving it, and what to do."""
    items = sorted(lost, key=lambda x: (len(x.job), x.job))
    first = items[0]
    base = first.job.split("_")[0]
    restarted = f" at {stamp(first.boot)}" if first.boot else ""
    if first.state == UNRECORDED:
        said = "accounting has no record of it either"
    elif first.closed_at is None:
        said = f"accounting still says {first.state}, but it will never run or end"
    else:
        said = "an admin closed its accounting record" + (
            f" at {stamp(first.closed_at)}" if first.closed_at else "")
    more = f" (and {len(items) - 1} more: {', '.join(x.job for x in items[1:6])}" \
           f"{', ...' if len(items) > 6 else ''})" if len(items) > 1 else ""
    return (f"job: {first.job} was lost: slurmctld restarted{restarted} before it saved the "
            f"job, submitted {stamp(first.submit)} ({said}){more}; submit it again with: "
            f"pyhpc resubmit {base}")


def not_found(ids: Sequence[str]) -> str:
    """One line for job ids that neither slurmctld nor accounting knows: no proof that they
    were ever accepted, so not LOST, but not finished either."""
    try:
        boot = slurm.boot_time()
    except slurm.SlurmError:
        boot = 0
    since = f" (it restarted at {stamp(boot)})" if boot else ""
    more = f" (and {len(ids) - 1} more: {', '.join(ids[1:6])}{', ...' if len(ids) > 6 else ''})" \
        if len(ids) > 1 else ""
    return (f"job: {ids[0]} is known neither to slurmctld nor to accounting{more}: not a job "
            f"id of this cluster, or a job accepted just before slurmctld lost its state{since} "
            "and lost with its records; submit it again")


def error(lost: Mapping[Key, Lost], states: Mapping[str, str]) -> LostError | None:
    """The one-line error for the jobs in ``lost``, else for the ones nobody knows
    (NOT_FOUND), or None when every job was found."""
    if lost:
        return LostError(message(lost.values()), states)
    unknown = sorted((j for j, s in states.items() if s == NOT_FOUND), key=lambda j: (len(j), j))
    return LostError(not_found(unknown), states) if unknown else None
