"""What the benchmarks ask the lab's Slurm: every call goes through pyhpc's one Slurm module
(:mod:`pyhpc.slurm.slurm`, its runner and retries) and waits through :mod:`pyhpc.slurm.watch`.
Only the commands a benchmark *measures* against pyhpc (a raw ``sbatch`` loop, ``srun -N k
true``) run on their own, marked ``# baseline:`` where they are."""
from __future__ import annotations

import time
from datetime import datetime

from pyhpc.slurm import slurm, watch


def output(argv: list[str], check: bool = True) -> str:
    """A Slurm command's output, through pyhpc's runner."""
    return slurm.run(argv, check=check).stdout


def queued(name: str | None = None) -> list[str]:
    """Ids of the queued and running jobs, every user's (only those named ``name``)."""
    return output(["squeue", "-h", "-o", "%i", *(["-n", name] if name else [])]).split()


def wait_for(ids: list[str], timeout_s: float) -> None:
    """Until the jobs have finished (one Slurm query per poll), at most ``timeout_s``."""
    if ids:
        watch.watch(sorted({i.split("_")[0] for i in ids}), interval_s=1.0, timeout_s=timeout_s,
                    quiet=True)


def wait_for_idle_queue(timeout_s: float = 180.0) -> None:
    """Until nothing is queued or running on the lab (other users' jobs included)."""
    wait_for(queued(), timeout_s)


def cancel(name: str, timeout_s: float = 120.0) -> None:
    """Cancel every job named ``name`` and wait until they have left the queue."""
    ids = queued(name)
    if ids:
        slurm.cancel(sorted({i.split("_")[0] for i in ids}))
        wait_for(ids, timeout_s)


def partition_state(partition: str, state: str) -> None:
    """``UP`` or ``DOWN`` (a DOWN partition queues jobs and never starts them)."""
    slurm.run(["scontrol", "update", f"PartitionName={partition}", f"State={state}"])


def wait_for_idle_nodes(partition: str, nodes: int, timeout_s: float = 300.0) -> None:
    """Until the partition's ``nodes`` nodes are idle (after a restart they register again)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = output(["sinfo", "-h", "-N", "-p", partition, "-o", "%t"], check=False).split()
        if len(states) == nodes and all(s == "idle" for s in states):
            return
        time.sleep(2)
    raise SystemExit(f"benchmarks: the {nodes} nodes of partition {partition} are not idle")


def completed(job_id: str) -> tuple[int, int]:
    """(tasks COMPLETED, tasks) of a job or array in the accounting database."""
    rows = slurm.accounting([job_id])
    return sum(r.state == "COMPLETED" for r in rows), len(rows)


def submit_and_start(job_id: str) -> tuple[float, float]:
    """A job's Submit and Start times from sacct, as epoch seconds (sacct has whole seconds)."""
    line = output(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "Submit,Start"]).split()[0]
    submit, start = line.split("|")

    def epoch(text: str) -> float:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").astimezone().timestamp()

    return epoch(submit), epoch(start)


def overlapping(job_id: str) -> list[str]:
    """Other jobs that ran at the same time as ``job_id`` in the last two hours (the lab is
    shared: a run beside them was disturbed)."""
    out = output(["sacct", "-a", "-X", "-n", "-P", "-S", "now-2hours", "-o", "JobID,Start,End"])
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 2]
    times = {j: (s, e) for j, s, e in rows}
    start, end = times[job_id]
    return [j for j, (s, e) in times.items() if j != job_id and s not in ("Unknown", "None")
            and s < end and (e in ("Unknown", "None") or e > start)]
