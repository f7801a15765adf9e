"""The framework image: containers/spec.yml rendered to a Containerfile or an Apptainer .def.

One spec, two outputs, same labels, environment, runscript and self-test. Rendering
is deterministic (sorted labels and environment, no timestamps), so the rendered
text is also the build cache key (see :mod:`pyhpc.container_build`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from pyhpc import paths

FORMATS = {"oci": "Containerfile.j2", "apptainer": "apptainer.def.j2"}
#: Scripts baked into every image (also linted with shellcheck).
SCRIPTS = ("pyhpc-selftest", "pyhpc-entrypoint")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+~:_-]*$")
PATH_DEFAULT = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ContainerError(Exception):
    """The image spec or a render/build request is invalid; the message names it."""


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


def _need(where: str, data: dict[str, Any], key: str, what: str) -> Any:
    if not isinstance(data, dict) or data.get(key) in (None, "", {}, []):
        raise ContainerError(f"{where}.{key}: missing in containers/spec.yml ({what})")
    return data[key]


def _version(where: str, value: Any) -> str:
    if not isinstance(value, str) or not VERSION_RE.match(value):
        raise ContainerError(f"{where}: {value!r} is not a pinned version (quote it, e.g. \"1.2.3\")")
    return value


def load_spec(path: Path | None = None) -> dict[str, Any]:
    """The raw spec: ``path``, else $PYHPC_CONTAINER_SPEC, else containers/spec.yml."""
    path = path or Path(os.environ.get("PYHPC_CONTAINER_SPEC") or paths.CONTAINERS / "spec.yml")
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ContainerError(f"spec: cannot read {path}: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise ContainerError(f"spec: {path} is not a mapping")
    return data


def variant(name: str, spec: dict[str, Any] | None = None, torch: str | None = None) -> Variant:
    """Resolve variant ``name``; ``torch``, when given, must be the spec's torch version."""
    spec = spec if spec is not None else load_spec()
    variants = _need("spec", spec, "variants", "mapping of variant name to settings")
    if name not in variants:
        raise ContainerError(f"variant: unknown variant {name!r}; allowed: {', '.join(sorted(variants))}")
    where = f"variants.{name}"
    var = variants[name] or {}
    base = _need(where, var, "base", "base image reference")
    _need(f"{where}.base", base, "image", "image reference, e.g. docker.io/nvidia/cuda:TAG")
    if base.get("bootstrap"):
        if base["bootstrap"] != "mmdebstrap":
            raise ContainerError(f"{where}.base.bootstrap: {base['bootstrap']!r} is not allowed; "
                                 "allowed: mmdebstrap")
        for key in ("suite", "mirror", "sources", "packages"):
            _need(f"{where}.base", base, key, "needed to bootstrap the base")
    for pkg, ver in base.get("packages", {}).items():
        _version(f"{where}.base.packages.{pkg}", ver)
    pinned = _version("torch", _need("spec", spec, "torch", "the torch version"))
    if torch is not None and torch != pinned:
        raise ContainerError(f"torch: version {torch!r} is not in containers/spec.yml; allowed: {pinned}")
    packages = {k: _version(f"packages.{k}", v) for k, v in spec.get("packages", {}).items()}
    wheels = _need(where, var, "wheels", "find_links and/or index_url for pip download")
    return Variant(
        name=name, image=f"{spec.get('name', 'pyhpc')}-{name}",
        description=str(var.get("description", name)), base=base,
        python=_version(f"{where}.python", _need(where, var, "python", "Python major.minor")),
        cuda=_version(f"{where}.cuda", var.get("cuda", "none")),
        nccl=_version(f"{where}.nccl", var.get("nccl", "none")),
        torch=pinned, packages=dict(sorted(packages.items())),
        environment={str(k): str(v) for k, v in spec.get("environment", {}).items()},
        venv=_need("spec", spec, "venv", "virtualenv path in the image"), wheels=wheels,
        spec_sha256=hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest())


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.CONTAINERS / "templates")),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["dq"] = lambda v: json.dumps(str(v))
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["pins"] = lambda pairs: " ".join(shlex.quote(f"{k}={v}") for k, v in pairs)
    return env


def _context(var: Variant) -> dict[str, Any]:
    return {
        "image": var.image, "variant": var.name, "base": var.base, "python": var.python,
        "cuda": var.cuda, "nccl": var.nccl, "torch": var.torch, "venv": var.venv,
        "labels": var.labels(), "env": var.env(), "base_packages": var.base_packages,
        # Packages the Containerfile installs itself: those of a base not bootstrapped here.
        "os_packages": [] if var.base.get("bootstrap") else var.base_packages,
    }


def render(var: Variant, fmt: str) -> str:
    """The Containerfile (``oci``) or Apptainer definition (``apptainer``) of ``var``."""
    if fmt not in FORMATS:
        raise ContainerError(f"format: unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    return _environment().get_template(FORMATS[fmt]).render(_context(var))


def render_script(var: Variant, name: str) -> str:
    """One of :data:`SCRIPTS`, rendered for ``var``."""
    return _environment().get_template(f"{name}.j2").render(_context(var))
