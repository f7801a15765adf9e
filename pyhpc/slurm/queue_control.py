"""The Slurm commands an admin's queue save and restore run (``pyhpc admin upgrade queue``),
as root on the controller: hold, release, requeue, write a batch script, and submit as a
job's own user. Every command goes through :func:`pyhpc.slurm.slurm.run`, the one runner
tests replace.

A job is submitted again as its user with ``runuser -u USER -- env -i ...``: no shell
reads its options, and the job gets a plain environment of that user's (home, PATH, name),
never root's.
"""
from __future__ import annotations

import json
import pwd
from collections.abc import Sequence
from typing import Any

from pyhpc import paths, validate
from pyhpc.slurm import slurm

RUNUSER = "/usr/sbin/runuser"
#: The PATH a job submitted again starts with (Debian's default for users).
USER_PATH = "/usr/local/bin:/usr/bin:/bin"
#: The upgrade's maintenance reservation: no job starts on any node while it is there.
RESERVATION = "pyhpc-upgrade"


def jobs() -> list[dict[str, Any]]:
    """Every job slurmctld knows, as ``squeue --json`` prints it (root: every user's): ONE
    call."""
    proc = slurm.run(["squeue", "--all", "--json"])
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise slurm.SlurmError("squeue: --json printed no JSON", "squeue") from None
    found = data.get("jobs") if isinstance(data, dict) else None
    return [j for j in found or [] if isinstance(j, dict)]


def batch_script(job_id: str) -> str:
    """``scontrol write batch_script ID -``: the job's script as Slurm holds it."""
    return slurm.run(["scontrol", "write", "batch_script", job_id, "-"]).stdout


def hold(job_id: str) -> None:
    """An admin's hold (``scontrol hold``): the user cannot release it."""
    slurm.run(["scontrol", "hold", job_id])


def user_hold(job_id: str) -> None:
    """A user's hold (``scontrol uhold``), as the user's own ``scontrol hold`` sets it."""
    slurm.run(["scontrol", "uhold", job_id])


def release(job_id: str) -> None:
    slurm.run(["scontrol", "release", job_id])


def requeue_hold(job_id: str) -> None:
    """``scontrol requeuehold``: the running job gets SIGTERM and pends again, held."""
    slurm.run(["scontrol", "requeuehold", job_id])


def set_dependency(job_id: str, dependency: str) -> None:
    slurm.run(["scontrol", "update", f"JobId={job_id}", f"Dependency={dependency}"])


def block() -> bool:
    """The maintenance reservation on every node, from now, for ever (MAINT: it counts as
    maintenance in accounting; IGNORE_JOBS: running jobs go on); True if it was made
    now, False if it was there already."""
    if slurm.reservation(RESERVATION):
        return False
    slurm.create_reservation({"ReservationName": RESERVATION, "StartTime": "now",
                              "Duration": "infinite", "Nodes": "ALL", "Users": "root",
                              "Flags": "MAINT,IGNORE_JOBS"})
    return True


def blocked() -> bool:
    return bool(slurm.reservation(RESERVATION))


def unblock() -> None:
    if slurm.reservation(RESERVATION):
        slurm.delete_reservation(RESERVATION)


def _as(user: str, argv: Sequence[str]) -> list[str]:
    """``runuser -u USER -- env -i HOME=.. USER=.. LOGNAME=.. SHELL=.. PATH=.. ARGV``."""
    validate.name("user", user, "user", error=slurm.SlurmError)
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise slurm.SlurmError(f"user: {user} is not a user of this host", "user") from None
    return [RUNUSER, "-u", user, "--", "env", "-i", f"HOME={entry.pw_dir}", f"USER={user}",
            f"LOGNAME={user}", f"SHELL={entry.pw_shell}", f"PATH={USER_PATH}",
            "LANG=C.UTF-8", *argv]


def submit_as(user: str, script: str, options: Sequence[str]) -> str:
    """sbatch ``script`` (on stdin) with ``options`` as ``user``; the new job's id."""
    proc = slurm.run(_as(user, ["sbatch", "--parsable", *options]), stdin=script, submits=True,
                     check=False)
    if proc.returncode != 0:
        if any(t in proc.stderr for t in slurm.AMBIGUOUS):
            raise slurm.ambiguous("sbatch", proc)
        raise slurm.SlurmError(f"sbatch: {slurm.why(proc)}", "sbatch")
    return proc.stdout.strip().splitlines()[-1].split(";")[0]


def resubmit_as(user: str, job_id: str, folder: str) -> str:
    """``pyhpc resubmit JOB --force --folder FOLDER --json`` as ``user`` (a job pyhpc
    submitted through submitit: it comes back from its own pickle); the new job's id."""
    pyhpc = str(paths.SHARED_VENV / "bin" / "pyhpc")
    proc = slurm.run(_as(user, [pyhpc, "resubmit", job_id, "--force", "--folder", folder,
                                "--json"]), submits=True, check=False)
    try:
        return str(json.loads(proc.stdout)["job_id"])
    except (ValueError, KeyError, TypeError):
        raise slurm.SlurmError(f"pyhpc resubmit {job_id}: {slurm.why(proc)}",
                               "resubmit") from None
