"""A backup controller's takeover (issue 47 item 3), measured on hostlab's Debian 12 hosts
as tests/integration/test_hostlab_takeover.py leaves them: controllers ctl and db, their
state on the shared /srv/slurmctld; writes benchmarks/results/takeover-hostlab.json.

Each kill: a quiet queue, a burst of ``--jobs`` plain sbatch jobs, and at once ``podman
kill ctl`` (the primary's host losing power). Then, once a second, an sbatch of a probe job
on the idle gpu partition, until one is accepted (``submit_again_s``), and the time until
that probe runs (``schedules_again_s``: the takeover, as a user sees it). Per burst job:
kept (accounting has its end) or lost (accepted in the seconds before the kill, after
slurmctld's last state save: issue 23's window, now with the backup reading that save).
Then ctl starts again and the time until it is in charge (``takeback_s``, its boot
included). Figures: medians over ``--kills``.

    python -m benchmarks.takeover              # 3 kills, bursts of 10
    python -m benchmarks.takeover --kills 5 --jobs 20
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from typing import Any

from benchmarks import record
from benchmarks.crash import HOSTLAB, OPEN, Target, burst, quiet, settle

PRIMARY_UP = "Slurmctld(primary) at ctl is UP"
TIMEOUT_S = 300


def ping(target: Target) -> list[str]:
    return target.sh("scontrol ping", check=False).splitlines()


def wait(what: str, check: Any, every: float = 0.25) -> float:
    """Seconds until ``check()`` is true."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > TIMEOUT_S:
            raise SystemExit(f"benchmarks.takeover: {what}: not within {TIMEOUT_S} s")
        time.sleep(every)
    return time.monotonic() - start


def probe(target: Target) -> str | None:
    """A probe job on the gpu partition (idle): its id, or None when sbatch is refused."""
    out = target.sh("sbatch --parsable -p gpu --time=1 -o /dev/null --wrap true 2>/dev/null",
                    check=False).strip()
    return out.split(";")[0] or None


def accepted(target: Target) -> tuple[str, int]:
    """The first probe sbatch accepts, trying once a second; and how many it refused."""
    start, refused = time.monotonic(), 0
    while (job := probe(target)) is None:
        if time.monotonic() - start > TIMEOUT_S:
            raise SystemExit(f"benchmarks.takeover: no sbatch accepted within {TIMEOUT_S} s")
        refused += 1
        time.sleep(1)
    return job, refused


def ran(target: Target, job: str) -> bool:
    """The probe started (running, or gone from the queue after it ran)."""
    state = target.sh(f"squeue -h -j {job} -o %T", check=False).strip()
    return state not in ("PENDING", "CONFIGURING")


def kill(target: Target, jobs: int) -> dict[str, Any]:
    wait("ctl in charge", lambda: ping(target)[:1] == [PRIMARY_UP], every=1)
    quiet(target)
    ids = burst(target, jobs)
    killed = time.monotonic()
    target.kill_controller()
    job, refused = accepted(target)
    submit_s = time.monotonic() - killed
    schedule_s = wait("the probe running", lambda: ran(target, job))
    takeover = {"submit_again_s": round(submit_s, 1),
                "schedules_again_s": round(time.monotonic() - killed, 1),
                "refused_submissions": refused, "probe_wait_s": round(schedule_s, 1)}
    states = settle(target, [*ids, job])
    lost = [j for j in ids if states.get(j) in OPEN or j not in states]
    target.sh("sacctmgr -i show runawayjobs", check=False)
    start = time.monotonic()
    subprocess.run([*HOSTLAB, "start", "ctl"], cwd=record.ROOT, check=True, capture_output=True)
    back_s = wait("ctl in charge again", lambda: ping(target)[:1] == [PRIMARY_UP], every=0.5)
    return {**takeover, "burst": jobs, "burst_kept": jobs - len(lost), "burst_lost": len(lost),
            "held_after_takeover": len([j for j in states.pop("held").split(",") if j]),
            "takeback_s": round(back_s, 1), "ctl_started_after_s": round(start - killed, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.takeover",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10)
    args = parser.parse_args()
    target = Target("hostlab")
    conf = target.sh("scontrol show config")
    if conf.count("SlurmctldHost[") < 2:
        raise SystemExit("benchmarks.takeover: hostlab runs one controller; run "
                         "tests/integration/test_hostlab_takeover.py first (it deploys two)")
    timeout = next(line.split("=")[1].split()[0] for line in conf.splitlines()
                   if line.startswith("SlurmctldTimeout"))
    kills = []
    for n in range(args.kills):
        kills.append(kill(target, args.jobs))
        print(f"kill {n + 1}: {kills[-1]}", flush=True)
    figures = {
        "slurm": target.version(), "slurmctld_timeout": timeout, "kills": kills,
        "median_schedules_again_s": statistics.median(k["schedules_again_s"] for k in kills),
        "median_submit_again_s": statistics.median(k["submit_again_s"] for k in kills),
        "median_takeback_s": statistics.median(k["takeback_s"] for k in kills),
        "burst_jobs": sum(k["burst"] for k in kills),
        "burst_lost": sum(k["burst_lost"] for k in kills),
    }
    print(record.write("takeover-hostlab", figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
