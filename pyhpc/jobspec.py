"""A job's resource request (nodes, tasks, GPUs, partition), checked against the cluster.

Rendering a template and submitting through submitit both go through
:func:`check`, so a bad request fails the same way before anything reaches Slurm.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pyhpc.cluster import Cluster


class JobSpecError(ValueError):
    """A resource request the cluster cannot satisfy; the message names the argument."""


TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$")


@dataclass(frozen=True)
class JobSpec:
    """What a job asks Slurm for. ``partition=None`` means the cluster's default."""

    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    partition: str | None = None
    time: str = "00:10:00"


def _int(name: str, value: object, minimum: int) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise JobSpecError(f"{name}: must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise JobSpecError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return number


def check(spec: JobSpec, cluster: Cluster) -> JobSpec:
    """Return ``spec`` with the partition filled in, or raise JobSpecError."""
    nodes = _int("nodes", spec.nodes, 1)
    tasks = _int("tasks_per_node", spec.tasks_per_node, 1)
    gpus = _int("gpus_per_node", spec.gpus_per_node, 0)
    cpus = None if spec.cpus_per_task is None else _int("cpus_per_task", spec.cpus_per_task, 1)
    name = spec.partition or cluster.default_partition.name
    try:
        part = cluster.partition(name)
    except Exception as exc:  # ConfigError: re-raise in this family, same message
        raise JobSpecError(str(exc)) from None
    if nodes > len(part.nodes):
        raise JobSpecError(
            f"nodes: partition {name!r} has {len(part.nodes)} nodes, {nodes} requested")
    have = cluster.partition_gpus(name)
    if gpus > have:
        with_gpus = [p.name for p in cluster.partitions if cluster.partition_gpus(p.name) > 0]
        where = ", ".join(with_gpus) if with_gpus else "none (this cluster has no GPUs)"
        raise JobSpecError(
            f"gpus_per_node: partition {name!r} has {have} GPUs per node, {gpus} requested; "
            f"partitions with GPUs: {where}")
    if not TIME_RE.match(str(spec.time)):
        raise JobSpecError(f"time: {spec.time!r} is not a Slurm time limit (e.g. 00:10:00)")
    return JobSpec(nodes, tasks, gpus, cpus, name, str(spec.time))
