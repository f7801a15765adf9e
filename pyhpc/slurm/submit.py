"""Submit work to Slurm: a Python function through submitit, or a batch script via sbatch.

Every path checks the resource request against the cluster definition first
(:mod:`pyhpc.slurm.jobspec`), so a bad request submits nothing. ``pyhpc.submit`` is
:func:`submit`, exported by the package from this private module. Every job submitted
here (but the tasks of :func:`submit_array`) leaves a private record of what it takes to
submit it again (:mod:`pyhpc.slurm.records`; ``pyhpc resubmit``).
"""
from __future__ import annotations

import contextlib
import getpass
import hashlib
import io
import os
import re
import shlex
import sys
import time as _time
import time as clock
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pyhpc import dist, files, paths, validate
from pyhpc.cluster import Cluster, load
from pyhpc.errors import PyhpcError, echo
from pyhpc.slurm import jobspec, records, refusals, render, reservations, slurm, watch
from pyhpc.slurm.jobspec import JobSpec, check

#: Where submitit keeps pickles and logs, and where rendered scripts are written.
DEFAULT_FOLDER = Path("pyhpc-jobs")
FUNCTION_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
KINDS = ("template", "script", "function")
#: Largest script pyhpc keeps a copy of (slurmctld's default max_script_size).
SCRIPT_LIMIT = 4 * 1024 * 1024


class SubmitError(PyhpcError):
    """Submission refused (missing script, sbatch error); the message names the argument."""


@dataclass(frozen=True)
class ScriptJob:
    """A job submitted with sbatch: its id and the script it runs; ``note``: why pyhpc kept
    no record of it (empty when it did)."""

    job_id: str
    script: Path
    note: str = ""
    #: When it was submitted (this host's clock): a lost job is then LOST, not FINISHED.
    submitted: int = field(default_factory=lambda: int(_time.time()))

    def state(self) -> str:
        return watch.query([self.job_id])[self.job_id]

    def wait(self, timeout_s: float = 600.0) -> str:
        return watch.watch([self.job_id], timeout_s=timeout_s, quiet=True,
                           submitted={self.job_id: self.submitted})[self.job_id]

    def cancel(self) -> None:
        slurm.cancel([self.job_id])


class Distributed:
    """Wraps ``fn`` so every task joins torch.distributed (nccl with CUDA, else gloo).

    A submitit Checkpointable: on preemption or timeout the same call is requeued;
    ``fn`` is expected to resume from its own checkpoints (as pyhpc.train does).
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
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


def _refused(text: str, cluster: Cluster, choice: reservations.Choice) -> SubmitError:
    """sbatch's refusal as one line that says what to do (:mod:`pyhpc.slurm.refusals`)."""
    ctx = refusals.Context(getpass.getuser(), cluster.name, choice.partition, choice)
    return SubmitError(refusals.explain(text, ctx), "sbatch")


def reserve(spec: JobSpec) -> reservations.Choice:
    """The reservation a checked ``spec`` runs in (:func:`pyhpc.slurm.reservations.resolve`)."""
    return reservations.resolve(spec.reservation, spec.partition or "", getpass.getuser())


def job_folder(folder: str | Path) -> Path:
    """The submitit ``folder`` with its per-job part under a directory that passed the one
    check (:func:`pyhpc.files.make_dir`: the user's alone, created private): nobody else
    can plant a job's pickle there before submitit writes it, or read it after."""
    fixed = records.fixed_part(folder)
    root = files.make_dir(fixed, arg="folder")
    return root.joinpath(*Path(folder).parts[len(fixed.parts):])


def job_python() -> str:
    """The interpreter line of every submitit task: this Python with ``-P``, so the
    directory the job runs in is never on its import path (submitit starts tasks with
    ``python -m``, which would put it first). Your own modules come from PYTHONPATH or
    an installed package; :func:`job_setup` adds the submit directory when it is yours."""
    return f"{shlex.quote(sys.executable)} -P"


def job_setup() -> list[str]:
    """Lines the batch script runs before its tasks: the job templates' rendezvous
    (slurm/jobs/_rendezvous.sh.j2: the job's store, hosted by this Python, on a port it
    holds before any task learns it; submitit's own port is one any user could bind
    first), then the submit directory on PYTHONPATH only when it passes
    the one check (the user's alone), as ``python -m`` had it."""
    rendezvous = render.rendezvous_lines(sys.executable)
    here = Path.cwd()
    try:
        files.safe_dir(here, arg="cwd", writable=False)
    except files.FileError:
        return rendezvous
    return [*rendezvous, f"export PYTHONPATH={shlex.quote(str(here))}${{PYTHONPATH:+:$PYTHONPATH}}"]


def _executor(spec: JobSpec, folder: Path, reservation: str | None = None) -> Any:
    """A submitit executor for ``spec``, which :func:`~pyhpc.slurm.jobspec.check` has checked,
    writing in ``folder``, which :func:`job_folder` returned, in ``reservation``."""
    import submitit

    executor = submitit.AutoExecutor(folder=folder, cluster="slurm",
                                     slurm_python=job_python())
    executor.update_parameters(**jobspec.submitit_parameters(spec),
                               slurm_setup=job_setup(),
                               # A rank that dies ends the step, as in the job templates:
                               # the others would wait for it until the time limit.
                               slurm_srun_args=["--kill-on-bad-exit=1"],
                               slurm_additional_parameters={
                                   "requeue": True,
                                   **({"reservation": reservation} if reservation else {})})
    return executor


@contextlib.contextmanager
def _quiet_submitit() -> Any:
    """submitit prints sbatch's refusal to stderr before it raises it; pyhpc says it once,
    in its own line."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def submit_spec(call: Callable[..., Any], spec: JobSpec, folder: str | Path, cluster: Cluster,
                args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
                kind: str = "function", replaces: str | None = None) -> Any:
    """Submit ``call(*args, **kwargs)`` as a job of ``spec``, a spec that
    :func:`~pyhpc.slurm.jobspec.check` returned for ``cluster``: it reaches submitit as it
    is, checked once. Returns the submitit Job, whose record (``kind``: function, train or
    bench; ``replaces``: the job it submits again) names its folder and pickle."""
    import submitit

    pattern = job_folder(folder)
    choice = reserve(spec)
    executor = _executor(spec, pattern, choice.name)
    records.prepare(pattern)
    submitted = int(clock.time())
    try:
        with files.private_umask(), _quiet_submitit():  # private: its files, Slurm's logs
            job = executor.submit(call, *args, **(kwargs or {}))
    except submitit.core.utils.FailedJobError as exc:
        raise _refused(str(exc), cluster, choice) from None
    records.write(pattern, {
        "kind": kind, "job_id": str(job.job_id), "submitted": submitted, "cwd": os.getcwd(),
        "spec": asdict(spec), "folder": str(pattern), "job_folder": str(job.paths.folder),
        "pickle": str(job.paths.submitted_pickle), "replaces": replaces})
    return job


def _function_spec(spec: JobSpec | None, given: Mapping[str, Any], cluster: Cluster) -> JobSpec:
    """The checked spec of a function's job: ``spec`` with the resource keywords ``given``;
    its job name defaults to pyhpc. An array is pyhpc.submit_array's (one per item)."""
    wanted = jobspec.with_keywords(spec, given)
    if wanted.array is not None:
        raise SubmitError("array: a function's array is its items; call "
                          "pyhpc.submit_array(fn, items)", "array")
    return check(replace(wanted, job_name=wanted.job_name or "pyhpc"), cluster)


def submit(fn: Callable[..., Any], *args: Any, spec: JobSpec | None = None,
           folder: str | Path = DEFAULT_FOLDER / "%j", distributed: bool = True,
           cluster: Cluster | None = None, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` as a job of ``spec``; returns a submitit Job.

    The resources are a :class:`~pyhpc.slurm.jobspec.JobSpec`, or its fields as keywords
    (``nodes=2, gpus_per_node=1``; ``name`` for ``job_name``), which override the spec's;
    every other keyword is ``fn``'s. ``tasks_per_node`` defaults to one task per GPU (one
    per node without GPUs). The partition defaults to the cluster's default, and GPUs are
    requested only where the partition has them; asking for more is an error, before any
    sbatch. ``reservation`` defaults to SBATCH_RESERVATION, else the caller's one active one.
    """
    the_cluster = cluster_or_default(cluster)
    given, kwargs = jobspec.resources(kwargs)
    checked = _function_spec(spec, given, the_cluster)
    return submit_spec(Distributed(fn) if distributed else fn, checked, folder, the_cluster,
                       args, kwargs)


def submit_array(fn: Callable[[Any], Any], items: Sequence[Any], *, spec: JobSpec | None = None,
                 folder: str | Path = DEFAULT_FOLDER / "%j", parallelism: int = 256,
                 cluster: Cluster | None = None, **resources: Any) -> list[Any]:
    """Run ``fn(item)`` for every item as ONE Slurm job array (one sbatch, one pickle
    folder); returns a submitit Job per item. Far cheaper than a submit per item:
    slurmctld gets one request. ``parallelism`` caps the tasks running at once (1-100000).
    The resources are :func:`submit`'s: a JobSpec, or its fields as keywords.
    """
    import submitit

    if not items:
        raise SubmitError("items: nothing to submit (give at least one)", "items")
    the_cluster = cluster_or_default(cluster)
    checked = _function_spec(spec, resources, the_cluster)
    width = int(validate.number("parallelism", parallelism, 1, 100000, error=SubmitError))
    pattern = job_folder(folder)
    choice = reserve(checked)
    executor = _executor(checked, pattern, choice.name)
    executor.update_parameters(slurm_array_parallelism=width)
    try:
        with files.private_umask(), _quiet_submitit():
            return list(executor.map_array(fn, items))
    except submitit.core.utils.FailedJobError as exc:
        raise _refused(str(exc), the_cluster, choice) from None


def resolve_function(target: str) -> Callable[..., Any]:
    """``module:function`` to the function object."""
    import importlib

    if not FUNCTION_RE.fullmatch(target):
        raise SubmitError(f"target: {echo(target)} is not module:function")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SubmitError(f"target: cannot import module {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SubmitError(f"target: {module_name!r} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]  # checked callable above


def _option(options: Sequence[str], name: str) -> str | None:
    """The value of ``--NAME=VALUE`` in ``options`` (the last one), or None."""
    found = [o.split("=", 1)[1] for o in options if o.startswith(f"--{name}=")]
    return found[-1] if found else None


def script_choice(path: Path, options: Sequence[str], cluster: Cluster) -> reservations.Choice:
    """The reservation an sbatch of ``path`` with ``options`` runs in: one that they, or
    the script's own ``#SBATCH`` lines, name (checked); else the caller's one active one."""
    head = files.read_bytes(path, SCRIPT_LIMIT, "script").decode(errors="replace")
    own = reservations.script_options(head)
    partition = (_option(options, "partition") or own.get("partition")
                 or jobspec.env_partition() or cluster.default_partition.name)
    given = _option(options, "reservation")
    where = "reservation"
    if given is None and "reservation" in own and not os.environ.get("SBATCH_RESERVATION"):
        given, where = own["reservation"], "script: #SBATCH --reservation"
    return reservations.resolve(given, partition, getpass.getuser(), where)


def sbatch(script: str | Path, options: Sequence[str] = (), test_only: bool = False,
           cluster: Cluster | None = None) -> str:
    """Submit an existing script, in the reservation :func:`script_choice` finds; returns
    the job id (or sbatch's message with test_only)."""
    path = Path(script)
    if not path.is_file():
        raise SubmitError(f"script: no such file {echo(str(script))}")
    the_cluster = cluster_or_default(cluster)
    choice = script_choice(path, options, the_cluster)
    extra = ([f"--reservation={choice.name}"]
             if choice.name and _option(options, "reservation") is None else [])
    try:
        return slurm.sbatch(str(path), [*options, *extra], test_only=test_only)
    except slurm.Refused as exc:
        raise _refused(exc.said, the_cluster, choice) from None


def submit_script(script: str | Path, spec: JobSpec | None = None,
                  cluster: Cluster | None = None, test_only: bool = False,
                  only: set[str] | None = None, **resources: Any) -> ScriptJob:
    """sbatch an existing script; a ``spec`` (checked first) overrides its #SBATCH lines
    (all its fields, or the ``only`` ones the caller set). The resources are
    :func:`submit`'s keywords too: each given overrides its line, and only those do when
    no ``spec`` is given. The job's record keeps a copy of the script as it was submitted."""
    the_cluster = cluster_or_default(cluster)
    if resources:
        asked, _ = jobspec.resources(resources)
        if only is not None or spec is None:
            only = {*(only if only is not None else ()), *asked}
        spec = jobspec.with_keywords(spec, resources)
    checked = check(spec, the_cluster) if spec else None
    options = jobspec.sbatch_args(checked, only) if checked else []
    if test_only:
        return ScriptJob(sbatch(script, options, test_only, the_cluster), Path(script))
    if not Path(script).is_file():
        raise SubmitError(f"script: no such file {echo(str(script))}")
    data = files.read_bytes(script, SCRIPT_LIMIT, "script")
    job_id, note = sbatch_recorded(Path(script), data, "script", options, the_cluster, {
        "kind": "script", "spec": asdict(checked) if checked else None,
        "only": sorted(only) if only is not None else None, "replaces": None})
    return ScriptJob(job_id, Path(script), note)


def submit_template(template: str, values: Mapping[str, Any], cluster: Cluster | None = None,
                    test_only: bool = False, reservation: str | None = None) -> ScriptJob:
    """Render a job template (see :mod:`pyhpc.slurm.render`), save it, and sbatch it (in
    ``reservation``, given on sbatch's command line: a rendered script names none)."""

    the_cluster = cluster_or_default(cluster)
    text = render.render(template, values, the_cluster)
    script = write_script(text, Path(template).name.split(".")[0])
    options = [f"--reservation={reservation}"] if reservation else []
    if test_only:
        return ScriptJob(sbatch(script, options, test_only=True, cluster=the_cluster), script)
    job_id, note = sbatch_recorded(script, text.encode(), script.name.rsplit("-", 1)[0], options,
                                   the_cluster, {"kind": "template", "template": template,
                                                 "spec": None, "reservation": reservation,
                                                 "replaces": None})
    return ScriptJob(job_id, script, note)


def sbatch_recorded(script: Path, data: bytes, name: str, options: Sequence[str],
                    cluster: Cluster, fields: Mapping[str, Any]) -> tuple[str, str]:
    """sbatch ``script`` (whose bytes are ``data``), then keep the job's record: a copy
    of ``data`` under ``pyhpc-jobs/scripts`` (content-addressed, as ``name``) is what
    ``pyhpc resubmit`` sbatches again, with ``fields``'s spec. Returns the job id, and why
    no record was kept: a script runs from any directory, while pyhpc keeps records only
    in one that is yours alone."""
    try:
        records.prepare(DEFAULT_FOLDER)
        saved = save_script(data, name)
    except files.FileError as exc:
        return sbatch(script, options, cluster=cluster), (
            f"no record kept of this job, so pyhpc resubmit cannot submit it again ({exc})")
    submitted = int(clock.time())
    job_id = sbatch(script, options, cluster=cluster)
    records.write(DEFAULT_FOLDER, {**fields, "job_id": job_id, "submitted": submitted,
                                   "cwd": os.getcwd(), "script": str(saved),
                                   "sha256": hashlib.sha256(data).hexdigest()})
    return job_id, ""


def write_script(text: str, name: str, folder: Path = DEFAULT_FOLDER / "scripts") -> Path:
    """Save a rendered script under a content-addressed name, so it can be read later."""
    return save_script(text.encode(), name, folder)


def save_script(data: bytes, name: str, folder: Path = DEFAULT_FOLDER / "scripts") -> Path:
    """Save a script under a content-addressed name (``NAME-DIGEST.sbatch``).

    The folder must pass the one check (the caller's alone); the file is written afresh
    (atomically, replacing whatever was there, link or not) unless it already holds
    exactly ``data``, so a planted file of the same name is never what gets submitted.
    """
    folder = files.make_dir(folder, arg="folder")
    digest = hashlib.sha256(data).hexdigest()[:12]
    safe = validate.name("template", name, "job", error=SubmitError)
    path = folder / f"{safe}-{digest}.sbatch"
    if not _holds(path, data):
        files.write_with(path, lambda fh: fh.write(data), arg="folder")
    return path


def _holds(path: Path, data: bytes | str) -> bool:
    """Whether ``path`` is a regular file (not a link) of ours holding exactly ``data``."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        with files.open_regular(path) as fh:
            if os.fstat(fh.fileno()).st_uid != os.getuid():
                return False
            return fh.read(len(raw) + 1) == raw
    except files.FileError:
        return False


def target_kind(target: str) -> str:
    """What ``pyhpc submit TARGET`` names: a template, a script file or module:function.
    A shipped template's name always means the template, whatever the directory holds."""
    if target.removesuffix(render.SUFFIX) in render.available() and "/" not in target:
        return "template"
    if Path(target).is_file() and not target.endswith(".j2"):
        return "script"
    if target.endswith(".j2"):
        return "template"
    if FUNCTION_RE.fullmatch(target):
        return "function"
    return "script"


def submit_target(target: str, args: Sequence[str] = (), sets: Mapping[str, str] | None = None,
                  resources: Mapping[str, Any] | None = None, test_only: bool = False,
                  folder: str = str(DEFAULT_FOLDER / "%j"), cluster: Cluster | None = None,
                  ) -> dict[str, Any]:
    """``pyhpc submit``: a template, a script or a function, with resource overrides.

    ``resources`` holds only the job spec fields the user set; they are checked
    before anything else. Returns what was submitted (kind, target, job_id or
    test_only, script, and the array expression of a job array: its job_id is the
    array's, each task's is JOBID_TASK).
    """

    given = {k: jobspec.check_value(k, v) for k, v in (resources or {}).items()}
    kind = target_kind(target)
    result: dict[str, Any] = {"kind": kind, "target": target}
    the_cluster = cluster_or_default(cluster)
    if kind != "template" and sets:
        raise SubmitError(f"--set: only templates take variables; {echo(target)} is a {kind}")
    if kind != "function" and args:
        raise SubmitError(f"args: only module:function takes arguments; {echo(target)} "
                          f"is a {kind}")
    if kind == "function":
        if test_only:
            raise SubmitError("--test-only: not for module:function (submitit submits at once)")
        if given.get("array"):
            raise SubmitError("--array: not for module:function; for a job array of a "
                              "function call pyhpc.submit_array(fn, items) from Python")
        fn = resolve_function(target)
        spec = check(JobSpec(**{**given, "job_name": given.get("job_name") or target.split(":")[1]}),
                     the_cluster)
        job = submit_spec(Distributed(fn), spec, folder, the_cluster, args)
        return {**result, "job_id": str(job.job_id), "folder": str(Path(folder).parent)}
    if kind == "template":
        reservation = given.pop("reservation", None)
        handle = submit_template(target, {**(sets or {}), **given}, the_cluster, test_only,
                                 reservation)
    else:
        if not Path(target).is_file():
            raise SubmitError(f"script: no such file {echo(target)} (and no template of that "
                              f"name; templates: {', '.join(render.available())})")
        spec = JobSpec(**given)
        handle = submit_script(target, spec, the_cluster, test_only, only=set(given))
    key = "test_only" if test_only else "job_id"
    if given.get("array"):
        result["array"] = given["array"]
    if handle.note:
        result["note"] = handle.note
    return {**result, "script": str(handle.script), key: handle.job_id}


#: srun's own line for a task the cgroup killed ("srun: error: cpu1: task 0: Out Of Memory").
#: Accounting keeps OUT_OF_MEMORY only for a step that ended on one node: across nodes
#: Slurm 22.05 records the step FAILED, after the killed task's peers exit 1.
SRUN_OOM = re.compile(rb"^srun: error: (\S+): tasks? ([\d,-]+): Out Of Memory$", re.M)
#: How much of the end of each log file is read for it.
OOM_TAIL_BYTES = 1 << 20


def submitit_logs(job_dir: Path) -> list[Path]:
    """submitit's log files in one job's folder (``*_log.out``, ``*_log.err``), sorted."""
    return sorted(job_dir.glob("*_log.*")) if job_dir.is_dir() else []


def oom_killed_tasks(log_dir: Path) -> list[str]:
    """``node: task N`` for each task srun reported killed for memory, from the ends of the
    job's own ``*_log.err`` files in ``log_dir`` (regular files only, links never followed)."""
    found: list[str] = []
    for path in (p for p in submitit_logs(log_dir) if p.name.endswith("_log.err")):
        fh, _ = files.try_open_regular(path)
        if fh is None:
            continue
        with fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - OOM_TAIL_BYTES))
            data = fh.read(OOM_TAIL_BYTES)
        for node, tasks in SRUN_OOM.findall(data):
            line = f"{node.decode(errors='replace')}: task {tasks.decode()}"
            if line not in found:
                found.append(line)
    return found


def job_logs(job_id: str) -> list[Path]:
    """A job's output files: what Slurm says (StdOut, StdErr), then submitit's logs."""
    found = [Path(p) for p in slurm.output_paths(job_id)]
    found += submitit_logs(DEFAULT_FOLDER / job_id)
    logs = [p for p in dict.fromkeys(found) if p.is_file()]
    if not logs:
        raise SubmitError(f"job_id: no log files found for job {job_id!r}")
    return logs
