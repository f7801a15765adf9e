"""Render the batch-job templates in slurm/jobs/ into sbatch scripts.

Jinja2 with StrictUndefined: a variable the template needs but was not given, or
one given that no template uses, is an error naming it. Every value printed with
``{{ }}`` is shell-quoted (the ``q`` filter, and a finalizer that quotes anything
that was not), and ``#SBATCH`` lines come from :func:`sbatch_lines`, sorted by key,
so the same inputs give the same bytes.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta

from pyhpc import paths
from pyhpc.cluster import Cluster
from pyhpc.jobspec import JobSpec, check

SUFFIX = ".sbatch.j2"
#: sbatch() keyword arguments that make up the resource request.
RESOURCE_KEYS = ("nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "partition", "time")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
SAFE_NAME_RE = re.compile(r"^[\w.+-]+$")
SAFE_CHARS_RE = re.compile(r"[^\w.+-]")


class RenderError(ValueError):
    """A template cannot be rendered; the message names the template and variable."""


class Quoted(str):
    """A string already safe to paste into a shell script."""


def q(value: Any) -> Quoted:
    """The ``q`` filter: shell-quote one value."""
    if isinstance(value, Quoted):
        return value
    return Quoted(shlex.quote(str(value)))


def qargs(value: Any) -> Quoted:
    """The ``qargs`` filter: split a string like a shell would, then quote each word."""
    words = value if isinstance(value, (list, tuple)) else shlex.split(str(value))
    return Quoted(" ".join(shlex.quote(str(w)) for w in words))


def sbatch_lines(cluster: Cluster, options: Mapping[str, Any]) -> Quoted:
    """``#SBATCH`` lines for ``options`` (None/False dropped, True is a bare flag), sorted."""
    opts = {k: v for k, v in options.items() if v is not None and v is not False and v != ""}
    resources = {k: opts[k] for k in RESOURCE_KEYS if k in opts}
    spec = check(JobSpec(
        nodes=resources.get("nodes", 1),
        tasks_per_node=resources.get("ntasks_per_node", 1),
        gpus_per_node=resources.get("gpus_per_node", 0),
        cpus_per_task=resources.get("cpus_per_task"),
        partition=resources.get("partition"),
        time=resources.get("time", "00:10:00"),
    ), cluster)
    opts["partition"] = spec.partition
    name = str(opts.get("job_name", ""))
    if "%x" in str(opts.get("output", "")) and not SAFE_NAME_RE.match(name):
        # slurmstepd fails to open a log path with quotes in it: spell a safe name instead.
        opts["output"] = str(opts["output"]).replace("%x", SAFE_CHARS_RE.sub("_", name) or "job")
    if str(opts.get("gpus_per_node", "0")) == "0":
        opts.pop("gpus_per_node", None)
    lines = []
    for key in sorted(k.replace("_", "-") for k in opts):
        value = opts[key.replace("-", "_")]
        if CONTROL_RE.search(str(value)):
            raise RenderError(f"{key.replace('-', '_')}: control characters (e.g. newlines) "
                              "are not allowed in #SBATCH values")
        lines.append(f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={q(value)}")
    return Quoted("\n".join(lines))


def _finalize(value: Any) -> Any:
    return value if isinstance(value, Quoted) else q(value)


def environment(cluster: Cluster, search: Iterable[Path] = ()) -> jinja2.Environment:
    """The Jinja2 environment used for every job template."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([*map(str, search), str(paths.SLURM_JOBS)]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
        autoescape=False,
    )
    env.filters["q"] = q
    env.filters["qargs"] = qargs
    env.globals["sbatch"] = lambda **opts: sbatch_lines(cluster, opts)
    env.globals["fail"] = _fail
    return env


def _fail(message: str) -> None:
    """Let a template refuse a value with its own message (e.g. an unknown runtime)."""
    raise RenderError(message)


def available() -> list[str]:
    """Names of the templates shipped in slurm/jobs/ (without the suffix)."""
    return sorted(p.name[: -len(SUFFIX)] for p in paths.SLURM_JOBS.glob(f"*{SUFFIX}"))


def _resolve(template: str) -> tuple[str, list[Path]]:
    """Template name for the loader, plus an extra search dir for a template given by path."""
    path = Path(template)
    if path.suffix == ".j2" and path.is_file():
        return path.name, [path.resolve().parent]
    name = template if template.endswith(SUFFIX) else template + SUFFIX
    if not (paths.SLURM_JOBS / name).is_file():
        raise RenderError(f"template: unknown template {template!r}; "
                          f"available: {', '.join(available())}")
    return name, []


def variables(env: jinja2.Environment, name: str) -> set[str]:
    """Every variable a template (and the templates it extends or includes) refers to."""
    seen: set[str] = set()
    found: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        assert env.loader is not None
        source = env.loader.get_source(env, current)[0]
        ast = env.parse(source)
        found |= meta.find_undeclared_variables(ast)
        todo.extend(t for t in meta.find_referenced_templates(ast) if t)
    return found - set(env.globals)


def render(template: str, values: Mapping[str, Any], cluster: Cluster) -> str:
    """Render ``template`` (a name in slurm/jobs/ or a path) with ``values``."""
    name, search = _resolve(template)
    env = environment(cluster, search)
    allowed = variables(env, name)
    for key in sorted(values):
        if key not in allowed:
            raise RenderError(f"{key}: unknown variable for template {name!r}; "
                              f"allowed: {', '.join(sorted(allowed))}")
    try:
        return env.get_template(name).render(dict(values))
    except jinja2.UndefinedError as exc:
        match = re.search(r"'([^']+)' is undefined", str(exc))
        var = match.group(1) if match else str(exc)
        raise RenderError(f"{var}: missing variable for template {name!r}; "
                          f"set it with --set {var}=VALUE") from None


def parse_sets(pairs: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` from ``--set`` into a dict; a pair without '=' is an error."""
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise RenderError(f"--set: expected KEY=VALUE, got {pair!r}")
        values[key.replace("-", "_")] = value
    return values
