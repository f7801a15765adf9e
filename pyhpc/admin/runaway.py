"""Runaway records: jobs accounting holds open that slurmctld lost when it restarted.

slurmctld saves job state every few seconds; jobs it accepted just before its host died
are gone after the restart, while slurmdbd keeps their records PENDING or RUNNING for
ever (what ``sacctmgr show runawayjobs`` lists). The doctor lists them, every user's
(it runs as root): records ``sacct -a`` holds open, submitted within the last
:data:`WINDOW_DAYS` days, that slurmctld does not know (one squeue call) and that were
submitted before its boot time. ``--fix-runaway`` first appends each to the ledger
(:data:`pyhpc.paths.RUNAWAY_LEDGER`: root's, 0644, JSON lines, never through a link),
so ``pyhpc status`` still calls those jobs LOST once sacct says COMPLETED, then has
``sacctmgr -i show runawayjobs`` close them (COMPLETED, end = start).
"""
from __future__ import annotations

import os
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
        return found, ""
    if found.agent_queue != 0:
        raise RunawayError(f"--fix-runaway: {check(found)[1]}; nothing closed")
    write_ledger(found.records, found.boot, now)
    return found, slurm.fix_runaway()


def write_ledger(records: Sequence[OpenRecord], boot: int, now: float | None = None) -> None:
    """Append each record to the ledger, creating it (and its directory, 0755) as root's."""
    ledger = paths.RUNAWAY_LEDGER
    files.make_dir(ledger.parent, "--fix-runaway", mode=0o755)
    files.append_text(ledger, "".join(lost.ledger_line(r, boot, now) for r in records),
                      "--fix-runaway", mode=0o644)


def table(found: Runaways) -> str:
    """The records as an aligned text table."""
    head = ("JOB", "USER", "ACCOUNT", "STATE", "SUBMITTED")
    body = [(r.job, r.user, r.account, r.state, stamp(r.submit)) for r in found.records]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in [head, *body])
