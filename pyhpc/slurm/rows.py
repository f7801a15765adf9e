"""What Slurm's query tools print, as rows: squeue's and sacct's JSON and text output, and
the times they print; hostlists and gres.conf's GPU files. Pure parsing:
:mod:`pyhpc.slurm.slurm` runs the commands.

Times in text output are local (``2026-11-25T16:18:54``, Slurm's standard format, which
:mod:`pyhpc.slurm.slurm` asks for with ``SLURM_TIME_FORMAT=standard``) and become epoch
seconds here; ``Unknown``, ``None`` and anything else unreadable become 0 (unknown).
"""
from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from typing import Any

#: Slurm's standard time format (``SLURM_TIME_FORMAT=standard``), in local time.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"


@dataclass(frozen=True)
class JobRow:
    """One job or array task as Slurm reports it. ``job_id`` is the array's id for tasks.
    ``submit``: the submit time in epoch seconds (0 = unknown); a requeued job gets a new
    one, and a new job that reuses an id has its own."""

    job_id: str
    task: str | None
    state: str
    reason: str = ""
    submit: int = 0


@dataclass(frozen=True)
class OpenRecord:
    """A job accounting holds open (no end), as ``sacct -a`` lists it for the doctor."""

    job: str  # sacct's JobID as printed: 42, 7_3, 7_[4-9]
    user: str
    account: str
    submit: int
    state: str

    @property
    def base(self) -> str:
        return self.job.split("_")[0]


@dataclass(frozen=True)
class JobView:
    """Who a job is and what it holds, as slurmctld says, read only from fields no job text
    can reach (:func:`job_views`, :func:`owner_rows`): its raw id, owner and account, per
    node its GRES GPU indices (the order of gres.conf) and CPUs, and its times (epoch, 0 =
    unknown)."""

    job_id: str
    user: str
    account: str
    gpu_index: dict[str, tuple[int, ...]] = field(default_factory=dict)
    cpus: dict[str, int] = field(default_factory=dict)
    uid: int | None = None
    start: int = 0
    end: int = 0


def epoch(text: str) -> int:
    """``2026-11-25T16:18:54`` (local time) as epoch seconds; 0 for anything else."""
    try:
        return int(time.mktime(time.strptime(text.strip(), TIME_FORMAT)))
    except (ValueError, OverflowError):
        return 0


def stamp(seconds: int) -> str:
    """Epoch seconds in Slurm's standard format, local time (``unknown`` for 0)."""
    return time.strftime(TIME_FORMAT, time.localtime(seconds)) if seconds > 0 else "unknown"


def number(value: Any) -> int | None:
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
        array = number(job.get("array_job_id"))
        task = number(job.get("array_task_id"))
        state, reason = _state(job.get("job_state")), str(job.get("state_reason") or "")
        submit = number(job.get("submit_time")) or 0
        pending = str(job.get("array_task_string") or "")
        if array and pending and task is None:
            rows += [JobRow(str(array), f"{pending}#{k}", state, reason, submit)
                     for k in range(task_count(pending))]
        elif array:
            rows.append(JobRow(str(array), str(task), state, reason, submit))
        else:
            rows.append(JobRow(str(job.get("job_id")), None, state, reason, submit))
    return rows


def sacct_rows(data: dict[str, Any]) -> list[JobRow]:
    """sacct --json's jobs (steps are nested inside, so each job is one row)."""
    rows: list[JobRow] = []
    for job in data.get("jobs", []):
        array = job.get("array") or {}
        array_id = number(array.get("job_id"))
        task = number(array.get("task_id"))
        state = job.get("state") or {}
        current, reason = _state(state.get("current")), str(state.get("reason") or "")
        times = job.get("time") or {}
        # Slurm's data parsers call it "submission" (22.05's dbv0.0.38, seen on the lab, and
        # later ones); "submit" is read too.
        submit = number(times.get("submission", times.get("submit"))) or 0
        if array_id and task is not None:
            rows.append(JobRow(str(array_id), str(task), current, reason, submit))
        else:
            rows.append(JobRow(str(job.get("job_id")), None, current, reason, submit))
    return rows


def text_rows(text: str) -> list[JobRow]:
    """``JobID|State[|Reason[|Submit]]`` lines of squeue -o / sacct -P; step lines are skipped."""
    rows: list[JobRow] = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 2 or "." in parts[0]:  # 123.batch, 123.0: the job's line has it
            continue
        jid, _, task = parts[0].split("+")[0].partition("_")
        state = parts[1].split()[0] if parts[1].split() else "UNKNOWN"
        # The submit time is the last field; a reason is never a time.
        submit = epoch(parts[-1]) if len(parts) > 3 else 0
        reason = "|".join(parts[2:-1] if len(parts) > 3 else parts[2:])
        if task.startswith("["):  # sacct's pending range 7_[2-999%4]
            spec = task.strip("[]")
            rows += [JobRow(jid, f"{spec}#{k}", state, reason, submit)
                     for k in range(task_count(spec))]
        else:
            rows.append(JobRow(jid, task or None, state, reason, submit))
    return rows


#: Accounting's states of a job that has not ended (``sacct -s``'s names).
OPEN_STATES = ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED")


def open_rows(text: str) -> list[OpenRecord]:
    """``JobID|User|Account|Submit|State|End`` lines of ``sacct -a -P``: the records with no
    end and an open state (sacct's ``-s`` also selects jobs that were in the state at some
    time in the window and have ended since); steps are skipped."""
    out: list[OpenRecord] = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 6 or "." in parts[0] or not parts[4].split():
            continue
        state = parts[4].split()[0]
        if state in OPEN_STATES and epoch(parts[5]) == 0:
            out.append(OpenRecord(parts[0], parts[1], parts[2], epoch(parts[3]), state))
    return out


# -- who a job is: never from the text its owner writes ------------------------------------
#
# A user sets a job's name, comment, work dir and output paths, and Slurm prints them
# unescaped: ``scontrol show job -o`` puts ``JobName=`` before ``UserId=`` and ``Comment=``
# after the per-node ``GRES=``, and a value may hold spaces, ``Key=`` and newlines, so no
# regex over its lines tells a real field from a forged one. What is read instead: squeue's
# JSON (``json.loads`` knows where a string ends), which both Slurm 22.05 (openapi/v0.0.38,
# the lab's) and 24.11 (data_parser/v0.0.42, Debian 13's) print with the per-node GRES
# indices; and, where one job's owner and times are enough, squeue's text in
# fixed columns of which no user sets any (so no value can hold the ``|`` or the newline).
# scontrol has no --json on 22.05.


def job_views(data: dict[str, Any]) -> list[JobView]:
    """``squeue --json``'s jobs, each with its GPU indices and CPUs per node."""
    out: list[JobView] = []
    for job in data.get("jobs", []):
        job_id, uid = number(job.get("job_id")), number(job.get("user_id"))
        if not job_id:
            continue
        allocated = _allocation(job.get("job_resources") or {})
        details = [str(d) for d in job.get("gres_detail") or []]
        out.append(JobView(
            str(job_id), str(job.get("user_name") or ""), str(job.get("account") or ""),
            {node: gpu_indices(details[i] if i < len(details) else "")
             for i, (node, _) in enumerate(allocated)},
            dict(allocated), uid, number(job.get("start_time")) or 0,
            number(job.get("end_time")) or 0))
    return out


def _allocation(res: dict[str, Any]) -> list[tuple[str, int]]:
    """(node, CPUs the job holds there) in the job's node order, the order of its
    ``gres_detail``. 24.11 counts the CPUs; 22.05 lists the cores, each worth the job's
    CPUs over its cores (threads per core; scontrol's CPU_IDs count the same)."""
    nodes = res.get("nodes")
    if isinstance(nodes, dict):  # data_parser (23.02 and later)
        return [(str(n.get("name")), number((n.get("cpus") or {}).get("count")) or 0)
                for n in nodes.get("allocation") or []]
    per_node = [(str(n.get("nodename")), sum(len(s.get("cores") or {}) for s in
                                             (n.get("sockets") or {}).values()))
                for n in res.get("allocated_nodes") or []]
    total = sum(c for _, c in per_node)
    cpus = number(res.get("allocated_cores", res.get("allocated_cpus"))) or total
    threads = cpus // total if total and cpus % total == 0 else 1
    return [(node, c * threads) for node, c in per_node]


def gpu_indices(detail: str) -> tuple[int, ...]:
    """The GPU indices of one node's GRES detail (``gpu:a100:2(IDX:0-1),gpu:1(IDX:3)``)."""
    return tuple(i for item in re.findall(r"gpu[^,(]*\(IDX:([0-9,-]+)\)", detail)
                 for i in _indices(item))


def _indices(spec: str) -> tuple[int, ...]:
    """``0-1,3`` -> (0, 1, 3)."""
    out: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            out += range(int(low), int(high or low) + 1)
    return tuple(out)


def output_files(data: dict[str, Any], job_id: str) -> list[str]:
    """Job ``job_id``'s (``42`` or a task's ``7_3``) output files in ``squeue --json``'s
    ``data`` as scontrol shows them: StdOut, then StdErr (the same path where stderr goes
    to stdout)."""
    expanded = "data_parser" in ((data.get("meta") or {}).get("plugin") or {})
    for job in data.get("jobs", []):
        array, task = number(job.get("array_job_id")), number(job.get("array_task_id"))
        if job_id not in (str(number(job.get("job_id"))), f"{array}_{task}"):
            continue
        out, err = str(job.get("standard_output") or ""), str(job.get("standard_error") or "")
        if expanded:  # 23.02's data parsers and later print what scontrol prints
            return [p for p in (out, err) if p]
        return [p for p in (_stdio(job, out), _stdio(job, err or out)) if p]
    return []


def _stdio(job: dict[str, Any], pattern: str) -> str:
    """22.05 prints the pattern sbatch got: expanded here as its scontrol does
    (``_fname_format`` and ``slurm_get_job_stdout`` in src/api/job_info.c)."""
    job_id, array = number(job.get("job_id")) or 0, number(job.get("array_job_id")) or 0
    task, work_dir = number(job.get("array_task_id")), str(job.get("current_working_directory"))
    if not pattern:
        if not job.get("batch_flag"):
            return ""
        return f"{work_dir}/slurm-{array}_{task}.out" if array else f"{work_dir}/slurm-{job_id}.out"
    path = (pattern.replace("%A", str(array if task is not None else job_id))
            .replace("%a", str(task if task is not None else NO_TASK)).replace("%j", str(job_id))
            .replace("%u", str(job.get("user_name") or "")).replace("%x", str(job.get("name"))))
    return path if path.startswith("/") else f"{work_dir}/{path}"


#: What 22.05's scontrol prints for ``%a`` of a job that is no array task (NO_VAL).
NO_TASK = 0xFFFFFFFE


#: squeue's columns for one job's owner and times: raw id, uid, user, account, start, end.
#: None of them is text a user sets.
OWNER_FORMAT = "%A|%U|%u|%a|%S|%e"


def owner_rows(text: str) -> list[JobView]:
    """Lines of :data:`OWNER_FORMAT` as views (no GPU or CPU detail)."""
    out: list[JobView] = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) == 6 and parts[0].isdigit() and parts[1].isdigit():
            out.append(JobView(parts[0], parts[2], parts[3], uid=int(parts[1]),
                               start=epoch(parts[4]), end=epoch(parts[5])))
    return out


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


@dataclass(frozen=True)
class Controller:
    """One slurmctld of ``SlurmctldHost`` as ``scontrol ping`` reports it: ``role`` is
    ``primary`` or ``backup`` (``backup2``..., Slurm's own words), ``up`` whether it
    answered."""

    role: str
    host: str
    up: bool


#: ``Slurmctld(primary) at ctl is UP``: 22.05's and 24.11's line, one per SlurmctldHost.
PING = re.compile(r"^Slurmctld\((primary|backup[0-9]*)\) at (\S+) is (UP|DOWN)\s*$")


def controllers(text: str) -> list[Controller]:
    """``scontrol ping``'s lines, in SlurmctldHost's order (the primary first); lines of any
    other form are left out."""
    found = (PING.match(line.strip()) for line in text.splitlines())
    return [Controller(m.group(1), m.group(2), m.group(3) == "UP") for m in found if m]


def in_charge(rows: list[Controller]) -> Controller | None:
    """The controller that schedules: the first that answers. A primary that answers has
    control (a returning primary takes it back from the backup before it answers), so a
    backup is in charge only while every controller before it is down."""
    return next((row for row in rows if row.up), None)
