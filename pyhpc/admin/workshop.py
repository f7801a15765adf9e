"""Workshops: participant accounts, a Slurm account whose QOS holds per-job limits, a
reservation for the workshop's window, and the instructor's sheet.

Run by an admin (root) on the login host. Every step first looks at what exists, so a
second ``create`` or ``delete`` changes nothing; ``delete`` touches only the workshop's
own entries (directory entries tagged ``pyhpc: workshop NAME``, the account NAME).
"""
from __future__ import annotations

import csv
import io
import os
import secrets
import shutil
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pyhpc import files, validate
from pyhpc.admin import directory
from pyhpc.cluster import Cluster, Directory
from pyhpc.errors import PyhpcError
from pyhpc.slurm import slurm

#: The Slurm account's organization: how ``list`` and ``delete`` know a workshop's account.
ORGANIZATION = "pyhpc-workshop"
MAX_PARTICIPANTS = 99
#: Hours a workshop may last (a reservation is a promise of nodes).
MAX_HOURS = 14 * 24
#: Seconds ``delete`` waits for cancelled jobs to leave the queue.
DRAIN_S = 60.0


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

    def qos_limits(self) -> list[str]:
        tres = f"node={self.nodes}" + (f",gres/gpu={self.nodes * self.gpus_per_node}"
                                       if self.gpus_per_node else "")
        return [f"MaxTRESPerJob={tres}", f"MaxWall={self.minutes}", "Flags=DenyOnLimit"]

    def reservation(self) -> dict[str, str]:
        return {"ReservationName": self.name, "StartTime": self.start,
                "Duration": str(self.minutes), "NodeCnt": str(self.nodes),
                "PartitionName": self.partition, "Users": ",".join(self.participants)}


def participant_names(name: str, count: int) -> tuple[str, ...]:
    return tuple(f"{name}-{i:02d}" for i in range(1, count + 1))


def start_time(text: str, now: datetime | None = None) -> str:
    """``now`` or an ISO time (converted to this host's local time) as Slurm's StartTime."""
    if text == "now":
        return "now"
    try:
        when = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise WorkshopError(f"start: {text!r} is not an ISO time; use now or "
                            "YYYY-MM-DDTHH:MM[:SS][+HH:MM]", "start") from None
    if when.tzinfo is not None:
        when = when.astimezone().replace(tzinfo=None)
    if when < (now or datetime.now()) - timedelta(minutes=1):
        raise WorkshopError(f"start: {text} is in the past; use now or a later time", "start")
    return when.strftime("%Y-%m-%dT%H:%M:%S")


def directory_of(the_cluster: Cluster) -> Directory:
    if the_cluster.directory is None:
        raise WorkshopError("directory: the cluster definition has none; workshops create "
                            "their participants there (add directory: {} to cluster.yml)",
                            "directory")
    return the_cluster.directory


def plan(name: str, participants: object, start: str, hours: object, nodes: object,
         the_cluster: Cluster, partition: str | None = None,
         now: datetime | None = None) -> Plan:
    """Check a ``workshop create`` request; raises before anything is changed."""
    validate.name("name", name, "slurm", error=WorkshopError)
    if len(name) > 28:  # NAME-NN must stay a valid user and account name
        raise WorkshopError(f"name: {name!r} is longer than 28 characters", "name")
    count = validate.integer("participants", participants, 1, MAX_PARTICIPANTS,
                             error=WorkshopError)
    length = validate.number("hours", hours, 0.25, MAX_HOURS, error=WorkshopError)
    part = the_cluster.partition(partition or the_cluster.default_partition.name)
    size = validate.integer("nodes", nodes, 1, len(part.nodes), error=WorkshopError)
    directory_of(the_cluster)
    return Plan(name, participant_names(name, count), start_time(start, now),
                round(length * 60), size, part.name, the_cluster.partition_gpus(part.name))


def _workshop_accounts() -> dict[str, str]:
    """Workshop account name -> description."""
    rows = slurm.sacctmgr_rows("account", [], ["account", "organization", "description"])
    return {r[0]: r[2] for r in rows if len(r) >= 3 and r[1] == ORGANIZATION}


def _associated(the_cluster: Cluster, account: str) -> list[str]:
    rows = slurm.sacctmgr_rows("associations", [f"cluster={the_cluster.name}",
                                                f"account={account}"], ["user"])
    return sorted({r[0] for r in rows if r and r[0]})


def create(p: Plan, the_cluster: Cluster, out: Path) -> dict[str, Any]:
    """Create what is missing of the workshop; the sheet is written when accounts are new."""
    d = directory_of(the_cluster)
    accounts = slurm.sacctmgr_rows("account", [f"name={p.name}"], ["account", "organization"])
    if accounts and accounts[0][1:] != [ORGANIZATION]:
        raise WorkshopError(f"name: account {p.name!r} exists and is not a pyhpc workshop", "name")
    passwords = {n: secrets.token_urlsafe(9) for n in p.participants}
    added = directory.add_members(d, p.name, p.participants, directory.workshop_tag(p.name),
                                  passwords)
    done: dict[str, Any] = {"name": p.name, "users_added": added}
    if not slurm.sacctmgr_rows("qos", [f"name={p.name}"], ["name"]):
        slurm.sacctmgr("add", "qos", p.name, *p.qos_limits())
        done["qos_added"] = True
    if not accounts:
        slurm.sacctmgr("add", "account", p.name, f"cluster={the_cluster.name}",
                       f"Organization={ORGANIZATION}", f"Description=workshop {p.name}",
                       f"QOS={p.name}", f"DefaultQOS={p.name}")
        done["account_added"] = True
    missing = [n for n in p.participants if n not in _associated(the_cluster, p.name)]
    if missing:
        slurm.sacctmgr("add", "user", ",".join(missing), f"account={p.name}",
                       f"cluster={the_cluster.name}")
    done["associations_added"] = missing
    if not slurm.reservation(p.name):
        slurm.create_reservation(p.reservation())
        done["reservation_added"] = True
    if added:
        done["sheet"] = [str(f) for f in write_sheet(p, {n: passwords[n] for n in added}, out)]
    done["changed"] = bool(added or missing or any(
        done.get(k) for k in ("qos_added", "account_added", "reservation_added")))
    return done


def sheet_rows(p: Plan, passwords: dict[str, str], host: str) -> list[dict[str, str]]:
    return [{"user": n, "password": passwords.get(n, "(unchanged)"), "login": f"ssh {n}@{host}",
             "reservation": p.name, "start": p.start, "minutes": str(p.minutes)}
            for n in p.participants]


def write_sheet(p: Plan, passwords: dict[str, str], out: Path) -> list[Path]:
    """The instructor's sheet, 0600 whatever --group-readable says: CSV and a printable page."""
    rows = sheet_rows(p, passwords, socket.getfqdn())
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    cut = "-" * 64
    page = "".join(
        f"{cut}\nWorkshop {p.name}: your account on cluster {p.name}\n\n"
        f"  login:     {r['login']}   (or su - {r['user']})\n  password:  {r['password']}\n"
        f"  jobs:      srun --reservation={p.name} ... / sbatch --reservation={p.name} ...\n"
        f"             or, for every job of your session (pyhpc, the notebooks):\n"
        f"             export SBATCH_RESERVATION={p.name} SLURM_RESERVATION={p.name}\n"
        f"  starts:    {p.start}, for {p.minutes} minutes\n"
        for r in rows) + cut + "\n"
    directory_path = files.make_dir(out, "out")
    os.chmod(directory_path, 0o700)
    written = []
    for fname, text in ((f"{p.name}.csv", table.getvalue()), (f"{p.name}.txt", page)):
        path = files.write_text(directory_path / fname, text, "out")
        os.chmod(path, 0o600)
        written.append(path)
    return written


def delete(name: str, the_cluster: Cluster, homes: bool = False) -> dict[str, Any]:
    """Cancel the participants' jobs; remove reservation, associations, account, QOS,
    directory entries and (``homes``) their homes. Nothing else is touched."""
    validate.name("name", name, "slurm", error=WorkshopError)
    d = directory_of(the_cluster)
    accounts = slurm.sacctmgr_rows("account", [f"name={name}"], ["account", "organization"])
    if accounts and accounts[0][1:] != [ORGANIZATION]:
        raise WorkshopError(f"name: account {name!r} is not a pyhpc workshop; nothing deleted",
                            "name")
    tag = directory.workshop_tag(name)
    entries = {u: e for u, e in directory.users(d).items() if e.tag == tag}
    associated = _associated(the_cluster, name) if accounts else []
    participants = sorted(set(entries) | set(associated))
    done: dict[str, Any] = {"name": name, "jobs_cancelled": slurm.jobs_of(participants)}
    if done["jobs_cancelled"]:
        slurm.cancel(done["jobs_cancelled"])
        _wait_gone(participants)
    if slurm.reservation(name):
        slurm.delete_reservation(name)
        done["reservation_deleted"] = True
    if associated:
        slurm.sacctmgr("delete", "user", f"name={','.join(associated)}", f"account={name}",
                       f"cluster={the_cluster.name}")
    if accounts:
        slurm.sacctmgr("delete", "account", f"name={name}")
        done["account_deleted"] = True
    if slurm.sacctmgr_rows("qos", [f"name={name}"], ["name"]):
        slurm.sacctmgr("delete", "qos", f"name={name}")
        done["qos_deleted"] = True
    groups = [g for g, e in directory.groups(d).items() if e.tag == tag]
    directory.delete(d, [directory.user_dn(d, u) for u in sorted(entries)]
                     + [directory.group_dn(d, g) for g in groups])
    done["users_deleted"] = sorted(entries)
    done["homes_deleted"] = _delete_homes(entries) if homes else []
    done["changed"] = bool(participants or groups or any(
        done.get(k) for k in ("reservation_deleted", "account_deleted", "qos_deleted")))
    return done


def _wait_gone(users: list[str]) -> None:
    deadline = time.monotonic() + DRAIN_S
    while slurm.jobs_of(users) and time.monotonic() < deadline:
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
    """Every workshop: its reservation window and nodes, its participants."""
    result = []
    for name, description in sorted(_workshop_accounts().items()):
        res = slurm.reservation(name)
        result.append({"name": name, "description": description,
                       "participants": len(_associated(the_cluster, name)),
                       "start": res.get("StartTime", ""), "end": res.get("EndTime", ""),
                       "nodes": res.get("Nodes", "")})
    return result
