"""``pyhpc doctor``: check a running cluster through the commands a user runs.

Munge round-trip, slurmctld and slurmdbd answer, every node idle, a 2-node
``srun`` lands on two distinct nodes and ``sacct`` records it. Each check is a
real command; a failed check makes the ones that need it fail too.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

#: Seconds a single command may take (the 2-node job included).
TIMEOUT = 90
#: How long sacct gets to record the doctor's job (accounting is asynchronous).
SACCT_WAIT = 30.0

Runner = Callable[[Sequence[str], str | None], "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str


def run(argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command and capture its output; a missing binary or a timeout is a failure."""
    try:
        return subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              timeout=TIMEOUT, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {TIMEOUT}s")


def _why(proc: subprocess.CompletedProcess[str]) -> str:
    text = (proc.stderr or proc.stdout).strip().splitlines()
    return f"exit {proc.returncode}: {text[-1] if text else 'no output'}"


class Doctor:
    """Runs the checks in order; ``runner`` is replaceable so unit tests can fake commands."""

    def __init__(self, runner: Runner = run, sacct_wait: float = SACCT_WAIT) -> None:
        self.runner = runner
        self.sacct_wait = sacct_wait
        self.job_id: str | None = None

    def munge(self) -> Check:
        cred = self.runner(["munge", "-n"], None)
        if cred.returncode != 0:
            return Check("munge", False, f"munge -n: {_why(cred)}")
        back = self.runner(["unmunge"], cred.stdout)
        ok = back.returncode == 0 and "STATUS:" in back.stdout and "Success" in back.stdout
        return Check("munge", ok, "munge -n | unmunge: Success" if ok else f"unmunge: {_why(back)}")

    def slurmctld(self) -> Check:
        proc = self.runner(["scontrol", "ping"], None)
        ok = proc.returncode == 0 and "UP" in proc.stdout
        return Check("slurmctld", ok, proc.stdout.strip() if ok else f"scontrol ping: {_why(proc)}")

    def slurmdbd(self) -> Check:
        proc = self.runner(["sacctmgr", "--noheader", "--parsable2", "show", "cluster",
                            "format=cluster"], None)
        clusters = proc.stdout.split()
        ok = proc.returncode == 0 and bool(clusters)
        detail = f"clusters: {', '.join(clusters)}" if ok else f"sacctmgr show cluster: {_why(proc)}"
        return Check("slurmdbd", ok, detail)

    def nodes(self) -> Check:
        proc = self.runner(["sinfo", "--noheader", "--Node", "--format=%N %t"], None)
        if proc.returncode != 0:
            return Check("nodes idle", False, f"sinfo: {_why(proc)}")
        states = dict(sorted({tuple(line.split()[:2]) for line in proc.stdout.splitlines()
                              if line.strip()}))
        busy = {n: s for n, s in states.items() if s != "idle"}
        if not states:
            return Check("nodes idle", False, "sinfo lists no nodes")
        if busy:
            return Check("nodes idle", False,
                         "not idle: " + ", ".join(f"{n} ({s})" for n, s in busy.items()))
        return Check("nodes idle", True, f"{len(states)} idle: {', '.join(states)}")

    def srun(self) -> Check:
        proc = self.runner(["srun", "--nodes=2", "--ntasks-per-node=1", "--time=1",
                            "--job-name=pyhpc-doctor", "sh", "-c",
                            'echo "$SLURM_JOB_ID $SLURMD_NODENAME"'], None)
        if proc.returncode != 0:
            return Check("srun -N2", False, f"srun: {_why(proc)}")
        lines = [line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2]
        names = sorted({name for _, name in lines})
        self.job_id = lines[0][0] if lines else None
        ok = len(names) == 2
        return Check("srun -N2", ok, f"job {self.job_id} ran on {', '.join(names) or 'nothing'}")

    def sacct(self) -> Check:
        if self.job_id is None:
            return Check("sacct", False, "no job to look up (srun -N2 failed)")
        deadline = time.monotonic() + self.sacct_wait
        state = ""
        while True:
            proc = self.runner(["sacct", "--noheader", "--parsable2", "--allocations",
                                f"--jobs={self.job_id}", "--format=JobID,State"], None)
            rows = [line.split("|") for line in proc.stdout.splitlines() if "|" in line]
            state = next((s for j, s in rows if j == self.job_id), "")
            if state == "COMPLETED" or time.monotonic() >= deadline:
                break
            time.sleep(1)
        ok = state == "COMPLETED"
        return Check("sacct", ok, f"job {self.job_id}: {state or 'not recorded'}")

    def checks(self) -> list[Check]:
        results = [self.munge(), self.slurmctld(), self.slurmdbd(), self.nodes()]
        if all(c.ok for c in results[1:]):
            results.append(self.srun())
        else:
            results.append(Check("srun -N2", False, "skipped: the controller or nodes are not ready"))
        results.append(self.sacct())
        return results


def table(checks: Sequence[Check]) -> str:
    """Render the checks as an aligned text table."""
    width = max(len(c.name) for c in checks)
    lines = [f"{'CHECK'.ljust(width)}  RESULT  DETAIL"]
    lines += [f"{c.name.ljust(width)}  {'ok' if c.ok else 'FAIL':<6}  {c.detail}" for c in checks]
    return "\n".join(lines)


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = Doctor().checks()
    if args.json:
        print(json.dumps({"ok": all(c.ok for c in checks),
                          "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(table(checks))
    return 0 if all(c.ok for c in checks) else 1


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``pyhpc doctor``."""
    doc = sub.add_parser("doctor", help="check the running cluster (munge, slurmctld, "
                         "slurmdbd, nodes, a 2-node job, sacct)")
    doc.add_argument("--json", action="store_true", help="print the checks as JSON")
    doc.set_defaults(func=cmd_doctor)
