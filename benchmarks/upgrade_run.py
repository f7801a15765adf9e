"""The whole cluster moved from Debian 12 to Debian 13 by ``pyhpc admin upgrade run`` (issue
46 item 8), on hostlab's Debian 12 cluster as a deploy leaves it (``HOSTLAB_RELEASE=bookworm
make hostlab``); writes benchmarks/results/upgrade-run.json.

History first: an array of jobs that ran, a held job and one that begins later (both
pending: the queue's save records them). Then one run, from here as an admin runs it, with
``--deadline 0`` and ``--stop-after deploy``: the queue's restore needs pyhpc on the moved
controller, and Debian 13 hosts have no pyhpc environment yet. Figures: each step's
seconds (the run's own record), each phase's, the time no job can start (from the queue's
save, which stops jobs from starting, to the deploy's end, after which the new slurmctld
starts jobs), the plan's estimate of it beside, and what accounting holds before and
after. The hosts are no Debian 12 cluster afterwards: the benchmark ends with ``hostlab
down`` (the image and the shared directories stay). A failed run leaves them up to look
at; ``make hostlab-down`` then.

    HOSTLAB_RELEASE=bookworm make hostlab && python -m benchmarks.upgrade_run
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

from benchmarks import record
from pyhpc.admin.upgrade_run import NAMES, RECORD, RUN_DIR

HOSTLAB = ["python3", "hostlab/hostlab.py"]
INVENTORY = record.ROOT / "ansible" / "inventories" / "hostlab"
HOSTS = ("ctl", "db", "login", "cpu1", "gpu1", "gpu2")
#: Each phase of the plan (pyhpc.admin.upgrade.PHASES, and the backup and the finish) and
#: the run's steps in it.
PHASES = {"backup": ("plan", "queue-save", "backup"),
          "dbd": ("move-dbd", "accounting"),
          "controller": ("queue-save-last", "move-controller"),
          "compute": ("move-compute",),
          "login": ("move-login",),
          "restart": ("release-finish", "deploy")}
#: From the queue's save to the deploy's end no job can start (the login hosts' move is
#: inside it: the run moves them before the deploy).
WINDOW = NAMES[NAMES.index("queue-save"):NAMES.index("deploy") + 1]
ESTIMATE = re.compile(r"^No job can start for about ([\d.]+) min", re.MULTILINE)
JOBS = 6


def on(host: str, command: str, check: bool = True) -> str:
    proc = subprocess.run([*HOSTLAB, "run", host, "--", "bash", "-c", command],
                          cwd=record.ROOT, capture_output=True, text=True, timeout=600,
                          check=check)
    return proc.stdout.strip()


def phases(done: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each phase's seconds, from the run's record of its steps."""
    return {phase: round(sum(done[s]["seconds"] for s in steps if s in done), 1)
            for phase, steps in PHASES.items()}


def window_s(done: dict[str, dict[str, Any]]) -> float:
    return round(float(sum(done[s]["seconds"] for s in WINDOW)), 1)


def estimate_min(plan_text: str) -> float | None:
    """The plan's estimate of the time no job can start, from its printed line."""
    found = ESTIMATE.search(plan_text)
    return float(found.group(1)) if found else None


def accounting_jobs() -> list[str]:
    """Every job accounting holds: id, user, account, state, exit code, elapsed."""
    return on("login", "sacct -anXP -S 2020-01-01 --format=JobID,User,Account,State,"
                       "ExitCode,ElapsedRaw").splitlines()


def history() -> dict[str, str]:
    array = on("login", f"sbatch --parsable -p cpu -o /dev/null --array=0-{JOBS - 1} "
                        "--wrap 'srun true; exit $((SLURM_ARRAY_TASK_ID % 2))'")
    deadline = time.monotonic() + 300
    while on("login", f"squeue -h -j {array}"):
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmarks.upgrade_run: array {array} did not end in 300 s")
        time.sleep(2)
    user = "runuser -u user1 -- sbatch --parsable -p cpu -o /dev/null"
    jobs = {"array": array, "held": on("login", f"{user} --hold --wrap true"),
            "later": on("login", f"{user} --begin=now+2hours --wrap true")}
    recorded(",".join(jobs.values()), JOBS + 2)
    return jobs


def recorded(ids: str, rows: int) -> None:
    """Wait until accounting lists ``rows`` jobs of ``ids``: slurmctld sends its records to
    slurmdbd a moment later (a first run read 5 of 8 rows before the upgrade)."""
    deadline = time.monotonic() + 120
    while len(on("login", f"sacct -anXP -j {ids} --format=JobID").splitlines()) < rows:
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmarks.upgrade_run: accounting did not list {rows} jobs "
                             f"of {ids} in 120 s")
        time.sleep(2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true",
                        help="leave the moved hosts up (no hostlab down) to look at them")
    args = parser.parse_args()
    found = {h: on(h, ". /etc/os-release; echo $VERSION_CODENAME; ls /var/lib/pyhpc/release "
                   "2>/dev/null | head -1", check=False) for h in HOSTS}
    if set(found.values()) != {"bookworm"}:
        raise SystemExit("benchmarks.upgrade_run: needs hostlab's Debian 12 hosts as a "
                         "deploy leaves them, none moved (HOSTLAB_RELEASE=bookworm make "
                         f"hostlab); found {found}")
    if os.path.lexists(RUN_DIR):
        raise SystemExit(f"benchmarks.upgrade_run: {RUN_DIR} holds an upgrade's record; "
                         "move it aside first")
    jobs = history()
    before = accounting_jobs()
    argv = [sys.executable, "-m", "pyhpc", "admin", "upgrade", "run", "--inventory",
            str(INVENTORY / "hosts.yml"), "--deadline", "0", "--stop-after", "deploy"]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=record.ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYHPC_CLUSTER=str(INVENTORY / "cluster.yml")))
    took = round(time.monotonic() - start, 1)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.upgrade_run: the run failed after {took} s: "
                         f"{proc.stderr.strip()}")
    done = json.loads((RUN_DIR / RECORD).read_text())["done"]
    after = accounting_jobs()
    versions = on("login", "sinfo -h -o %t | sort -u; scontrol version").splitlines()
    figures = {
        "hosts": len(HOSTS), "jobs": jobs, "run_s": took,
        "steps_s": {name: done[name]["seconds"] for name in NAMES if name in done},
        "phases_s": phases(done),
        "no_job_can_start_s": window_s(done),
        "plan_estimate_min": estimate_min(proc.stdout),
        "accounting_jobs": {"before": len(before), "after": len(after),
                            "kept": [row for row in before if row in after] == before},
        "after": {"node_states": versions[:-1], "slurm": versions[-1]},
        "stopped_after": "deploy (the queue's restore needs pyhpc on Debian 13: issue 46 "
                         "item 6)",
    }
    shutil.rmtree(RUN_DIR)
    if not args.keep:
        subprocess.run([*HOSTLAB, "down"], cwd=record.ROOT, check=True)
    print(f"wrote {record.write('upgrade-run', figures)}")
    print({k: figures[k] for k in ("phases_s", "no_job_can_start_s", "plan_estimate_min",
                                   "accounting_jobs")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
