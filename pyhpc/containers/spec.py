"""The framework image: containers/spec.yml rendered to a Containerfile or an Apptainer .def.

One spec, two outputs, same labels, environment, runscript and self-test. Rendering
is deterministic (sorted labels and environment, no timestamps), so the rendered
text is also the build cache key (see :mod:`pyhpc.containers.build`).

Spec values land in a Containerfile, an Apptainer definition, shell scripts, a Python
self-test and podman's env file, so they are checked twice: :func:`check_spec` checks
every field when the spec is loaded (names, versions, URLs, paths, one-line text), and
the templates quote each value for where it lands (``dq`` Containerfile strings, ``q``
shell words, ``py`` Python literals) while no rendered value may hold a line break or
a control character at all (the Jinja ``finalize`` hook), so no value can start a new
instruction, section, heredoc line or env entry.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from pyhpc import files, paths, validate, yamlio
from pyhpc.errors import PyhpcError, echo

FORMATS = {"oci": "Containerfile.j2", "apptainer": "apptainer.def.j2"}
#: Scripts baked into every image (also linted with shellcheck).
SCRIPTS = ("pyhpc-selftest", "pyhpc-entrypoint")
#: A pinned version (pip, Debian or CUDA): matched whole, at most VERSION_MAX characters.
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~:_-]*")
VERSION_RULE = "letters, digits and '.+~:_-', starting with a letter or digit"
VERSION_MAX = 128
PYTHON_RE = re.compile(r"[0-9]{1,2}\.[0-9]{1,3}")
DESCRIPTION_MAX = 200
ENV_VALUE_MAX = 1024
PATH_DEFAULT = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: validate.KINDS kind of pip and Debian package names (letters, digits, '._+-').
PACKAGE_KIND = "job"
#: The keys each mapping of the spec may hold.
SPEC_KEYS = ("environment", "mount_points", "name", "packages", "torch", "variants", "venv")
VARIANT_KEYS = ("base", "cuda", "description", "nccl", "python", "wheels")
BASE_KEYS = ("bootstrap", "image", "mirror", "packages", "sources", "suite")
WHEEL_KEYS = ("extra_index_url", "find_links", "index_url")


class ContainerError(PyhpcError):
    """The image spec or a render/build request is invalid; the message names the key."""


@dataclass(frozen=True)
class Variant:
    """One buildable image: the spec's shared pins plus one variant's base and CUDA."""

    name: str
    image: str
    description: str
    base: dict[str, Any]
    python: str
    cuda: str
    nccl: str
    torch: str
    packages: dict[str, str]
    environment: dict[str, str]
    venv: str
    wheels: dict[str, Any]
    spec_sha256: str
    #: Directories the container template mounts host paths on (see containers/spec.yml).
    mount_points: tuple[str, ...] = ()

    @property
    def base_packages(self) -> list[tuple[str, str]]:
        return sorted(self.base.get("packages", {}).items())

    @property
    def requirements(self) -> str:
        """requirements.txt baked into the image: every pip pin, torch included."""
        pins = sorted({**self.packages, "torch": self.torch}.items())
        return "".join(f"{name}=={version}\n" for name, version in pins)

    def labels(self) -> list[tuple[str, str]]:
        """Every pinned version, as OCI/Apptainer labels, sorted by key."""
        labels = {
            "org.opencontainers.image.title": self.image,
            "org.opencontainers.image.description": self.description,
            "org.opencontainers.image.base.name": self.base["image"],
            "org.pyhpc.variant": self.name,
            "org.pyhpc.spec.sha256": self.spec_sha256,
            "org.pyhpc.python": self.python,
            "org.pyhpc.torch": self.torch,
            "org.pyhpc.cuda": self.cuda,
            "org.pyhpc.nccl": self.nccl,
        }
        if "suite" in self.base:
            labels["org.pyhpc.base.suite"] = self.base["suite"]
        labels.update({f"org.pyhpc.pip.{k}": v for k, v in self.packages.items()})
        labels.update({f"org.pyhpc.deb.{k}": v for k, v in self.base_packages})
        return sorted(labels.items())

    def env(self) -> list[tuple[str, str]]:
        env = {**self.environment, "PATH": f"{self.venv}/bin:{PATH_DEFAULT}",
               "PYHPC_IMAGE": self.image, "PYHPC_IMAGE_VARIANT": self.name}
        return sorted(env.items())


def _what(value: object) -> str:
    """What a YAML value is, in words, for messages."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return type(value).__name__


def _mapping(where: str, value: object, keys: Iterable[str] | None = None) -> dict[Any, Any]:
    """``value`` if it is a mapping (holding only ``keys``, when given)."""
    if not isinstance(value, dict):
        raise ContainerError(f"{where}: must be a mapping (key: value), got {_what(value)}", where)
    if keys is not None:
        allowed = sorted(keys)
        for key in value:
            if key not in allowed:
                raise ContainerError(f"{where}: unknown key {echo(key)}; allowed: "
                                     f"{', '.join(allowed)}", where)
    return value


def _list(where: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise ContainerError(f"{where}: must be a list, got {_what(value)}", where)
    return value


def _need(where: str, data: dict[str, Any], key: str, what: str) -> Any:
    if not isinstance(data, dict) or data.get(key) in (None, "", {}, []):
        raise ContainerError(f"{where}.{key}: missing in containers/spec.yml ({what})",
                             f"{where}.{key}")
    return data[key]


def _text(where: str, value: object, max_len: int) -> str:
    """One line of printable text: no line break, tab or other control character."""
    if not isinstance(value, str) or len(value) > max_len or not value.isprintable():
        raise ContainerError(f"{where}: {echo(value)} is not allowed; allowed: one line of "
                             f"printable text, at most {max_len} characters", where)
    return value


def _version(where: str, value: Any, pattern: re.Pattern[str] = VERSION_RE,
             rule: str = VERSION_RULE) -> str:
    if not isinstance(value, str) or len(value) > VERSION_MAX or not pattern.fullmatch(value):
        raise ContainerError(f"{where}: {echo(value)} is not a pinned version (quote it, e.g. "
                             f"\"1.2.3\"); allowed: {rule}", where)
    return value


def _name(where: str, value: object, kind: str) -> str:
    return validate.name(where, value, kind, error=ContainerError)


def _pins(where: str, value: object) -> dict[str, str]:
    """A mapping of package name to pinned version."""
    return {_name(where, name, PACKAGE_KIND): _version(f"{where}.{name}", version)
            for name, version in _mapping(where, value).items()}


def _source(where: str, value: object) -> str:
    """One apt source line: ``deb URL SUITE COMPONENT...`` (mmdebstrap and sources.list)."""
    words = value.split(" ") if isinstance(value, str) else []
    if len(words) < 4 or words[0] not in ("deb", "deb-src"):
        raise ContainerError(f"{where}: {echo(value)} is not an apt source; allowed: "
                             "'deb URL SUITE COMPONENT...', single spaces between", where)
    _name(where, words[1], "url")
    for word in words[2:]:
        _name(where, word, "image")
    return str(value)


def _check_variant(where: str, value: object) -> None:
    var = _mapping(where, value, VARIANT_KEYS)
    if "description" in var:
        _text(f"{where}.description", var["description"], DESCRIPTION_MAX)
    base = _mapping(f"{where}.base", _need(where, var, "base", "base image reference"), BASE_KEYS)
    _name(f"{where}.base.image", _need(f"{where}.base", base, "image",
                                       "image reference, e.g. docker.io/nvidia/cuda:TAG"),
          "imageref")
    if "bootstrap" in base:
        if base["bootstrap"] != "mmdebstrap":
            raise ContainerError(f"{where}.base.bootstrap: {echo(base['bootstrap'])} is not "
                                 "allowed; allowed: mmdebstrap", f"{where}.base.bootstrap")
        for key in ("suite", "mirror", "sources", "packages"):
            _need(f"{where}.base", base, key, "needed to bootstrap the base")
    if "suite" in base:
        _name(f"{where}.base.suite", base["suite"], "image")
    if "mirror" in base:
        _name(f"{where}.base.mirror", base["mirror"], "url")
    if "sources" in base:
        for i, line in enumerate(_list(f"{where}.base.sources", base["sources"])):
            _source(f"{where}.base.sources[{i}]", line)
    _pins(f"{where}.base.packages", base.get("packages", {}))
    _version(f"{where}.python", _need(where, var, "python", "Python major.minor"), PYTHON_RE,
             "Python major.minor, e.g. \"3.11\"")
    for key in ("cuda", "nccl"):
        if key in var:
            _version(f"{where}.{key}", var[key])
    wheels = _mapping(f"{where}.wheels", _need(where, var, "wheels", "find_links and/or "
                                               "index_url for pip download"), WHEEL_KEYS)
    for i, link in enumerate(_list(f"{where}.wheels.find_links",
                                   wheels.get("find_links", []))):
        kind = "abspath" if isinstance(link, str) and link.startswith("/") else "url"
        _name(f"{where}.wheels.find_links[{i}]", link, kind)
    for key in ("index_url", "extra_index_url"):
        if key in wheels:
            _name(f"{where}.wheels.{key}", wheels[key], "url")


def _env_value(where: str, value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _text(where, value, ENV_VALUE_MAX)


def check_spec(spec: object) -> dict[str, Any]:
    """Check every field of a spec (as read from YAML); return it unchanged.

    Wrong types (a list where a mapping belongs, or the reverse), unknown keys, names,
    versions, URLs and paths of the wrong shape, and text with line breaks or control
    characters are each one :class:`ContainerError` naming the key.
    """
    data = _mapping("spec", spec, SPEC_KEYS)
    if "name" in data:
        _name("name", data["name"], "image")
    _version("torch", _need("spec", data, "torch", "the torch version"))
    _pins("packages", data.get("packages", {}))
    _name("venv", _need("spec", data, "venv", "virtualenv path in the image"), "abspath")
    for i, path in enumerate(_list("mount_points", data.get("mount_points", []))):
        _name(f"mount_points[{i}]", path, "abspath")
    for key, value in _mapping("environment", data.get("environment", {})).items():
        _env_value(f"environment.{_name('environment', key, 'env')}", value)
    variants = _mapping("variants", _need("spec", data, "variants",
                                          "mapping of variant name to settings"))
    for name, var in variants.items():
        _check_variant(f"variants.{_name('variants', name, 'image')}", var)
    return data


def load_spec(path: Path | None = None) -> dict[str, Any]:
    """The checked spec: ``path``, else $PYHPC_CONTAINER_SPEC, else containers/spec.yml."""
    path = path or Path(os.environ.get("PYHPC_CONTAINER_SPEC") or paths.CONTAINERS / "spec.yml")
    return check_spec(yamlio.load(path, "container spec", error=ContainerError))


def variant(name: str, spec: dict[str, Any] | None = None, torch: str | None = None) -> Variant:
    """Resolve variant ``name``; ``torch``, when given, must be the spec's torch version."""
    spec = check_spec(spec if spec is not None else load_spec())
    variants = spec["variants"]
    if name not in variants:
        raise ContainerError(f"variant: unknown variant {echo(name)}; allowed: "
                             f"{', '.join(sorted(variants))}", "variant")
    var = variants[name]
    pinned = spec["torch"]
    if torch is not None and torch != pinned:
        raise ContainerError(f"torch: version {echo(torch)} is not in containers/spec.yml; "
                             f"allowed: {pinned}", "torch")
    packages = _pins("packages", spec.get("packages", {}))
    environment = spec.get("environment", {})
    return Variant(
        name=name, image=f"{spec.get('name', 'pyhpc')}-{name}",
        description=var.get("description", name), base=var["base"], python=var["python"],
        cuda=var.get("cuda", "none"), nccl=var.get("nccl", "none"),
        torch=pinned, packages=dict(sorted(packages.items())),
        environment={k: _env_value(f"environment.{k}", v) for k, v in environment.items()},
        venv=spec["venv"], wheels=var["wheels"], mount_points=tuple(spec.get("mount_points", [])),
        spec_sha256=hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest())


def env_file(var: Variant) -> str:
    """The image's env file (``podman run --env-file``): one ``KEY=VALUE`` a line.

    Podman reads it line by line and unquoted, so a key or value that could split a line
    is refused here too, whatever reached the :class:`Variant`.
    """
    lines = []
    for key, value in var.env():
        _name("environment", key, "env")
        _text(f"environment.{key}", value, ENV_VALUE_MAX + 2048)
        lines.append(f"{key}={value}\n")
    return "".join(lines)


def _one_line(value: object) -> object:
    """Jinja ``finalize``: no rendered value may hold a line break or control character."""
    if isinstance(value, str) and not value.isprintable():
        raise ContainerError(f"render: {echo(value)} holds a line break or control character; "
                             "allowed: one line of printable text", "render")
    return value


def containerfile_quote(value: object) -> str:
    """A double-quoted Containerfile word (LABEL, ENV): ``\\``, ``"`` and ``$`` escaped."""
    return '"' + re.sub(r'([\\"$])', r"\\\1", str(value)) + '"'


def python_literal(value: object) -> str:
    """A double-quoted Python string literal of printable ASCII holding no ``'`` (so it is
    also safe inside a shell '...' word); any other character is a ``\\x``/``\\u``/``\\U``
    escape."""
    out = []
    for char in str(value):
        code = ord(char)
        if 0x20 <= code < 0x7F and char not in "\"'\\":
            out.append(char)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.CONTAINERS / "templates")),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, autoescape=False, finalize=_one_line)
    env.filters["dq"] = containerfile_quote
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["py"] = python_literal
    env.filters["pins"] = lambda pairs: " ".join(shlex.quote(f"{k}={v}") for k, v in pairs)
    return env


def _context(var: Variant) -> dict[str, Any]:
    return {
        "image": var.image, "variant": var.name, "base": var.base, "python": var.python,
        "cuda": var.cuda, "nccl": var.nccl, "torch": var.torch, "venv": var.venv,
        "mount_points": var.mount_points,
        "labels": var.labels(), "env": var.env(), "base_packages": var.base_packages,
        # Packages the Containerfile installs itself: those of a base not bootstrapped here.
        "os_packages": [] if var.base.get("bootstrap") else var.base_packages,
    }


def render(var: Variant, fmt: str) -> str:
    """The Containerfile (``oci``) or Apptainer definition (``apptainer``) of ``var``."""
    if fmt not in FORMATS:
        raise ContainerError(f"format: unknown format {echo(fmt)}; allowed: "
                             f"{', '.join(FORMATS)}", "format")
    return _environment().get_template(FORMATS[fmt]).render(_context(var))


def render_script(var: Variant, name: str) -> str:
    """One of :data:`SCRIPTS`, rendered for ``var``."""
    return _environment().get_template(f"{name}.j2").render(_context(var))


def _write_output(output: str, text: str) -> Path:
    """Write ``text`` to the file ``output`` atomically, privately, never through a link."""
    if not output.isprintable():
        raise ContainerError(f"output: {echo(output)} is not a usable file name", "output")
    path = Path(output)
    if os.path.isdir(output):
        raise ContainerError(f"output: {output} is a directory; give a file name", "output")
    if output.endswith(os.sep):
        raise ContainerError(f"output: directory {output} does not exist", "output")
    if not path.parent.exists():
        raise ContainerError(f"output: directory {path.parent} does not exist", "output")
    if not path.parent.is_dir():
        raise ContainerError(f"output: {path.parent} is not a directory", "output")
    try:
        return files.write_text(path, text, arg="output")
    except files.FileError as exc:
        raise ContainerError(str(exc), "output") from None


def render_variant(name: str, fmt: str, torch: str | None = None,
                   output: str | None = None) -> str:
    """``pyhpc containers render``: resolve variant ``name`` and render it as ``fmt``;
    with ``output``, also write the text to that file. Returns the text."""
    text = render(variant(name, torch=torch), fmt)
    if output is not None:
        _write_output(output, text)
    return text
