"""``pyhpc bench``'s submission: the job's spec checked against the cluster, the job
submitted, and with ``--wait`` its results read back."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pyhpc.bench.config import BenchConfig
from pyhpc.bench.results import RESULTS, read_results, table
from pyhpc.cluster import Cluster
from pyhpc.errors import PyhpcError
from pyhpc.slurm import watch
from pyhpc.slurm.jobspec import JobSpec
from pyhpc.slurm.submit import cluster_or_default
from pyhpc.train.config import check_out
from pyhpc.train.sweep import Resources, submit_task


def resources(res: Resources, gpus: bool, cluster: Cluster) -> Resources:
    """GPU tests without ``--gpus-per-node``: every GPU of the partition's nodes (at least
    one, so a partition without GPUs is refused by :func:`pyhpc.slurm.jobspec.check`)."""
    if not gpus or res.gpus_per_node:
        return res
    name = res.partition or cluster.default_partition.name
    try:
        have = cluster.partition_gpus(name)
    except PyhpcError:  # an unknown partition: jobspec.check says so, in its words
        have = 0
    return replace(res, gpus_per_node=max(1, have))


def check(cfg: BenchConfig, res: Resources, cluster: Cluster) -> JobSpec:
    """The benchmark job's spec, checked against the cluster; ``device=cuda`` (``--gpus``)
    on a partition without GPUs is a one-line :class:`~pyhpc.slurm.jobspec.JobSpecError`."""
    res = resources(res, cfg.device == "cuda", cluster)
    spec = res.spec("bench", cluster)
    check_out(cfg.out)
    return spec


def submit_bench(cfg: BenchConfig, res: Resources, cluster: Cluster | None = None) -> Any:
    """Submit the benchmark job (a submitit job of :class:`pyhpc.bench.job.BenchTask`)."""
    the_cluster = cluster_or_default(cluster)
    spec = check(cfg, res, the_cluster)
    from pyhpc.bench.job import BenchTask  # torch: only once the job is known to be good

    return submit_task(BenchTask(cfg), spec, res.folder, the_cluster)


def run(cfg: BenchConfig, res: Resources, cluster: Cluster | None = None, wait: bool = False,
        timeout_s: float | None = None) -> dict[str, Any]:
    """``pyhpc bench``: submit; with ``wait``, wait for the job and read its results back.

    Returns ``job_id`` and ``out``; after a wait also ``state`` and, when it completed,
    the paths of ``bench.json``/``.txt``/``.png`` and the ``table``.
    """
    job = submit_bench(cfg, res, cluster)
    result: dict[str, Any] = {"job_id": str(job.job_id), "out": cfg.out}
    if not wait:
        return result
    result["state"] = watch.watch([result["job_id"]], interval_s=1.0, timeout_s=timeout_s,
                                  fail_on_timeout=True)[result["job_id"]]
    if result["state"] == "COMPLETED":
        out = Path(cfg.out)
        doc = read_results(out / RESULTS["json"])
        result.update({k: str(out / name) for k, name in RESULTS.items()}, table=table(doc))
    return result
