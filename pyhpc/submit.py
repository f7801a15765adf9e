"""Submit work to Slurm: a Python function through submitit, or a batch script via sbatch.

Both paths check the resource request against the cluster definition first
(:mod:`pyhpc.jobspec`), so a bad request submits nothing.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyhpc import paths
from pyhpc.cluster import Cluster, load
from pyhpc.jobspec import JobSpec, check

#: Where submitit keeps pickles and logs, and where rendered scripts are written.
DEFAULT_FOLDER = Path("pyhpc-jobs")


class SubmitError(ValueError):
    """Submission refused (missing script, sbatch error); the message names the argument."""


@dataclass(frozen=True)
class ScriptJob:
    """A job submitted with sbatch: its id and the script it runs."""

    job_id: str
    script: Path

    def state(self) -> str:
        from pyhpc import watch

        return watch.query([self.job_id])[self.job_id]

    def wait(self, timeout_s: float = 600.0) -> str:
        from pyhpc import watch

        return watch.watch([self.job_id], timeout_s=timeout_s, quiet=True)[self.job_id]

    def cancel(self) -> None:
        subprocess.run(["scancel", self.job_id], check=True)


class Distributed:
    """Wraps ``fn`` so every task joins torch.distributed (nccl with CUDA, else gloo).

    A submitit Checkpointable: on preemption or timeout the same call is requeued;
    ``fn`` is expected to resume from its own checkpoints (as pyhpc.train does).
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pyhpc import dist

        dist.setup()
        try:
            return self.fn(*args, **kwargs)
        finally:
            dist.teardown()

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def cluster_or_default(cluster: Cluster | None) -> Cluster:
    return cluster if cluster is not None else load(paths.cluster_file())


def submit(fn: Callable[..., Any], *args: Any, nodes: int = 1, tasks_per_node: int | None = None,
           gpus_per_node: int = 0, partition: str | None = None,
           cpus_per_task: int | None = None, timeout_min: int = 10, name: str = "pyhpc",
           folder: str | Path = DEFAULT_FOLDER / "%j", distributed: bool = True,
           cluster: Cluster | None = None, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` on ``nodes`` nodes; returns a submitit Job.

    ``tasks_per_node`` defaults to one task per GPU (one per node without GPUs).
    The partition defaults to the cluster's default, and GPUs are requested only
    where the partition has them; asking for more is an error, before any sbatch.
    """
    import submitit

    spec = check(JobSpec(nodes=nodes, tasks_per_node=tasks_per_node or max(gpus_per_node, 1),
                         gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task,
                         partition=partition), cluster_or_default(cluster))
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    params: dict[str, Any] = {
        "name": name, "nodes": spec.nodes, "tasks_per_node": spec.tasks_per_node,
        "timeout_min": timeout_min, "slurm_partition": spec.partition,
        "slurm_additional_parameters": {"requeue": True},
    }
    if spec.gpus_per_node:
        params["gpus_per_node"] = spec.gpus_per_node
    if spec.cpus_per_task:
        params["cpus_per_task"] = spec.cpus_per_task
    executor.update_parameters(**params)
    call = Distributed(fn) if distributed else fn
    return executor.submit(call, *args, **kwargs)


def resolve_function(target: str) -> Callable[..., Any]:
    """``module:function`` to the function object."""
    import importlib

    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SubmitError(f"target: cannot import module {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SubmitError(f"target: {module_name!r} has no function {attr!r}")
    return fn


def sbatch_args(spec: JobSpec) -> list[str]:
    """sbatch options for a checked resource request (they override the script's)."""
    args = [f"--nodes={spec.nodes}", f"--ntasks-per-node={spec.tasks_per_node}",
            f"--partition={spec.partition}"]
    if spec.gpus_per_node:
        args.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.cpus_per_task:
        args.append(f"--cpus-per-task={spec.cpus_per_task}")
    return args


def sbatch(script: str | Path, options: Sequence[str] = (), test_only: bool = False,
           runner: Callable[..., subprocess.CompletedProcess[str]] | None = None) -> str:
    """Submit an existing script; returns the job id (or sbatch's message with test_only)."""
    path = Path(script)
    if not path.is_file():
        raise SubmitError(f"script: no such file {str(script)!r}")
    cmd = ["sbatch", "--parsable", *(["--test-only"] if test_only else []), *options, str(path)]
    proc = (runner or subprocess.run)(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SubmitError(f"sbatch: {proc.stderr.strip() or proc.stdout.strip()}")
    if test_only:
        return proc.stderr.strip()
    return proc.stdout.strip().split(";")[0]


def submit_script(script: str | Path, spec: JobSpec | None = None,
                  cluster: Cluster | None = None, test_only: bool = False) -> ScriptJob:
    """sbatch an existing script; a ``spec`` (checked first) overrides its #SBATCH lines."""
    options = sbatch_args(check(spec, cluster_or_default(cluster))) if spec else []
    return ScriptJob(sbatch(script, options, test_only=test_only), Path(script))


def submit_template(template: str, values: dict[str, Any], cluster: Cluster | None = None,
                    test_only: bool = False) -> ScriptJob:
    """Render a job template (see :mod:`pyhpc.render`), save it, and sbatch it."""
    from pyhpc import render

    text = render.render(template, values, cluster_or_default(cluster))
    script = write_script(text, Path(template).name.split(".")[0])
    return ScriptJob(sbatch(script, test_only=test_only), script)


def write_script(text: str, name: str, folder: Path = DEFAULT_FOLDER / "scripts") -> Path:
    """Save a rendered script under a content-addressed name, so it can be read later."""
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = folder / f"{name}-{digest}.sbatch"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


class _CallableModule(types.ModuleType):
    """Lets ``pyhpc.submit(fn, ...)`` call :func:`submit` while ``pyhpc.submit`` stays a module."""

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return submit(fn, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
