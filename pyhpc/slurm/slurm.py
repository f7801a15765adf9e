"""The one place that runs Slurm's commands: sbatch, squeue, sacct, scancel, scontrol,
sinfo, sacctmgr, sdiag and srun (plus munge's, for the doctor).

Client behaviour schedulers ask of their clients lives here too: one query per poll
for any number of jobs, a bounded retry with backoff while slurmctld is busy, and a
clear error when a command is missing. Queries use ``--json`` where the installed
Slurm answers it (22.05's openapi/v0.0.38 and later) and fall back to parsing the
text output where it does not (parsed in :mod:`pyhpc.slurm.rows`). Tests replace
:data:`RUNNER`, and nothing else.
"""
from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pyhpc.errors import PyhpcError
from pyhpc.slurm.rows import (
    OWNER_FORMAT,
    JobView,
    OpenRecord,
    job_views,
    open_rows,
    output_files,
    owner_rows,
    sacct_rows,
    squeue_rows,
    stamp,
    text_rows,
)
from pyhpc.slurm.rows import JobRow as JobRow  # re-exported: the rows every caller reads
from pyhpc.slurm.rows import epoch as epoch

#: ``RUNNER(argv, stdin, timeout_s)``: how every command is run. Tests replace it.
Runner = Callable[[Sequence[str], "str | None", float], "subprocess.CompletedProcess[str]"]
#: Seconds one command may take.
TIMEOUT_S = 90.0
#: slurmctld answers these while busy; the call is retried, a few times, with backoff.
TRANSIENT = ("Socket timed out", "Resource temporarily unavailable",
             "Unable to contact slurm controller")
RETRIES = 3
BACKOFF_S = 0.5
#: Of those, the ones where slurmctld may have carried the request out and only its answer
#: was lost: a submission is never sent again on these (seen on hostlab under load: one
#: sbatch, retried after "Socket timed out", left two jobs).
AMBIGUOUS = ("Socket timed out",)
#: Pending reasons after which a job can never start without a change by someone: the
#: request itself exceeds a limit. Reasons that clear by themselves are not here:
#: ReqNodeNotAvail (a node down or restarting comes back) and AssocMaxJobsLimit (other
#: jobs of the association finish); a wait shows them and goes on until --timeout.
NEVER_STARTS = ("PartitionTimeLimit", "PartitionNodeLimit", "InvalidAccount", "InvalidQOS",
                "AssocMaxNodesPerJobLimit", "AssocMaxWallDurationPerJobLimit",
                "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit")


class SlurmError(PyhpcError):
    """A Slurm command is missing, timed out or refused; the message names the command."""


class NoAnswer(SlurmError):
    """A Slurm command ran and got no answer within its time (its daemon hangs or is cut
    off), as opposed to one that is missing."""


class AmbiguousSubmit(SlurmError):
    """A submission slurmctld did not answer in time: it may have accepted the job."""


#: Tools whose printed times pyhpc reads: asked for Slurm's standard format whatever the
#: caller's SLURM_TIME_FORMAT says (never set for sbatch or srun: jobs inherit it).
TIME_READERS = ("squeue", "sacct", "scontrol", "sdiag", "sacctmgr")


def run_command(argv: Sequence[str], stdin: str | None, timeout_s: float,
                ) -> subprocess.CompletedProcess[str]:
    """The real runner: capture text output; never raises for a non-zero exit. Output is
    UTF-8 with any other byte replaced: Slurm takes a job name of any bytes and prints it
    as it is, in ``--json`` too, and one user's name must not fail every reader."""
    env = {**os.environ, "SLURM_TIME_FORMAT": "standard"} if argv[0] in TIME_READERS else None
    proc = subprocess.run(list(argv), input=None if stdin is None else stdin.encode(),
                          capture_output=True, timeout=timeout_s, check=False, env=env)
    return subprocess.CompletedProcess(proc.args, proc.returncode,
                                       proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


RUNNER: Runner = run_command
#: Commands run by this process, by tool, each attempt counted (a retry too): the exporters
#: show from it that a scrape runs one of each, whatever the number of jobs.
CALLS: collections.Counter[str] = collections.Counter()


def run(argv: Sequence[str], stdin: str | None = None, check: bool = True,
        timeout_s: float = TIMEOUT_S, submits: bool = False) -> subprocess.CompletedProcess[str]:
    """Run one command through :data:`RUNNER`, retrying while slurmctld is busy.

    ``submits``: the command creates something (sbatch); it is sent again only where
    slurmctld never got it, never after an :data:`AMBIGUOUS` failure."""
    proc: subprocess.CompletedProcess[str] | None = None
    for attempt in range(RETRIES + 1):
        CALLS[argv[0]] += 1
        try:
            proc = RUNNER(argv, stdin, timeout_s)
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]}: command not found; is this a login node of the "
                             "cluster (the slurm-client package)?", argv[0]) from None
        except subprocess.TimeoutExpired:
            raise NoAnswer(f"{argv[0]}: no answer within {timeout_s:.0f} s", argv[0]) from None
        if proc.returncode == 0 or not any(t in proc.stderr for t in TRANSIENT):
            break
        if submits and any(t in proc.stderr for t in AMBIGUOUS):
            if check:
                raise ambiguous(argv[0], proc)
            break
        if attempt < RETRIES:
            time.sleep(BACKOFF_S * 2 ** attempt)
    assert proc is not None
    if check and proc.returncode != 0:
        raise SlurmError(f"{argv[0]}: {why(proc)}", argv[0])
    return proc


def ambiguous(tool: str, proc: subprocess.CompletedProcess[str]) -> AmbiguousSubmit:
    return AmbiguousSubmit(f"{tool}: {why(proc)}; slurmctld may have accepted the job all the "
                           "same: look for it with squeue --me before submitting again", tool)


def why(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line a failed command printed (or its exit status)."""
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


# -- submission and control -------------------------------------------------------------

class Refused(SlurmError):
    """sbatch refused a job; ``said`` is all it printed (22.05 names the limit a job is
    beyond on a line of its own, before the line it fails with)."""

    def __init__(self, message: str, said: str) -> None:
        super().__init__(message, "sbatch")
        self.said = said


def sbatch(script: str, options: Sequence[str] = (), test_only: bool = False) -> str:
    """Submit ``script``; returns the job id, or sbatch's verdict with ``test_only``; a
    refusal raises :class:`Refused`."""
    argv = ["sbatch", "--parsable", *(["--test-only"] if test_only else []), *options, "--",
            script]
    proc = run(argv, submits=not test_only, check=False)
    if proc.returncode != 0:
        if not test_only and any(t in proc.stderr for t in AMBIGUOUS):
            raise ambiguous("sbatch", proc)
        raise Refused(f"sbatch: {why(proc)}", proc.stderr or proc.stdout)
    if test_only:
        return proc.stderr.strip()
    return proc.stdout.strip().split(";")[0]


def cancel(job_ids: Sequence[str]) -> None:
    """scancel every id (already validated job ids)."""
    run(["scancel", "--", *job_ids])


def output_paths(job_id: str) -> list[str]:
    """A job's StdOut and StdErr as scontrol shows them, [] when Slurm no longer knows it:
    from ``squeue --json`` (ONE call; 22.05 prints every job the caller may see), never
    from scontrol's text, where a comment ``StdOut=/elsewhere`` comes first."""
    proc = run(["squeue", "--states=all", f"--jobs={job_id}", "--json"], check=False)
    return output_files(_json(proc), job_id) if proc.returncode == 0 else []


def my_job_ids() -> list[str]:
    """Ids of the calling user's queued and running jobs (array tasks folded)."""
    proc = run(["squeue", "--me", "-h", "-o", "%i"])
    return sorted({line.split("_")[0] for line in proc.stdout.split()}, key=_idkey)


def _idkey(job_id: str) -> tuple[int, str]:
    head = job_id.split("_")[0]
    return (int(head) if head.isdigit() else 0, job_id)


# -- queries -----------------------------------------------------------------------------

_json_ok: dict[str, bool] = {}
#: What a Slurm without JSON output says to ``--json``.
NO_JSON = ("unrecognized option", "invalid option", "data_parser", "serializer", "openapi")


def _rows(json_argv: list[str], text_argv: list[str],
          from_json: Callable[[dict[str, Any]], list[JobRow]]) -> list[JobRow]:
    """Rows from ``json_argv --json`` where this Slurm has JSON output, else from text."""
    tool = json_argv[0]
    if _json_ok.get(tool, True):
        proc = run([*json_argv, "--json"], check=False)
        if proc.returncode == 0:
            data = _json(proc)
            _json_ok[tool] = True
            return from_json(data)
        if "Invalid job id" in proc.stderr:
            return []  # every id has left the queue
        if _json_ok.get(tool) is not None or not any(s in proc.stderr.lower() for s in NO_JSON):
            raise SlurmError(f"{tool}: {why(proc)}", tool)
        _json_ok[tool] = False  # this Slurm has no JSON output: text from now on
    proc = run(text_argv, check=False)
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return []
        raise SlurmError(f"{tool}: {why(proc)}", tool)
    return text_rows(proc.stdout)


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """A checked command's ``--json`` answer."""
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise SlurmError(f"{proc.args[0]}: --json printed no JSON", proc.args[0]) from None
    return data if isinstance(data, dict) else {}


def _wanted(rows: Iterable[JobRow], job_ids: Sequence[str]) -> list[JobRow]:
    wanted = {j.split("_")[0] for j in job_ids}
    return [r for r in rows if r.job_id in wanted]


#: squeue's text columns: id, state, reason, submit time (parsed by rows.text_rows).
SQUEUE_FORMAT = "%i|%T|%r|%V"


def queue(job_ids: Sequence[str]) -> list[JobRow]:
    """Every job and array task of ``job_ids`` that slurmctld knows: ONE squeue call.

    ``-t all`` keeps finished jobs (for MinJobAge) with their final state.
    """
    if not job_ids:
        return []
    ids = ",".join(job_ids)
    return _wanted(_rows(["squeue", "-t", "all", "-j", ids],
                         ["squeue", "-h", "-r", "-t", "all", "-o", SQUEUE_FORMAT, "-j", ids],
                         squeue_rows), job_ids)


def known_jobs() -> list[JobRow]:
    """Every job slurmctld knows (root sees every user's): ONE squeue call."""
    return _rows(["squeue", "-t", "all"], ["squeue", "-h", "-r", "-t", "all", "-o", SQUEUE_FORMAT],
                 squeue_rows)


def accounting(job_ids: Sequence[str]) -> list[JobRow]:
    """Every record of every job and array task of ``job_ids`` in the accounting database,
    each with its submit time: ONE sacct call. ``-D``: a requeued job's earlier runs, and
    an older job whose id a new one reuses, are rows too (without it sacct shows only the
    newest job of an id)."""
    if not job_ids:
        return []
    ids = ",".join(job_ids)
    # No -X in the text form: Slurm 22.05's sacct -X drops array tasks; steps are skipped.
    return _wanted(_rows(["sacct", "-D", "-j", ids],
                         ["sacct", "-n", "-P", "-D", "-o", "JobID,State,Reason,Submit", "-j", ids],
                         sacct_rows), job_ids)


def boot_time() -> int:
    """When slurmctld last started (``scontrol show config``'s BOOT_TIME), epoch seconds;
    0 when it does not say. Every user may ask."""
    text = run(["scontrol", "show", "config"]).stdout
    found = re.search(r"^BOOT_TIME\s*=\s*(\S+)", text, re.MULTILINE)
    return epoch(found.group(1)) if found else 0


def agent_queue() -> int | None:
    """How many accounting messages slurmctld holds, not yet sent to slurmdbd (``sdiag``'s
    DBD Agent queue size; every user may ask); None when sdiag does not say."""
    proc = run(["sdiag"], check=False)
    found = re.search(r"DBD Agent queue size:\s*(\d+)", proc.stdout)
    return int(found.group(1)) if proc.returncode == 0 and found else None


#: The states ``sacct -s`` selects for records that may have no end.
OPEN_STATE_NAMES = "pending,running,requeued,suspended"


def open_records(since: int) -> list[OpenRecord]:
    """Every user's accounting records submitted since ``since`` (epoch) that have no end
    (``sacct -a``; root sees all): ONE sacct call. Steps are skipped, array tasks kept.
    ``-D``: after a crash slurmctld gives a lost job's id to a new job, and without it sacct
    shows only the newest job of an id (seen on the lab: the doctor's own check job hid the
    lost one's record)."""
    # -E: with -s and no end, sacct selects jobs in those states at -S only (none, here).
    proc = run(["sacct", "-a", "-D", "-n", "-P", "-s", OPEN_STATE_NAMES, "-S", stamp(since), "-E", "now",
                "-o", "JobID,User,Account,Submit,State,End"])
    return open_rows(proc.stdout)


def fix_runaway() -> str:
    """``sacctmgr -i show runawayjobs``: accounting closes the records of jobs slurmctld
    does not know (COMPLETED, end = start); returns what sacctmgr printed."""
    return run(["sacctmgr", "-i", "show", "runawayjobs"]).stdout


def step_states(job_id: str) -> dict[str, str]:
    """Each record of one job in accounting, its steps included (``4242``, ``4242.batch``,
    ``4242.0``), with its state's first word: ONE sacct call."""
    proc = run(["sacct", "-n", "-P", "-o", "JobID,State", "-j", job_id], check=False)
    out = {}
    for line in proc.stdout.splitlines():
        fields = line.split("|")
        if len(fields) == 2 and fields[0].split(".")[0] == job_id and fields[1].split():
            out[fields[0]] = fields[1].split()[0]
    return out


def nodes() -> dict[str, str]:
    """Node name to its short state (``idle``, ``mix``, ``down*``...), from sinfo."""
    proc = run(["sinfo", "--noheader", "--Node", "--format=%N %t"])
    return dict(sorted({tuple(line.split()[:2]) for line in proc.stdout.splitlines()  # type: ignore[misc]  # pairs
                        if len(line.split()) >= 2}))


def reasons() -> dict[str, str]:
    """Node name to the reason its drain, down or failed state was given (``sinfo
    --list-reasons``: by an admin, or by Slurm itself, "Duplicate jobid"); others absent."""
    proc = run(["sinfo", "--noheader", "--Node", "--list-reasons", "--format=%N|%E"])
    pairs = (line.split("|", 1) for line in proc.stdout.splitlines() if "|" in line)
    return dict(sorted((node, why.strip()) for node, why in pairs))


def ping() -> subprocess.CompletedProcess[str]:
    """``scontrol ping`` (not checked: the doctor reports its answer)."""
    return run(["scontrol", "ping"], check=False)


def clusters() -> subprocess.CompletedProcess[str]:
    """``sacctmgr show cluster``: answers only when slurmdbd does."""
    return run(["sacctmgr", "--noheader", "--parsable2", "show", "cluster", "format=cluster"],
               check=False)


def srun(args: Sequence[str], timeout_s: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``srun ARGS`` in the foreground (not checked)."""
    return run(["srun", *args], check=False, timeout_s=timeout_s)


def node_info(timeout_s: float = TIMEOUT_S) -> dict[str, dict[str, str]]:
    """Every node's ``scontrol show node -o`` fields (``Gres``, ``State``, ``Partitions``,
    ``CfgTRES``, ``AllocTRES``...): ONE call for all nodes.

    Only the first occurrence of a key counts: free text (``OS=``) comes later. ``Reason``
    is the whole reason, without the ``[user@time]`` Slurm appends to it.
    """
    proc = run(["scontrol", "show", "node", "-o"], timeout_s=timeout_s)
    info: dict[str, dict[str, str]] = {}
    for line in proc.stdout.splitlines():
        fields: dict[str, str] = {}
        for match in re.finditer(r"(\w+)=(\S*)", line):
            fields.setdefault(match.group(1), match.group(2))
        reason = re.search(r" Reason=(.*?)(?: \[[^\]\s]*@[^\]\s]*\].*)?\s*$", line)
        if reason:
            fields["Reason"] = reason.group(1).strip()
        if fields.get("NodeName"):
            info[fields["NodeName"]] = fields
    return info


#: Longest drain reason kept (slurmctld stores and shows it in every sinfo -R).
REASON_LIMIT = 200


def reason_text(text: str) -> str:
    """``text`` as a drain reason: one line, no quotes or control characters, capped."""
    clean = " ".join(re.sub(r"[\x00-\x1f\x7f\"'`\\]", " ", text).split())
    return clean[:REASON_LIMIT] or "no reason given"


def drain(node: str, reason: str) -> None:
    """``scontrol update NodeName=NODE State=DRAIN Reason=...``; a refusal raises."""
    run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason_text(reason)}"])


def munge_roundtrip() -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str] | None]:
    """``munge -n | unmunge``: the credential, then its decoding (None if munge failed)."""
    cred = run(["munge", "-n"], check=False)
    if cred.returncode != 0:
        return cred, None
    return cred, run(["unmunge"], stdin=cred.stdout, check=False)


# -- accounts, QOS and reservations (admin commands: pyhpc workshop) ----------------------

def sacctmgr_rows(entity: str, conditions: Sequence[str], columns: Sequence[str],
                  ) -> list[list[str]]:
    """``sacctmgr show ENTITY CONDITIONS format=COLUMNS`` as rows of fields."""
    proc = run(["sacctmgr", "--noheader", "--parsable2", "show", entity, *conditions,
                f"format={','.join(columns)}"])
    return [line.split("|") for line in proc.stdout.splitlines() if line.strip()]


def sacctmgr(verb: str, entity: str, *args: str) -> None:
    """``sacctmgr --immediate VERB ENTITY ARGS`` (add, modify, delete); a refusal raises."""
    run(["sacctmgr", "--immediate", verb, entity, *args])


def fields_of(line: str) -> dict[str, str]:
    """``KEY=VALUE`` fields of one ``scontrol -o`` line, the first of each key."""
    fields: dict[str, str] = {}
    for match in re.finditer(r"(\w+)=(\S*)", line):
        fields.setdefault(match.group(1), match.group(2))
    return fields


def reservation(name: str) -> dict[str, str]:
    """``scontrol show reservation NAME``: its fields; {} when there is none."""
    proc = run(["scontrol", "show", "reservation", "-o", "--", name], check=False)
    fields = fields_of(proc.stdout) if proc.returncode == 0 else {}
    return fields if fields.get("ReservationName") == name else {}


def reservations() -> list[dict[str, str]]:
    """Every reservation the caller may see (``PrivateData=reservations``: those they may
    use; root: all), one mapping of fields each: ONE scontrol call (22.05's scontrol has
    no ``--json``)."""
    proc = run(["scontrol", "show", "reservation", "-o"])
    found = (fields_of(line) for line in proc.stdout.splitlines())
    return [f for f in found if f.get("ReservationName")]


def my_associations(user: str) -> list[tuple[str, str]]:
    """(account, partition) of each of ``user``'s associations, as sacctmgr shows them to
    the caller (partition "" for any): ONE call, made only to explain a refusal."""
    rows = sacctmgr_rows("associations", [f"users={user}"], ["account", "partition", "user"])
    return sorted({(r[0], r[1]) for r in rows if len(r) >= 3 and r[2] == user and r[0]})


def create_reservation(fields: dict[str, str]) -> None:
    """``scontrol create reservation KEY=VALUE...`` (validated values)."""
    run(["scontrol", "create", "reservation", *(f"{k}={v}" for k, v in fields.items())])


def delete_reservation(name: str) -> None:
    run(["scontrol", "delete", f"ReservationName={name}"])


def jobs_in_account(account: str) -> list[str]:
    """Queued and running job ids of the account ``account`` (a validated name), whoever
    submitted them: a workshop's delete cancels these and no others."""
    proc = run(["squeue", "-h", "-o", "%i", f"--account={account}"])
    return sorted(set(proc.stdout.split()), key=_idkey)


# -- monitoring (pyhpc.monitor): one call of each per scrape, for any number of jobs -------

#: Seconds a monitoring query may take: a scrape must answer before Prometheus gives up.
MONITOR_TIMEOUT_S = 20.0
#: squeue's columns for the exporter: raw job id, state, partition, account, user, reason.
QUEUE_FORMAT = "%A|%T|%P|%a|%u|%r"


def all_jobs() -> str:
    """Every queued and running job and array task of every user and partition, one line
    each in :data:`QUEUE_FORMAT` (text: a few dozen bytes a job, where ``--json`` is some
    4 KB): ONE squeue call. Under ``PrivateData=jobs`` only an admin sees everyone's."""
    return run(["squeue", "--noheader", "--all", "--array", f"--format={QUEUE_FORMAT}"],
               timeout_s=MONITOR_TIMEOUT_S).stdout


def job_details() -> dict[str, JobView]:
    """Every job slurmctld knows, by raw id, with its GPU indices and CPUs per node: ONE
    ``squeue --json`` call (22.05 prints every job whatever the filters). Never from
    ``scontrol show job``'s text, where a job's name or comment can forge another's fields
    (see :mod:`pyhpc.slurm.rows`); a Slurm without ``--json`` is a failed call."""
    proc = run(["squeue", "--all", "--json"], timeout_s=MONITOR_TIMEOUT_S)
    return {view.job_id: view for view in job_views(_json(proc))}


def job_owner(job_id: str) -> JobView | None:
    """One job's raw id, owner, account and times while slurmctld knows it (a finished one
    too, until MinJobAge): ONE squeue call, in columns no user sets (22.05's ``--json``
    would print the whole queue, at each job's end); None when it is unknown."""
    proc = run(["squeue", "--noheader", "--states=all", f"--jobs={job_id}",
                f"--format={OWNER_FORMAT}"], check=False)
    found = [v for v in owner_rows(proc.stdout if proc.returncode == 0 else "")
             if v.job_id == job_id]
    return found[0] if found else None


def scheduler_stats() -> str:
    """``sdiag``'s text (22.05 has no ``--json`` for it): ONE call."""
    return run(["sdiag"], timeout_s=MONITOR_TIMEOUT_S).stdout


def running_in_accounting() -> subprocess.CompletedProcess[str]:
    """Raw ids of the jobs the accounting database holds as running now (``sacct -s R``
    without a start time means now), not checked: a failure means slurmdbd did not
    answer. ONE call."""
    return run(["sacct", "--allusers", "--allocations", "--noheader", "--parsable2",
                "--state=RUNNING", "--format=JobIDRaw"], check=False, timeout_s=MONITOR_TIMEOUT_S)


#: The first Slurm whose sacctmgr keeps an AdminComment's case (CHANGELOG/slurm-23.02.md:
#: "no longer force updates to the AdminComment ... to lower-case"); 22.05's lowercases it.
ADMIN_COMMENT_KEEPS_CASE = (23, 2)
#: An AdminComment pyhpc stores: letters, digits and base64's ``+/=:``, no space or quote.
ADMIN_COMMENT = re.compile(r"[A-Za-z0-9+/=:]{1,16384}")


def version() -> tuple[int, int] | None:
    """The installed Slurm's (major, minor), from ``sacctmgr --version`` (no daemon asked);
    None where it prints no version."""
    proc = run(["sacctmgr", "--version"], check=False)
    found = re.search(r"\b([0-9]{2})\.([0-9]{2})\.", proc.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def stores_admin_comment() -> bool:
    """Whether a finished job's AdminComment can be stored here: slurmctld refuses any
    update of a finished job (``scontrol``: "Job has already finished", in
    EpilogSlurmctld too), so only accounting can take it, and 22.05's sacctmgr
    lowercases it (base64 would no longer decode)."""
    found = version()
    return found is not None and found >= ADMIN_COMMENT_KEEPS_CASE


def set_admin_comment(job_id: str, comment: str) -> None:
    """Store a finished job's AdminComment in accounting, as an admin (SlurmUser, root):
    ONE ``sacctmgr --immediate update job`` call. Only pyhpc's own text, never a user's."""
    if not job_id.isdigit() or ADMIN_COMMENT.fullmatch(comment) is None:
        raise SlurmError("sacctmgr: an AdminComment is letters, digits and '+/=:', for a raw "
                         "job id", "sacctmgr")
    run(["sacctmgr", "--immediate", "update", "job", "where", f"jobid={job_id}", "set",
         f"AdminComment={comment}"])


#: sacct's columns for a job summary (``pyhpc jobstats``), job and step lines alike.
JOBSTATS_FORMAT = ("JobID,JobIDRaw,User,Account,Partition,State,ElapsedRaw,TimelimitRaw,"
                   "TotalCPU,AllocCPUS,NNodes,NTasks,MaxRSS,ReqMem,AllocTRES,Start,End")


def job_accounting(job_id: str) -> str:
    """One job's accounting, its steps included, in :data:`JOBSTATS_FORMAT` (``|``-separated,
    no header): ONE sacct call. Under ``PrivateData=jobs`` a user gets only their own."""
    return run(["sacct", "--noheader", "--parsable2", f"--format={JOBSTATS_FORMAT}",
                "-j", job_id]).stdout
