"""Watch many jobs without hammering Slurm: ONE squeue (or sacct) call per poll.

Watching polls squeue: slurmctld answers at once, knows every live job and array
task, and keeps finished jobs with their final state for MinJobAge (300 s by
default), far longer than a poll interval. sacct is for one-off queries of older
jobs: the accounting database lags, and array tasks appear in it only when they
start, so it can make an array look finished early. Progress counts array tasks;
a job's state is the least finished of its tasks' states until every task has
finished. A job Slurm says can never start (a time limit above the partition's,
say) stops the watch with that reason.
"""
from __future__ import annotations

import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import TextIO

from pyhpc import slurm, validate
from pyhpc.errors import PyhpcError

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


class Tracker:
    """The last known state of every job and array task seen while watching.

    squeue forgets finished jobs after MinJobAge: a job or task gone from it keeps
    the last state seen; a job never seen is UNKNOWN (sacct) or FINISHED (squeue).
    """

    def __init__(self, ids: Sequence[str], source: str) -> None:
        if source not in SOURCES:
            raise WatchError(f"source: {source!r} is not allowed; allowed: {', '.join(SOURCES)}")
        self.ids, self.source = list(ids), source
        self.tasks: dict[tuple[str, str | None], slurm.JobRow] = {}

    def poll(self) -> None:
        rows = (slurm.queue if self.source == "squeue" else slurm.accounting)(self.ids)
        seen_now = {(r.job_id, r.task) for r in rows}
        for key in [k for k in self.tasks if k[1] is not None and "#" in k[1]]:
            if key[0] in {r.job_id for r in rows} and key not in seen_now:
                del self.tasks[key]  # a pending range split into real tasks
        for row in rows:
            self.tasks[(row.job_id, row.task)] = row

    def _rows(self, job_id: str) -> list[slurm.JobRow]:
        base = job_id.split("_")[0]
        task = job_id.partition("_")[2] or None
        return [r for (j, t), r in self.tasks.items() if j == base and (task is None or t == task)]

    def states(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for jid in self.ids:
            rows = self._rows(jid)
            if rows:
                out[jid] = _merge([r.state for r in rows])
            else:
                out[jid] = "FINISHED" if self.source == "squeue" else UNKNOWN
        return out

    def task_states(self) -> list[str]:
        """One state per task (a plain job is one task)."""
        states = [r.state for jid in self.ids for r in self._rows(jid)]
        return states + [s for s in self.states().values() if s in ("FINISHED", UNKNOWN)]

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
    """States of ``ids`` from one Slurm call (UNKNOWN for ids Slurm does not know yet)."""
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
