"""The nfs role's input checks that argument_specs cannot express: absolute paths, CIDR networks."""
from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from typing import Any

# Absolute, no '.', '..' or empty component, no trailing '/', no whitespace (exports(5) splits on it).
PATH = re.compile(r"^(/(?!\.\.?(/|$))[^/\s]+)+$")
CONTRADICTIONS = [("rw", "ro"), ("sync", "async"), ("root_squash", "no_root_squash"),
                  ("all_squash", "no_all_squash"), ("subtree_check", "no_subtree_check"),
                  ("secure", "insecure"), ("wdelay", "no_wdelay"), ("hide", "nohide")]


def cidr_error(key: str, value: Any) -> list[str]:
    """One message naming key unless value is a network in CIDR notation (host bits zero)."""
    try:
        if not isinstance(value, str) or "/" not in value:
            raise ValueError("not set" if value in ("", None) else "no /prefix length")
        ipaddress.ip_network(value, strict=True)
    except ValueError as err:
        return [f"{key}: must be the network allowed to mount, in CIDR notation (e.g. 10.0.0.0/16),"
                f" got {json.dumps(value)} ({err})"]
    return []


def nfs_input_errors(exports: list[dict[str, Any]], network: str, server: bool) -> list[str]:
    """Every bad value of nfs_exports and nfs_network, each message naming its key; networks only
    where they are used (the server)."""
    errors: list[str] = []
    paths = [export.get("path") for export in exports]
    for i, export in enumerate(exports):
        key = f"nfs_exports[{i}]"
        path = export.get("path")
        if not isinstance(path, str) or not PATH.match(path):
            errors.append(f"{key}.path: must be an absolute path without '.', '..' or whitespace"
                          f" and no trailing '/', got {json.dumps(path)}")
        elif paths.count(path) > 1:
            errors.append(f"{key}.path: {path} is exported twice")
        options = export.get("options") or []
        errors += [f"{key}.options: {a} and {b} contradict each other, got {json.dumps(options)}"
                   for a, b in CONTRADICTIONS if a in options and b in options]
        if server and export.get("network"):
            errors += cidr_error(f"{key}.network", export["network"])
    if server and (network or not all(export.get("network") for export in exports)):
        errors += cidr_error("nfs_network", network)
    return errors


#: The groups that mount an export that names none: the hosts users and jobs run on.
MOUNTED_BY = ("login", "compute")


def nfs_mounted_by(exports: list[dict[str, Any]], group_names: list[str]) -> list[dict[str, Any]]:
    """The exports a host of `group_names` mounts: those naming one of its groups in `groups`
    (default login and compute; e.g. [controller] for slurmctld's shared state)."""
    return [export for export in exports
            if set(export.get("groups") or MOUNTED_BY) & set(group_names)]


def nfs_holding(paths: list[str], path: str) -> list[str]:
    """The paths among `paths` that `path` is, or lies under."""
    return [p for p in paths if (path + "/").startswith(p + "/")]


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"nfs_input_errors": nfs_input_errors, "nfs_holding": nfs_holding,
                "nfs_mounted_by": nfs_mounted_by}
