"""Whether the user and group modules would change an existing account: one `getent` on
the host (the modules look accounts up through NSS too) instead of a module run.

Understood: a group asked present (`system` matters only when it is made); a user asked
present with its primary group, home and shell, and `create_home: false` (the module
would otherwise make a missing home). Anything else, and any difference, is the module's.
Pure: no Ansible import (action/user.py and group.py ask the host).
"""
from __future__ import annotations

import shlex
from typing import Any

from ansible_collections.pyhpc.deploy.plugins.plugin_utils.asked import plain_path, unknown

GROUP = frozenset({"name", "state", "system"})
USER = frozenset({"name", "user", "state", "group", "system", "shell", "home", "create_home",
                  "createhome"})
#: What getent prints for the name and the group, each line or "none".
LOOKUP = "getent passwd {name} || echo none; getent group {group} || echo none"


def entry(line: str, fields: int) -> list[str] | None:
    """A passwd (7 fields) or group (4) line's fields, or None."""
    parts = line.split(":")
    return parts if len(parts) == fields and parts[2].isdigit() else None


def user_settled(args: dict[str, Any], stdout: str) -> dict[str, Any] | None:
    """The user module's unchanged answer, from LOOKUP's output, or None."""
    name = args.get("name") or args.get("user")
    create_home = args.get("create_home", args.get("createhome"))
    home, shell = args.get("home"), args.get("shell")
    lines = stdout.splitlines()
    if unknown(args, USER) or args.get("state") not in (None, "present") or create_home is not False:
        return None
    if len(lines) != 2 or any(value is not None and not plain_path(value) for value in (home, shell)):
        return None
    found, group = entry(lines[0], 7), entry(lines[1], 4)
    if found is None or found[0] != name:
        return None
    if args.get("group") is not None and (group is None or group[2] != found[3]):
        return None
    if home not in (None, found[5]) or shell not in (None, found[6]):
        return None
    return {"changed": False, "name": name, "state": "present", "append": False, "move_home": False,
            "uid": int(found[2]), "group": int(found[3]), "comment": found[4], "home": found[5],
            "shell": found[6]}


def group_settled(args: dict[str, Any], stdout: str) -> dict[str, Any] | None:
    """The group module's unchanged answer, from LOOKUP's output (its group line), or None."""
    lines = stdout.splitlines()
    if unknown(args, GROUP) or args.get("state") not in (None, "present") or len(lines) != 2:
        return None
    found = entry(lines[1], 4)
    if found is None or found[0] != args.get("name"):
        return None
    return {"changed": False, "name": found[0], "state": "present",
            "system": bool(args.get("system")), "gid": int(found[2])}


def lookup_line(name: Any, group: Any) -> str | None:
    """LOOKUP for `name` and `group`, or None where either is no plain account name."""
    if not all(isinstance(value, str) and value and not value.isdigit() for value in (name, group)):
        return None
    return LOOKUP.format(name=shlex.quote(name), group=shlex.quote(group))
