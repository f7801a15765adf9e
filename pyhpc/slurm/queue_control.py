"""The Slurm commands an admin's queue save and restore run (``pyhpc admin upgrade queue``),
as root on the controller: hold, release, requeue, write a batch script, and submit as a
job's own user. Every command goes through :func:`pyhpc.slurm.slurm.run`, the one runner
tests replace.

A job is submitted again as its user with ``runuser -u USER -- env -i ...``: no shell
reads its options, and sbatch runs in a plain environment of that user's (home, PATH,
name), never root's; the job's own stored environment reaches it through
``--export-file``, a file only that user can read.
"""
from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import struct
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pyhpc import files, paths, validate
from pyhpc.slurm import slurm

RUNUSER = "/usr/sbin/runuser"
#: The PATH a job submitted again starts with (Debian's default for users).
USER_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Largest stored environment read (Slurm's own limit is far below).
ENV_LIMIT = 4 * 1024 * 1024
#: Where a job's environment waits, for its user's sbatch to read, during a restore.
EXPORT_DIR = "/run"
#: The upgrade's maintenance reservation: no job starts on any node while it is there.
RESERVATION = "pyhpc-upgrade"
#: sacct over all of accounting's years: far longer than a usual query.
ACCOUNTING_TIMEOUT_S = 600.0


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


def config() -> dict[str, str]:
    """``scontrol show config`` as KEY -> value, one per ``KEY = value`` line: ONE call."""
    found = re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", slurm.run(["scontrol", "show", "config"]).stdout,
                       re.MULTILINE)
    return dict(found)


def state_dir(conf: dict[str, str] | None = None) -> Path:
    """slurmctld's StateSaveLocation (``scontrol show config``, or ``conf`` read from it)."""
    value = (config() if conf is None else conf).get("StateSaveLocation", "")
    if not value.startswith("/"):
        raise slurm.SlurmError("scontrol: show config names no StateSaveLocation", "scontrol")
    return Path(value.split()[0])


def config_number(conf: dict[str, str], key: str) -> int:
    """A whole number of ``scontrol show config`` (``NEXT_JOB_ID``, ``FirstJobId``)."""
    value = conf.get(key, "")
    if not value.isdigit():
        raise slurm.SlurmError(f"scontrol: show config gives no number for {key}", "scontrol")
    return int(value)


def highest_accounted_id() -> int:
    """The highest job id accounting holds of this cluster, every user's, over all time
    (0: none): ONE sacct call. Without -X: Slurm 22.05's sacct -X leaves out array tasks
    that ran, whose own ids are then only on their steps' lines (``128.batch``)."""
    proc = slurm.run(["sacct", "-a", "-n", "-P", "-o", "JobIDRaw", "-S", "1970-01-01T00:00:00",
                      "-E", "now"], timeout_s=ACCOUNTING_TIMEOUT_S)
    return max((int(m) for m in re.findall(r"^(\d+)", proc.stdout, re.MULTILINE)), default=0)


def environment(job_id: str, where: Path) -> list[str] | None:
    """The environment sbatch stored with pending job ``job_id`` in StateSaveLocation
    ``where`` (22.05: ``hash.N/job.ID/environment``, a native uint32 count, then as many
    NUL-ended NAME=value strings; no Slurm command prints it); None where there is none
    or it is not of that shape. Bytes that are not UTF-8 are kept (surrogateescape)."""
    fh, _ = files.try_open_regular(where / f"hash.{int(job_id) % 10}" / f"job.{job_id}" /
                                   "environment")
    if fh is None:
        return None
    with fh:
        data = fh.read(ENV_LIMIT + 1)
    if len(data) < 4 or len(data) > ENV_LIMIT:
        return None
    count = struct.unpack("=I", data[:4])[0]
    parts = data[4:].split(b"\0")
    if len(parts) != count + 1 or parts[-1]:
        return None
    return [p.decode(errors="surrogateescape") for p in parts[:-1]]


def submit_as(user: str, script: str, options: Sequence[str],
              env: Sequence[str] | None = None, umask: str = "") -> str:
    """sbatch ``script`` (on stdin) with ``options`` as ``user``; the new job's id. ``env``:
    the job's environment, handed to sbatch in a file only that user can read
    (``--export-file``), removed after; ``umask``: the one sbatch runs with (the job's)."""
    with _export_file(user, env) as path, _umask(umask):
        extra = [f"--export-file={path}"] if path else []
        proc = slurm.run(_as(user, ["sbatch", "--parsable", *extra, *options]), stdin=script,
                         submits=True, check=False)
    if proc.returncode != 0:
        if any(t in proc.stderr for t in slurm.AMBIGUOUS):
            raise slurm.ambiguous("sbatch", proc)
        raise slurm.SlurmError(f"sbatch: {slurm.why(proc)}", "sbatch")
    return proc.stdout.strip().splitlines()[-1].split(";")[0]


@contextlib.contextmanager
def _umask(mode: str) -> Iterator[None]:
    old = os.umask(int(mode, 8)) if mode else None
    try:
        yield
    finally:
        if old is not None:
            os.umask(old)


@contextlib.contextmanager
def _export_file(user: str, env: Sequence[str] | None) -> Iterator[str]:
    """A NUL-separated file of ``env`` in a fresh directory of root's under /run, both
    then given to ``user`` (0700, 0600); removed on the way out. "" for no ``env``."""
    if not env:
        yield ""
        return
    entry = pwd.getpwnam(user)
    top = Path(tempfile.mkdtemp(prefix="pyhpc-queue-", dir=EXPORT_DIR))
    try:
        path = top / "environment"
        files.write_with(path, lambda fh: fh.write(b"".join(
            e.encode(errors="surrogateescape") + b"\0" for e in env)), "environment", 0o600)
        for p in (path, top):
            os.chown(p, entry.pw_uid, entry.pw_gid)
        yield str(path)
    finally:
        shutil.rmtree(top, ignore_errors=True)


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
