"""The one rule: pyhpc changes or deletes only what it created.

Everything pyhpc creates carries a marker saying who made it: the Slurm QOS and accounts
of a workshop and the definition's accounts (organization ``pyhpc`` and the marker as
description), a workshop's reservation (``Accounts=`` its own marked account: Slurm 22.05's
reservations have no free text) and the directory's entries (the marker as
``description``). Before a change, :func:`claim` refuses a name that exists without the
marker; before a delete, :func:`ours` keeps only what carries it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pyhpc.errors import PyhpcError, echo

#: Organization of every Slurm account pyhpc creates.
ORGANIZATION = "pyhpc"
#: The marker of what the cluster definition makes (its accounts, users and groups).
DEFINITION = "pyhpc: cluster.yml"
#: The organization workshop accounts had before markers (still recognised as pyhpc's).
LEGACY_WORKSHOP_ORGANIZATION = "pyhpc-workshop"


class OwnershipError(PyhpcError):
    """A name pyhpc would create or change belongs to something it did not create."""


def workshop(name: str) -> str:
    """The marker of workshop ``name``'s objects."""
    return f"pyhpc: workshop {name}"


def is_pyhpcs(marker: str) -> bool:
    """Whether ``marker`` is one pyhpc sets (the definition's, or any workshop's)."""
    return marker == DEFINITION or marker.startswith(workshop(""))


@dataclass(frozen=True)
class Found:
    """An object that exists: what it is, its name, and the marker it carries ('' none)."""

    kind: str
    name: str
    marker: str


def account_marker(name: str, organization: str, description: str) -> str:
    """The marker a Slurm account carries: its description when its organization is
    pyhpc's; a workshop account of before markers carries its workshop's."""
    if organization == ORGANIZATION:
        return description
    if organization == LEGACY_WORKSHOP_ORGANIZATION and description == f"workshop {name}":
        return workshop(name)
    return ""


def claim(arg: str, marker: str, found: Iterable[Found]) -> None:
    """Refuse, in one line naming ``arg``, if anything in ``found`` lacks ``marker``."""
    for item in found:
        if item.marker != marker:
            carried = f"marked {echo(item.marker)}" if item.marker else "no pyhpc marker"
            raise OwnershipError(
                f"{arg}: {item.kind} {echo(item.name)} exists and is not this one's "
                f"({carried}, not {marker!r}); pyhpc changes only what it created: choose "
                "another name; nothing was changed", arg)


def ours(marker: str, found: Iterable[Found]) -> list[Found]:
    """What in ``found`` carries ``marker``: all that a delete may touch."""
    return [item for item in found if item.marker == marker]
