"""Training runs on the cluster: one run (``pyhpc train``) or a sweep of node counts x
batch sizes (``pyhpc scale``), each checked whole before anything is submitted."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyhpc.cluster import Cluster
from pyhpc.slurm import jobspec, watch
from pyhpc.slurm.jobspec import JobSpec, JobSpecError, check
from pyhpc.slurm.submit import DEFAULT_FOLDER, cluster_or_default, submit
from pyhpc.train.config import TrainConfig, TrainError, check_out, check_steps

SCALING = ("weak", "strong")


@dataclass(frozen=True)
class Resources:
    """Where a training run goes; ``tasks_per_node=None`` means one task per GPU."""

    nodes: int = 1
    tasks_per_node: int | None = None
    gpus_per_node: int = 0
    partition: str | None = None
    time: str = jobspec.DEFAULT_TIME
    folder: str = str(DEFAULT_FOLDER / "%j")

    @property
    def tasks(self) -> int:
        return self.tasks_per_node if self.tasks_per_node is not None else max(
            self.gpus_per_node, 1)

    def spec(self, job_name: str, cluster: Cluster) -> JobSpec:
        """These resources as a job spec, checked against ``cluster``."""
        return check(JobSpec(nodes=self.nodes, tasks_per_node=self.tasks,
                             gpus_per_node=self.gpus_per_node, partition=self.partition,
                             time=self.time, job_name=job_name), cluster)


def submit_task(task: Any, spec: JobSpec, folder: str, cluster: Cluster) -> Any:
    """Submit a checked job whose every task calls ``task`` (which sets up its own ranks)."""
    return submit(task, nodes=spec.nodes, tasks_per_node=spec.tasks_per_node,
                  gpus_per_node=spec.gpus_per_node, partition=spec.partition, time=spec.time,
                  name=spec.job_name or "pyhpc", folder=folder, distributed=False,
                  cluster=cluster)


def check_run(cfg: TrainConfig, res: Resources, cluster: Cluster, local: bool = False,
              ) -> JobSpec:
    """The run's job spec, checked: resources first, then that it has steps to measure.
    A job asking for ``device=cuda`` must ask for GPUs (``local``: this machine's own
    GPUs count, and the task checks them when it starts)."""
    spec = res.spec(f"train-{cfg.mode}", cluster)
    if cfg.device == "cuda" and spec.gpus_per_node == 0 and not local:
        raise TrainError(f"device: cuda needs GPUs, and this job asks for none on partition "
                         f"{spec.partition!r}; add --gpus-per-node on a partition with GPUs, "
                         "or use --device auto or cpu", "device")
    if cfg.pipeline > 1 and not (spec.tasks_per_node % cfg.pipeline == 0
                                 or cfg.pipeline % spec.tasks_per_node == 0):
        raise TrainError(f"pipeline: {cfg.pipeline} stages run one task each, inside a node or "
                         f"over whole nodes; {spec.tasks_per_node} tasks per node fit neither "
                         "(set --tasks-per-node or --gpus-per-node to the stage count)", "pipeline")
    check_steps(cfg, spec.nodes * spec.tasks_per_node)
    check_out(cfg.out)
    return spec


def for_pipeline(res: Resources, cfg: TrainConfig) -> Resources:
    """A pipelined run's tasks: one per stage on each node, unless the request says
    otherwise (its GPUs, or its own --tasks-per-node)."""
    if cfg.pipeline > 1 and res.tasks_per_node is None and res.gpus_per_node == 0:
        return replace(res, tasks_per_node=cfg.pipeline)
    return res


def submit_run(cfg: TrainConfig, res: Resources, cluster: Cluster | None = None) -> Any:
    """Submit one training run (a submitit job of :class:`pyhpc.train.loop.Trainer`)."""
    the_cluster = cluster_or_default(cluster)
    res = for_pipeline(res, cfg)
    spec = check_run(cfg, res, the_cluster)
    # torch: only once the run is known to be good
    if cfg.pipeline > 1:
        from pyhpc.train.pipeline import PipelineTrainer

        return submit_task(PipelineTrainer(cfg), spec, res.folder, the_cluster)
    from pyhpc.train.loop import Trainer

    return submit_task(Trainer(cfg), spec, res.folder, the_cluster)


def plan(base: TrainConfig, nodes: list[int], batches: list[int], scaling: str,
         res: Resources, out: Path, cluster: Cluster) -> list[tuple[Resources, TrainConfig]]:
    """Every point of the sweep, each checked; a bad point raises before any submission."""
    if scaling not in SCALING:
        raise JobSpecError(f"scaling: {scaling!r} is not allowed; allowed: {', '.join(SCALING)}")
    points: list[tuple[Resources, TrainConfig]] = []
    for n in nodes:
        point = replace(res, nodes=n)
        for b in batches:
            workers = n * point.tasks
            if scaling == "strong" and b % workers:
                raise JobSpecError(f"batch_sizes: global batch {b} does not divide over "
                                   f"{workers} workers (strong scaling)")
            local = b if scaling == "weak" else b // workers
            cfg = replace(base, out=str((out / f"nodes{n}-batch{b}").resolve()), batch_size=local)
            check_run(cfg, for_pipeline(point, cfg), cluster)
            points.append((point, cfg))
    return points


def run(points: list[tuple[Resources, TrainConfig]], cluster: Cluster,
        interval_s: float) -> dict[str, dict[str, str]]:
    """Submit every point, then watch them all (one query per poll): job id -> out, state."""

    jobs = {str(submit_run(cfg, res, cluster).job_id): cfg.out for res, cfg in points}
    states = watch.watch(list(jobs), interval_s=interval_s)
    return {j: {"out": o, "state": states[j]} for j, o in jobs.items()}
