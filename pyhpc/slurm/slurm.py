"""The one place that runs Slurm's commands: sbatch, squeue, sacct, scancel, scontrol,
sinfo, sacctmgr and srun (plus munge's, for the doctor).

Client behaviour schedulers ask of their clients lives here too: one query per poll
for any number of jobs, a bounded retry with backoff while slurmctld is busy, and a
clear error when a command is missing. Queries use ``--json`` where the installed
Slurm answers it (22.05's openapi/v0.0.38 and later) and fall back to parsing the
text output where it does not. Tests replace :data:`RUNNER`, and nothing else.
"""
from __future__ import annotations

import functools
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyhpc.errors import PyhpcError

#: ``RUNNER(argv, stdin, timeout_s)``: how every command is run. Tests replace it.
Runner = Callable[[Sequence[str], "str | None", float], "subprocess.CompletedProcess[str]"]
#: Seconds one command may take.
TIMEOUT_S = 90.0
#: slurmctld answers these while busy; the call is retried, a few times, with backoff.
TRANSIENT = ("Socket timed out", "Resource temporarily unavailable",
             "Unable to contact slurm controller")
RETRIES = 3
BACKOFF_S = 0.5
#: Pending reasons after which a job can never start without a change by someone: the
#: request itself exceeds a limit. Reasons that clear by themselves are not here:
#: ReqNodeNotAvail (a node down or restarting comes back) and AssocMaxJobsLimit (other
#: jobs of the association finish); a wait shows them and goes on until --timeout.
NEVER_STARTS = ("PartitionTimeLimit", "PartitionNodeLimit", "InvalidAccount", "InvalidQOS",
                "AssocMaxNodesPerJobLimit", "AssocMaxWallDurationPerJobLimit",
                "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit")


class SlurmError(PyhpcError):
    """A Slurm command is missing, timed out or refused; the message names the command."""


def run_command(argv: Sequence[str], stdin: str | None, timeout_s: float,
                ) -> subprocess.CompletedProcess[str]:
    """The real runner: capture text output; never raises for a non-zero exit."""
    return subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                          timeout=timeout_s, check=False)


RUNNER: Runner = run_command


@dataclass(frozen=True)
class JobRow:
    """One job or array task as Slurm reports it. ``job_id`` is the array's id for tasks."""

    job_id: str
    task: str | None
    state: str
    reason: str = ""


def run(argv: Sequence[str], stdin: str | None = None, check: bool = True,
        timeout_s: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run one command through :data:`RUNNER`, retrying while slurmctld is busy."""
    proc: subprocess.CompletedProcess[str] | None = None
    for attempt in range(RETRIES + 1):
        try:
            proc = RUNNER(argv, stdin, timeout_s)
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]}: command not found; is this a login node of the "
                             "cluster (the slurm-client package)?", argv[0]) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]}: no answer within {timeout_s:.0f} s", argv[0]) from None
        if proc.returncode == 0 or not any(t in proc.stderr for t in TRANSIENT):
            break
        if attempt < RETRIES:
            time.sleep(BACKOFF_S * 2 ** attempt)
    assert proc is not None
    if check and proc.returncode != 0:
        raise SlurmError(f"{argv[0]}: {why(proc)}", argv[0])
    return proc


def why(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line a failed command printed (or its exit status)."""
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


# -- submission and control -------------------------------------------------------------

NO_ASSOCIATION = ("Invalid account or account/partition combination",)


def explain_submit_error(text: str, user: str, cluster: str) -> str | None:
    """A one-line explanation for sbatch refusals users hit, or None."""
    if any(s in text for s in NO_ASSOCIATION):
        return (f"user {user} has no account on cluster {cluster}; an admin adds it to "
                "accounts in cluster.yml")
    return None


def sbatch(script: str, options: Sequence[str] = (), test_only: bool = False) -> str:
    """Submit ``script``; returns the job id, or sbatch's verdict with ``test_only``."""
    argv = ["sbatch", "--parsable", *(["--test-only"] if test_only else []), *options, "--",
            script]
    proc = run(argv)
    if test_only:
        return proc.stderr.strip()
    return proc.stdout.strip().split(";")[0]


def cancel(job_ids: Sequence[str]) -> None:
    """scancel every id (already validated job ids)."""
    run(["scancel", "--", *job_ids])


def show_job(job_id: str) -> dict[str, str]:
    """``scontrol show job -o``: the job's fields; {} when Slurm no longer knows it."""
    proc = run(["scontrol", "show", "job", "-o", "--", job_id], check=False)
    fields: dict[str, str] = {}
    for match in re.finditer(r"(\w+)=(\S*)", proc.stdout if proc.returncode == 0 else ""):
        fields.setdefault(match.group(1), match.group(2))
    return fields


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
            try:
                data = json.loads(proc.stdout)
            except ValueError:
                raise SlurmError(f"{tool}: --json printed no JSON", tool) from None
            _json_ok[tool] = True
            return from_json(data if isinstance(data, dict) else {})
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


def _number(value: Any) -> int | None:
    """An integer from JSON that is either a number or ``{"set": .., "number": ..}``."""
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set", True) and "number" in value else None
    if isinstance(value, bool) or value is None:
        return None
    return int(value)


def _state(value: Any) -> str:
    """A state from JSON: ``"RUNNING"`` (v0.0.38) or ``["RUNNING", ...]`` (later)."""
    if isinstance(value, list):
        return str(value[0]) if value else "UNKNOWN"
    return str(value or "UNKNOWN")


def task_count(spec: str) -> int:
    """How many tasks an array expression such as ``2-999%4`` or ``1,3,5-7`` names."""
    return len(task_ids(spec))


@functools.lru_cache(maxsize=64)
def task_ids(spec: str) -> tuple[int, ...]:
    """The task ids an array expression names, in its order: ``1,3,5-7`` is 1, 3, 5, 6, 7."""
    ids: list[int] = []
    for part in spec.split("%")[0].split(","):
        lo, _, rest = part.partition("-")
        hi, _, step = rest.partition(":")
        if lo.isdigit() and (not hi or hi.isdigit()) and (not step or step.isdigit()):
            ids += range(int(lo), int(hi or lo) + 1, max(int(step or 1), 1))
    return tuple(ids)


def squeue_rows(data: dict[str, Any]) -> list[JobRow]:
    """squeue --json's jobs as rows; a pending array range is one row per task."""
    rows: list[JobRow] = []
    for job in data.get("jobs", []):
        array = _number(job.get("array_job_id"))
        task = _number(job.get("array_task_id"))
        state, reason = _state(job.get("job_state")), str(job.get("state_reason") or "")
        pending = str(job.get("array_task_string") or "")
        if array and pending and task is None:
            rows += [JobRow(str(array), f"{pending}#{k}", state, reason)
                     for k in range(task_count(pending))]
        elif array:
            rows.append(JobRow(str(array), str(task), state, reason))
        else:
            rows.append(JobRow(str(job.get("job_id")), None, state, reason))
    return rows


def sacct_rows(data: dict[str, Any]) -> list[JobRow]:
    """sacct --json's jobs (steps are nested inside, so each job is one row)."""
    rows: list[JobRow] = []
    for job in data.get("jobs", []):
        array = job.get("array") or {}
        array_id = _number(array.get("job_id"))
        task = _number(array.get("task_id"))
        state = job.get("state") or {}
        current, reason = _state(state.get("current")), str(state.get("reason") or "")
        if array_id and task is not None:
            rows.append(JobRow(str(array_id), str(task), current, reason))
        else:
            rows.append(JobRow(str(job.get("job_id")), None, current, reason))
    return rows


def text_rows(text: str) -> list[JobRow]:
    """``JobID|State[|Reason]`` lines of squeue -o / sacct -P; step lines are skipped."""
    rows: list[JobRow] = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 2 or "." in parts[0]:  # 123.batch, 123.0: the job's line has it
            continue
        jid, _, task = parts[0].split("+")[0].partition("_")
        state = parts[1].split()[0] if parts[1].split() else "UNKNOWN"
        reason = parts[2] if len(parts) > 2 else ""
        if task.startswith("["):  # sacct's pending range 7_[2-999%4]
            spec = task.strip("[]")
            rows += [JobRow(jid, f"{spec}#{k}", state, reason) for k in range(task_count(spec))]
        else:
            rows.append(JobRow(jid, task or None, state, reason))
    return rows


def _wanted(rows: Iterable[JobRow], job_ids: Sequence[str]) -> list[JobRow]:
    wanted = {j.split("_")[0] for j in job_ids}
    return [r for r in rows if r.job_id in wanted]


def queue(job_ids: Sequence[str]) -> list[JobRow]:
    """Every job and array task of ``job_ids`` that slurmctld knows: ONE squeue call.

    ``-t all`` keeps finished jobs (for MinJobAge) with their final state.
    """
    if not job_ids:
        return []
    ids = ",".join(job_ids)
    return _wanted(_rows(["squeue", "-t", "all", "-j", ids],
                         ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%r", "-j", ids],
                         squeue_rows), job_ids)


def accounting(job_ids: Sequence[str]) -> list[JobRow]:
    """Every job and array task of ``job_ids`` in the accounting database: ONE sacct call."""
    if not job_ids:
        return []
    ids = ",".join(job_ids)
    # No -X in the text form: Slurm 22.05's sacct -X drops array tasks; steps are skipped.
    return _wanted(_rows(["sacct", "-j", ids], ["sacct", "-n", "-P", "-o", "JobID,State,Reason",
                                                 "-j", ids], sacct_rows), job_ids)


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


def node_info() -> dict[str, dict[str, str]]:
    """Every node's ``scontrol show node -o`` fields (``Gres``, ``State``, ``Partitions``...).

    Only the first occurrence of a key counts: free text (``Reason=``, ``OS=``) comes later.
    """
    proc = run(["scontrol", "show", "node", "-o"])
    info: dict[str, dict[str, str]] = {}
    for line in proc.stdout.splitlines():
        fields: dict[str, str] = {}
        for match in re.finditer(r"(\w+)=(\S*)", line):
            fields.setdefault(match.group(1), match.group(2))
        if fields.get("NodeName"):
            info[fields["NodeName"]] = fields
    return info


def hostnames(expression: str) -> list[str]:
    """A hostlist expression (``gn[1-4]``, ``/dev/nvidia[0-3]``) expanded by Slurm itself."""
    return run(["scontrol", "show", "hostnames", expression]).stdout.split()


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


def reservation(name: str) -> dict[str, str]:
    """``scontrol show reservation NAME``: its fields; {} when there is none."""
    proc = run(["scontrol", "show", "reservation", "-o", "--", name], check=False)
    fields: dict[str, str] = {}
    if proc.returncode == 0:
        for match in re.finditer(r"(\w+)=(\S*)", proc.stdout):
            fields.setdefault(match.group(1), match.group(2))
    return fields if fields.get("ReservationName") == name else {}


def create_reservation(fields: dict[str, str]) -> None:
    """``scontrol create reservation KEY=VALUE...`` (validated values)."""
    run(["scontrol", "create", "reservation", *(f"{k}={v}" for k, v in fields.items())])


def delete_reservation(name: str) -> None:
    run(["scontrol", "delete", f"ReservationName={name}"])


def jobs_of(users: Sequence[str]) -> list[str]:
    """Queued and running job ids of any of ``users`` (validated names)."""
    if not users:
        return []
    proc = run(["squeue", "-h", "-o", "%i", f"--user={','.join(users)}"])
    return sorted(set(proc.stdout.split()), key=_idkey)
