"""Runaway records: jobs accounting holds open that slurmctld lost when it restarted.

slurmctld saves job state every few seconds; jobs it accepted just before its host died
are gone after the restart, while slurmdbd keeps their records PENDING or RUNNING for
ever (what ``sacctmgr show runawayjobs`` lists). The doctor lists them, every user's
(it runs as root): records ``sacct -a`` holds open, submitted within the last
:data:`WINDOW_DAYS` days, that slurmctld does not know (one squeue call) and that were
submitted before its boot time. ``--fix-runaway`` first appends each to its owner's
ledger (:data:`pyhpc.paths.RUNAWAY_LEDGERS`: root's, 0600, JSON lines, never through a
link; an ACL entry lets that user, and no other, read it), so their ``pyhpc status``
still calls those jobs LOST once sacct says COMPLETED, then has ``sacctmgr -i show
runawayjobs`` close them (COMPLETED, end = start).
"""
from __future__ import annotations

import json
import os
import pwd
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pyhpc import files, paths
from pyhpc.errors import PyhpcError
from pyhpc.slurm import lost, slurm
from pyhpc.slurm.rows import OpenRecord, stamp

#: How far back the doctor looks for open records (sacct -S).
WINDOW_DAYS = 30
NAME = "runaway jobs"


@dataclass(frozen=True)
class Runaways:
    """Open records slurmctld lost, its boot time, and the DBD agent's queue (None: sdiag
    did not say; nonzero: some end records may still be on their way)."""

    records: tuple[OpenRecord, ...]
    boot: int
    agent_queue: int | None


def _known(record: OpenRecord, known: dict[str, set[int]]) -> bool:
    """slurmctld knows this run: a job of its id with its submit time (or one unknown)."""
    times = known.get(record.base)
    return times is not None and (record.submit in times or 0 in times or not record.submit)


def find(now: float | None = None) -> Runaways:
    """One sacct call; one squeue call and one scontrol call if accounting holds any job
    open; one sdiag call if some of those are runaway."""
    since = int((time.time() if now is None else now) - WINDOW_DAYS * 86400)
    records = slurm.open_records(since)
    if not records:
        return Runaways((), 0, None)
    known: dict[str, set[int]] = {}
    for row in slurm.known_jobs():
        known.setdefault(row.job_id, set()).add(row.submit)
    boot = slurm.boot_time()
    gone = tuple(r for r in records if not _known(r, known) and 0 < r.submit < boot)
    return Runaways(gone, boot, slurm.agent_queue() if gone else None)


def summary(found: Runaways) -> str:
    """How many, whose, since when."""
    users = Counter(r.user for r in found.records)
    whose = ", ".join(f"{u} {n}" for u, n in sorted(users.items()))
    return (f"{len(found.records)} open in accounting, lost by slurmctld (restarted "
            f"{stamp(found.boot)}): {whose}; submitted since "
            f"{stamp(min(r.submit for r in found.records))}")


def check(found: Runaways) -> tuple[bool, str]:
    """The doctor's verdict and detail."""
    if not found.records:
        return True, "none: slurmctld knows every job accounting holds open"
    if found.agent_queue != 0:
        waiting = ("sdiag does not say" if found.agent_queue is None else
                   f"{found.agent_queue} accounting messages not yet sent to slurmdbd")
        return False, (f"{summary(found)}; {waiting}: some may still get their end, "
                       "look again later")
    return False, f"{summary(found)}; pyhpc doctor --fix-runaway closes them"


#: What closing them costs the usage reports: sacctmgr has slurmdbd redo its rollups from the
#: month before the first of them, and drops the rolled-up usage since then until it has
#: (the lab's hourly table was empty after a fix, and full 2 s after a slurmdbd restart).
AFTER_FIX = ("sreport may show no usage until slurmdbd's next rollup (on the hour, or when "
             "slurmdbd restarts): sacctmgr has it redo usage from the month before the first of them")


class RunawayError(PyhpcError):
    """--fix-runaway refused: not root, or records may still be on their way."""


def is_root() -> bool:
    return os.geteuid() == 0


def fix(now: float | None = None) -> tuple[Runaways, str]:
    """Record every runaway job in the ledger, then close them with sacctmgr; returns
    them and what sacctmgr printed. Refused (one line) unless root, and while slurmctld
    holds accounting messages not yet sent."""
    if not is_root():
        raise RunawayError("--fix-runaway: only root closes accounting records (sacctmgr "
                           "show runawayjobs); run pyhpc doctor --fix-runaway as root")
    found = find(now)
    if not found.records:
        write_ledger((), found.boot, now)  # moves a shared ledger from before, if any
        return found, ""
    if found.agent_queue != 0:
        raise RunawayError(f"--fix-runaway: {check(found)[1]}; nothing closed")
    write_ledger(found.records, found.boot, now)
    return found, slurm.fix_runaway()


def owner(user: str) -> int | None:
    """The uid of a job's owner as sacct names them (a name, or a uid it cannot resolve)."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return int(user) if user.isdigit() else None


def append_ledger(uid: int | None, lines: str) -> None:
    """Append to the ledger of ``uid``'s jobs (root's, 0600), which only ``uid`` may read
    besides root (an ACL entry; without ACLs on the filesystem only root reads it)."""
    path = lost.ledger_path(uid)
    files.append_text(path, lines, "--fix-runaway", mode=0o600)
    if uid is not None:
        files.let_read(path, uid, "--fix-runaway")


def write_ledger(records: Sequence[OpenRecord], boot: int, now: float | None = None) -> None:
    """Append each record to its owner's ledger, creating the folder (0711: nobody lists
    whose ledgers there are) as root's; a shared ledger from before is moved in first."""
    files.make_dir(paths.RUNAWAY_LEDGERS, "--fix-runaway", mode=0o711)
    split_shared()
    append_by_owner([(r.user, lost.ledger_line(r, boot, now)) for r in records])


def append_by_owner(rows: Sequence[tuple[str, str]]) -> None:
    """Append each (user, line) to that user's ledger, one write per ledger."""
    by_owner: dict[int | None, list[str]] = {}
    for user, line in rows:
        by_owner.setdefault(owner(user), []).append(line)
    for uid, lines in by_owner.items():
        append_ledger(uid, "".join(lines))


def split_shared() -> None:
    """Move the rows of the one ledger of every user's jobs (0644, from before) into each
    owner's ledger, then remove it. Only a regular file of root's is read; any other
    thing at that path is left where it is."""
    shared = paths.RUNAWAY_LEDGER_SHARED
    fh, _ = files.try_open_regular(shared)
    if fh is None:
        return
    with fh:
        if os.fstat(fh.fileno()).st_uid != os.geteuid():
            return
        os.fchmod(fh.fileno(), 0o600)  # private at once, whatever happens next
        data = fh.read(lost.LEDGER_LIMIT)
    rows = []
    for line in data.decode(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            rows.append((str(entry.get("user", "")), line + "\n"))
    append_by_owner(rows)
    shared.unlink()


def table(found: Runaways) -> str:
    """The records as an aligned text table."""
    head = ("JOB", "USER", "ACCOUNT", "STATE", "SUBMITTED")
    body = [(r.job, r.user, r.account, r.state, stamp(r.submit)) for r in found.records]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in [head, *body])
