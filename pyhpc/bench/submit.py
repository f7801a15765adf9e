"""``pyhpc bench``'s submission: the job's spec checked against the cluster once, the job
submitted through :mod:`pyhpc.slurm.submit`, and with ``--wait`` its results read back."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyhpc import files
from pyhpc.bench.config import BenchConfig
from pyhpc.bench.results import RESULTS, read_results, table
from pyhpc.cluster import Cluster
from pyhpc.errors import PyhpcError
from pyhpc.slurm import jobspec, watch
from pyhpc.slurm.jobspec import JobSpec
from pyhpc.slurm.submit import submit_spec


def with_gpus(spec: JobSpec, gpus: bool, cluster: Cluster) -> JobSpec:
    """GPU tests without ``--gpus-per-node``: every GPU of the partition's nodes (at least
    one, so a partition without GPUs is refused by :func:`pyhpc.slurm.jobspec.check`)."""
    if not gpus or spec.gpus_per_node:
        return spec
    name = spec.partition or cluster.default_partition.name
    try:
        have = cluster.partition_gpus(name)
    except PyhpcError:  # an unknown partition: jobspec.check says so, in its words
        have = 0
    return replace(spec, gpus_per_node=max(1, have))


def check(cfg: BenchConfig, spec: JobSpec, cluster: Cluster) -> JobSpec:
    """The benchmark job's spec, checked against the cluster; ``device=cuda`` (``--gpus``)
    on a partition without GPUs is a one-line :class:`~pyhpc.slurm.jobspec.JobSpecError`."""
    spec = with_gpus(replace(spec, job_name=spec.job_name or "bench"), cfg.device == "cuda", cluster)
    checked = jobspec.check(spec, cluster)
    files.safe_dir(cfg.out, "out")
    return checked


def submit_bench(cfg: BenchConfig, spec: JobSpec, folder: str, cluster: Cluster) -> Any:
    """Submit the benchmark job (a submitit job of :class:`pyhpc.bench.job.BenchTask`)."""
    checked = check(cfg, spec, cluster)
    from pyhpc.bench.job import BenchTask  # torch: only once the job is known to be good

    return submit_spec(BenchTask(cfg), checked, folder, cluster, kind="bench")


def run(cfg: BenchConfig, spec: JobSpec, folder: str, cluster: Cluster, wait: bool = False,
        timeout_s: float | None = None) -> dict[str, Any]:
    """``pyhpc bench``: submit; with ``wait``, wait for the job and read its results back.

    Returns ``job_id`` and ``out``; after a wait also ``state`` and, when it completed,
    the paths of ``bench.json``/``.txt``/``.png`` and the ``table``.
    """
    job = submit_bench(cfg, spec, folder, cluster)
    result: dict[str, Any] = {"job_id": str(job.job_id), "out": cfg.out}
    if not wait:
        return result
    result["state"] = watch.watch([result["job_id"]], interval_s=1.0, timeout_s=timeout_s,
                                  fail_on_timeout=True,
                                  submitted={result["job_id"]: int(time.time())})[result["job_id"]]
    if result["state"] == "COMPLETED":
        out = Path(cfg.out)
        doc = read_results(out / RESULTS["json"])
        result.update({k: str(out / name) for k, name in RESULTS.items()}, table=table(doc))
    return result
