"""Watch many jobs without hammering Slurm: ONE squeue (or sacct) call per poll.

Watching polls squeue: slurmctld answers at once, knows every live job and array
task, and keeps finished jobs with their final state for MinJobAge (300 s by
default, 60 s under ``tuning: high_throughput``), which a long --interval can
outlast. So a job or task that left squeue before it was seen finished (or was never
seen) is looked up in ONE sacct call for just those jobs; if sacct does not know it
either, it keeps its last state seen (FINISHED if never seen), and is FINISHED after
two polls in a row in neither, so a watch never hangs on it. sacct alone is for one-off
queries of older jobs: the accounting database lags, and array tasks appear in it only
when they start, so it can make an array look finished early. Progress counts array
tasks; a job's state is the least finished of its tasks' states until every task has
finished. A job Slurm says can never start (a time limit above the partition's, say)
stops the watch with that reason.
"""
from __future__ import annotations

import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TextIO

from pyhpc import validate
from pyhpc.errors import PyhpcError
from pyhpc.slurm import rows, slurm

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY",
                      "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED",
                      "FINISHED"})
#: Not yet known to the accounting database (sacct lags sbatch by a moment).
UNKNOWN = "UNKNOWN"
SOURCES = ("sacct", "squeue")
#: Seconds between polls: bounds for --interval.
INTERVAL_BOUNDS = (0.1, 3600.0)
#: --timeout of a wait, in seconds: 0 (one look) to 30 days.
TIMEOUT_BOUNDS = (0.0, 30 * 86400.0)
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
            ids = rows.task_ids(spec)
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


def _lost(old: dict[Key, str], new: set[Key]) -> bool:
    """Whether tasks last seen in states ``old`` left squeue unfinished, now it shows ``new``."""
    if not new:
        return not old or any(s not in TERMINAL for s in old.values())
    real = {k for k in old if not _in_range(k)}
    # Fewer tasks than before: some left a pending range, ran and left squeue unseen.
    return len(new | real) < len(old) or any(old[k] not in TERMINAL for k in real - new)


class Tracker:
    """The last known state of every job and array task seen while watching.

    squeue forgets finished jobs after MinJobAge: a job or task gone from it before it
    was seen finished gets its state from sacct, else keeps the last state seen (FINISHED
    after ABSENT_POLLS polls); a job never seen is UNKNOWN (sacct) or FINISHED (squeue).
    """

    def __init__(self, ids: Sequence[str], source: str) -> None:
        if source not in SOURCES:
            raise WatchError(f"source: {source!r} is not allowed; allowed: {', '.join(SOURCES)}")
        self.ids, self.source = list(ids), source
        self.unseen = "FINISHED" if source == "squeue" else UNKNOWN
        self.tasks: dict[Key, slurm.JobRow] = {}
        self.absent: Counter[Key] = Counter()

    def poll(self) -> None:
        """One squeue call, and one sacct call for the jobs that left it unfinished, if any."""
        if self.source == "sacct":
            self._update(slurm.accounting(self.ids))
            return
        rows = slurm.queue(self.ids)
        seen = {(r.job_id, r.task) for r in rows}
        gone = self._vanished(seen)
        found = self._final(gone, rows) if gone else []
        self._update(rows + found)
        self._settle(gone, seen | {(r.job_id, r.task) for r in found})

    def _update(self, rows: Sequence[slurm.JobRow]) -> None:
        keys, jobs = {(r.job_id, r.task) for r in rows}, {r.job_id for r in rows}
        for key in [k for k in self.tasks if _in_range(k) and k[0] in jobs and k not in keys]:
            del self.tasks[key]  # a pending range split into real tasks
        for row in rows:
            self.tasks[(row.job_id, row.task)] = row

    def _vanished(self, seen: set[Key]) -> list[str]:
        """Watched ids that left squeue, or some of whose tasks did, before seen finished."""
        old, new = _by_job(self.tasks), _by_job(seen)
        return [jid for jid in self.ids if _lost(
            {k: self.tasks[k].state for k in _pick(jid, old)}, set(_pick(jid, new)))]

    def _final(self, gone: Sequence[str], rows: Sequence[slurm.JobRow]) -> list[slurm.JobRow]:
        """sacct's rows for ``gone``, where squeue has nothing newer and no final state was seen."""
        try:
            found = slurm.accounting(gone)
        except slurm.SlurmError:
            return []  # accounting disabled or down: the states seen stand
        seen, live = {(r.job_id, r.task) for r in rows}, {r.job_id for r in rows}
        # Of a job still in squeue, only tasks: its pending range is squeue's, not sacct's.
        return [r for r in found if (r.job_id, r.task) not in seen
                and not (r.job_id in live and (r.task is None or _in_range((r.job_id, r.task))))
                and self._unfinished((r.job_id, r.task))]

    def _unfinished(self, key: Key) -> bool:
        return key not in self.tasks or self.tasks[key].state not in TERMINAL

    def _settle(self, gone: Sequence[str], known: set[Key]) -> None:
        """Jobs and tasks of ``gone`` in neither squeue nor sacct are FINISHED after a while."""
        index = _by_job(self.tasks)
        stale = {k for jid in gone for k in _pick(jid, index)
                 if k not in known and self._unfinished(k)}
        stale |= {_key(jid) for jid in gone if not _pick(jid, index)}  # never seen
        self.absent = Counter({k: self.absent[k] + 1 for k in stale})
        for key in [k for k, polls in self.absent.items() if polls >= ABSENT_POLLS]:
            self.tasks[key] = slurm.JobRow(*key, state="FINISHED")

    def _rows(self) -> list[list[slurm.JobRow]]:
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
            if r.state == "PENDING" and word and word.group() in slurm.NEVER_STARTS:
                task = f"_{r.task}" if r.task and "#" not in r.task else ""
                out[f"{r.job_id}{task}"] = r.reason
        return out


def query(ids: Sequence[str], source: str = "sacct") -> dict[str, str]:
    """States of ``ids`` from one Slurm call (UNKNOWN for ids Slurm does not know yet).

    With squeue, one sacct call more for ids that have left its queue unfinished.
    """
    tracker = Tracker(ids, source)
    tracker.poll()
    return tracker.states()


def progress_line(task_states: Sequence[str], elapsed: float, jobs: int) -> str:
    """``[  12s] 978/1000 tasks finished | COMPLETED 978 | PENDING 20 | RUNNING 2``"""
    counts = Counter(task_states)
    done = sum(n for s, n in counts.items() if s in TERMINAL)
    parts = " | ".join(f"{s} {n}" for s, n in sorted(counts.items()))
    unit = "tasks" if len(task_states) != jobs else ("job" if jobs == 1 else "jobs")
    return f"[{elapsed:5.0f}s] {done}/{len(task_states)} {unit} finished | {parts}"


def watch(ids: Sequence[str], interval_s: float = 2.0, timeout_s: float | None = None,
          source: str = "squeue", quiet: bool = False, stream: TextIO | None = None,
          fail_on_timeout: bool = False) -> dict[str, str]:
    """Poll until every job has finished; returns the last states.

    A job Slurm says can never start raises WatchError with its reason. After
    ``timeout_s`` the watch returns the states so far, or raises with
    ``fail_on_timeout``.
    """
    if timeout_s is not None:
        timeout_s = timeout(timeout_s)
    tracker = Tracker(ids, source)
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
            raise WatchError(f"job: {job} can never start ({reason}); change the request, "
                             f"or pyhpc cancel {job.split('_')[0]}", "job")
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            if fail_on_timeout:
                running = ", ".join(f"{j} {s}" for j, s in states.items() if s not in TERMINAL)
                raise WatchError(f"timeout: still not finished after {timeout_s:g} s: {running} "
                                 "(the jobs keep running)", "timeout")
            break
        time.sleep(interval_s)
    if not quiet and tty:
        stream.write("\n")
    return states
