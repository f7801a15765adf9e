"""``pyhpc doctor``: check a running cluster through the commands a user runs.

Munge round-trip, slurmctld and slurmdbd answer, every node idle, a 2-node
``srun`` lands on two distinct nodes and ``sacct`` records it. Each check is a
real command (run through :mod:`pyhpc.slurm`); a check that needs a failed one is
skipped and names what it waits for. Jobs run without slurmdbd, so the 2-node job
needs only the controller and the nodes; only the accounting check needs slurmdbd.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyhpc import slurm

#: How long sacct gets to record the doctor's job (accounting is asynchronous).
SACCT_WAIT = 30.0


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str


def _why(proc: object) -> str:
    return f"exit {getattr(proc, 'returncode', '?')}: {slurm.why(proc)}"  # type: ignore[arg-type]  # a CompletedProcess


class Doctor:
    """Runs the checks in order (every command through pyhpc.slurm)."""

    def __init__(self, sacct_wait: float = SACCT_WAIT) -> None:
        self.sacct_wait = sacct_wait
        self.job_id: str | None = None

    def munge(self) -> Check:
        cred, back = slurm.munge_roundtrip()
        if back is None:
            return Check("munge", False, f"munge -n: {_why(cred)}")
        ok = back.returncode == 0 and "STATUS:" in back.stdout and "Success" in back.stdout
        return Check("munge", ok, "munge -n | unmunge: Success" if ok else f"unmunge: {_why(back)}")

    def slurmctld(self) -> Check:
        proc = slurm.ping()
        ok = proc.returncode == 0 and "UP" in proc.stdout
        return Check("slurmctld", ok, proc.stdout.strip() if ok else f"scontrol ping: {_why(proc)}")

    def slurmdbd(self) -> Check:
        proc = slurm.clusters()
        names = proc.stdout.split()
        ok = proc.returncode == 0 and bool(names)
        detail = f"clusters: {', '.join(names)}" if ok else f"sacctmgr show cluster: {_why(proc)}"
        return Check("slurmdbd", ok, detail)

    def nodes(self) -> Check:
        try:
            states = slurm.nodes()
        except slurm.SlurmError as exc:
            return Check("nodes idle", False, str(exc))
        busy = {n: s for n, s in states.items() if s != "idle"}
        if not states:
            return Check("nodes idle", False, "sinfo lists no nodes")
        if busy:
            return Check("nodes idle", False,
                         "not idle: " + ", ".join(f"{n} ({s})" for n, s in busy.items()))
        return Check("nodes idle", True, f"{len(states)} idle: {', '.join(states)}")

    def srun(self) -> Check:
        proc = slurm.srun(["--nodes=2", "--ntasks-per-node=1", "--time=1",
                           "--job-name=pyhpc-doctor", "sh", "-c",
                           'echo "$SLURM_JOB_ID $SLURMD_NODENAME"'])
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
            rows = slurm.accounting([self.job_id])
            state = next((r.state for r in rows if r.job_id == self.job_id), "")
            if state == "COMPLETED" or time.monotonic() >= deadline:
                break
            time.sleep(1)
        ok = state == "COMPLETED"
        return Check("sacct", ok, f"job {self.job_id}: {state or 'not recorded'}")

    def checks(self) -> list[Check]:
        munge, ctld, dbd, nodes = self.munge(), self.slurmctld(), self.slurmdbd(), self.nodes()
        results = [munge, ctld, dbd, nodes]
        blockers = [c.name for c in (munge, ctld, nodes) if not c.ok]
        results.append(self.srun() if not blockers else Check(
            "srun -N2", False, f"skipped: needs {', '.join(blockers)}"))
        if not dbd.ok:
            results.append(Check("sacct", False, "skipped: slurmdbd does not answer "
                                 "(jobs still run; accounting is not recorded)"))
        else:
            try:
                results.append(self.sacct())
            except slurm.SlurmError as exc:
                results.append(Check("sacct", False, str(exc)))
        return results


def table(checks: Sequence[Check]) -> str:
    """Render the checks as an aligned text table."""
    width = max(len(c.name) for c in checks)
    lines = [f"{'CHECK'.ljust(width)}  RESULT  DETAIL"]
    lines += [f"{c.name.ljust(width)}  {'ok' if c.ok else 'FAIL':<6}  {c.detail}" for c in checks]
    return "\n".join(lines)
