"""Watch many jobs without hammering Slurm: ONE squeue (or sacct) call per poll.

Watching polls squeue: slurmctld answers at once, knows every live job and array
task, and keeps finished jobs with their final state for MinJobAge (300 s by
default, 60 s under ``tuning: high_throughput``), which a long --interval can
outlast. So a job or task that left squeue before it was seen finished (or was never
seen) is looked up in ONE sacct call for just those jobs; if sacct does not know it
either, it keeps its last state seen (UNKNOWN if never seen), and after two polls in a
row in neither it is FINISHED, or NOT_FOUND if it was never seen and accounting answered
(no job of that id exists, or it was lost with its records), so a watch never hangs on
it. The one-off query asks sacct, and squeue once for what sacct does not hold (a job
just submitted is in squeue before accounting has it). sacct alone is for one-off
queries of older jobs: the accounting database lags, and array tasks appear in it only
when they start, so it can make an array look finished early. Progress counts array
tasks; a job's state is the least finished of its tasks' states until every task has
finished. A job Slurm says can never start (a time limit above the partition's, say)
stops the watch with that reason.

Each job's run is followed by its submit time: squeue showing the id with another submit
time is either the same job run again (a requeue, which accounting shows as its next
record) or a new job that got the id after slurmctld lost ours. A job slurmctld lost
while accounting holds it open is LOST (:mod:`pyhpc.slurm.lost`): a terminal state and a
failure, so no watch waits forever for it; ``watch`` ends with one line saying so.
"""
from __future__ import annotations

import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TextIO

from pyhpc import validate
from pyhpc.errors import PyhpcError
from pyhpc.slurm import lost, refusals, slurm
from pyhpc.slurm.rows import JobRow, task_ids

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY",
                      "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED",
                      "FINISHED", "LOST", "NOT_FOUND"})
#: Not yet known to the accounting database (sacct lags sbatch by a moment).
UNKNOWN = "UNKNOWN"
SOURCES = ("sacct", "squeue")
#: Seconds between polls: bounds for --interval.
INTERVAL_BOUNDS = (0.1, 3600.0)
#: --timeout of a wait, in seconds: 0 (one look) to 30 days.
TIMEOUT_BOUNDS = (0.0, 30 * 86400.0)
#: The reason of a job slurmctld saved pending that its node had started when slurmctld
#: died: after the restart it is requeued and held until someone releases it (seen in
#: make bench-crash), so a watch would wait for it for ever.
HELD_AFTER_RESTART = "launch_failed_requeued_held"
#: Polls in a row a job or task left squeue unfinished and sacct does not know it: then FINISHED.
ABSENT_POLLS = 2
#: A job or array task in the tracker: (job id, task id, or None for a plain job).
Key = tuple[str, str | None]


class WatchError(PyhpcError):
    """Slurm could not be queried, or a watched job can never finish."""


def job_ids(values: Sequence[str], arg: str = "job_ids") -> list[str]:
    """Validated job ids (digits, or ARRAYID_TASK): never an option for a Slurm tool."""
    return [validate.name(arg, v, "job_id", error=WatchError) for v in values]


def interval(value: float, arg: str = "interval") -> float:
    return validate.number(arg, value, *INTERVAL_BOUNDS, error=WatchError)


def timeout(value: object, arg: str = "timeout") -> float:
    return validate.number(arg, value, *TIMEOUT_BOUNDS, error=WatchError)


def _merge(states: Sequence[str]) -> str:
    """One state for an array job from its tasks' states."""
    running = [s for s in states if s not in TERMINAL]
    if running:
        return "RUNNING" if "RUNNING" in running else running[0]
    bad = [s for s in states if s != "COMPLETED"]
    return bad[0] if bad else "COMPLETED"


def _key(job_id: str) -> Key:
    """``123`` is (123, None), ``123_4`` is (123, 4)."""
    base, _, task = job_id.partition("_")
    return base, task or None


def _by_job(keys: Iterable[Key]) -> dict[str, list[Key]]:
    """Keys grouped by job id: finding one job's keys scans only them. A task still in a
    pending range (``7_[2-5]``) is also found under its own id (``7_3``)."""
    out: dict[str, list[Key]] = {}
    for key in keys:
        out.setdefault(key[0], []).append(key)
        if _in_range(key):
            spec, _, k = str(key[1]).partition("#")
            ids = task_ids(spec)
            if k.isdigit() and int(k) < len(ids):
                out.setdefault(f"{key[0]}_{ids[int(k)]}", []).append(key)
    return out


def _pick(job_id: str, by_job: dict[str, list[Key]]) -> list[Key]:
    """The keys of ``job_id`` (a job, or one task such as ``123_4``) in ``by_job``."""
    base, task = _key(job_id)
    keys = by_job.get(base, [])
    if task is None:
        return keys
    return [k for k in keys if k[1] == task] or by_job.get(job_id, [])


def _in_range(key: Key) -> bool:
    """A task of a pending array range (``7_[2-5%2]``): its key is ``('7', '2-5%2#0')``."""
    return key[1] is not None and "#" in key[1]


def _left_unfinished(old: dict[Key, str], new: set[Key]) -> bool:
    """Whether tasks last seen in states ``old`` left squeue unfinished, now it shows ``new``."""
    if not new:
        return not old or any(s not in TERMINAL for s in old.values())
    real = {k for k in old if not _in_range(k)}
    # Fewer tasks than before: some left a pending range, ran and left squeue unseen.
    return len(new | real) < len(old) or any(old[k] not in TERMINAL for k in real - new)


def _keyed(rows: Iterable[JobRow]) -> set[Key]:
    return {(r.job_id, r.task) for r in rows}


class Tracker:
    """The last known state of every job and array task seen while watching.

    squeue forgets finished jobs after MinJobAge: a job or task gone from it before it
    was seen finished gets its state from sacct, else keeps the last state seen (FINISHED
    after ABSENT_POLLS polls); a job never seen is UNKNOWN, then NOT_FOUND once accounting
    answered without it for ABSENT_POLLS polls (FINISHED when accounting cannot answer).
    ``submitted``: job id -> the submit time pyhpc noted when it submitted the job (its
    job record), to tell its run from another job's that reuses the id.
    """

    def __init__(self, ids: Sequence[str], source: str,
                 submitted: Mapping[str, int] | None = None) -> None:
        if source not in SOURCES:
            raise WatchError(f"source: {source!r} is not allowed; allowed: {', '.join(SOURCES)}")
        self.ids, self.source = list(ids), source
        self.unseen = UNKNOWN  # until squeue or sacct shows it, or it is settled
        self.tasks: dict[Key, JobRow] = {}
        self.absent: Counter[Key] = Counter()
        self.first: dict[Key, int] = {}  # the submit time of the run followed
        self.hints = {_key(j)[0]: t for j, t in (submitted or {}).items() if t}
        self.lost: dict[Key, lost.Lost] = {}
        self.answered = False  # whether sacct answered this poll

    def poll(self) -> None:
        """One squeue call, and one sacct call for the jobs that left it unfinished (or that
        it shows with another submit time), if any; scontrol and sdiag only to tell LOST."""
        if self.source == "sacct":
            self._poll_accounting()
            return
        rows = slurm.queue(self.ids)
        moved = {(r.job_id, r.task): r for r in rows if self._moved(r)}
        rows = [r for r in rows if (r.job_id, r.task) not in moved]
        gone = self._vanished(_keyed(rows))
        gone += sorted({k[0] for k in moved} - set(gone))
        records = self._records(gone, quiet=True) if gone else {}
        back = [r for k, r in moved.items() if lost.is_ours(r, records.get(k))]
        self.first.update({(r.job_id, r.task): r.submit for r in back})  # run again
        rows += back
        found = self._final(records, rows)
        self._update(rows + found)
        self._judge({(r.job_id, r.task): r for r in found})
        self._settle(gone, _keyed(rows) | _keyed(found))

    def _poll_accounting(self) -> None:
        """One sacct call; one squeue call for the jobs it holds open and those it has no
        record of, if any: a job in neither is LOST if pyhpc noted submitting it, else
        NOT_FOUND (a job just submitted is in squeue before accounting has it)."""
        records = self._records(self.ids, quiet=False)
        open_ = {k: r for k, r in records.items()
                 if r.state in (*lost.OPEN, "REQUEUED") and r.submit}
        missing = {_key(j) for j in self.ids if not any(k[0] == _key(j)[0] for k in records)}
        ask = sorted({k[0] for k in open_} | {k[0] for k in missing})
        live = slurm.queue(ask) if ask else []
        known = {k for k, r in open_.items()
                 if any(q.job_id == k[0] and lost.is_ours(q, r) for q in live)}
        nowhere = {k for k in missing if not any(q.job_id == k[0] for q in live)}
        unrecorded = {k: JobRow(*k, state=lost.UNRECORDED, submit=self.hints[k[0]])
                      for k in nowhere if k[0] in self.hints}
        queued = [q for q in live if any(k[0] == q.job_id for k in missing)]  # not in sacct yet
        self._update(list(records.values()) + queued + [
            JobRow(*k, state=lost.NOT_FOUND) for k in nowhere if k[0] not in self.hints])
        self._judge({**{k: r for k, r in records.items() if k not in known}, **unrecorded})

    def _moved(self, row: JobRow) -> bool:
        """squeue shows the job's id with another submit time than the run followed."""
        first = self.first.get((row.job_id, row.task))
        return bool(first and row.submit and row.submit != first)

    def _records(self, ids: Sequence[str], quiet: bool) -> dict[Key, JobRow]:
        """sacct's record of the run followed, per job and task of ``ids`` (one call);
        ``quiet``: accounting disabled or down is no records, not an error."""
        try:
            found = slurm.accounting(ids)
        except slurm.SlurmError:
            if not quiet:
                raise
            self.answered = False  # no record is not "no record": nothing is UNRECORDED
            return {}
        self.answered = True
        runs: dict[Key, list[JobRow]] = {}
        for row in found:
            runs.setdefault((row.job_id, row.task), []).append(row)
        picked = {k: lost.incarnation(r, self.first.get(k) or self.hints.get(k[0]))
                  for k, r in runs.items()}
        return {k: r for k, r in picked.items() if r is not None}

    def _update(self, rows: Sequence[JobRow]) -> None:
        keys, jobs = _keyed(rows), {r.job_id for r in rows}
        for key in [k for k in self.tasks if _in_range(k) and k[0] in jobs and k not in keys]:
            del self.tasks[key]  # a pending range split into real tasks
        for row in rows:
            key = (row.job_id, row.task)
            if key not in self.lost:
                self.tasks[key] = row
            if row.submit and key not in self.first:
                self.first[key] = row.submit

    def _judge(self, records: Mapping[Key, JobRow]) -> None:
        """Which of accounting's ``records`` of runs slurmctld does not know are LOST."""
        found = {**lost.judge(records), **lost.closed(records)}
        for key, why in found.items():
            self.lost[key] = why
            self.tasks[key] = replace(records[key], state="LOST")

    def _vanished(self, seen: set[Key]) -> list[str]:
        """Watched ids that left squeue, or some of whose tasks did, before seen finished."""
        old, new = _by_job(self.tasks), _by_job(seen)
        return [jid for jid in self.ids if _left_unfinished(
            {k: self.tasks[k].state for k in _pick(jid, old)}, set(_pick(jid, new)))]

    def _final(self, records: Mapping[Key, JobRow], rows: Sequence[JobRow]) -> list[JobRow]:
        """sacct's ``records`` where squeue has nothing newer and no final state was seen."""
        seen, live = _keyed(rows), {r.job_id for r in rows}
        # Of a job still in squeue, only tasks: its pending range is squeue's, not sacct's.
        return [r for k, r in records.items() if k not in seen
                and not (r.job_id in live and (r.task is None or _in_range(k)))
                and self._unfinished(k)]

    def _unfinished(self, key: Key) -> bool:
        return key not in self.tasks or self.tasks[key].state not in TERMINAL

    def _settle(self, gone: Sequence[str], known: set[Key]) -> None:
        """Jobs and tasks of ``gone`` in neither squeue nor sacct are FINISHED after a while."""
        index = _by_job(self.tasks)
        stale = {k for jid in gone for k in _pick(jid, index)
                 if k not in known and self._unfinished(k)}
        stale |= {_key(jid) for jid in gone if not _pick(jid, index)}  # never seen
        # Accepted runs (seen, or noted by pyhpc) of which neither slurmctld nor accounting
        # knows anything: LOST when slurmctld restarted since (lost.judge), else FINISHED.
        noted = {k: self.first.get(k) or self.hints.get(k[0], 0) for k in stale} \
            if gone and self.answered else {}
        self._judge({k: JobRow(*k, state=lost.UNRECORDED, submit=t) for k, t in noted.items() if t})
        stale -= set(self.lost)
        self.absent = Counter({k: self.absent[k] + 1 for k in stale})
        for key in [k for k, polls in self.absent.items() if polls >= ABSENT_POLLS]:
            # Never seen, and accounting answered with no record: not a job Slurm knows.
            never = key not in self.tasks and not self.hints.get(key[0]) and self.answered
            self.tasks[key] = JobRow(*key, state=lost.NOT_FOUND if never else "FINISHED")

    def _rows(self) -> list[list[JobRow]]:
        """Each watched id's rows: a plain job's one, or its array tasks'."""
        index = _by_job(self.tasks)
        return [[self.tasks[k] for k in _pick(jid, index)] for jid in self.ids]

    def states(self) -> dict[str, str]:
        return {jid: _merge([r.state for r in rows]) if rows else self.unseen
                for jid, rows in zip(self.ids, self._rows(), strict=True)}

    def task_states(self) -> list[str]:
        """One state per task (a plain job is one task)."""
        per_id = self._rows()
        return [r.state for rows in per_id for r in rows] + [self.unseen for r in per_id if not r]

    def never_starts(self) -> dict[str, str]:
        """Jobs pending for a reason after which they can never start."""
        out: dict[str, str] = {}
        for r in self.tasks.values():
            word = re.match(r"\w*", r.reason)
            held = r.reason.replace(" ", "_").lower().startswith(HELD_AFTER_RESTART)
            if r.state == "PENDING" and (held or word and word.group() in slurm.NEVER_STARTS):
                task = f"_{r.task}" if r.task and "#" not in r.task else ""
                out[f"{r.job_id}{task}"] = r.reason
        return out


def query(ids: Sequence[str], source: str = "sacct") -> dict[str, str]:
    """States of ``ids`` from one Slurm call (UNKNOWN for ids Slurm does not know yet).

    With squeue, one sacct call more for ids that have left its queue unfinished; with
    sacct, one squeue call more for the jobs it holds open (LOST needs both).
    """
    tracker = Tracker(ids, source)
    tracker.poll()
    return tracker.states()


def inspect(ids: Sequence[str], source: str = "sacct", submitted: Mapping[str, int] | None = None,
            ) -> tuple[dict[str, str], lost.LostError | None]:
    """:func:`query`, and the one-line error naming the jobs that were LOST, if any."""
    tracker = Tracker(ids, source, submitted)
    tracker.poll()
    states = tracker.states()
    return states, lost.error(tracker.lost, states)


def progress_line(task_states: Sequence[str], elapsed: float, jobs: int) -> str:
    """``[  12s] 978/1000 tasks finished | COMPLETED 978 | PENDING 20 | RUNNING 2``"""
    counts = Counter(task_states)
    done = sum(n for s, n in counts.items() if s in TERMINAL)
    parts = " | ".join(f"{s} {n}" for s, n in sorted(counts.items()))
    unit = "tasks" if len(task_states) != jobs else ("job" if jobs == 1 else "jobs")
    return f"[{elapsed:5.0f}s] {done}/{len(task_states)} {unit} finished | {parts}"


def watch(ids: Sequence[str], interval_s: float = 2.0, timeout_s: float | None = None,
          source: str = "squeue", quiet: bool = False, stream: TextIO | None = None,
          fail_on_timeout: bool = False, submitted: Mapping[str, int] | None = None,
          ) -> dict[str, str]:
    """Poll until every job has finished; returns the last states.

    A job Slurm says can never start raises WatchError with its reason. After
    ``timeout_s`` the watch returns the states so far, or raises with
    ``fail_on_timeout``. ``submitted``: job id -> when pyhpc submitted it (a job the
    controller lost before the watch first saw it is then LOST, not FINISHED). At the end,
    a job that was LOST raises
    :class:`~pyhpc.slurm.lost.LostError` (one line; its ``states`` are the last states).
    """
    if timeout_s is not None:
        timeout_s = timeout(timeout_s)
    tracker = Tracker(ids, source, submitted)
    stream = stream or sys.stderr
    tty = stream.isatty()
    start = time.monotonic()
    last = ""
    while True:
        tracker.poll()
        states = tracker.states()
        line = progress_line(tracker.task_states(), time.monotonic() - start, len(ids))
        if not quiet and line.split("]", 1)[1] != last:
            stream.write(("\r" + line) if tty else (line + "\n"))
            stream.flush()
            last = line.split("]", 1)[1]
        if all(s in TERMINAL for s in states.values()):
            break
        stuck = tracker.never_starts()
        if stuck:
            job, reason = next(iter(sorted(stuck.items())))
            if reason.replace(" ", "_").lower().startswith(HELD_AFTER_RESTART):
                raise WatchError(f"job: {job} is held by Slurm ({reason}): slurmctld restarted "
                                 "while it started, and holds it until someone releases it; an "
                                 f"admin runs scontrol release {job.split('_')[0]}, or pyhpc "
                                 f"cancel {job.split('_')[0]}", "job")
            why = refusals.pending(reason) or "change the request"
            raise WatchError(f"job: {job} can never start ({reason}): {why}; or pyhpc "
                             f"cancel {job.split('_')[0]}", "job")
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            if fail_on_timeout:
                running = ", ".join(f"{j} {s}" for j, s in states.items() if s not in TERMINAL)
                raise WatchError(f"timeout: still not finished after {timeout_s:g} s: {running} "
                                 "(the jobs keep running)", "timeout")
            break
        time.sleep(interval_s)
    if not quiet and tty:
        stream.write("\n")
    failure = lost.error(tracker.lost, states)
    if failure is not None:
        raise failure
    return states
