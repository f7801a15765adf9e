"""Whether lineinfile, replace or blockinfile would leave a file's bytes as they are: each
module's own decision, redone on the controller over the bytes the probe read.

Only the arguments below are understood; any other (insertafter, backrefs, create, owner,
mode, validate, ...) returns None and the module decides. The regular expressions run in
the controller's Python, the modules' in the host's: the same `re` for the patterns here.
Pure: no Ansible import (probed.py holds the action).
"""
from __future__ import annotations

import io
import re
from typing import Any

from ansible_collections.pyhpc.deploy.plugins.plugin_utils.asked import plain_path, unknown

COMMON = frozenset({"path", "dest", "destfile", "name", "state", "unsafe_writes"})
LINEINFILE = COMMON | {"regexp", "regex", "line", "value"}
REPLACE = COMMON | {"regexp", "replace", "encoding"}
BLOCKINFILE = COMMON | {"marker", "block", "content", "marker_begin", "marker_end"}


def path_of(args: dict[str, Any]) -> str | None:
    """The file the task edits, where the probe may read it."""
    given = [args[key] for key in ("path", "dest", "destfile", "name") if args.get(key) is not None]
    return given[0] if len(given) == 1 and plain_path(given[0]) else None


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _one(args: dict[str, Any], *names: str) -> Any:
    given = [args[key] for key in names if args.get(key) is not None]
    return given[0] if len(given) == 1 else None


def lineinfile(args: dict[str, Any], content: bytes) -> dict[str, Any] | None:
    """lineinfile's unchanged answer (state present, a regexp and a line), or None. The
    module replaces the last line the regexp matches, or, where none does, the last line
    equal to `line`, and adds the line where neither is found."""
    regexp, line = _one(args, "regexp", "regex"), _one(args, "line", "value")
    if unknown(args, LINEINFILE) or args.get("state") not in (None, "present"):
        return None
    if not isinstance(regexp, str) or not regexp or not isinstance(line, str):
        return None
    try:
        pattern = re.compile(_bytes(regexp))
    except re.error:
        return None
    lines, wanted = io.BytesIO(content).readlines(), _bytes(line)  # as the module reads them
    found = [n for n, cur in enumerate(lines) if pattern.search(cur)]
    found = found or [n for n, cur in enumerate(lines) if cur.rstrip(b"\r\n") == wanted]
    new = wanted if wanted.endswith(b"\n") else wanted + b"\n"
    if not found or lines[found[-1]] != new:
        return None
    return {"changed": False, "msg": "", "backup": ""}


def replace(args: dict[str, Any], content: bytes) -> dict[str, Any] | None:
    """replace's unchanged answer (a regexp and its replacement over the whole file), or
    None: the module changes the file where re.subn gives other text."""
    regexp, by = args.get("regexp"), args.get("replace") or ""
    if unknown(args, REPLACE) or args.get("encoding") not in (None, "utf-8"):
        return None
    if not isinstance(regexp, str) or not isinstance(by, str):
        return None
    text = content.decode("utf-8", "surrogateescape")
    try:
        done, count = re.subn(re.compile(regexp, re.MULTILINE), by, text, count=0)
    except re.error:
        return None
    if count > 0 and done != text:
        return None
    return {"changed": False, "msg": "", "rc": 0}


def blockinfile(args: dict[str, Any], content: bytes) -> dict[str, Any] | None:
    """blockinfile's unchanged answer (state present, the block at its markers or the end of
    the file), or None: the module's result, rebuilt, must be the file's bytes."""
    if unknown(args, BLOCKINFILE) or args.get("state") not in (None, "present"):
        return None
    marker = args.get("marker") or "# {mark} ANSIBLE MANAGED BLOCK"
    block = _one(args, "block", "content") or ""
    begin, end = args.get("marker_begin") or "BEGIN", args.get("marker_end") or "END"
    if not all(isinstance(value, str) for value in (marker, block, begin, end)) or not block:
        return None
    if "\\" in begin + end:  # the module puts them in with re.sub, escapes and all
        return None
    first = _bytes(marker.replace("{mark}", begin)) + b"\n"
    last = _bytes(marker.replace("{mark}", end)) + b"\n"
    body = _bytes(block if block.endswith("\n") else block + "\n")
    lines = content.splitlines(True)
    starts = [n for n, cur in enumerate(lines) if cur == first]
    ends = [n for n, cur in enumerate(lines) if cur == last]
    if not starts or not ends:
        return None
    low, high = sorted((starts[-1], ends[-1]))
    rebuilt = lines[:low]
    if rebuilt and not rebuilt[-1].endswith(b"\n"):
        return None
    rebuilt += [first, *body.splitlines(True), last, *lines[high + 1:]]
    if b"".join(rebuilt) != content:
        return None
    return {"changed": False, "msg": ""}

