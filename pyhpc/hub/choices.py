"""What one user may choose in the hub's form, read from Slurm as that user: their
associations (accounts, each with its partition and QOS) and the reservations that
admit them. Partitions, their nodes and GPUs come from the cluster definition.

Who may log in at all is decided here too: a user with at least one association.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from pyhpc import validate
from pyhpc.errors import PyhpcError
from pyhpc.slurm import as_user, reservations
from pyhpc.slurm.as_user import Association
from pyhpc.slurm.reservations import Reservation

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choices:
    """Everything the form offers one user, as Slurm answered that user."""

    user: str
    associations: tuple[Association, ...] = ()
    reservations: tuple[Reservation, ...] = ()

    @property
    def accounts(self) -> list[str]:
        return sorted({a.account for a in self.associations})

    def qos_of(self, account: str) -> list[str]:
        """The QOS the user may name with ``account`` (any of its associations)."""
        return sorted({q for a in self.associations if a.account == account for q in a.qos})

    def default_qos(self, account: str) -> str:
        found = [a.default_qos for a in self.associations if a.account == account and a.default_qos]
        return found[0] if found else ""

    def reservation(self, name: str) -> Reservation | None:
        return next((r for r in self.reservations if r.name == name), None)


def admitted(fields: dict[str, str], user: str, accounts: Iterable[str]) -> Reservation | None:
    """The reservation of ``scontrol show reservation``'s ``fields`` if it names ``user`` or
    one of ``accounts`` (:func:`pyhpc.slurm.reservations.admits`, the rule a submission
    follows); None otherwise, or when its name could not go back to sbatch safely."""
    found = reservations.parse(fields)
    if not reservations.admits(found, user, set(accounts)):
        return None
    try:
        validate.name("reservation", found.name, "slurm")
    except PyhpcError:
        return None
    return found


def read(user: str) -> Choices:
    """The user's associations and reservations, from Slurm, as the user."""
    assocs = tuple(as_user.associations(user))
    accounts = {a.account for a in assocs}
    found = (admitted(f, user, accounts) for f in as_user.reservations(user))
    return Choices(user, assocs, tuple(sorted((r for r in found if r), key=lambda r: r.name)))


def may_log_in(user: str, local_users: Iterable[str], unknown: bool = False) -> bool:
    """The hub's allow rule: a directory user (not one of the definition's local users,
    root among them) with at least one Slurm association. Anything else is a no; when
    Slurm cannot be asked the answer is ``unknown`` (no at a login; a login that lasts
    keeps going through a slurmdbd restart)."""
    try:
        validate.name("user", user, "user")
    except PyhpcError:
        return False
    if user in set(local_users):
        LOG.warning("refused %s: a local user of this host, never a hub user", user)
        return False
    try:
        found = as_user.associations(user)
    except PyhpcError as exc:
        LOG.warning("%s %s: Slurm's associations could not be read (%s)",
                    "kept" if unknown else "refused", user, exc)
        return unknown
    if not found:
        LOG.warning("refused %s: no Slurm association", user)
    return bool(found)
