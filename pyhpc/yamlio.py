"""Reading the YAML files people give pyhpc (cluster definitions, container specs).

PyYAML's safe loader constructs no objects, but it still expands aliases (a few hundred
bytes can become gigabytes) and lets a duplicate key silently win. This loader refuses
both, caps the file size, wants UTF-8 text, and reports every problem as one line that
names the file (and the line, where YAML knows it).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from pyhpc.errors import PyhpcError

#: Larger files are refused before they are read: a definition is a few KiB.
MAX_BYTES = 1 << 20


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without aliases and without duplicate keys."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in stubs
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, "mapping keys must be plain scalars", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _where(path: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)


def loads(text: str, path: Path, error: type[PyhpcError] = PyhpcError) -> Any:
    """Parse ``text`` (read from ``path``) strictly; a problem is one line naming the file."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{_where(path, exc)}: not valid YAML ({problem})", str(path)) from None
    except RecursionError:
        raise error(f"{path}: not valid YAML (nested too deeply)", str(path)) from None


def load(path: str | Path, what: str, error: type[PyhpcError] = PyhpcError) -> Any:
    """Read and parse the YAML file ``path`` (a ``what``, for messages)."""
    path = Path(path)
    try:
        # Without blocking, then only a regular file: a FIFO named here never hangs us.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise error(f"{path}: {what} is not a regular file", str(path))
            os.set_blocking(fh.fileno(), True)
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror})", str(path)) from None
    if len(data) > MAX_BYTES:
        raise error(f"{path}: {what} is larger than {MAX_BYTES >> 10} KiB", str(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: {what} is not UTF-8 text (byte {exc.start})", str(path)) from None
    if "\x00" in text:
        raise error(f"{path}: {what} is not text (it holds NUL bytes)", str(path))
    if not text.strip():
        raise error(f"{path}: {what} is empty", str(path))
    return loads(text, path, error)
