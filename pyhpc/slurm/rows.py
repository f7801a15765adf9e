"""Slurm's answers read into rows: squeue's and sacct's jobs, from ``--json`` or from text.

Parsing only; nothing here runs a command (:mod:`pyhpc.slurm.slurm` runs them and hands
the output here), so every reader is a pure function the tests feed directly.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobRow:
    """One job or array task as Slurm reports it. ``job_id`` is the array's id for tasks."""

    job_id: str
    task: str | None
    state: str
    reason: str = ""


def _number(value: Any) -> int | None:
    """An integer from JSON that is either a number or ``{"set": .., "number": ..}``."""
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set", True) and "number" in value else None
    if isinstance(value, bool) or value is None:
        return None
    return int(value)


def _state(value: Any) -> str:
    """A state from JSON: ``"RUNNING"`` (v0.0.38) or ``["RUNNING", ...]`` (later)."""
    if isinstance(value, list):
        return str(value[0]) if value else "UNKNOWN"
    return str(value or "UNKNOWN")


def task_count(spec: str) -> int:
    """How many tasks an array expression such as ``2-999%4`` or ``1,3,5-7`` names."""
    return len(task_ids(spec))


@functools.lru_cache(maxsize=64)
def task_ids(spec: str) -> tuple[int, ...]:
    """The task ids an array expression names, in its order: ``1,3,5-7`` is 1, 3, 5, 6, 7."""
    ids: list[int] = []
    for part in spec.split("%")[0].split(","):
        lo, _, rest = part.partition("-")
        hi, _, step = rest.partition(":")
        if lo.isdigit() and (not hi or hi.isdigit()) and (not step or step.isdigit()):
            ids += range(int(lo), int(hi or lo) + 1, max(int(step or 1), 1))
    return tuple(ids)


def squeue_rows(data: dict[str, Any]) -> list[JobRow]:
    """squeue --json's jobs as rows; a pending array range is one row per task."""
    rows: list[JobRow] = []
    for job in data.get("jobs", []):
        array = _number(job.get("array_job_id"))
        task = _number(job.get("array_task_id"))
        state, reason = _state(job.get("job_state")), str(job.get("state_reason") or "")
        pending = str(job.get("array_task_string") or "")
        if array and pending and task is None:
            rows += [JobRow(str(array), f"{pending}#{k}", state, reason)
                     for k in range(task_count(pending))]
        elif array:
            rows.append(JobRow(str(array), str(task), state, reason))
        else:
            rows.append(JobRow(str(job.get("job_id")), None, state, reason))
    return rows


def sacct_rows(data: dict[str, Any]) -> list[JobRow]:
    """sacct --json's jobs (steps are nested inside, so each job is one row)."""
    rows: list[JobRow] = []
    for job in data.get("jobs", []):
        array = job.get("array") or {}
        array_id = _number(array.get("job_id"))
        task = _number(array.get("task_id"))
        state = job.get("state") or {}
        current, reason = _state(state.get("current")), str(state.get("reason") or "")
        if array_id and task is not None:
            rows.append(JobRow(str(array_id), str(task), current, reason))
        else:
            rows.append(JobRow(str(job.get("job_id")), None, current, reason))
    return rows


def text_rows(text: str) -> list[JobRow]:
    """``JobID|State[|Reason]`` lines of squeue -o / sacct -P; step lines are skipped."""
    rows: list[JobRow] = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 2 or "." in parts[0]:  # 123.batch, 123.0: the job's line has it
            continue
        jid, _, task = parts[0].split("+")[0].partition("_")
        state = parts[1].split()[0] if parts[1].split() else "UNKNOWN"
        reason = parts[2] if len(parts) > 2 else ""
        if task.startswith("["):  # sacct's pending range 7_[2-999%4]
            spec = task.strip("[]")
            rows += [JobRow(jid, f"{spec}#{k}", state, reason) for k in range(task_count(spec))]
        else:
            rows.append(JobRow(jid, task or None, state, reason))
    return rows




def hostlist(expression: str) -> list[str]:
    """A Slurm hostlist (``gpu[1-2],cpu1``, ``/dev/nvidia[0-3]``) expanded without running
    a command, by submitit's parser (the one pyhpc's jobs use); [] if it is not one."""
    from submitit.slurm.slurm import SlurmParseException, _parse_node_list

    try:
        return list(_parse_node_list(expression))
    except SlurmParseException:
        return []


def gres_gpu_files(node: str, gres_conf: str) -> list[str]:
    """The device files gres.conf's text gives ``node``'s ``Name=gpu`` lines (``File=``, keys
    in any case), in gres.conf's order: Slurm's GRES index IDX counts along this list."""
    out: list[str] = []
    for line in gres_conf.splitlines():
        fields = {k.lower(): v for k, v in re.findall(r"(\w+)=(\S+)", line.split("#", 1)[0])}
        listed = fields.get("file") or fields.get("files")
        if fields.get("name") != "gpu" or not listed:
            continue
        if "nodename" in fields and node not in hostlist(fields["nodename"]):
            continue
        out += hostlist(listed)
    return out
