"""The cluster's state read from one answer of each Slurm command: pure parsers.

:mod:`pyhpc.monitor.slurm_exporter` runs squeue, ``scontrol show node``, sdiag and sacct
once a scrape (through :mod:`pyhpc.slurm.slurm`) and hands their output here, so every
figure the exporter shows can be tested from a fixed text.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from pyhpc.slurm import slurm

#: Node states that take a node out of service (the alert fires on these).
UNAVAILABLE = ("down", "drained", "draining", "fail", "failing")


@dataclass(frozen=True)
class NodeState:
    """One node as the exporter shows it: sinfo's long state name and the admin's reason."""

    node: str
    state: str
    reason: str
    gpus: int
    gpus_allocated: int
    cpus: int = 0
    cpus_allocated: int = 0

    @property
    def available(self) -> bool:
        """False for a node out of service (its free CPUs are sinfo's "other")."""
        return self.state not in UNAVAILABLE


@dataclass(frozen=True)
class JobKey:
    """What jobs are counted by: a row of ``pyhpc_slurm_jobs``."""

    state: str
    partition: str
    account: str
    user: str


def long_state(scontrol_state: str) -> str:
    """sinfo's long name for scontrol's ``State=`` (``IDLE+DRAIN`` is ``drained``,
    ``MIXED+DRAIN`` ``draining``, ``DOWN*`` ``down``: ``*`` only says it does not answer)."""
    base, *flags = scontrol_state.lower().replace("*", "").split("+")
    busy = base in ("allocated", "mixed", "completing")
    if base in ("down", "future", "unknown"):
        return base or "unknown"
    if "fail" in flags:
        return "failing" if busy else "fail"
    if "drain" in flags:
        return "draining" if busy else "drained"
    for flag in ("maint", "reserved", "powered_down", "powering_down", "powering_up",
                 "reboot_issued", "reboot_requested", "completing", "planned"):
        if flag in flags:
            return flag
    return base or "unknown"


def tres_count(tres: str, name: str = "gres/gpu") -> int:
    """The count of ``name`` in a TRES list (``cpu=2,mem=2G,gres/gpu=4``; typed entries such
    as ``gres/gpu:a100=4`` are the same GPUs again and are not added), 0 if absent."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == name and value.isdigit():
            return int(value)
    return 0


def nodes(info: dict[str, dict[str, str]]) -> list[NodeState]:
    """Every node of ``scontrol show node -o`` (:func:`pyhpc.slurm.slurm.node_info`)."""
    out = []
    for name, fields in sorted(info.items()):
        reason = fields.get("Reason", "")
        reason = slurm.reason_text(reason) if reason not in ("", "(null)", "none") else ""
        cfg, alloc = fields.get("CfgTRES", ""), fields.get("AllocTRES", "")
        out.append(NodeState(name, long_state(fields.get("State", "")), reason,
                             tres_count(cfg), tres_count(alloc), tres_count(cfg, "cpu"),
                             tres_count(alloc, "cpu")))
    return out


@dataclass(frozen=True)
class Queue:
    """squeue's answer, counted: jobs by state, partition, account and user; pending jobs
    by partition and reason; the raw ids of running jobs (for runaways)."""

    jobs: Counter[JobKey]
    pending: Counter[tuple[str, str]]
    running: frozenset[str]


def queue(text: str) -> Queue:
    """Lines of :data:`pyhpc.slurm.slurm.QUEUE_FORMAT` counted (states lower-case, as in
    sinfo; a pending array task is one job, as Slurm counts it once it runs)."""
    jobs: Counter[JobKey] = Counter()
    pending: Counter[tuple[str, str]] = Counter()
    running: set[str] = set()
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 6 or not parts[0].isdigit():
            continue
        raw, state, partition, account, user, reason = parts
        state = state.lower()
        jobs[JobKey(state, partition, account, user)] += 1
        if state == "pending":
            pending[(partition, reason)] += 1
        elif state == "running":
            running.add(raw)
    return Queue(jobs, pending, frozenset(running))


def runaways(in_accounting: str, queued: Queue) -> int:
    """Jobs the accounting database holds as running that slurmctld does not list as
    running (``sacctmgr show runawayjobs``' definition, from the scrape's own squeue:
    no extra call). A job that starts or ends between the two calls counts for one
    scrape; the alert waits for it to last."""
    ids = {line.strip() for line in in_accounting.splitlines() if line.strip().isdigit()}
    return len(ids - queued.running)


#: sdiag lines the exporter keeps: (section, label in sdiag) -> (metric, scale).
#: prometheus-slurm-exporter's names first, its units (cycle times in microseconds, as
#: sdiag prints them); then those it has none for, pyhpc's, cycle times in seconds.
SDIAG: dict[tuple[str, str], tuple[str, float]] = {
    ("", "Server thread count"): ("slurm_scheduler_threads", 1.0),
    ("", "Agent queue size"): ("slurm_scheduler_queue_size", 1.0),
    ("", "DBD Agent queue size"): ("slurm_scheduler_dbd_queue_size", 1.0),
    ("main", "Last cycle"): ("slurm_scheduler_last_cycle", 1.0),
    ("main", "Mean cycle"): ("slurm_scheduler_mean_cycle", 1.0),
    ("main", "Cycles per minute"): ("slurm_scheduler_cycle_per_minute", 1.0),
    ("backfill", "Last cycle"): ("slurm_scheduler_backfill_last_cycle", 1.0),
    ("backfill", "Mean cycle"): ("slurm_scheduler_backfill_mean_cycle", 1.0),
    ("backfill", "Depth Mean"): ("slurm_scheduler_backfill_depth_mean", 1.0),
    ("backfill", "Total backfilled jobs (since last slurm start)"):
        ("slurm_scheduler_backfilled_jobs_since_start_total", 1.0),
    ("backfill", "Total backfilled jobs (since last stats cycle start)"):
        ("slurm_scheduler_backfilled_jobs_since_cycle_total", 1.0),
    ("backfill", "Total backfilled heterogeneous job components"):
        ("slurm_scheduler_backfilled_heterogeneous_total", 1.0),
    ("", "Jobs submitted"): ("pyhpc_slurm_scheduler_jobs_submitted", 1.0),
    ("", "Jobs started"): ("pyhpc_slurm_scheduler_jobs_started", 1.0),
    ("", "Jobs completed"): ("pyhpc_slurm_scheduler_jobs_completed", 1.0),
    ("", "Jobs canceled"): ("pyhpc_slurm_scheduler_jobs_canceled", 1.0),
    ("", "Jobs failed"): ("pyhpc_slurm_scheduler_jobs_failed", 1.0),
    ("", "Jobs pending"): ("pyhpc_slurm_scheduler_jobs_pending", 1.0),
    ("", "Jobs running"): ("pyhpc_slurm_scheduler_jobs_running", 1.0),
    ("main", "Max cycle"): ("pyhpc_slurm_scheduler_main_max_cycle_seconds", 1e-6),
    ("main", "Last queue length"): ("pyhpc_slurm_scheduler_main_last_queue_length", 1.0),
    ("backfill", "Max cycle"): ("pyhpc_slurm_scheduler_backfill_max_cycle_seconds", 1e-6),
    ("backfill", "Last depth cycle"): ("pyhpc_slurm_scheduler_backfill_last_depth", 1.0),
    ("backfill", "Last queue length"):
        ("pyhpc_slurm_scheduler_backfill_last_queue_length", 1.0),
}
_RPC = re.compile(r"^\s*([A-Z][A-Z0-9_]+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:\d+\s+"
                  r"total_time:(\d+)")


@dataclass(frozen=True)
class Scheduler:
    """sdiag's figures: :data:`SDIAG`'s metrics, and RPC calls and seconds by message type."""

    stats: dict[str, float]
    rpc_calls: dict[str, int]
    rpc_seconds: dict[str, float]


def scheduler(text: str) -> Scheduler:
    """sdiag's text read; a line it does not have is left out, never guessed."""
    section = ""
    stats: dict[str, float] = {}
    calls: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("Main schedule statistics"):
            section = "main"
        elif line.startswith("Backfilling stats"):
            section = "backfill"
        elif line.startswith("Remote Procedure Call statistics by message type"):
            section = "rpc"
        elif line.startswith(("Remote Procedure Call statistics by user", "Pending RPC")):
            section = "other"
        if section == "rpc" and (rpc := _RPC.match(line)):
            calls[rpc.group(1)] = int(rpc.group(2))
            seconds[rpc.group(1)] = int(rpc.group(3)) * 1e-6
            continue
        label, sep, value = line.strip().partition(":")
        key = (section, label.strip())
        if sep and key in SDIAG and re.fullmatch(r"\s*\d+\s*", value):
            name, scale = SDIAG[key]
            stats.setdefault(name, int(value) * scale)
    return Scheduler(stats, calls, seconds)
