"""Slurm's commands run as another user, through sudo: what the hub runs for each user.

The hub's own user has no Slurm account of its own; it starts, watches and stops a user's
notebook server as that user (``sudo -n -u USER``), and reads what that user may choose
as that user too, so Slurm's PrivateData shows it exactly what the user would see. Each
command here has one fixed form; the hub's sudo rule
(``ansible/roles/jupyterhub/templates/etc/sudoers.d/pyhpc-hub.j2``) allows exactly these
forms and nothing else, and a unit test matches every one against it. Every command goes
through :func:`pyhpc.slurm.slurm.run`, the one runner tests replace.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

from pyhpc import validate
from pyhpc.slurm import slurm

SUDO = "/usr/bin/sudo"
#: Where Debian's slurm-client puts the commands (the sudo rule names these paths).
BIN = "/usr/bin"
#: squeue's answer for one job: its state and the node its batch script runs on.
QUERY_FORMAT = "%T %B"
#: squeue's answer for each of the user's jobs: its id and its comment.
FIND_FORMAT = "%i %k"
#: How long a submission slurmctld did not answer is looked for before it counts as lost.
FIND_WAIT_S = 30.0
FIND_EVERY_S = 2.0
JOB_ID = re.compile(r"[0-9]{1,12}")


@dataclass(frozen=True)
class Association:
    """One of the user's associations: its account, partition ("" for any) and QOS."""

    account: str
    partition: str = ""
    qos: tuple[str, ...] = ()
    default_qos: str = ""


def argv(user: str, tool: str, *args: str) -> list[str]:
    """``sudo -n -u USER /usr/bin/TOOL ARGS`` (-n: fail at once rather than ask for a
    password the hub has not got)."""
    validate.name("user", user, "user", error=slurm.SlurmError)
    return [SUDO, "-n", "-u", user, f"{BIN}/{tool}", *args]


def job_id(value: str, where: str = "job_id") -> str:
    """A plain Slurm job id (digits): the only id these commands take."""
    if not JOB_ID.fullmatch(value):
        raise slurm.SlurmError(f"{where}: {value[:40]!r} is not a Slurm job id", where)
    return value


def submit(user: str, script: str) -> str:
    """``sbatch --parsable`` as ``user``, the script on stdin; its job id. Where slurmctld
    did not answer in time: :class:`pyhpc.slurm.slurm.AmbiguousSubmit` (the job may exist,
    :func:`submitted` looks for it)."""
    proc = slurm.run(argv(user, "sbatch", "--parsable"), stdin=script, submits=True)
    lines = proc.stdout.strip().splitlines()
    return job_id(lines[-1].split(";")[0] if lines else "", "sbatch")


def submitted(user: str, comment: str) -> str | None:
    """After an :class:`~pyhpc.slurm.slurm.AmbiguousSubmit`: the id of the user's job whose
    comment is ``comment`` (the script's ``#SBATCH --comment``, unique to that submission),
    looked for up to :data:`FIND_WAIT_S` (slurmctld may take the queued submission late);
    None if it never shows: then slurmctld did not accept it."""
    deadline = time.monotonic() + FIND_WAIT_S
    while (found := find(user, comment)) is None and time.monotonic() < deadline:
        time.sleep(FIND_EVERY_S)
    return found


def find(user: str, comment: str) -> str | None:
    """``squeue`` as ``user`` over their own jobs: the id of the one whose comment is
    ``comment``, or None (none has it, or Slurm did not answer)."""
    proc = slurm.run(argv(user, "squeue", "-h", "--me", "-o", FIND_FORMAT), check=False)
    if proc.returncode != 0:
        return None
    for line in proc.stdout.splitlines():
        job, _, said = line.strip().partition(" ")
        if said == comment and JOB_ID.fullmatch(job):
            return job
    return None


def query(user: str, job: str) -> str:
    """``squeue`` as ``user`` for one job: ``STATE NODE`` while Slurm knows the job, else
    what squeue said (batchspawner reads both)."""
    proc = slurm.run(argv(user, "squeue", "-h", "-j", job_id(job), "-o", QUERY_FORMAT),
                     check=False)
    return (proc.stdout if proc.returncode == 0 else proc.stderr).strip()


def cancel(user: str, job: str) -> None:
    """``scancel`` as ``user``; a job Slurm no longer knows is gone already."""
    proc = slurm.run(argv(user, "scancel", job_id(job)), check=False)
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
        raise slurm.SlurmError(f"scancel: {slurm.why(proc)}", "scancel")


def _table(text: str) -> list[dict[str, str]]:
    """``-P`` output with its header line as rows of column -> value."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    head = lines[0].split("|")
    return [dict(zip(head, line.split("|"), strict=False)) for line in lines[1:]]


def associations(user: str) -> list[Association]:
    """The user's associations, as ``sacctmgr`` shows them to that user (PrivateData
    shows a user only their own; rows of other users are dropped here all the same)."""
    proc = slurm.run(argv(user, "sacctmgr", "-P", "show", "associations"))
    found = []
    for row in _table(proc.stdout):
        if row.get("User") != user or not row.get("Account"):
            continue
        qos = tuple(sorted(q for q in row.get("QOS", "").split(",") if q))
        found.append(Association(row["Account"], row.get("Partition", ""), qos,
                                 row.get("Def QOS", "")))
    return sorted(set(found), key=lambda a: (a.account, a.partition))


def reservations(user: str) -> list[dict[str, str]]:
    """Every reservation ``scontrol`` shows to ``user`` (PrivateData: those the user may
    use), one mapping of fields each."""
    proc = slurm.run(argv(user, "scontrol", "-o", "show", "reservation"))
    found = (slurm.fields_of(line) for line in proc.stdout.splitlines())
    return [f for f in found if f.get("ReservationName")]

