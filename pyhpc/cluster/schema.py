"""What every part of the cluster definition is checked with: its error, and the checks
of keys, integers, choices, booleans and name lists that name the offending key.

:mod:`pyhpc.cluster` (nodes, partitions) and :mod:`pyhpc.cluster.users` (accounts, their
per-user limits, the directory) build on these; names themselves go through
:mod:`pyhpc.validate`.
"""
from __future__ import annotations

from typing import Any

from pyhpc import validate
from pyhpc.errors import PyhpcError, echo


class ConfigError(PyhpcError):
    """The cluster definition is invalid; the message names the key."""


#: Entries in one list (partitions, accounts, users of an account).
MAX_ITEMS = 4096
#: Nodes in one cluster, all groups together: the one node limit (a definition, a job,
#: a per-user limit, a sweep); ``pyhpc.cluster.MAX_NODES``.
MAX_NODES = 4096


def listing(names: list[str], most: int = 12) -> str:
    """``a, b, c``, or the first ``most`` names and how many there are in all."""
    if len(names) <= most:
        return ", ".join(names)
    return f"{', '.join(names[:most])}, ... ({len(names)} in all)"


def check_keys(where: str, data: Any, allowed: dict[str, str], required: tuple[str, ...]) -> None:
    """``data`` is a mapping of ``allowed`` keys that has every ``required`` one."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            shown = key if isinstance(key, str) and key.isidentifier() and len(key) <= 40 \
                else echo(key)
            raise ConfigError(
                f"{where}.{shown}: unknown key; allowed: {', '.join(sorted(allowed))}"
            )
    for key in required:
        if key not in data:
            raise ConfigError(f"{where}.{key}: required key is missing ({allowed[key]})")


def integer(where: str, value: Any, bounds: dict[str, tuple[int, int]]) -> int:
    """A YAML integer within the bounds of its key (the last part of ``where``)."""
    return validate.integer(where, value, *bounds[where.rsplit(".", 1)[-1]], error=ConfigError,
                            text=False)


def choice(where: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{where}: {echo(value)} is not allowed; allowed: {', '.join(allowed)}")
    return value


def boolean(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false, got {echo(value)}")
    return value


def name(where: str, value: Any, field: str | None = None, kind: str = "slurm") -> str:
    """A name of ``kind``; with ``field`` (node, partition, account, ...) also none of the
    words Slurm reserves in that field, in any case."""
    if field is not None:
        return validate.slurm_name(where, value, field, error=ConfigError)
    return validate.name(where, value, kind, error=ConfigError)


def names(where: str, value: Any, field: str | None = None, kind: str = "slurm") -> list[str]:
    """A list of at most :data:`MAX_ITEMS` distinct names (see :func:`name`)."""
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise ConfigError(f"{where}: must be a list of at most {MAX_ITEMS} names, "
                          f"got {echo(value)}")
    found = [name(f"{where}[{i}]", v, field, kind) for i, v in enumerate(value)]
    for i, item in enumerate(found):
        if item in found[:i]:
            raise ConfigError(f"{where}[{i}]: duplicate name {item!r}")
    return found
