"""A job's resource request, checked against the cluster, and its one mapping to Slurm.

Templates (:mod:`pyhpc.slurm.render`), script submission and submitit all go through
:func:`check` and read option names from :data:`OPTIONS`, so a request has one set of
names (``tasks_per_node``, ``cpus_per_task``...) and fails the same way everywhere
before anything reaches Slurm.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pyhpc import validate
from pyhpc.cluster import MAX_NODES, Cluster, ConfigError
from pyhpc.errors import PyhpcError

#: The time limit of a job that names none.
DEFAULT_TIME = "00:10:00"


class JobSpecError(PyhpcError):
    """A resource request the cluster cannot satisfy; the message names the argument."""


def _meta(help: str, low: int | None = None, high: int | None = None) -> dict[str, Any]:
    return {"help": help, **({"bounds": (low, high)} if low is not None else {})}


@dataclass(frozen=True)
class JobSpec:
    """What a job asks Slurm for. ``partition=None`` means the cluster's default and
    ``tasks_per_node=None`` one task per GPU (one without GPUs): :func:`check` fills both
    in, so a checked spec is complete. Each field's help is the CLI's."""

    nodes: int = field(default=1, metadata=_meta(f"nodes (1 to {MAX_NODES})", 1, MAX_NODES))
    tasks_per_node: int | None = field(default=None, metadata=_meta(
        "tasks per node (1 to 1024; default: one per GPU, one without GPUs)", 1, 1024))
    gpus_per_node: int = field(default=0, metadata=_meta(
        "GPUs per node (the partition must have them)", 0, 64))
    cpus_per_task: int | None = field(default=None, metadata=_meta(
        "CPUs per task (1 to 4096; default: Slurm's)", 1, 4096))
    partition: str | None = field(default=None, metadata=_meta(
        "partition (default: the cluster's default)"))
    time: str = field(default=DEFAULT_TIME, metadata=_meta(f"time limit (default {DEFAULT_TIME})"))
    job_name: str | None = field(default=None, metadata=_meta("job name"))
    #: A job array expression (``0-999%50``): one sbatch for every task.
    array: str | None = field(default=None, metadata=_meta(
        "a job array in one sbatch, e.g. 0-999%%50 (ids 0-999, at most 50 running); each "
        "task reads its id from SLURM_ARRAY_TASK_ID. Templates and scripts; for functions: "
        "pyhpc.submit_array"))
    #: None: the one the user names elsewhere (SBATCH_RESERVATION, the script's #SBATCH
    #: line), else the one active reservation that admits them (pyhpc.slurm.reservations).
    reservation: str | None = field(default=None, metadata=_meta(
        "reservation to run in (default: SBATCH_RESERVATION, else your one active "
        "reservation, e.g. your workshop's)"))

    @property
    def tasks(self) -> int:
        """Tasks per node of a spec :func:`check` returned (it works the count out)."""
        if self.tasks_per_node is None:
            raise JobSpecError("tasks_per_node: not worked out before the spec is checked")
        return self.tasks_per_node


#: JobSpec field -> (sbatch option, submitit parameter): the one table of names.
#: ``array`` has no submitit parameter: functions go into arrays by pyhpc.submit_array;
#: nor has ``reservation``: it reaches submitit's sbatch as an additional parameter.
OPTIONS: dict[str, tuple[str, str | None]] = {
    "nodes": ("nodes", "nodes"),
    "tasks_per_node": ("ntasks-per-node", "tasks_per_node"),
    "gpus_per_node": ("gpus-per-node", "gpus_per_node"),
    "cpus_per_task": ("cpus-per-task", "cpus_per_task"),
    "partition": ("partition", "slurm_partition"),
    "time": ("time", "timeout_min"),
    "job_name": ("job-name", "name"),
    "array": ("array", None),
    "reservation": ("reservation", None),
}
BOUNDS: dict[str, tuple[int, int]] = {
    f.name: f.metadata["bounds"] for f in fields(JobSpec) if "bounds" in f.metadata}


#: The older keyword of a field: ``name`` is pyhpc.submit's and submit_array's job name.
ALIASES = {"name": "job_name"}
#: Every resource keyword the submit functions take: the fields, then the aliases.
KEYWORDS = (*(f.name for f in fields(JobSpec)), *ALIASES)


def resources(given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``given`` split into (resource keywords, the rest), an alias under its field's name."""
    asked = {ALIASES.get(k, k): v for k, v in given.items() if k in KEYWORDS}
    both = [k for k, v in ALIASES.items() if k in given and v in given]
    if both:
        raise JobSpecError(f"{both[0]}: give {both[0]} or {ALIASES[both[0]]}, not both")
    return asked, {k: v for k, v in given.items() if k not in KEYWORDS}


def with_keywords(spec: JobSpec | None, given: Mapping[str, Any]) -> JobSpec:
    """``spec`` (default: an empty one) with the JobSpec fields ``given`` as keywords (the
    one keyword set of pyhpc.submit, submit_array and submit_script); another keyword is
    refused with the allowed ones."""
    asked, rest = resources(given)
    if rest:
        raise JobSpecError(f"{sorted(rest)[0]}: not a resource; allowed: {', '.join(KEYWORDS)}")
    return replace(spec or JobSpec(), **asked)


def check_value(key: str, value: object) -> Any:
    """One field's value, converted and checked on its own (no cluster needed)."""
    if value is None and key in ("tasks_per_node", "cpus_per_task", "partition", "job_name",
                                 "array", "reservation"):
        return None
    if key in BOUNDS:
        return validate.integer(key, value, *BOUNDS[key], error=JobSpecError)
    if key == "time":
        validate.time_limit(key, value, error=JobSpecError)
        return value
    if key == "job_name":
        return validate.name(key, value, "job", error=JobSpecError)
    if key in ("partition", "reservation"):
        return validate.name(key, value, "slurm", error=JobSpecError)
    if key == "array":
        return validate.array_spec(key, value, error=JobSpecError)
    raise JobSpecError(f"{key}: not a resource; allowed: {', '.join(OPTIONS)}")


def env_partition() -> str | None:
    """SBATCH_PARTITION, checked as a partition name (one: a list is refused), or None."""
    value = os.environ.get("SBATCH_PARTITION")
    return validate.name("SBATCH_PARTITION", value, "slurm", error=JobSpecError) if value else None


def check(spec: JobSpec, cluster: Cluster) -> JobSpec:
    """Return ``spec`` with values converted and the partition filled in, or raise. No
    partition given: sbatch's own default, SBATCH_PARTITION (a hub server sets it, so the
    jobs its notebooks submit go where it went), else the cluster's default."""
    values = {f.name: check_value(f.name, getattr(spec, f.name)) for f in fields(JobSpec)}
    name = values["partition"] or env_partition() or cluster.default_partition.name
    try:
        part = cluster.partition(name)
    except ConfigError as exc:  # re-raised in this family, same message
        raise JobSpecError(str(exc), "partition") from None
    if values["nodes"] > len(part.nodes):
        raise JobSpecError(f"nodes: partition {name!r} has {len(part.nodes)} nodes, "
                           f"{values['nodes']} requested")
    have = cluster.partition_gpus(name)
    if values["gpus_per_node"] > have:
        with_gpus = [p.name for p in cluster.partitions if cluster.partition_gpus(p.name) > 0]
        where = ", ".join(with_gpus) if with_gpus else "none (this cluster has no GPUs)"
        raise JobSpecError(
            f"gpus_per_node: partition {name!r} has {have} GPUs per node, "
            f"{values['gpus_per_node']} requested; partitions with GPUs: {where}")
    limit = validate.time_limit("max_time", part.max_time, unlimited=True)
    wanted = validate.time_limit("time", values["time"], error=JobSpecError)
    if limit is not None and wanted is not None and wanted > limit:
        raise JobSpecError(f"time: {values['time']} is longer than partition {name!r} allows "
                           f"({part.max_time}); the job could never start")
    values["partition"] = name
    if values["tasks_per_node"] is None:  # the one place "one task per GPU" is written
        values["tasks_per_node"] = max(values["gpus_per_node"], 1)
    return JobSpec(**values)


def sbatch_options(spec: JobSpec, only: set[str] | None = None) -> dict[str, Any]:
    """sbatch option name -> value for a checked spec (no GPUs: no GPU option)."""
    out: dict[str, Any] = {}
    for key, (option, _) in OPTIONS.items():
        value = getattr(spec, key)
        if (only is not None and key not in only) or value is None:
            continue
        if key == "gpus_per_node" and value == 0:
            continue
        out[option] = value
    return out


def sbatch_args(spec: JobSpec, only: set[str] | None = None) -> list[str]:
    """``--option=value`` arguments for sbatch, sorted by option name."""
    return [f"--{k}={v}" for k, v in sorted(sbatch_options(spec, only).items())]


def submitit_parameters(spec: JobSpec) -> dict[str, Any]:
    """submitit's parameter names for a checked spec (time goes in as minutes; ``array``
    is skipped: submitit makes its own array from pyhpc.submit_array's items; so is
    ``reservation``: :func:`pyhpc.slurm.submit.submit_spec` passes the one it resolved)."""
    params: dict[str, Any] = {}
    for key, (_, param) in OPTIONS.items():
        value = getattr(spec, key)
        if param is None or value is None or (key == "gpus_per_node" and value == 0):
            continue
        if key == "time":
            seconds = validate.time_limit("time", value, error=JobSpecError) or 0
            params["timeout_min"] = max(1, -(-seconds // 60))
        else:
            params[param] = value
    return params
