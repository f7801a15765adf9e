"""What a task asks, as pyhpc.deploy's probes read it, and the shell commands they send.

Pure functions, no Ansible import: the unit tests import them in the test process, where
Ansible's import-time patches would break torch's.
"""
from __future__ import annotations

import base64
import binascii
import shlex
from typing import Any

#: A regular file's bytes (following a link, as the modules' open() does), in base64.
READ = 'f={path}; if [ -f "$f" ] && [ -r "$f" ]; then printf "file:"; base64 -w0 < "$f"; else echo other; fi'
#: One connect from bash, bounded as the wait_for module's first try is.
CONNECT = "timeout {seconds} bash -c 'exec 3<>\"/dev/tcp/$0/$1\"' {host} {port}"
WAIT_FOR = frozenset({"host", "port", "timeout", "connect_timeout", "state"})


def plain_path(path: Any) -> bool:
    """An absolute path the modules would not expand (type 'path': ~ and $VARS)."""
    return isinstance(path, str) and path.startswith("/") and "$" not in path and "~" not in path


def unknown(args: dict[str, Any], understood: frozenset[str]) -> bool:
    """Whether `args` sets an argument outside `understood`."""
    return any(value is not None for key, value in args.items() if key not in understood)


def read_line(path: str) -> str:
    """The shell command that prints a regular file's bytes (READ)."""
    return READ.format(path=shlex.quote(path))


def decode(stdout: str) -> bytes | None:
    """The bytes READ printed, or None for anything else."""
    if not stdout.startswith("file:"):
        return None
    try:
        return base64.b64decode(stdout[5:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


def connect_line(args: dict[str, Any]) -> str | None:
    """The shell command that connects once as wait_for would, or None where the module
    must run (a path, a search string, a delay, another state, a bad port)."""
    port, seconds = str(args.get("port", "")), str(args.get("connect_timeout") or 5)
    host = args.get("host") or "127.0.0.1"
    if unknown(args, WAIT_FOR) or args.get("state") not in (None, "started"):
        return None
    if not port.isdigit() or not 0 < int(port) < 65536 or not seconds.isdigit() or not isinstance(host, str):
        return None
    return CONNECT.format(seconds=int(seconds), host=shlex.quote(host), port=int(port))
