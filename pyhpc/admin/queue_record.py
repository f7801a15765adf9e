"""What ``pyhpc admin upgrade queue save`` keeps of each job, and the sbatch options that
reproduce it after Slurm's unsupported jump (docs/admin/upgrades.md).

A job is read from ``squeue --json`` (Slurm 22.05 prints the patterns sbatch was given,
never a job's text in another's fields) into a :class:`SavedJob`: its user, working
directory, batch script and one option per field in :data:`SBATCH`, the one table of
recorded names to sbatch options. Pure: no Slurm call, no file here.
"""
from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pyhpc.errors import PyhpcError
from pyhpc.slurm.rows import number, stamp

#: What save did with a job: held (pending before), requeued and held (a pyhpc train
#: job running at the deadline), or cancelled (another job running at the deadline).
FATES = ("held", "requeued", "cancelled")
#: Who held a job before save did: nobody, its user, an admin.
HOLDS = ("", "user", "admin")
#: squeue's reason for each hold.
HOLD_REASONS = {"JobHeldUser": "user", "JobHeldAdmin": "admin"}
#: Recorded name -> the sbatch option that reproduces it: the one table.
SBATCH = {
    "name": "--job-name", "partition": "--partition", "account": "--account", "qos": "--qos",
    "time": "--time", "time_min": "--time-min", "nodes": "--nodes", "ntasks": "--ntasks",
    "ntasks_per_node": "--ntasks-per-node", "cpus_per_task": "--cpus-per-task",
    "mem": "--mem", "mem_per_cpu": "--mem-per-cpu", "gres": "--gres", "gpus": "--gpus",
    "gpus_per_task": "--gpus-per-task", "cpus_per_gpu": "--cpus-per-gpu",
    "mem_per_gpu": "--mem-per-gpu", "constraint": "--constraint", "nodelist": "--nodelist",
    "exclude": "--exclude", "licenses": "--licenses", "output": "--output", "error": "--error",
    "input": "--input", "reservation": "--reservation", "comment": "--comment",
    "array": "--array", "wckey": "--wckey", "nice": "--nice", "begin": "--begin",
    "deadline": "--deadline", "exclusive": "--exclusive", "requeue": "--requeue",
}
#: squeue --json's string fields, as they are: recorded name -> key.
TEXT = {"name": "name", "partition": "partition", "account": "account", "qos": "qos",
        "constraint": "features", "nodelist": "required_nodes", "exclude": "excluded_nodes",
        "licenses": "licenses", "output": "standard_output", "error": "standard_error",
        "input": "standard_input", "reservation": "resv_name", "comment": "comment",
        "wckey": "wckey"}
#: Positive counts: recorded name -> key (Slurm's NO_VAL and INFINITE are no value).
COUNTS = {"ntasks": "tasks", "ntasks_per_node": "tasks_per_node",
          "cpus_per_task": "cpus_per_task", "mem": "memory_per_node",
          "mem_per_cpu": "memory_per_cpu", "time": "time_limit", "time_min": "time_minimum"}
#: Per-GPU and per-job TRES strings (``gres:gpu:2``): recorded name -> key.
TRES = {"gres": "tres_per_node", "gpus": "tres_per_job", "gpus_per_task": "tres_per_task",
        "cpus_per_gpu": "cpus_per_tres", "mem_per_gpu": "memory_per_tres"}
#: Below these, a number is a value; from them on it is NO_VAL / INFINITE of its width.
NO_VAL16, NO_VAL = 0xFFFE, 0xFFFFFFFE
#: 22.05's ``shared`` -> --exclusive's value ("" is plain --exclusive).
EXCLUSIVE = {"none": "", "user": "user", "mcs": "mcs"}
#: One dependency as squeue shows it: ``afterok:42_7+5(unfulfilled)``, ``singleton``.
DEPENDENCY = re.compile(r"(after\w*|singleton)(?::(\d+)(_\d+|_\*)?(\+\d+)?)?(?:\([a-z]+\))?")


class QueueError(PyhpcError):
    """The queue cannot be saved or restored, or its record is missing or not one pyhpc
    wrote; the message names the key or the file."""


@dataclass(frozen=True)
class SavedJob:
    """One job of the record: enough to submit it again as its user."""

    job_id: str
    user: str
    uid: int
    cwd: str
    submit: int
    fate: str
    script: str = ""
    options: dict[str, str] = field(default_factory=dict)
    dependency: str = ""
    held: str = ""
    #: pyhpc's submit folder of a job submitted through submitit (a function, pyhpc train,
    #: pyhpc bench): it comes back through ``pyhpc resubmit``, from its pickle.
    pyhpc_folder: str = ""
    pyhpc_kind: str = ""
    #: The environment sbatch stored with the job (NAME=value; sbatch's own SLURM_* left
    #: out: the new sbatch sets them), and the umask it ran with; empty: not read.
    environment: list[str] = field(default_factory=list)
    umask: str = ""


def _count(value: Any, limit: int = NO_VAL) -> int | None:
    """A positive count from squeue --json, or None (no value, NO_VAL, INFINITE)."""
    if isinstance(value, dict) and value.get("infinite"):
        return None
    try:
        n = number(value)
    except (TypeError, ValueError):
        return None
    return n if n is not None and 0 < n < limit else None


def _tres(text: str, gpus: bool) -> str:
    """``gres:gpu:2,gres:fpga:1`` -> ``gpu:2,fpga:1``; for the --gpus family, ``gpu:a100:2``
    -> ``a100:2``."""
    parts = [p.removeprefix("gres:").removeprefix("gres/") for p in text.split(",") if p]
    if gpus:
        parts = [p.removeprefix("gpu:") for p in parts]
    return ",".join(parts)


def options_of(job: Mapping[str, Any], now: float | None = None) -> dict[str, str]:
    """The sbatch options (names of :data:`SBATCH`) that reproduce one ``squeue --json``
    job: what it asked for, not what it was given. Memory only where the job set it
    (flag JOB_MEM_SET): else the partition's default applies again, as it did."""
    out: dict[str, str] = {}
    flags = job.get("flags")
    flags = flags if isinstance(flags, list) else []
    for name, key in TEXT.items():
        value = job.get(key)
        if isinstance(value, str) and value and value != "(null)":
            out[name] = value
    if out.get("input") == "/dev/null":
        del out["input"]
    for name, key in COUNTS.items():
        n = _count(job.get(key), NO_VAL16 if key in ("tasks_per_node", "cpus_per_task") else NO_VAL)
        if n is not None and (not name.startswith("mem") or "JOB_MEM_SET" in flags):
            out[name] = str(n)
    for name, key in TRES.items():
        value = job.get(key)
        if isinstance(value, str) and value:
            out[name] = _tres(value, name != "gres")
    # No maximum: the job gave no --nodes (Slurm worked the count out), unless it asked more
    # than one, which --nodes=MIN keeps (as MIN-MIN: the one change from the job it had).
    low, high = _count(job.get("node_count")), _count(job.get("max_nodes"))
    if low is not None and (high is not None or low > 1):
        out["nodes"] = f"{low}-{high}" if high is not None and high > low else str(low)
    nice = _count(job.get("nice"))
    if nice is not None and nice < 1 << 30:  # a user may only lower their priority
        out["nice"] = str(nice)
    shared = job.get("shared")
    if isinstance(shared, str) and shared in EXCLUSIVE:
        out["exclusive"] = EXCLUSIVE[shared]
    begin = _count(job.get("eligible_time"))  # a job's submit time, unless --begin is later
    if begin is not None and begin > (time.time() if now is None else now):
        out["begin"] = stamp(begin)
    deadline = _count(job.get("deadline"))
    if deadline is not None:
        out["deadline"] = stamp(deadline)
    if isinstance(job.get("requeue"), bool):
        out["requeue"] = "yes" if job["requeue"] else "no"
    pending = job.get("array_task_string")
    if isinstance(pending, str) and pending:
        throttle = _count(job.get("array_max_tasks"))
        out["array"] = pending + (f"%{throttle}" if throttle and "%" not in pending else "")
    return dict(sorted(out.items()))


def held_by(job: Mapping[str, Any]) -> str:
    """Who held a pending job: "" (nobody), "user" or "admin"."""
    return HOLD_REASONS.get(str(job.get("state_reason") or ""), "")


def dependency_of(job: Mapping[str, Any]) -> str:
    """The job's dependencies still to be met, as squeue shows them ("" for none)."""
    value = job.get("dependency")
    return value if isinstance(value, str) and value != "(null)" else ""


def remap(dependency: str, new_ids: Mapping[str, str]) -> tuple[str, list[str]]:
    """``dependency`` with each recorded job id replaced by its new id, without the
    states squeue appends; and the ids it names that ``new_ids`` lacks (their job was not
    resubmitted: the caller keeps the job held)."""
    items, missing = [], []
    for sep, item in re.findall(r"(^|[,?])([^,?]+)", dependency):
        match = DEPENDENCY.fullmatch(item.strip())
        if match is None:
            missing.append(item.strip())
            continue
        kind, old, task, delay = match.groups()
        if old is None:
            items.append(f"{sep}{kind}")
        elif old in new_ids:
            items.append(f"{sep}{kind}:{new_ids[old]}{task or ''}{delay or ''}")
        else:
            missing.append(old)
    return "".join(items).lstrip(",?"), missing


def sbatch_args(saved: SavedJob, dependency: str = "", hold: bool = False) -> list[str]:
    """sbatch's arguments for ``saved``: its options in :data:`SBATCH`'s order, its
    working directory, ``dependency`` (already remapped) and ``--hold``."""
    args = [f"--chdir={saved.cwd}"]
    for name, option in SBATCH.items():
        value = saved.options.get(name)
        if value is None:
            continue
        if name == "requeue":
            args.append("--requeue" if value == "yes" else "--no-requeue")
        elif name == "exclusive":
            args.append(f"--exclusive={value}" if value else "--exclusive")
        else:
            args.append(f"{option}={value}")
    if dependency:
        args.append(f"--dependency={dependency}")
    if hold:
        args.append("--hold")
    return args


def to_json(saved: SavedJob) -> dict[str, Any]:
    return asdict(saved)


def environment(entries: list[str]) -> tuple[list[str], str]:
    """A job's stored environment as the record keeps it: its entries without sbatch's own
    ``SLURM_*``, and the umask sbatch ran with (``SLURM_UMASK``; "" if none)."""
    umask = next((e.split("=", 1)[1] for e in entries if e.startswith("SLURM_UMASK=")), "")
    return ([e for e in entries if "=" in e and not e.startswith("SLURM_")],
            umask if re.fullmatch(r"0[0-7]{3}", umask) else "")


def from_json(data: Any, where: str) -> SavedJob:
    """A :class:`SavedJob` from its record file's JSON; one line where it is not one."""
    if not isinstance(data, dict) or set(data) != {f.name for f in fields(SavedJob)}:
        raise QueueError(f"record: {where} is not a pyhpc queue record (its fields differ)")
    for f in fields(SavedJob):
        value = data[f.name]
        kind = {"uid": int, "submit": int, "options": dict, "environment": list}.get(f.name, str)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise QueueError(f"record: {where}: {f.name} is not a {kind.__name__}; not a pyhpc "
                             "queue record")
    options = data["options"]
    if not set(options) <= set(SBATCH) or not all(isinstance(v, str) for v in options.values()):
        raise QueueError(f"record: {where}: options may name only "
                         f"{', '.join(SBATCH)}, each a string")
    if data["fate"] not in FATES or data["held"] not in HOLDS:
        raise QueueError(f"record: {where}: fate must be one of {', '.join(FATES)} and held "
                         "one of user, admin or empty")
    if not all(isinstance(v, str) and "=" in v and "\0" not in v for v in data["environment"]) \
            or not re.fullmatch(r"(0[0-7]{3})?", data["umask"]):
        raise QueueError(f"record: {where}: environment must be NAME=value strings and umask "
                         "an octal mode such as 0077")
    if not re.fullmatch(r"[0-9]{1,10}", data["job_id"]) or not data["cwd"].startswith("/"):
        raise QueueError(f"record: {where}: job_id is not a job id or cwd not an absolute path")
    return SavedJob(**data)
