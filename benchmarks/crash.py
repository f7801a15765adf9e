"""The controller-crash window: how many accepted jobs survive a slurmctld killed N seconds
after a burst of submissions; prints figures, writes benchmarks/results/crash.json.

slurmctld saves its job state in batches, at most every 5 s (``SAVE_MAX_WAIT`` in Slurm's
``src/slurmctld/state_save.c``, compiled in): after a quiet spell the first job is saved at
once, the jobs accepted in the next seconds wait for the next save. For each N of
``--delays``: a quiet queue for 6 s, a burst of ``--jobs`` plain sbatch jobs (one shell
loop), N seconds, then SIGKILL of slurmctld (the lab: its pid file; hostlab: ``podman kill
ctl``, the host losing power), a start, and once every job has settled, per job: survived
(accounting has its end) or lost (slurmctld forgot it, accounting holds it open). Each
lost job is then asked of ``pyhpc status`` (which must say LOST: before issue 23 it said
what sacct says, PENDING or RUNNING), and the runaway records are closed
(``sacctmgr -i show runawayjobs``) before the next N.

    python -m benchmarks.crash                       # the lab (Slurm 22.05 on Debian 12)
    python -m benchmarks.crash --target hostlab      # hostlab as it is up (24.11 on Debian 13)
    python -m benchmarks.crash --delays 0,3,6 --jobs 10
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import time
from collections import Counter
from typing import Any

from benchmarks import record

DELAYS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30)
JOBS = 20
PYHPC = "/opt/pyhpc/venv/bin/pyhpc"
HOSTLAB = ["python3", "hostlab/hostlab.py", "podman"]
#: sacct's states of a record still open.
OPEN = ("PENDING", "RUNNING", "SUSPENDED", "REQUEUED")


class Target:
    """Where the commands run and how the controller dies and comes back."""

    def __init__(self, name: str) -> None:
        self.name = name

    def sh(self, command: str, check: bool = True) -> str:
        """A shell command on the login side (the lab: here; hostlab: on ``login``)."""
        argv = ["bash", "-c", command] if self.name == "lab" else \
            [*HOSTLAB, "exec", "login", "bash", "-c", command]
        proc = subprocess.run(argv, cwd=record.ROOT, capture_output=True, text=True,
                              check=False, timeout=300)
        if check and proc.returncode != 0:
            raise SystemExit(f"benchmarks.crash: {command[:80]}: {proc.stderr.strip()[-400:]}")
        return proc.stdout

    def kill_controller(self) -> None:
        if self.name == "lab":
            pid_file = re.search(r"^SlurmctldPidFile\s*=\s*(\S+)", self.sh("scontrol show config"),
                                 re.M)
            assert pid_file
            pid = open(pid_file.group(1)).read().split()[0]
            self.sh(f"kill -KILL {int(pid)}; while kill -0 {int(pid)} 2>/dev/null; do sleep 0.05; done")
        else:
            subprocess.run([*HOSTLAB, "kill", "ctl"], cwd=record.ROOT, check=True,
                           capture_output=True)

    def start_controller(self) -> float:
        """Seconds until ``scontrol ping`` answers UP again."""
        start = time.monotonic()
        if self.name == "lab":
            self.sh("service pyhpc-slurmctld start")
        else:
            subprocess.run([*HOSTLAB, "start", "ctl"], cwd=record.ROOT, check=True,
                           capture_output=True)
        while "UP" not in self.sh("scontrol ping", check=False):
            if time.monotonic() - start > 300:
                raise SystemExit("benchmarks.crash: slurmctld did not come back in 300 s")
            time.sleep(0.5)
        return time.monotonic() - start

    def version(self) -> str:
        return self.sh("sinfo --version").strip()


def quiet(target: Target) -> None:
    deadline = time.monotonic() + 300
    while target.sh("squeue -h -o %i").split():
        if time.monotonic() > deadline:
            raise SystemExit("benchmarks.crash: the queue did not empty in 300 s")
        time.sleep(1)
    time.sleep(6)  # more than SAVE_MAX_WAIT since the last save: the first job saves at once


def burst(target: Target, jobs: int) -> list[str]:
    # baseline: plain sbatch, as any user's burst; pyhpc's submissions go the same way.
    out = target.sh(f"for i in $(seq {jobs}); do sbatch --parsable -J crash --time=2 "
                    "-o /dev/null --wrap 'sleep 1'; done")
    return [line.split(";")[0] for line in out.split()]


def settle(target: Target, ids: list[str]) -> dict[str, str]:
    """Each job's state once nothing of ours is queued and slurmctld has sent accounting
    everything (sdiag's DBD agent queue empty): COMPLETED, or the open record of a job
    slurmctld forgot; ``held``: the jobs Slurm held after the restart (released here);
    ``drained``: nodes it drained for a duplicate job id (resumed here)."""
    states: dict[str, str] = {}
    deadline = time.monotonic() + 300
    held: set[str] = set()
    drained: set[str] = set()
    while queued := target.sh(f"squeue -h -o '%i|%r' -j {','.join(ids)}", check=False).split("\n"):
        # A job slurmctld had saved as pending but its slurmd had started: requeued and held
        # ("launch failed requeued held") until someone releases it. Counted, then released.
        stuck = [q.split("|")[0] for q in queued if q.endswith("|launch failed requeued held")]
        if stuck:
            held.update(stuck)
            target.sh(f"scontrol release {','.join(stuck)}", check=False)
        # A node still running a lost job whose id slurmctld gave again: drained ("Duplicate
        # jobid"), as an admin would see it. Counted, then resumed.
        for line in target.sh("sinfo -h -R -o '%n|%E'", check=False).splitlines():
            node, _, why = line.partition("|")
            if why.startswith("Duplicate jobid"):
                drained.add(node)
                target.sh(f"scontrol update NodeName={node} State=RESUME", check=False)
        if not [q for q in queued if q.strip()]:
            break
        if time.monotonic() > deadline:
            raise SystemExit("benchmarks.crash: the burst did not finish in 300 s")
        time.sleep(1)
    states["held"] = ",".join(sorted(held))
    states["drained"] = ",".join(sorted(drained))
    while True:  # until slurmctld has sent accounting everything it holds
        time.sleep(2)
        queue = re.search(r"DBD Agent queue size:\s*(\d+)", target.sh("sdiag"))
        if queue and queue.group(1) == "0":
            break
        if time.monotonic() > deadline:
            raise SystemExit("benchmarks.crash: accounting did not settle in 300 s")
    time.sleep(2)
    out = target.sh(f"sacct -X -n -P -o JobID,State -j {','.join(ids)}")
    states.update({j: s.split()[0] for j, s in (line.split("|") for line in out.split())})
    return states


def point(target: Target, delay: float, jobs: int) -> dict[str, Any]:
    quiet(target)
    start = time.monotonic()
    ids = burst(target, jobs)
    accepted = time.monotonic()
    time.sleep(max(0.0, delay - (time.monotonic() - accepted)))
    killed = time.monotonic()
    target.kill_controller()
    back_s = target.start_controller()
    states = settle(target, ids)
    held = [j for j in states.pop("held").split(",") if j]
    drained = [n for n in states.pop("drained").split(",") if n]
    lost = [j for j in ids if states.get(j) in OPEN or j not in states]
    unrecorded = [j for j in lost if j not in states]
    said = json.loads(target.sh(f"{PYHPC} status --json {shlex.join(lost)}", check=False) or "{}") \
        if lost else {}
    target.sh("sacctmgr -i show runawayjobs", check=False)
    return {"delay_s": delay, "jobs": jobs, "survived": jobs - len(lost), "lost": len(lost),
            "lost_open_in_accounting": len(lost) - len(unrecorded),
            "lost_without_a_record": len(unrecorded), "held_after_restart": len(held),
            "nodes_drained_duplicate_jobid": len(drained),
            # pyhpc status of the lost jobs (as root, no job records: plain sbatch jobs)
            "pyhpc_said": dict(sorted(Counter(said.values()).items())),
            "burst_s": round(accepted - start, 2), "kill_after_s": round(killed - accepted, 2),
            "controller_back_s": round(back_s, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=("lab", "hostlab"), default="lab")
    parser.add_argument("--delays", default=",".join(str(d) for d in DELAYS))
    parser.add_argument("--jobs", type=int, default=JOBS)
    args = parser.parse_args()
    target = Target(args.target)
    version = target.version()
    rows = []
    for delay in (float(d) for d in args.delays.split(",")):
        rows.append(point(target, delay, args.jobs))
        print(json.dumps(rows[-1]), flush=True)
    name = "crash" if args.target == "lab" else "crash-hostlab"
    old = record.read(name).get("figures", {})
    figures = {**old, version: {"target": args.target, "rows": rows,
                                "window": "SAVE_MAX_WAIT 5 s (src/slurmctld/state_save.c)"}}
    print(record.write(name, figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
