"""A job's summary in Princeton jobstats' format, for the job's AdminComment.

jobstats' slurmctld epilog stores each finished job's use per node in its AdminComment, as
``JS1:`` + base64(gzip(JSON)), or ``JS1:Short`` (a run shorter than two samples) or
``JS1:None`` (no samples). jobstats reads it back for finished jobs; reportseff reads it
for its CPUEff, MemEff, GPUEff and GPUMem columns. The JSON is
``{"gpus": N, "nodes": {NODE: {...}}, "total_time": SECONDS}``; per node ``cpus``,
``total_time`` (CPU seconds), ``used_memory``, ``total_memory`` and, for GPUs,
``gpu_total_memory``, ``gpu_used_memory``, ``gpu_utilization`` (percent), each by minor.

The figures come from jobstats' own Prometheus queries over the job's run, at its end,
of cgroup_exporter's and the GPU exporter's series (the job exporter's names). Only numbers,
node names (the exporter's ``node`` label) and GPU minor numbers are stored: nothing a
user wrote. Standard library only: the record program runs it with the system python3.
"""
from __future__ import annotations

import base64
import gzip
import json
import math
import re
from typing import Any

from pyhpc import validate
from pyhpc.errors import PyhpcError
from pyhpc.monitor import prometheus

PREFIX = "JS1:"
#: jobstats' markers for a run shorter than two samples and for one with no samples.
SHORT, NO_DATA = "Short", "None"
#: Largest comment stored (jobstats reports about 5,000 characters for its largest jobs).
MAX_CHARS = 16 << 10
#: A comment as this module writes it; nothing else is passed to scontrol.
COMMENT = re.compile(r"JS1:(?:Short|None|[A-Za-z0-9+/]+={0,2})")
#: A Prometheus duration as the cluster definition allows it (monitoring.scrape_interval).
DURATION = re.compile(r"([1-9][0-9]{0,5})(s|m|h)")
UNIT_S = {"s": 1, "m": 60, "h": 3600}

#: Per node, by jobstats' key: the query over the job's run ({sel}: its own cgroup, {w}: its
#: length). Used memory is RSS plus shared memory, RSS alone where there is no shmem series.
CGROUP_QUERIES = {
    "total_memory": "max_over_time(cgroup_memory_total_bytes{sel}[{w}])",
    "used_memory": "max_over_time(((cgroup_memory_rss_bytes{sel} + "
                   "cgroup_memory_shmem_bytes{sel}) or 1 * cgroup_memory_rss_bytes{sel})[{w}:])",
    "total_time": "max_over_time(cgroup_cpu_total_seconds{sel}[{w}])",
    "cpus": "max_over_time(cgroup_cpus{sel}[{w}])",
}
#: Per GPU (by its minor number), for a job that holds GPUs.
GPU_QUERIES = {
    "gpu_total_memory": "max_over_time(nvidia_gpu_memory_total_bytes{sel}[{w}])",
    "gpu_used_memory": "max_over_time(nvidia_gpu_memory_used_bytes{sel}[{w}])",
    "gpu_utilization": "avg_over_time(nvidia_gpu_duty_cycle{sel}[{w}])",
}
#: Stored as whole numbers; the others with one decimal, as jobstats trims them.
WHOLE = ("total_memory", "used_memory", "cpus", "gpu_total_memory", "gpu_used_memory")


class CommentError(PyhpcError):
    """A summary too large for the AdminComment, or a scrape interval that is not one."""


def interval_seconds(text: str) -> int:
    """``5s``, ``1m``: the scrape interval in seconds."""
    match = DURATION.fullmatch(text)
    if match is None:
        raise CommentError(f"--scrape-interval: {text[:20]!r} is not a duration such as 15s "
                           "or 1m", "--scrape-interval")
    return int(match.group(1)) * UNIT_S[match.group(2)]


def _value(key: str, value: float) -> float | int:
    return int(value) if key in WHOLE else round(value, 1)


def _node(labels: dict[str, str]) -> str | None:
    """The series' node, where it is a host name (else the series is left out)."""
    node = labels.get("node", "")
    return node if validate.KINDS["host"].pattern.fullmatch(node) and len(node) <= 253 \
        else None


def _minor(labels: dict[str, str]) -> str | None:
    minor = labels.get("minor_number", "")
    return minor if minor.isdigit() and len(minor) <= 4 else None


def held_gpus(base: str, job_id_raw: str, end: float, window: str) -> int:
    """GPUs the job held, over its nodes, as the job exporter counted them (the allocation:
    jobstats reads it from AllocTRES)."""
    sel = prometheus.selector(job_id_raw)
    held = prometheus.query(base, f"sum(max_over_time(pyhpc_job_gpus{sel}[{window}]))", end)
    return int(held[0][1]) if held and math.isfinite(held[0][1]) else 0


def nodes(base: str, job_id_raw: str, end: float, window: str, gpus: int,
          ) -> dict[str, dict[str, Any]]:
    """Per node, the job's figures by jobstats' keys; GPU figures only where it holds GPUs."""
    sel = prometheus.selector(job_id_raw)[:-1] + ',step="",task=""}'
    gpu_sel = prometheus.selector(job_id_raw)
    found: dict[str, dict[str, Any]] = {}
    for key, promql in CGROUP_QUERIES.items():
        for labels, value in prometheus.query(base, promql.format(sel=sel, w=window), end):
            node = _node(labels)
            if node is not None and math.isfinite(value):
                found.setdefault(node, {})[key] = _value(key, value)
    for key, promql in GPU_QUERIES.items() if gpus else ():
        for labels, value in prometheus.query(base, promql.format(sel=gpu_sel, w=window), end):
            node, minor = _node(labels), _minor(labels)
            if node is not None and minor is not None and math.isfinite(value):
                found.setdefault(node, {}).setdefault(key, {})[minor] = _value(key, value)
    return found


def encode(found: dict[str, dict[str, Any]], total_time: int, gpus: int,
           sampling_s: int) -> str:
    """The AdminComment: jobstats' markers, or its summary compressed and encoded. The
    same figures give the same text (keys sorted, no time in the gzip header)."""
    if total_time < 2 * sampling_s:
        return PREFIX + SHORT
    if not found:
        return PREFIX + NO_DATA
    data = {"gpus": gpus, "nodes": found, "total_time": total_time}
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    comment = PREFIX + base64.b64encode(gzip.compress(text.encode("ascii"), mtime=0)).decode()
    if len(comment) > MAX_CHARS:
        raise CommentError(f"admin comment: the summary of {len(found)} nodes takes "
                           f"{len(comment)} characters, more than {MAX_CHARS}", "admin comment")
    return comment


def decode(comment: str) -> dict[str, Any] | None:
    """The summary in a comment this module wrote; None for a marker (no figures)."""
    if COMMENT.fullmatch(comment) is None or len(comment) > MAX_CHARS:
        raise CommentError("admin comment: not a jobstats summary", "admin comment")
    if comment in (PREFIX + SHORT, PREFIX + NO_DATA):
        return None
    raw = gzip.decompress(base64.b64decode(comment[len(PREFIX):], validate=True))
    data: dict[str, Any] = json.loads(raw)
    return data


def summary(base: str, job_id_raw: str, start: float, end: float, sampling_s: int) -> str:
    """The job's AdminComment from Prometheus' samples of its run (``start``, ``end``:
    epoch seconds; jobstats asks Prometheus nothing for a short run)."""
    total_time = max(0, int(end - start))
    if total_time < 2 * sampling_s:
        return PREFIX + SHORT
    window = f"{max(1, math.ceil(end - start))}s"
    gpus = held_gpus(base, job_id_raw, end, window)
    return encode(nodes(base, job_id_raw, end, window, gpus), total_time, gpus, sampling_s)
