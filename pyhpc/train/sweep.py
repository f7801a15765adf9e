"""Training runs on the cluster: one run (``pyhpc train``) or a sweep of node counts x
batch sizes (``pyhpc scale``). The job spec the CLI built is checked here, once, and
carried to submitit as it is; a sweep checks every point before anything is submitted."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyhpc.cluster import Cluster
from pyhpc.slurm import jobspec, watch
from pyhpc.slurm.jobspec import JobSpec, JobSpecError, check
from pyhpc.slurm.submit import DEFAULT_FOLDER, cluster_or_default, submit_spec
from pyhpc.train.config import TrainConfig, TrainError, check_out, check_steps, from_mapping

SCALING = ("weak", "strong")


def run_spec(spec: JobSpec, cfg: TrainConfig, cluster: Cluster) -> JobSpec:
    """``spec`` for this run, checked: named after the mode unless it has a name, and for a
    pipelined run without GPUs or tasks per node of its own, one task per stage."""
    if cfg.pipeline > 1 and spec.tasks_per_node is None and spec.gpus_per_node == 0:
        spec = replace(spec, tasks_per_node=cfg.pipeline)
    return check(replace(spec, job_name=spec.job_name or f"train-{cfg.mode}"), cluster)


def check_run(cfg: TrainConfig, spec: JobSpec, local: bool = False) -> None:
    """The run against its checked spec: that it has steps to measure and a run directory,
    and that ``device=cuda`` asks for GPUs (``local``: this machine's own GPUs count, and
    the task checks them when it starts)."""
    if cfg.device == "cuda" and spec.gpus_per_node == 0 and not local:
        raise TrainError(f"device: cuda needs GPUs, and this job asks for none on partition "
                         f"{spec.partition!r}; add --gpus-per-node on a partition with GPUs, "
                         "or use --device auto or cpu", "device")
    if cfg.pipeline > 1 and not (spec.tasks % cfg.pipeline == 0 or cfg.pipeline % spec.tasks == 0):
        raise TrainError(f"pipeline: {cfg.pipeline} stages run one task each, inside a node or "
                         f"over whole nodes; {spec.tasks} tasks per node fit neither "
                         "(set --tasks-per-node or --gpus-per-node to the stage count)", "pipeline")
    check_steps(cfg, spec.nodes * spec.tasks)
    check_out(cfg.out)


def _trainer(cfg: TrainConfig) -> Any:
    """What every task of the job calls; torch is imported only once the run is known good."""
    if cfg.pipeline > 1:
        from pyhpc.train.pipeline import PipelineTrainer

        return PipelineTrainer(cfg)
    from pyhpc.train.loop import Trainer

    return Trainer(cfg)


def submit_run(cfg: TrainConfig, spec: JobSpec, folder: str, cluster: Cluster) -> Any:
    """``pyhpc train``: check the run and ``spec`` (unchecked, as the CLI built it) once,
    then submit it; returns the submitit Job."""
    checked = run_spec(spec, cfg, cluster)
    check_run(cfg, checked)
    return submit_spec(_trainer(cfg), checked, folder, cluster, kind="train")


def submit_training(*, nodes: int = 1, tasks_per_node: int | None = None, gpus_per_node: int = 0,
                    cpus_per_task: int | None = None, partition: str | None = None,
                    time: str = jobspec.DEFAULT_TIME, job_name: str | None = None,
                    folder: str = str(DEFAULT_FOLDER / "%j"), cluster: Cluster | None = None,
                    **options: Any) -> Any:
    """The Python API of ``pyhpc train``: the job spec's names for the resources and the
    same names as its options (``out``, ``model``, ``layers``, ``pipeline``, ``epochs``...)
    for the run, checked as the CLI checks them; returns the submitit job.
    ``pyhpc.submit_training(out="runs/deep", model="deep", layers=400, pipeline=2, nodes=2)``."""
    spec = JobSpec(nodes=nodes, tasks_per_node=tasks_per_node, gpus_per_node=gpus_per_node,
                   cpus_per_task=cpus_per_task, partition=partition, time=time, job_name=job_name)
    out = options.get("out")
    if isinstance(out, (str, Path)):
        options["out"] = str(Path(out).resolve())
    return submit_run(from_mapping(options), spec, folder, cluster_or_default(cluster))


def plan(base: TrainConfig, nodes: list[int], batches: list[int], scaling: str,
         spec: JobSpec, out: Path, cluster: Cluster, stages: list[int] | None = None,
         ) -> list[tuple[JobSpec, TrainConfig]]:
    """Every point of the sweep (nodes x stage counts x batches) with its checked spec; a bad
    point raises before any submission. A pipelined point's directory names its stages."""
    if scaling not in SCALING:
        raise JobSpecError(f"scaling: {scaling!r} is not allowed; allowed: {', '.join(SCALING)}")
    points: list[tuple[JobSpec, TrainConfig]] = []
    for n in nodes:
        for p in stages or [base.pipeline]:
            probe = replace(base, pipeline=p)
            point = run_spec(replace(spec, nodes=n), probe, cluster)
            workers = point.nodes * point.tasks // p
            for b in batches:
                if scaling == "strong" and b % workers:
                    raise JobSpecError(f"batch_sizes: global batch {b} does not divide over "
                                       f"{workers} workers (strong scaling)")
                name = f"nodes{n}-batch{b}" + (f"-stages{p}" if p > 1 else "")
                cfg = replace(probe, out=str((out / name).resolve()),
                              batch_size=b if scaling == "weak" else b // workers)
                check_run(cfg, point)
                points.append((point, cfg))
    return points


def run(points: list[tuple[JobSpec, TrainConfig]], folder: str, cluster: Cluster,
        interval_s: float) -> dict[str, dict[str, str]]:
    """Submit every planned point, then watch them all (one query per poll): job id -> out,
    state."""
    jobs = {str(submit_spec(_trainer(cfg), spec, folder, cluster, kind="train").job_id): cfg.out
            for spec, cfg in points}
    now = int(time.time())  # every job was accepted by now (a lost one is LOST, not FINISHED)
    states = watch.watch(list(jobs), interval_s=interval_s, submitted=dict.fromkeys(jobs, now))
    return {j: {"out": o, "state": states[j]} for j, o in jobs.items()}
