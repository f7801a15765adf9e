"""``pyhpc jobstats JOB``: one job's use of what it asked for, and what to ask next time.

From accounting (one sacct call: TotalCPU, elapsed time, CPUs, the steps' MaxRSS, ReqMem,
AllocTRES, state), plus the GPU and cgroup figures the job exporter sampled while it ran:
from the summary ``pyhpc-jobstats-record`` stored at the job's end (:mod:`record`) where
that is readable, else from Prometheus where one is configured, else none (null). Prometheus
answers admins only: a user's own job's figures come through ``pyhpc-jobstats-query``
(:mod:`pyhpc.monitor.own_query`, run by sudo), which shows no one another's. Any
job works, submitted by pyhpc or not. A user sees only their own jobs: Slurm's
``PrivateData=jobs`` hides others' from sacct, and a job sacct shows that belongs to
someone else is refused here too (root excepted).
"""
from __future__ import annotations

import math
import os
import pwd
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyhpc import validate
from pyhpc.errors import PyhpcError
from pyhpc.monitor import hints, own_query, prometheus, record
from pyhpc.slurm import slurm

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


class JobstatsError(PyhpcError):
    """A job that is not in accounting, not the caller's, or an array named as a whole."""


@dataclass(frozen=True)
class Accounting:
    """One job's accounting record and its steps, read from sacct."""

    job_id: str
    job_id_raw: str
    user: str
    account: str
    partition: str
    state: str
    elapsed_s: int
    time_limit_s: int | None
    total_cpu_s: float
    cpus: int
    nodes: int
    gpus: int
    mem_requested_bytes: int | None
    step_mem_peak_bytes: int | None
    start: float | None
    end: float | None


def size_bytes(text: str) -> int | None:
    """``1268K``, ``2.5G``, ``1024`` (bytes) -> bytes; None if empty or not a size."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([KMGTP]?)", text.strip())
    return int(float(match.group(1)) * UNITS.get(match.group(2), 1)) if match else None


def cpu_seconds(text: str) -> float:
    """sacct's TotalCPU: ``MM:SS.mmm``, ``HH:MM:SS``, ``D-HH:MM:SS``."""
    days, _, rest = text.strip().rpartition("-")
    parts = [float(p) for p in rest.split(":") if p]
    seconds = sum(v * 60.0 ** i for i, v in enumerate(reversed(parts)))
    return float(seconds + (int(days) * 86400 if days.isdigit() else 0))


def requested_memory(text: str, cpus: int, nodes: int) -> int | None:
    """ReqMem in bytes per node. Slurm 21.08 and later print the job's total; earlier
    versions suffix ``n`` (per node) or ``c`` (per CPU)."""
    suffix = text[-1:] if text[-1:] in ("n", "c") else ""
    number = text[:-1] if suffix else text
    amount = size_bytes(number + "M" if number.isdigit() else number)  # plain: megabytes
    if amount is None or nodes < 1:
        return None
    if suffix == "n":
        return amount
    total = amount * cpus if suffix == "c" else amount
    return total // nodes


def parse_accounting(text: str) -> list[Accounting]:
    """sacct's lines in :data:`pyhpc.slurm.slurm.JOBSTATS_FORMAT`: one record per job
    (several for an array named by its id), with its steps' largest per-node memory."""
    jobs: dict[str, dict[str, str]] = {}
    step_peak: dict[str, int] = {}
    names = slurm.JOBSTATS_FORMAT.split(",")
    for line in text.splitlines():
        values = line.split("|")
        if len(values) != len(names):
            continue
        row = dict(zip(names, values, strict=True))
        job, dot, _ = row["JobIDRaw"].partition(".")
        if not dot:
            jobs[job] = row
            continue
        rss, tasks, nodes = size_bytes(row["MaxRSS"]), row["NTasks"], row["NNodes"]
        if rss is not None:
            # MaxRSS is one task's peak; its node held up to ceil(tasks/nodes) such tasks.
            per_node = math.ceil(int(tasks) / max(int(nodes), 1)) if tasks.isdigit() \
                and nodes.isdigit() else 1
            step_peak[job] = max(step_peak.get(job, 0), rss * per_node)
    return [_record(raw, row, step_peak.get(raw)) for raw, row in jobs.items()]


def _record(raw: str, row: dict[str, str], peak: int | None) -> Accounting:
    cpus = int(row["AllocCPUS"]) if row["AllocCPUS"].isdigit() else 0
    nodes = int(row["NNodes"]) if row["NNodes"].isdigit() else 1
    limit = row["TimelimitRaw"]
    gpus = re.search(r"(?:^|,)gres/gpu=(\d+)", row["AllocTRES"])
    return Accounting(
        job_id=row["JobID"], job_id_raw=raw, user=row["User"], account=row["Account"],
        partition=row["Partition"], state=(row["State"].split() or ["UNKNOWN"])[0],
        elapsed_s=int(row["ElapsedRaw"]) if row["ElapsedRaw"].isdigit() else 0,
        time_limit_s=int(limit) * 60 if limit.isdigit() else None,
        total_cpu_s=cpu_seconds(row["TotalCPU"]) if row["TotalCPU"] else 0.0, cpus=cpus,
        nodes=nodes, gpus=int(gpus.group(1)) if gpus else 0,
        mem_requested_bytes=requested_memory(row["ReqMem"], cpus, nodes),
        step_mem_peak_bytes=peak, start=record.epoch(row["Start"]), end=record.epoch(row["End"]))


def caller() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def find(job_id: str, me: str | None = None) -> Accounting:
    """The job's accounting, if the caller may see it: ONE sacct call."""
    job_id = validate.name("job", job_id, "job_id", JobstatsError)
    found = parse_accounting(slurm.job_accounting(job_id))
    if not found:
        raise JobstatsError(f"job: {job_id} is not in accounting (Slurm shows each user only "
                            "their own jobs)", "job")
    if len(found) > 1:
        raise JobstatsError(f"job: {job_id} is an array of {len(found)} tasks; name one, e.g. "
                            f"{found[0].job_id}", "job")
    me = me if me is not None else caller()
    if found[0].user != me and os.geteuid() != 0:
        raise JobstatsError(f"job: {job_id} is not yours; pyhpc jobstats shows only your own "
                            "jobs", "job")
    return found[0]


@dataclass(frozen=True)
class Sources:
    """Where GPU figures may come from: the record store, a Prometheus URL."""

    store: Path = record.STORE
    prometheus_url: str | None = None


def gpu_and_memory(job: Accounting, sources: Sources,
                   ) -> tuple[prometheus.GpuFigures | None, int | None, str]:
    """(GPU figures, the cgroup's peak memory per node, where they came from)."""
    stored = record.read(sources.store, job.job_id_raw)
    if stored is not None:
        return stored.gpu, stored.host_mem_peak_bytes, "record"
    if sources.prometheus_url and job.start is not None:
        end = job.end if job.end is not None else time.time()
        if prometheus.credentials() is None and Path(own_query.PROGRAM).exists():
            return (*through_sudo(job, job.start, end), "prometheus")
        return (prometheus.gpu_figures(sources.prometheus_url, job.job_id_raw, job.start, end),
                prometheus.host_memory_peak(sources.prometheus_url, job.job_id_raw, job.start,
                                            end), "prometheus")
    return None, None, "none"


def through_sudo(job: Accounting, start: float, end: float,
                 ) -> tuple[prometheus.GpuFigures | None, int | None]:
    """The caller's own job's figures from ``pyhpc-jobstats-query`` (sudo's rule runs it as
    the monitoring user, who may ask Prometheus; it answers only for the caller's jobs)."""
    argv = ["sudo", "-n", "-u", own_query.RUN_AS, own_query.PROGRAM, job.job_id_raw,
            str(int(start)), str(max(int(start), math.ceil(end)))]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False,
                              timeout=3 * prometheus.TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JobstatsError(f"pyhpc-jobstats-query: did not answer ({exc})", "prometheus") \
            from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise JobstatsError(why[:300], "prometheus")
    return own_query.parse(validate.read_json("pyhpc-jobstats-query", proc.stdout,
                                              JobstatsError))


def summary(job: Accounting, sources: Sources) -> dict[str, Any]:
    """Everything ``pyhpc jobstats --json`` prints."""
    gpu, host_peak, source = gpu_and_memory(job, sources)
    wall = job.elapsed_s * job.cpus
    efficiency = min(1.0, job.total_cpu_s / wall) if wall else None
    peak = host_peak if host_peak is not None else job.step_mem_peak_bytes
    figures = hints.Figures(
        state=job.state, elapsed_s=job.elapsed_s, time_limit_s=job.time_limit_s,
        cpus=job.cpus, nodes=job.nodes, cpu_efficiency=efficiency, mem_peak_bytes=peak,
        mem_requested_bytes=job.mem_requested_bytes, gpus=job.gpus,
        gpus_used=gpu.used if gpu else None, gpu_util_mean=gpu.util_mean if gpu else None)
    return {
        "job_id": job.job_id, "user": job.user, "account": job.account,
        "partition": job.partition, "state": job.state, "elapsed_s": job.elapsed_s,
        "cpus": job.cpus, "nodes": job.nodes, "gpus": job.gpus,
        "cpu_efficiency": efficiency, "mem_peak_bytes": peak,
        "mem_requested_bytes": job.mem_requested_bytes,
        "gpu_util_mean": gpu.util_mean if gpu else None,
        "gpu_util_peak": gpu.util_peak if gpu else None,
        "gpu_mem_peak_bytes": gpu.mem_peak_bytes if gpu else None,
        "gpus_used": gpu.used if gpu else None, "gpu_source": source if gpu else None,
        "hints": hints.hints(figures)}


def text(data: dict[str, Any]) -> str:
    """The summary for people: a few lines, then the hints."""
    def pct(value: float | None) -> str:
        return "n/a" if value is None else hints.percent(value)

    def size(value: int | None) -> str:
        return "n/a" if value is None else f"{value / (1 << 30):.2f} GiB"

    lines = [f"job {data['job_id']} ({data['user']}, {data['account']}, {data['partition']}): "
             f"{data['state']} after {data['elapsed_s']} s on {data['nodes']} node(s)",
             f"  CPU efficiency   {pct(data['cpu_efficiency'])} of {data['cpus']} CPUs",
             f"  memory per node  peak {size(data['mem_peak_bytes'])} of "
             f"{size(data['mem_requested_bytes'])} requested"]
    if data["gpus"]:
        lines.append(f"  GPUs             {data['gpus']}: utilization mean "
                     f"{pct(data['gpu_util_mean'])}, peak {pct(data['gpu_util_peak'])}, "
                     f"memory peak {size(data['gpu_mem_peak_bytes'])}"
                     + ("" if data["gpu_util_mean"] is not None else " (no GPU samples)"))
    lines += [f"hint: {h}" for h in data["hints"]] or ["no hints: the request fits the use"]
    return "\n".join(lines)
