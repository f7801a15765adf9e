"""Watch many jobs without hammering Slurm: ONE squeue (or sacct) call per poll.

Watching polls ``squeue -t all``: slurmctld answers at once, knows every live job
and array task, and keeps finished jobs with their final state for MinJobAge
(300 s by default), far longer than a poll interval. sacct is for one-off queries
of older jobs: the accounting database lags, and array tasks appear in it only
when they start, so it can make an array look finished early.
Array jobs are watched by their array id; their state is the least finished of
their tasks' states until every task has finished.
"""
from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TextIO

Runner = Callable[..., subprocess.CompletedProcess[str]]

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY",
                      "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED",
                      "FINISHED"})
#: Not yet known to the accounting database (sacct lags sbatch by a moment).
UNKNOWN = "UNKNOWN"
SOURCES = ("sacct", "squeue")


class WatchError(RuntimeError):
    """Slurm could not be queried."""


def _command(job_ids: Sequence[str], source: str) -> list[str]:
    ids = ",".join(job_ids)
    if source == "sacct":
        # No -X: Slurm 22.05's sacct -X drops array tasks; step lines are skipped below.
        return ["sacct", "-n", "-P", "-o", "JobID,State", "-j", ids]
    if source == "squeue":
        return ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ids]
    raise WatchError(f"source: {source!r} is not allowed; allowed: {', '.join(SOURCES)}")


def _merge(states: list[str]) -> str:
    """One state for an array job from its tasks' states."""
    running = [s for s in states if s not in TERMINAL]
    if running:
        return "RUNNING" if "RUNNING" in running else running[0]
    bad = [s for s in states if s != "COMPLETED"]
    return bad[0] if bad else "COMPLETED"


def query(job_ids: Sequence[str], source: str = "sacct", runner: Runner | None = None,
          ) -> dict[str, str]:
    """States of ``job_ids`` from one Slurm call; ids Slurm does not know yet map to UNKNOWN.

    squeue forgets finished jobs after MinJobAge, so with ``source="squeue"`` a job it
    no longer knows is FINISHED (outcome unknown); :func:`watch` keeps the last state
    it saw instead.
    """
    if not job_ids:
        return {}
    proc = (runner or subprocess.run)(_command(job_ids, source), capture_output=True, text=True,
                                      check=False)
    if proc.returncode != 0 and not (source == "squeue" and "Invalid job id" in proc.stderr):
        raise WatchError(f"{source}: {proc.stderr.strip() or 'exit status ' + str(proc.returncode)}")
    per_job: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        if "|" not in line:
            continue
        jid, state = line.split("|", 1)
        if "." in jid:  # a job step (123.batch, 123.0): the job's own line has its state
            continue
        base = jid.split("_")[0].split("+")[0]
        per_job.setdefault(base, []).append(state.split()[0] if state.split() else UNKNOWN)
    out: dict[str, str] = {}
    for jid in job_ids:
        states = per_job.get(jid.split("_")[0])
        if states:
            out[jid] = _merge(states)
        else:
            out[jid] = "FINISHED" if source == "squeue" else UNKNOWN
    return out


def progress_line(states: dict[str, str], elapsed: float) -> str:
    """``[12s] 3/10 finished | COMPLETED 3 | PENDING 5 | RUNNING 2``"""
    counts = Counter(states.values())
    done = sum(n for s, n in counts.items() if s in TERMINAL)
    parts = " | ".join(f"{s} {n}" for s, n in sorted(counts.items()))
    return f"[{elapsed:4.0f}s] {done}/{len(states)} finished | {parts}"


def watch(job_ids: Sequence[str], interval_s: float = 2.0, timeout_s: float | None = None,
          source: str = "squeue", runner: Runner | None = None, quiet: bool = False,
          stream: TextIO | None = None) -> dict[str, str]:
    """Poll until every job has finished (or ``timeout_s``); returns the last states."""
    seen: dict[str, str] = {}
    stream = stream or sys.stderr
    tty = stream.isatty()
    start = time.monotonic()
    last = ""
    while True:
        states = query(job_ids, source, runner)
        # A job gone from squeue keeps the final state of the poll before.
        states = {j: seen.get(j, s) if s == "FINISHED" else s for j, s in states.items()}
        seen.update(states)
        line = progress_line(states, time.monotonic() - start)
        if not quiet and line.split("]", 1)[1] != last:
            stream.write(("\r" + line) if tty else (line + "\n"))
            stream.flush()
            last = line.split("]", 1)[1]
        if all(s in TERMINAL for s in states.values()):
            break
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            break
        time.sleep(interval_s)
    if not quiet and tty:
        stream.write("\n")
    return states
