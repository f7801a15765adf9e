"""Slurm's refusals of a job, each as one line that says what to do: ONE table.

A refusal is what sbatch prints when it refuses a job (Slurm 22.05's words, from
``src/common/slurm_errno.c``, and the limit it names on a line of its own before them
under ``DenyOnLimit``), or the reason a job waits for where it can never start. Each row
of :data:`TABLE` maps those words to pyhpc's line; anything not in it is passed on once,
in Slurm's own words.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pyhpc.slurm import slurm
from pyhpc.slurm.reservations import Choice, when


@dataclass(frozen=True)
class Refusal:
    """Slurm's words for one refusal (``said``: any of them, in sbatch's output or as a
    pending reason) and pyhpc's line for it (``line``: formatted with :class:`Context`'s
    fields)."""

    key: str
    said: tuple[str, ...]
    line: str


#: Most specific first: sbatch prints the limit (``QOSMaxGRESPerUser``) before the line
#: every QOS limit fails with ("Job violates accounting/QOS policy ...").
TABLE: tuple[Refusal, ...] = (
    Refusal("gpus_per_user", ("QOSMaxGRESPerUser",),
            "gpus_per_node: your jobs together would hold more GPUs than your QOS allows "
            "each user; ask for fewer, or wait for one of yours to end (pyhpc status; "
            "pyhpc cancel JOBID)"),
    Refusal("nodes_per_user", ("QOSMaxNodePerUserLimit",),
            "nodes: your jobs together would hold more nodes than your QOS allows each "
            "user; ask for fewer, or wait for one of yours to end (pyhpc status; "
            "pyhpc cancel JOBID)"),
    Refusal("jobs_per_user", ("QOSMaxSubmitJobPerUserLimit", "QOSMaxJobsPerUserLimit",
                              "AssocMaxSubmitJobLimit"),
            "jobs: you have as many jobs queued and running as your QOS allows each "
            "user; wait for one to end, or cancel one (pyhpc status; pyhpc cancel JOBID)"),
    Refusal("gpus_per_job", ("QOSMaxGRESPerJob",),
            "gpus_per_node: the job asks for more GPUs than your QOS allows a job; ask "
            "for fewer"),
    Refusal("nodes_per_job", ("QOSMaxNodePerJobLimit",),
            "nodes: the job asks for more nodes than your QOS allows a job; ask for "
            "fewer"),
    Refusal("time_per_job", ("QOSMaxWallDurationPerJobLimit",),
            "time: the job asks for longer than your QOS allows a job; ask for less "
            "(--time)"),
    Refusal("qos_limit", ("Job violates accounting/QOS policy",),
            "the job is beyond a limit of your account's QOS; ask for less, or wait "
            "for one of your jobs to end (sacctmgr show qos lists the limits)"),
    Refusal("reservation_required", ("Invalid qos specification", "InvalidQOS"),
            "reservation: your account's QOS runs jobs only in a reservation{waiting}"),
    Refusal("no_association", ("Invalid account or account/partition combination",
                               "InvalidAccount"),
            "{association}"),
    Refusal("partition_time", ("PartitionTimeLimit",
                               "Requested time limit is invalid (missing or exceeds some limit)"),
            "time: longer than {part} allows ({sinfo} shows its limit); ask for less "
            "(--time)"),
    Refusal("partition_nodes", ("PartitionNodeLimit", "Node count specification invalid"),
            "nodes: more than {part} gives one job ({sinfo} shows its nodes); ask for fewer "
            "(--nodes)"),
    Refusal("reservation_gone", ("Requested reservation is invalid",),
            "reservation: Slurm has no reservation {reservation} now: it has ended, or was "
            "never made (scontrol show reservation lists yours)"),
    Refusal("reservation_denied", ("Access denied to requested reservation",),
            "reservation: {reservation} does not admit you (neither your user nor your "
            "account); run without it, or ask its owner"),
    Refusal("reservation_not_active", ("Requested reservation not usable now",),
            "reservation: {reservation} cannot run jobs now (it has not started, or its "
            "nodes are down: scontrol show reservation {reservation}); submit when it runs"),
    Refusal("no_nodes", ("Requested node configuration is not available",),
            "the job asks for nodes that {part}{inside} does not have ({sinfo}); check "
            "--partition, --nodes and --gpus-per-node"),
)


@dataclass(frozen=True)
class Context:
    """What the lines name: who submitted, where, and the reservation chosen for them."""

    user: str
    cluster: str
    partition: str = ""
    choice: Choice = Choice()


def find(said: str) -> Refusal | None:
    """The table's row for what Slurm said, or None."""
    return next((r for r in TABLE if any(s in said for s in r.said)), None)


def slurm_words(said: str) -> str:
    """What Slurm said, once: the reason for the failure without sbatch's prefixes."""
    lines = [line.strip() for line in said.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "refused the job"
    last = re.sub(r"^(?:sbatch: )?(?:error: )?(?:Batch job submission failed: )?", "", last)
    limit = next((line.split("error: ", 1)[1] for line in lines[:-1]
                  if line.startswith("sbatch: error: ") and " " not in line.split("error: ", 1)[1]),
                 "")
    return f"{limit}: {last}" if limit else last


def _waiting(ctx: Context) -> str:
    choice = ctx.choice
    if choice.waiting:
        r = choice.waiting[0]
        return f", and yours, {r.name}, starts at {when(r.start)}; submit then"
    if choice.elsewhere:
        r = choice.elsewhere[0]
        return (f", and yours, {r.name}, holds nodes of partition {r.partition}; add "
                f"--partition {r.partition}")
    if choice.name:
        return f", and {choice.name} was asked for: check its partition and account"
    return (", and none that admits you is active now (a workshop's ends with its window); "
            "name one with --reservation NAME, or ask your instructor")


def _association(ctx: Context) -> str:
    """No account at all, or none for this partition (asked of Slurm only now)."""
    try:
        mine = slurm.my_associations(ctx.user)
    except slurm.SlurmError:
        mine = []
    if not mine:
        return (f"user {ctx.user} has no account on cluster {ctx.cluster}; an admin adds it "
                "to accounts in cluster.yml")
    parts = sorted({p for _, p in mine if p})
    where = f"; add --partition {parts[0]}" if parts and ctx.partition not in parts else ""
    yours = ", ".join(f"{a} (partition {p})" if p else a for a, p in mine)
    return (f"account: your accounts on cluster {ctx.cluster} are {yours}; the job names "
            f"another account, or a partition none of them admits{where}")


def explain(said: str, ctx: Context) -> str:
    """One line for what Slurm said when it refused a job: the table's, with Slurm's own
    words after it; what the table does not know, in Slurm's words alone."""
    words = slurm_words(said)
    row = find(said)
    if row is None:
        return f"sbatch refused the job: {words}"
    reservation = ctx.choice.name or "(none)"
    line = row.line.format(
        **_partition(ctx.partition), reservation=reservation,
        inside=f" in reservation {ctx.choice.name}" if ctx.choice.name else "",
        waiting=_waiting(ctx) if "{waiting}" in row.line else "",
        association=_association(ctx) if "{association}" in row.line else "")
    return line if row.key == "no_association" and line.startswith("user ") else (
        f"{line} (Slurm: {words})")


def pending(reason: str, partition: str = "") -> str | None:
    """The table's line for a job that waits for ``reason`` and can never start, or None."""
    row = find(reason)
    if row is None or "{association}" in row.line or "{waiting}" in row.line:
        return None
    return row.line.format(**_partition(partition), reservation="its reservation", inside="",
                           waiting="", association="")


def _partition(name: str) -> dict[str, str]:
    """How a line names the job's partition, and the sinfo that shows it."""
    return ({"part": f"partition {name}", "sinfo": f"sinfo -p {name}"} if name else
            {"part": "the job's partition", "sinfo": "sinfo"})
