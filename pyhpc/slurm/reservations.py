"""Which reservation a job runs in, worked out once per submission from Slurm itself.

The one the user names wins: ``--reservation``, then ``SBATCH_RESERVATION`` (sbatch's own
order), then the script's ``#SBATCH --reservation``. Otherwise the job goes into the one
active reservation that admits the user (by name, or through one of their accounts) and
holds nodes of the job's partition: a workshop participant at a terminal runs in the
workshop's reservation without naming it. Slurm is the source, not a login profile: it
knows a reservation moved, ended or was made after the login, in every shell, the hub's
terminals and ``ssh host pyhpc ...`` too. ``scontrol show reservation`` (one call) shows a
user only the reservations they may use (``PrivateData=reservations``).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime

from pyhpc import validate
from pyhpc.errors import PyhpcError
from pyhpc.slurm import slurm

#: Slurm's word for an empty field in ``scontrol show reservation``.
NULL = "(null)"
#: Slurm's time format in ``scontrol show reservation`` (this host's local time).
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
#: ``#SBATCH`` lines naming a reservation or a partition (sbatch reads them up to the first
#: line that is neither a comment nor blank).
SCRIPT_OPTION = re.compile(r"#SBATCH\s+(?:--(reservation|partition)[=\s]|-(p)\s*)\s*(\S+)")


class ReservationError(PyhpcError):
    """The reservation named is not one the job can run in now; the message says when."""


@dataclass(frozen=True)
class Reservation:
    """One reservation as ``scontrol -o show reservation`` prints it."""

    name: str
    partition: str = ""
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    start: str = ""
    end: str = ""
    state: str = ""

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


@dataclass(frozen=True)
class Choice:
    """What a submission runs in (``name``; None: no reservation), and what the user has
    that does not fit now, for the line that explains a refusal: ``waiting``, their
    reservations not started yet; ``elsewhere``, their active ones in other partitions."""

    name: str | None = None
    partition: str = ""
    waiting: tuple[Reservation, ...] = ()
    elsewhere: tuple[Reservation, ...] = ()


def _names(field: str) -> tuple[str, ...]:
    return tuple(n for n in field.split(",") if n and n != NULL)


def parse(fields: dict[str, str]) -> Reservation:
    partition = fields.get("PartitionName", "")
    return Reservation(fields.get("ReservationName", ""), "" if partition == NULL else partition,
                       _names(fields.get("Users", "")), _names(fields.get("Accounts", "")),
                       fields.get("StartTime", ""), fields.get("EndTime", ""),
                       fields.get("State", ""))


def admits(r: Reservation, user: str, accounts: set[str]) -> bool:
    """Whether ``r`` names ``user`` or one of ``accounts`` (one that admits by exclusion,
    ``Users=-bob``, is never chosen for anyone: Slurm decides those)."""
    if any(n.startswith("-") for n in r.users + r.accounts):
        return False
    return user in r.users or bool(set(r.accounts) & accounts)


def when(text: str, now: datetime | None = None) -> str:
    """``2026-03-02T09:00:00 (in 1 h 5 min)``: a reservation time, and how far it is."""
    try:
        at = datetime.strptime(text, TIME_FORMAT)
    except ValueError:
        return text
    seconds = int(((now or datetime.now()) - at).total_seconds())
    minutes = abs(seconds) // 60
    span = f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"
    return f"{text} ({'in ' + span if seconds < 0 else span + ' ago'})"


def script_options(text: str) -> dict[str, str]:
    """The reservation and partition a batch script's own ``#SBATCH`` lines name."""
    found: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        match = SCRIPT_OPTION.match(stripped)
        if match:
            found[match.group(1) or "partition"] = match.group(3)
    return found


def _account_names(user: str) -> set[str]:
    return {account for account, _ in slurm.my_associations(user)}


def resolve(given: str | None, partition: str, user: str, where: str = "reservation",
            now: datetime | None = None) -> Choice:
    """The reservation a job of ``user`` in ``partition`` runs in. ``given`` (checked, as
    ``where`` names it) must be active now; without it, the one active reservation that
    admits the user in that partition, or none; with several, the user chooses."""
    if given is None and os.environ.get("SBATCH_RESERVATION"):
        given, where = os.environ["SBATCH_RESERVATION"], "SBATCH_RESERVATION"
    if given is not None:
        given = validate.name(where, given, "slurm", error=ReservationError)
    known = [parse(f) for f in slurm.reservations()]
    if given is not None:
        return Choice(_check(given, known, partition, where, now), partition)
    accounts: set[str] | None = None
    mine = []
    for r in known:
        if not r.users and r.accounts and accounts is None:
            accounts = _account_names(user)  # only for a reservation that admits by account
        if admits(r, user, accounts or set()):
            mine.append(r)
    active = [r for r in mine if r.active]
    fits = [r for r in active if r.partition in ("", partition)]
    if len(fits) > 1:
        raise ReservationError(f"reservation: you may run in {len(fits)} active reservations "
                               f"({', '.join(r.name for r in fits)}); choose one with "
                               "--reservation NAME", "reservation")
    return Choice(fits[0].name if fits else None, partition,
                  tuple(r for r in mine if not r.active),
                  tuple(r for r in active if r not in fits))


def _check(name: str, known: list[Reservation], partition: str, where: str,
           now: datetime | None) -> str:
    """``name`` if it is active now and holds nodes of ``partition``; else one line."""
    found = next((r for r in known if r.name == name), None)
    if found is None:
        yours = ", ".join(r.name for r in known) or "none"
        raise ReservationError(f"{where}: Slurm has no reservation {name} now: it has ended, "
                               f"or was never made (those you may use: {yours})", where)
    if not found.active:
        starts = datetime.strptime(found.start, TIME_FORMAT) if re.fullmatch(
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", found.start) else None
        if starts is not None and starts > (now or datetime.now()):
            raise ReservationError(f"{where}: reservation {name} starts at "
                                   f"{when(found.start, now)}; submit then", where)
        raise ReservationError(f"{where}: reservation {name} is not active (it ended at "
                               f"{when(found.end, now)})", where)
    if found.partition and found.partition != partition:
        raise ReservationError(f"{where}: reservation {name} holds nodes of partition "
                               f"{found.partition}, and the job asks for {partition}; add "
                               f"--partition {found.partition}", where)
    return name
