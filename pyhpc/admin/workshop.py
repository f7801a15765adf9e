"""Workshops: participant accounts, a Slurm account whose QOS holds per-job and per-user
limits, a reservation for the workshop's window, each new participant's home with the
workshop's notebooks, and the instructor's sheet (with the hub's URL where there is one).

Run by an admin (root) on the login host. Every step first looks at what exists, so a
second ``create`` or ``delete`` changes nothing. Everything a workshop creates carries its
marker (:mod:`pyhpc.owner`): ``create`` refuses, before any change, a name that an object
without it already has; ``delete`` touches only what carries it, and cancels only the jobs
of the workshop's own account.
"""
from __future__ import annotations

import pwd
import secrets
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pyhpc import validate
from pyhpc.admin import directory, directory_sync, homes, owner
from pyhpc.admin.workshop_sheet import host, readme, write_sheet
from pyhpc.cluster import Cluster, Directory
from pyhpc.errors import PyhpcError, echo
from pyhpc.hub import api as hub
from pyhpc.slurm import slurm

#: A big day-one workshop (Virginia Tech's had 770 attendees); from 100 on, participants
#: are NAME-001 to NAME-NNN.
MAX_PARTICIPANTS = 999
#: Hours a workshop may last (a reservation is a promise of nodes).
MAX_HOURS = 14 * 24
#: How far ahead a workshop may start.
MAX_AHEAD = timedelta(days=366)
#: Seconds ``delete`` waits for cancelled jobs to leave the queue.
DRAIN_S = 60.0
#: Per-user limits unless the instructor says otherwise: jobs running, jobs queued.
JOBS_PER_USER = 2
SUBMITTED_PER_USER = 10


class WorkshopError(PyhpcError):
    """A workshop request is invalid or the cluster cannot host it; names the argument."""


@dataclass(frozen=True)
class Plan:
    """A checked ``workshop create``: every value is ready for Slurm and the directory."""

    name: str
    participants: tuple[str, ...]
    start: str  # Slurm StartTime: "now" or YYYY-MM-DDTHH:MM:SS (local time)
    minutes: int
    nodes: int
    partition: str
    gpus_per_node: int
    cluster: str = "cluster"
    jobs_per_user: int = JOBS_PER_USER
    submitted_per_user: int = SUBMITTED_PER_USER
    nodes_per_user: int = 1
    gpus_per_user: int = 0
    #: True: participants may also run outside the reservation, in its partition only.
    outside: bool = False
    #: Whether ``partition`` is the cluster's default (the sheet's commands then name none).
    default_partition: bool = True

    @property
    def marker(self) -> str:
        return owner.workshop(self.name)

    def qos_limits(self) -> list[str]:
        """Per job: the nodes and their GPUs, the window; per participant: jobs running
        and queued, nodes and GPUs together; every job in the reservation unless
        ``outside``. DenyOnLimit refuses a job beyond a limit at submission."""
        flags = "DenyOnLimit" + ("" if self.outside else ",RequiresReservation")
        return [f"Description={self.marker}",
                f"MaxTRESPerJob=node={self.nodes},gres/gpu={self.nodes * self.gpus_per_node}",
                f"MaxWall={self.minutes}", f"MaxJobsPerUser={self.jobs_per_user}",
                f"MaxSubmitJobsPerUser={self.submitted_per_user}",
                f"MaxTRESPerUser=node={self.nodes_per_user},gres/gpu={self.gpus_per_user}",
                f"Flags={flags}"]

    def reservation(self) -> dict[str, str]:
        """Its nodes for its window, for its participants in its own account (the marker)."""
        return {"ReservationName": self.name, "StartTime": self.start,
                "Duration": str(self.minutes), "NodeCnt": str(self.nodes),
                "PartitionName": self.partition, "Users": ",".join(self.participants),
                "Accounts": self.name}


def participant_names(name: str, count: int) -> tuple[str, ...]:
    width = 2 if count < 100 else 3
    return tuple(f"{name}-{i:0{width}d}" for i in range(1, count + 1))


def start_time(text: str, now: datetime | None = None) -> str:
    """``now`` or an ISO time (converted to this host's local time) as Slurm's StartTime,
    from now to :data:`MAX_AHEAD` ahead."""
    if text == "now":
        return "now"
    now = now or datetime.now()
    try:
        when = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise WorkshopError(f"start: {echo(text)} is not an ISO time; use now or "
                            "YYYY-MM-DDTHH:MM[:SS][+HH:MM]", "start") from None
    try:
        if when.tzinfo is not None:
            when = when.astimezone().replace(tzinfo=None)
    except (ValueError, OverflowError):  # beyond year 9999 in this host's time zone
        raise WorkshopError(f"start: {echo(text)} is out of range; use now or a time within "
                            "a year", "start") from None
    if when < now - timedelta(minutes=1):
        raise WorkshopError(f"start: {text} is in the past; use now or a later time", "start")
    if when > now + MAX_AHEAD:
        raise WorkshopError(f"start: {text} is more than {MAX_AHEAD.days} days ahead; use now "
                            "or a time within a year", "start")
    return when.strftime("%Y-%m-%dT%H:%M:%S")


def directory_of(the_cluster: Cluster) -> Directory:
    if the_cluster.directory is None:
        raise WorkshopError("directory: the cluster definition has none; workshops create "
                            "their participants there (add directory: {} to cluster.yml)",
                            "directory")
    return the_cluster.directory


def workshop_name(name: object) -> str:
    """A workshop's name: its Slurm account, QOS and reservation, its directory group."""
    checked = validate.slurm_name("name", name, "account", error=WorkshopError)
    if len(checked) > 28:  # NAME-NN must stay a valid user and account name
        raise WorkshopError(f"name: {checked!r} is longer than 28 characters", "name")
    return checked


def plan(name: str, participants: object, start: str, hours: object, nodes: object,
         the_cluster: Cluster, partition: str | None = None, now: datetime | None = None,
         limits: dict[str, object] | None = None, outside: bool = False) -> Plan:
    """Check a ``workshop create`` request; raises before anything is changed. ``limits``:
    per participant, ``jobs_per_user``, ``submitted_per_user``, ``nodes_per_user``,
    ``gpus_per_user`` (None or absent: the default)."""
    workshop_name(name)
    count = validate.integer("participants", participants, 1, MAX_PARTICIPANTS,
                             error=WorkshopError)
    if count >= 100 and len(name) > 27:  # NAME-NNN must stay a valid user and account name
        raise WorkshopError(f"name: {name!r} is longer than 27 characters, and {count} "
                            "participants are NAME-001 to NAME-NNN", "name")
    length = validate.number("hours", hours, 0.25, MAX_HOURS, error=WorkshopError)
    part = the_cluster.partition(partition or the_cluster.default_partition.name)
    size = validate.integer("nodes", nodes, 1, len(part.nodes), error=WorkshopError)
    gpus = the_cluster.partition_gpus(part.name)
    given = {k: v for k, v in (limits or {}).items() if v is not None}
    jobs = validate.integer("jobs_per_user", given.get("jobs_per_user", JOBS_PER_USER), 1, 1000,
                            error=WorkshopError)
    per_user = {
        "jobs_per_user": jobs,
        "submitted_per_user": validate.integer(
            "submitted_per_user", given.get("submitted_per_user", max(jobs, SUBMITTED_PER_USER)),
            jobs, 10_000, error=WorkshopError),
        "nodes_per_user": validate.integer("nodes_per_user", given.get("nodes_per_user", size),
                                           1, size, error=WorkshopError),
        "gpus_per_user": validate.integer("gpus_per_user",
                                          given.get("gpus_per_user", size * gpus), 0,
                                          size * gpus, error=WorkshopError)}
    unknown = sorted(set(given) - set(per_user))
    if unknown:
        raise WorkshopError(f"{unknown[0]}: unknown limit; allowed: {', '.join(per_user)}",
                            unknown[0])
    directory_of(the_cluster)
    return Plan(name, participant_names(name, count), start_time(start, now),
                round(length * 60), size, part.name, gpus, the_cluster.name,
                outside=outside, default_partition=part.name == the_cluster.default_partition.name,
                **per_user)


# -- what exists, and whose it is ----------------------------------------------------------

def _qos(name: str) -> list[owner.Found]:
    rows = slurm.sacctmgr_rows("qos", [f"name={name}"], ["name", "description"])
    return [owner.Found("Slurm QOS", r[0], r[1] if len(r) > 1 else "")
            for r in rows if r and r[0] == name]


def _account(name: str) -> list[owner.Found]:
    rows = slurm.sacctmgr_rows("account", [f"name={name}"],
                               ["account", "organization", "description"])
    return [owner.Found("Slurm account", r[0], owner.account_marker(r[0], r[1], r[2]))
            for r in rows if len(r) >= 3 and r[0] == name]


def _reservation(name: str, account_ours: bool) -> list[owner.Found]:
    """A reservation is the workshop's when it admits exactly the workshop's own account."""
    fields = slurm.reservation(name)
    if not fields:
        return []
    mine = account_ours and fields.get("Accounts") == name
    return [owner.Found("reservation", name, owner.workshop(name) if mine else "")]


def _other_associations(the_cluster: Cluster, p: Plan) -> list[owner.Found]:
    """Participants' names that Slurm already knows in another account (someone else's)."""
    rows = slurm.sacctmgr_rows("associations", [f"users={','.join(p.participants)}"],
                               ["user", "account", "cluster"])
    return [owner.Found("Slurm user", r[0], "")
            for r in rows if len(r) >= 3 and r[0] and r[1] != p.name]


def _refuse_foreign(p: Plan, the_cluster: Cluster) -> list[owner.Found]:
    """Everything of the workshop's name that exists; refused (one line, nothing changed)
    if any of it, or any participant's name, belongs to something pyhpc did not create."""
    account = _account(p.name)
    owner.claim("name", p.marker, account)
    found = account + _qos(p.name) + _reservation(p.name, bool(account))
    owner.claim("name", p.marker, found + _other_associations(the_cluster, p))
    d = directory_of(the_cluster)
    directory_sync.claim_members(d, p.name, p.participants, p.marker, "name")
    known = directory.users(d)
    for user in p.participants:
        if user not in known:
            _new_participant_is_clean(user)
    return found


def _new_participant_is_clean(user: str) -> None:
    """A new participant's name must not be a local account, nor have a home left behind
    (an earlier user's files would become theirs, or keep them out of their home)."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        pass
    else:
        raise WorkshopError(f"name: participant {user} would be the local user {user} of "
                            "this host; choose another name; nothing was changed", "name")
    home = Path(directory.HOME) / user
    if home.exists() or home.is_symlink():
        raise WorkshopError(f"name: participant {user}'s home {home} exists (an earlier "
                            "user's files); remove it or choose another name; nothing was "
                            "changed", "name")


# -- create, delete, list ------------------------------------------------------------------

def create(p: Plan, the_cluster: Cluster, out: Path) -> dict[str, Any]:
    """Create what is missing of the workshop; the sheet is written when accounts are new."""
    d = directory_of(the_cluster)
    found = {f.kind for f in _refuse_foreign(p, the_cluster)}
    passwords = {n: secrets.token_urlsafe(9) for n in p.participants}
    added = directory_sync.add_members(d, p.name, p.participants, p.marker, passwords)
    done: dict[str, Any] = {"name": p.name, "users_added": added}
    if hub_enabled(the_cluster):
        done["hub_url"] = hub.url(the_cluster)
    if "Slurm QOS" not in found:
        slurm.sacctmgr("add", "qos", f"name={p.name}", *p.qos_limits())
        done["qos_added"] = True
    if "Slurm account" not in found:
        slurm.sacctmgr("add", "account", f"name={p.name}", f"cluster={the_cluster.name}",
                       f"Organization={owner.ORGANIZATION}", f"Description={p.marker}",
                       f"QOS={p.name}", f"DefaultQOS={p.name}")
        done["account_added"] = True
    have = set(_associated(the_cluster, p.name))  # one sacctmgr call, not one a participant
    missing = [n for n in p.participants if n not in have]
    if missing:
        where = [] if not p.outside else [f"partition={p.partition}"]
        slurm.sacctmgr("add", "user", f"name={','.join(missing)}", f"account={p.name}",
                       f"cluster={the_cluster.name}", *where)
    done["associations_added"] = missing
    if "reservation" not in found:
        slurm.create_reservation(p.reservation())
        done["reservation_added"] = True
    if added:
        entries = directory.users(d)
        files = homes.notebooks()
        login = host()
        made = [homes.make(n, entries[n].number, entries[n].gid, files,
                           texts={"README": readme(p, n, login, done.get("hub_url"))})
                for n in added]
        done["homes_made"] = [str(h) for h in made if h is not None]
        done["sheet"] = [str(f) for f in write_sheet(p, {n: passwords[n] for n in added}, out,
                                                     done.get("hub_url"))]
    done["changed"] = bool(added or missing or any(
        done.get(k) for k in ("qos_added", "account_added", "reservation_added")))
    return done


def hub_enabled(the_cluster: Cluster) -> bool:
    return the_cluster.jupyterhub is not None and the_cluster.jupyterhub.enabled


def _forget_in_hub(the_cluster: Cluster, users: list[str], done: dict[str, Any]) -> None:
    """The hub forgets the participants (their servers' jobs are cancelled by then): a
    later workshop may give their names again. A hub that does not answer forgets them at
    its next start (delete_invalid_users); until then their logins fail (no association)."""
    if not users or not hub_enabled(the_cluster):
        return
    try:
        done["hub_users_deleted"] = hub.forget(users)
    except PyhpcError as exc:
        done["hub_unreachable"] = str(exc)


def _associated(the_cluster: Cluster, account: str) -> list[str]:
    rows = slurm.sacctmgr_rows("associations", [f"cluster={the_cluster.name}",
                                                f"account={account}"], ["user"])
    return sorted({r[0] for r in rows if r and r[0]})


def delete(name: str, the_cluster: Cluster, homes: bool = False) -> dict[str, Any]:
    """Cancel the jobs of the workshop's account; remove its reservation, associations,
    account, QOS, directory entries and (``homes``) their homes: each only if it carries
    the workshop's marker. Anything else of that name is left alone and reported."""
    workshop_name(name)
    d = directory_of(the_cluster)
    marker = owner.workshop(name)
    account = _account(name)
    owner.claim("name", marker, account)
    found = account + _qos(name) + _reservation(name, bool(account))
    mine = {f.kind for f in owner.ours(marker, found)}
    entries = {u: e for u, e in directory.users(d).items() if e.tag == marker}
    associated = _associated(the_cluster, name) if account else []
    done: dict[str, Any] = {"name": name, "jobs_cancelled": slurm.jobs_in_account(name)
                            if account else [],
                            "left_alone": [f"{f.kind} {f.name}" for f in found
                                           if f.kind not in mine]}
    if done["jobs_cancelled"]:  # the participants' notebook servers among them
        slurm.cancel(done["jobs_cancelled"])
        _wait_gone(name)
    _forget_in_hub(the_cluster, sorted(entries), done)
    if "reservation" in mine:
        slurm.delete_reservation(name)
        done["reservation_deleted"] = True
    if associated:
        slurm.sacctmgr("delete", "user", f"name={','.join(associated)}", f"account={name}",
                       f"cluster={the_cluster.name}")
    if account:
        slurm.sacctmgr("delete", "account", f"name={name}")
        done["account_deleted"] = True
    if "Slurm QOS" in mine:
        slurm.sacctmgr("delete", "qos", f"name={name}")
        done["qos_deleted"] = True
    groups = [g for g, e in directory.groups(d).items() if e.tag == marker]
    directory.delete(d, [directory.user_dn(d, u) for u in sorted(entries)]
                     + [directory.group_dn(d, g) for g in groups])
    done["users_deleted"] = sorted(entries)
    done["homes_deleted"] = _delete_homes(entries) if homes else []
    done["changed"] = bool(associated or entries or groups or any(
        done.get(k) for k in ("reservation_deleted", "account_deleted", "qos_deleted")))
    return done


def _wait_gone(account: str) -> None:
    deadline = time.monotonic() + DRAIN_S
    while slurm.jobs_in_account(account) and time.monotonic() < deadline:
        time.sleep(1)


def _delete_homes(entries: dict[str, directory.Entry]) -> list[str]:
    """Remove /home/USER of each participant, only a real directory that user owns."""
    deleted = []
    for user, entry in sorted(entries.items()):
        home = Path(directory.HOME) / user
        if home.is_dir() and not home.is_symlink() and home.stat().st_uid == entry.number:
            shutil.rmtree(home)
            deleted.append(str(home))
    return deleted


def listing(the_cluster: Cluster) -> list[dict[str, Any]]:
    """Every workshop (an account carrying a workshop's marker): its reservation window
    and nodes, its participants."""
    rows = slurm.sacctmgr_rows("account", [], ["account", "organization", "description"])
    names = sorted(r[0] for r in rows if len(r) >= 3
                   and owner.account_marker(r[0], r[1], r[2]) == owner.workshop(r[0]))
    result = []
    for name in names:
        res = slurm.reservation(name)
        result.append({"name": name, "description": owner.workshop(name),
                       "participants": len(_associated(the_cluster, name)),
                       "start": res.get("StartTime", ""), "end": res.get("EndTime", ""),
                       "nodes": res.get("Nodes", "")})
    return result
