"""Time to first step: when each rank's process started and passed each point on its way to
its first optimizer step, and the phases between them.

Marks are wall-clock times (``time.time()``), so ranks on different hosts can be set side
by side (up to the hosts' clock skew); a phase's duration uses one host's clock. This
module imports neither torch nor any other pyhpc module: a bare torch script
(``benchmarks/ddp_hello.py``) records the same marks as :mod:`pyhpc.train.loop`.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

#: The phases from submission to the first step, each as the (from, to) marks that bound it.
#: ``submitted`` and ``job_start`` are the job's, the others each rank's own.
PHASES: dict[str, tuple[str, str]] = {
    "queue": ("submitted", "job_start"),
    "launch": ("job_start", "process_start"),
    "import": ("process_start", "imported"),          # the interpreter, torch, the program
    "rendezvous": ("imported", "rendezvous_done"),    # also options, run directory checks
    "first_step": ("rendezvous_done", "first_step"),  # data, model, DDP wrap, one step
}


@dataclass
class Marks:
    """When one process passed each point (``time.time()``); ``None``: not (yet) passed."""

    process_start: float | None = None
    imported: float | None = None
    rendezvous_done: float | None = None
    first_step: float | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Marks:
        """Marks from a gathered dict; keys that are not marks are ignored."""
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


def start_ticks(proc_pid_stat: str) -> int:
    """Field 22 of ``/proc/<pid>/stat``: the process's start, in clock ticks after boot.
    Fields are counted after the last ``)``: the command name (field 2) may hold spaces."""
    after_name = proc_pid_stat[proc_pid_stat.rindex(")") + 1:].split()
    return int(after_name[22 - 3])


def process_start(proc_pid_stat: str, ticks_per_s: int, booted_at: float) -> float:
    """The wall-clock time a process started, from its ``/proc/<pid>/stat`` text."""
    return booted_at + start_ticks(proc_pid_stat) / ticks_per_s


def booted_at() -> float:
    """The wall-clock time of boot, to the microsecond. ``btime`` in ``/proc/stat`` is
    whole seconds, truncated: up to a second early, as long as the phases it would time."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def this_process_start() -> float | None:
    """When this process started (to a clock tick, 10 ms); ``None`` without ``/proc``."""
    try:
        with open("/proc/self/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    return process_start(text, os.sysconf("SC_CLK_TCK"), booted_at())


def durations(marks: Marks, job_start: float | None = None,
              submitted: float | None = None) -> dict[str, float | None]:
    """Seconds in each phase of :data:`PHASES`, ``None`` where a bound is unknown, and
    ``in_process``: from the process's start to its first step."""
    known: dict[str, float | None] = {"submitted": submitted, "job_start": job_start,
                                      **asdict(marks)}
    out: dict[str, float | None] = {}
    for phase, (begin, end) in [*PHASES.items(), ("in_process", ("process_start", "first_step"))]:
        a, b = known[begin], known[end]
        out[phase] = None if a is None or b is None else b - a
    return out


def _seconds(value: str | None) -> float | None:
    """A Slurm time variable (seconds since the epoch), or ``None`` if unset or not one."""
    try:
        return float(value) if value else None
    except ValueError:
        return None


def report(ranks: Sequence[Mapping[str, Any]], env: Mapping[str, str]) -> dict[str, Any]:
    """``startup.json``: the job (id and start from Slurm's variables, when set) and, per
    rank (dicts with ``rank`` and ``marks``, any other keys kept), its marks and phase
    durations; ``slowest`` is each phase's longest over the ranks. Rank 0's rendezvous
    includes waiting for the slowest rank to get there. Slurm gives the job's start in
    whole seconds (``SLURM_JOB_START_TIME``, where the release sets it), so ``launch`` is
    good to a second; the queue wait needs the submit time, which only the accounting has
    (``sacct -o Submit``): :func:`durations` takes it."""
    job_start = _seconds(env.get("SLURM_JOB_START_TIME"))
    rows = [{**r, "seconds": durations(Marks.from_mapping(r["marks"]), job_start)}
            for r in sorted(ranks, key=lambda r: int(r["rank"]))]
    slowest: dict[str, float | None] = {}
    for phase in rows[0]["seconds"] if rows else ():
        values = [r["seconds"][phase] for r in rows if r["seconds"][phase] is not None]
        slowest[phase] = max(values) if values else None
    return {"job_id": env.get("SLURM_JOB_ID"), "job_start": job_start, "ranks": rows,
            "slowest": slowest}
