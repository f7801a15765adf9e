"""Whether a virtualenv already holds what its requirement files pin, without pip.

``python -I -m pyhpc.pins FILE...`` (the virtualenv's own python) exits 0 when every
``name==version`` of the files (and of the files they include with ``-r``) is installed at
that version, and what those require is installed, and what that requires; else it names the
first thing missing and exits 1. The deploy runs ``pip install -r`` only then: pip takes
about 2.5 s to find that nothing is to be done, this about 0.2 s. Where in doubt (a line it
cannot read, a requirement whose marker it cannot evaluate) it says no, and pip decides.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)\s*(?:#.*)?$")
NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> Iterator[tuple[str, str]]:
    """(name, version) of each pin; ValueError on a line that is not one."""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r "):
            yield from pins(path.parent / line[3:].strip())
        elif line.startswith(("-c ", "--")):
            continue  # constraints and pip options: not what the file asks to install
        elif match := PIN.match(line):
            yield match[1], match[2]
        else:
            raise ValueError(f"{path}: not a pin: {line}")


def _marker_holds(requirement: str) -> bool:
    """A requirement's environment marker, evaluated here (True where there is none)."""
    if ";" not in requirement:
        return True
    from pip._vendor.packaging.requirements import Requirement  # every venv has pip
    marker = Requirement(requirement).marker
    return marker is None or bool(marker.evaluate({"extra": ""}))


def missing(files: list[Path], path: list[str] | None = None) -> str | None:
    """The first pin, or requirement of a pinned distribution (and so on down), not
    installed (in ``path``, default sys.path); None when all are."""
    found = metadata.distributions() if path is None else metadata.distributions(path=path)
    installed = {canonical(d.metadata["Name"]): d for d in found}
    todo: list[str] = []
    for name, version in (pin for path in files for pin in pins(path)):
        dist = installed.get(canonical(name))
        got = "none" if dist is None else dist.version
        # PEP 440: a pin without a local label (+cpu) matches every local label.
        if (got if "+" in version else got.split("+")[0]) != version:
            return f"{name}=={version} (installed: {got})"
        todo.append(canonical(name))
    seen = set(todo)
    while todo:
        dist = installed[todo.pop()]
        for requirement in dist.requires or ():
            match = NAME.match(requirement)
            if match is None:
                return f"{dist.metadata['Name']} requires {requirement!r}"
            name = canonical(match[1])
            if name in seen or not _marker_holds(requirement):
                continue
            if name not in installed:
                return f"{match[1]} (required by {dist.metadata['Name']})"
            seen.add(name)
            todo.append(name)
    return None


def main(argv: list[str]) -> int:
    try:
        gap = missing([Path(a) for a in argv])
    except (OSError, ValueError) as exc:
        gap = str(exc)
    if gap is not None:
        print(f"pins: missing {gap}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
