"""Render the batch-job templates in slurm/jobs/ into sbatch scripts.

Jinja2's sandbox (a template is text, never code that runs) with StrictUndefined: a
variable the template needs but was not given, or one given that no template uses, is an
error naming it. Every value printed with ``{{ }}`` is shell-quoted (the ``q`` filter,
and a finalizer that quotes anything that was not), and ``#SBATCH`` lines come from
:func:`sbatch_lines`, sorted by key, so the same inputs give the same bytes.
"""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pyhpc import files, paths, validate
from pyhpc.cluster import Cluster
from pyhpc.dist import launch
from pyhpc.errors import PyhpcError, echo
from pyhpc.slurm import jobspec
from pyhpc.slurm.jobspec import JobSpec, check

SUFFIX = ".sbatch.j2"
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
#: Longest value one variable may have.
MAX_VALUE = 4096
#: Most array tasks (Slurm's default MaxArraySize is 1001).
MAX_ARRAY_TASKS = 1001


class RenderError(PyhpcError):
    """A template cannot be rendered; the message names the template and variable."""


class Quoted(str):
    """A string already safe to paste into a shell script."""


def _int_var(low: int, high: int) -> Callable[[str, str], str]:
    return lambda key, value: str(validate.integer(key, value, low, high, error=RenderError))


def _name_var(kind: str) -> Callable[[str, str], str]:
    return lambda key, value: validate.name(key, value, kind, error=RenderError)


def _time_var(key: str, value: str) -> str:
    validate.time_limit(key, value, error=RenderError)
    return value


def _array_var(key: str, value: str) -> str:
    return validate.array_spec(key, value, error=RenderError)


def _image_var(key: str, value: str) -> str:
    """A path (podman's image dir, a .sif) or an image reference (enroot)."""
    try:
        return validate.name(key, value, "path", error=RenderError)
    except RenderError:
        return validate.name(key, value, "imageref", error=RenderError)


def _paths_var(key: str, value: str) -> str:
    for i, item in enumerate(v for v in value.split(",") if v):
        validate.name(f"{key}[{i}]", item, "abspath", error=RenderError)
    return value


#: Variables with a type, checked before any template sees them (a template's
#: ``|int`` would quietly turn ``abc`` or ``inf`` into 0). The resource variables
#: take their bounds from the job spec; the rest are declared here.
VARIABLES: dict[str, Callable[[str, str], str]] = {
    **{key: _int_var(*bounds) for key, bounds in jobspec.BOUNDS.items()},
    "nproc_per_node": _int_var(1, 1024),
    "concurrency": _int_var(1, MAX_ARRAY_TASKS),
    "port": _int_var(1024, 65535),
    "time": _time_var,
    "array": _array_var,
    "job_name": _name_var("job"),
    "partition": _name_var("slurm"),
    "python": _name_var("path"),
    "script": _name_var("path"),
    "image": _image_var,
    "output": _name_var("path"),
    "module": _name_var("module"),
    "src": _name_var("abspath"),
    "binds": _paths_var,
    "login_host": _name_var("host"),
}


def check_values(values: Mapping[str, Any]) -> dict[str, str]:
    """Every value as a string, checked: no control characters, bounded, typed ones typed."""
    out: dict[str, str] = {}
    for key, value in values.items():
        text = str(value)
        if len(text) > MAX_VALUE:
            raise RenderError(f"{key}: longer than {MAX_VALUE} characters")
        if CONTROL_RE.search(text):
            raise RenderError(f"{key}: control characters (e.g. newlines) are not allowed, "
                              f"got {echo(text)}")
        out[key] = VARIABLES[key](key, text) if key in VARIABLES else text
    if "script" in out and "module" in out:
        raise RenderError("script: give script or module, not both")
    return out


def q(value: Any) -> Quoted:
    """The ``q`` filter: shell-quote one value."""
    if isinstance(value, Quoted):
        return value
    return Quoted(shlex.quote(str(value)))


def _split(value: Any, key: str) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(w) for w in value]
    try:
        return shlex.split(str(value))
    except ValueError as exc:
        raise RenderError(f"{key}: cannot split {echo(str(value))} into words ({exc}); "
                          "quote like a shell would") from None


def qargs(value: Any, key: str = "args") -> Quoted:
    """The ``qargs`` filter: split a string like a shell would, then quote each word."""
    return Quoted(" ".join(shlex.quote(w) for w in _split(value, key)))


def qcmd(value: Any, key: str = "command") -> Quoted:
    """The ``qcmd`` filter: ``qargs`` for a command line, whose first word is no option."""
    words = _split(value, key)
    if not words or words[0].startswith("-"):
        raise RenderError(f"{key}: must start with a program, not {echo(words[0] if words else '')}")
    return Quoted(" ".join(shlex.quote(w) for w in words))


def array_values(text: str, key: str = "values") -> list[str]:
    """Comma-separated values; an item ``N-M`` of integers stands for N, N+1, ..., M."""
    items: list[str] = []
    for item in text.split(","):
        lo, sep, hi = item.partition("-")
        if sep and lo.isdigit() and hi.isdigit() and len(lo) < 10 and len(hi) < 10:
            if int(hi) < int(lo) or int(hi) - int(lo) >= MAX_ARRAY_TASKS:
                raise RenderError(f"{key}: range {item} must go up and have at most "
                                  f"{MAX_ARRAY_TASKS} values")
            items += [str(n) for n in range(int(lo), int(hi) + 1)]
        else:
            items.append(item)
        if len(items) > MAX_ARRAY_TASKS:
            raise RenderError(f"{key}: at most {MAX_ARRAY_TASKS} values (one array task each)")
    return items


def sbatch_lines(cluster: Cluster, options: Mapping[str, Any]) -> Quoted:
    """``#SBATCH`` lines: the job spec's fields through its one table, other options
    (None/False dropped, True a bare flag) by name; sorted."""
    opts = {k: v for k, v in options.items() if v is not None and v is not False and v != ""}
    given = {k: opts.pop(k) for k in list(opts) if k in jobspec.OPTIONS}
    spec = check(JobSpec(**given), cluster)
    lines = {f"--{k}={q(v)}" for k, v in jobspec.sbatch_options(spec).items()}
    for key, value in opts.items():
        if CONTROL_RE.search(str(value)):
            raise RenderError(f"{key}: control characters (e.g. newlines) "
                              "are not allowed in #SBATCH values")
        option = key.replace("_", "-")
        lines.add(f"--{option}" if value is True else f"--{option}={q(value)}")
    return Quoted("\n".join(f"#SBATCH {line}" for line in sorted(lines)))


def _finalize(value: Any) -> Any:
    return value if isinstance(value, Quoted) else q(value)


def environment(cluster: Cluster, own: Path | None = None,
                source: str = "") -> jinja2.Environment:
    """The Jinja2 environment of every job template: sandboxed (a template can call no
    Python beyond the filters and globals below, nor reach an object's internals), so
    rendering a colleague's template only ever prints text. Templates load from
    slurm/jobs/; ``own`` (a user's template, named by its path) is one more template, under
    its absolute path, with ``source`` as its text: it may extend or include the shipped
    ones, and a shipped name always means the shipped template."""
    loaders: list[jinja2.BaseLoader] = [jinja2.FileSystemLoader(str(paths.SLURM_JOBS))]
    if own is not None:
        key = str(own)
        loaders.insert(0, jinja2.FunctionLoader(
            lambda name: (source, None, lambda: True) if name == key else None))
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
        autoescape=False,
    )
    env.filters["q"] = q
    env.filters["qargs"] = qargs
    env.filters["qcmd"] = qcmd
    env.filters["array_values"] = array_values
    env.globals["sbatch"] = lambda **opts: sbatch_lines(cluster, opts)
    env.globals["fail"] = _fail
    env.globals["default_time"] = jobspec.DEFAULT_TIME
    env.globals["launch_py"] = Quoted(launcher_source())
    env.globals["store_start_s"] = launch.STORE_START_S
    return env


def launcher_source() -> str:
    """pyhpc/dist/launch.py's text, which every distributed job script carries (in a quoted
    heredoc: it reaches the tasks' Python unchanged), so the tasks need no pyhpc."""
    return Path(launch.__file__).read_text().rstrip("\n")


def rendezvous_lines(python: str) -> list[str]:
    """The job templates' rendezvous (slurm/jobs/_rendezvous.sh.j2) for a batch script
    pyhpc does not render itself (submitit's), with ``python`` hosting the store."""
    env = environment(None)  # type: ignore[arg-type]  # the snippet calls no sbatch()
    return env.get_template("_rendezvous.sh.j2").render(python=python).splitlines()


def _fail(message: str) -> None:
    """Let a template refuse a value with its own message (e.g. an unknown runtime)."""
    raise RenderError(message)


def available() -> list[str]:
    """Names of the templates shipped in slurm/jobs/ (without the suffix)."""
    return sorted(p.name[: -len(SUFFIX)] for p in paths.SLURM_JOBS.glob(f"*{SUFFIX}"))


#: Largest template file of a user's that is read.
MAX_TEMPLATE_BYTES = 1 << 20


def _resolve(template: str) -> tuple[str, Path | None, str]:
    """The loader's name for ``template``, and for a user's template its path and text.

    A shipped name (``single``, ``single.sbatch.j2``) always means the shipped template,
    whatever files the current directory holds; any other template is used only when
    named by a path (``./mine.sbatch.j2``, with a '/'), and is read once, as a regular file.
    """
    name = template if template.endswith(SUFFIX) else template + SUFFIX
    if "/" not in template:
        if not (paths.SLURM_JOBS / name).is_file():
            raise RenderError(f"template: unknown template {echo(template)}; available: "
                              f"{', '.join(available())} (a template of your own: name its "
                              "path, e.g. ./mine.sbatch.j2)")
        return name, None, ""
    if not template.endswith(".j2"):
        raise RenderError(f"template: {echo(template)} is not a template; a template of "
                          "your own is a file whose name ends in .j2")
    own = Path(os.path.abspath(template))
    try:
        data = files.read_bytes(own, MAX_TEMPLATE_BYTES, "template")
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RenderError(f"template: {echo(template)} is not UTF-8 text") from None
    return str(own), own, text


def variables(env: jinja2.Environment, name: str) -> set[str]:
    """Every variable a template (and the templates it extends or includes) refers to."""
    seen: set[str] = set()
    found: set[str] = set()
    assigned: set[str] = set()
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
        for assign in ast.find_all(nodes.Assign):  # {% set x = ... %}: not a variable
            targets = [assign.target, *assign.target.find_all(nodes.Name)]
            assigned |= {t.name for t in targets if isinstance(t, nodes.Name)}
        todo.extend(t for t in meta.find_referenced_templates(ast) if t)
    return found - set(env.globals) - assigned


def render(template: str, values: Mapping[str, Any], cluster: Cluster) -> str:
    """Render ``template`` (a name in slurm/jobs/ or a path) with ``values``."""
    name, own, source = _resolve(template)
    env = environment(cluster, own, source)
    label = Path(name).name  # a user's template by its file name, as a shipped one
    try:
        allowed = variables(env, name)
        for key in sorted(values):
            if key not in allowed:
                shown = key if key.isidentifier() and len(key) <= 40 else echo(key)
                raise RenderError(f"{shown}: unknown variable for template {label!r}; "
                                  f"allowed: {', '.join(sorted(allowed))}")
        checked = check_values(values)
        return env.get_template(name).render(checked)
    except jinja2.UndefinedError as exc:
        match = re.search(r"'([^']+)' is undefined", str(exc))
        var = match.group(1) if match else str(exc)
        raise RenderError(f"{var}: missing variable for template {label!r}; "
                          f"set it with --set {var}=VALUE") from None
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"template: {exc.filename or label}:{exc.lineno}: "
                          f"{exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise RenderError(f"template: {label!r} includes {exc.name!r}, which does not "
                          "exist") from None
    except SecurityError as exc:
        raise RenderError(f"template: {label!r} tried what a template may not "
                          f"({echo(str(exc))}); templates only print text") from None
    except PyhpcError:
        raise
    except Exception as exc:  # raised by a user's template while rendering
        raise RenderError(f"template: {label!r} failed while rendering "
                          f"({type(exc).__name__}: {echo(str(exc))})") from None


def parse_sets(pairs: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` from ``--set`` into a dict; a pair without '=' is an error."""
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise RenderError(f"--set: expected KEY=VALUE, got {echo(pair)}")
        values[key.replace("-", "_")] = value
    return values

