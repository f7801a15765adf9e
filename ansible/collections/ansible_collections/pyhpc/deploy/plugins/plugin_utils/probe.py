"""What a path on a host is, asked in one shell command instead of a module run.

The builtin copy, template and file actions ask through Ansible's stat and file modules:
a new Python with Ansible's module code for each, about 0.2 s on a 2-core host, on every
re-run, for every file that is already right. PROBE asks ``sh`` for the path's type,
owner, group and mode (and a plain file's SHA-1). ``settled`` then says whether the file
module, given these arguments, would change nothing; where it cannot tell (a link, a
symbolic mode, SELinux or attribute options, an unknown argument) it answers None, and the
action runs the module, so every write, and every check not understood here, is Ansible's.
"""
from __future__ import annotations

import posixpath
import re
import shlex
from typing import Any

PROBE = ('f={path}; if [ -h "$f" ]; then echo other; '
         'elif [ -f "$f" ]; then stat -c "file %u %g %U %G %a" -- "$f" && sha1sum < "$f"; '
         'elif [ -d "$f" ]; then stat -c "directory %u %g %U %G %a" -- "$f"; '
         'elif [ -e "$f" ]; then echo other; else echo absent; fi')
#: The file module's arguments understood here; any other one set takes the module.
UNDERSTOOD = frozenset({"dest", "path", "owner", "group", "mode", "state", "recurse",
                        "_original_basename", "follow", "force", "unsafe_writes"})
#: A link's target, where the link is one and its source exists (the module refuses a
#: missing source without force, link or not).
LINK = ('p={path}; if [ -h "$p" ] && [ -e {source} ]; then printf "link:"; readlink -- "$p"; '
        'else echo other; fi')
LINK_UNDERSTOOD = frozenset({"dest", "path", "src", "state", "follow", "unsafe_writes"})
OCTAL = re.compile(r"0?[0-7]{3,4}")
DIGEST = re.compile(r"[0-9a-f]{40}")


def command(path: str) -> str:
    """The shell command that probes `path`."""
    return PROBE.format(path=shlex.quote(path))


def ask(action: Any, path: str) -> dict[str, Any] | None:
    """Probe `path` through `action`'s connection (and become); the stat module's answer,
    or None where the module must ask."""
    done = action._low_level_execute_command(command(path))
    return parse(done.get("stdout", "")) if done.get("rc") == 0 else None


def parse(stdout: str) -> dict[str, Any] | None:
    """The stat module's answer (its keys) for what PROBE printed; None for a link, a
    device or anything unexpected, where the stat module must ask."""
    lines = stdout.splitlines()
    if lines == ["absent"]:
        return {"exists": False, "isdir": False, "isreg": False, "islnk": False, "checksum": "1"}
    if not lines:
        return None
    fields = lines[0].split(" ")
    if len(fields) != 6 or fields[0] not in ("file", "directory") or not fields[5].isdigit():
        return None
    kind, uid, gid, owner, group, mode = fields
    found: dict[str, Any] = {
        "exists": True, "isdir": kind == "directory", "isreg": kind == "file", "islnk": False,
        "uid": int(uid), "gid": int(gid), "pw_name": owner, "gr_name": group,
        "mode": f"{int(mode, 8):04o}"}
    if kind == "directory":
        return found if len(lines) == 1 else None
    digest = lines[1].split(" ")[0] if len(lines) == 2 else ""
    if not DIGEST.fullmatch(digest):
        return None
    found["checksum"] = digest
    return found


def _named(value: Any, name: str, number: int) -> bool:
    return value is None or str(value) in (name, str(number))


def _mode(value: Any, mode: int) -> bool:
    """Whether the task's mode is the file's; False where it is not plain octal."""
    if value is None:
        return True
    if isinstance(value, int) and not isinstance(value, bool):
        return value == mode
    return isinstance(value, str) and bool(OCTAL.fullmatch(value)) and int(value, 8) == mode


def settled(args: dict[str, Any], stat: dict[str, Any] | None) -> dict[str, Any] | None:
    """The file module's unchanged result for `args` on a probed path, or None where the
    module must run (it would change something, or this cannot tell)."""
    state, path = args.get("state") or "file", args.get("dest") or args.get("path")
    if state == "touch" and stat is not None and stat["exists"] and all(
            args.get(key) == "preserve" for key in ("modification_time", "access_time")):
        # An existing file touched with both times preserved: only its owner, group and mode.
        state, args = "file", {k: v for k, v in args.items() if k not in ("modification_time", "access_time")}
    if stat is None or any(value is not None for key, value in args.items() if key not in UNDERSTOOD):
        return None
    if state == "absent":
        return {"changed": False, "path": path, "state": "absent"} if not stat["exists"] else None
    if args.get("recurse") or state not in ("file", "directory"):
        return None
    if not stat[{"file": "isreg", "directory": "isdir"}[state]]:
        return None
    if not (_named(args.get("owner"), stat["pw_name"], stat["uid"])
            and _named(args.get("group"), stat["gr_name"], stat["gid"])
            and _mode(args.get("mode"), int(stat["mode"], 8))):
        return None
    return {"changed": False, "path": path, "state": state, "uid": stat["uid"], "gid": stat["gid"],
            "owner": stat["pw_name"], "group": stat["gr_name"], "mode": stat["mode"]}


def link_command(args: dict[str, Any], path: str) -> str | None:
    """The shell command that reads the link `args` asks for at `path`, or None where the
    module must run (an owner, group, mode or force, or no source)."""
    src = args.get("src")
    if any(value is not None for key, value in args.items() if key not in LINK_UNDERSTOOD):
        return None
    if not isinstance(src, str) or not src or "\n" in src:
        return None
    source = posixpath.join(posixpath.dirname(path), src)  # the module's, for a relative src
    return LINK.format(path=shlex.quote(path), source=shlex.quote(source))


def link_settled(args: dict[str, Any], path: str, stdout: str) -> dict[str, Any] | None:
    """The file module's unchanged answer for a link already pointing at `src`, or None."""
    if stdout != f"link:{args.get('src')}\n":
        return None
    return {"changed": False, "dest": path, "src": args["src"], "state": "link"}
