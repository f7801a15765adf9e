"""Issue 23 on the lab: the controller dies seconds after a burst of submissions.

slurmctld saves its job state at most every 5 s (compiled in): the first job after a
quiet spell is saved at once, the ones accepted in the next seconds wait for the next
save. Root holds both CPU nodes with an anchor job (saved), the researcher (user1)
submits a `pyhpc train` and a few plain `sbatch` jobs behind it (pending), and root kills
slurmctld with SIGKILL, as a host losing power would, before the next save; then starts it
again. Real slurmctld, slurmdbd, sacct, sacctmgr and pyhpc, as the researcher under
PrivateData=jobs.

Then: every job either runs or pyhpc reports it LOST (none waits for ever); the doctor
lists the runaway records and --fix-runaway closes them (status still says LOST); and
`pyhpc resubmit` brings the lost training back, resuming from its checkpoint.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from test_directory import sh
from test_jobs import home, pyhpc, read_history, researcher, wait, work  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

PYHPC = "/opt/pyhpc/venv/bin/pyhpc"
#: Seconds after the anchor's save by which the kill must come (the next save is 5 s later).
WINDOW_S = 4.0
BURST = 3


def config(key: str) -> str:
    out = sh("scontrol", "show", "config").stdout
    match = re.search(rf"^{key}\s*=\s*(\S+)", out, re.M)
    assert match, key
    return match.group(1)


def controller_up(timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while sh("scontrol", "ping", check=False).returncode != 0 or \
            "UP" not in sh("scontrol", "ping", check=False).stdout:
        assert time.monotonic() < deadline, "slurmctld did not come back"
        time.sleep(0.5)


def kill_controller() -> None:
    """SIGKILL, as a power loss: no state is saved on the way down."""
    pid = int(Path(config("SlurmctldPidFile")).read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # pyhpc's pid-file script (Debian's would act on every slurmctld by name).
    sh("service", "pyhpc-slurmctld", "start")
    controller_up()


def quiet_queue() -> None:
    deadline = time.monotonic() + 180
    while sh("squeue", "-h", "-o", "%i").stdout.split():
        assert time.monotonic() < deadline, "the lab's queue did not empty"
        time.sleep(1)


def burst(where: Path, run: Path) -> tuple[str, str, list[str], float]:
    """The anchor (saved at once after a quiet spell), then the researcher's train job and
    plain jobs behind it; returns their ids and the seconds from the anchor to the last."""
    quiet_queue()
    time.sleep(6)  # > 5 s since the last save: the anchor's submission saves at once
    start = time.monotonic()
    anchor = sh("sbatch", "--parsable", "-p", "cpu", "-N", "2", "--exclusive", "-J", "anchor",
                "--time=2", "--wrap", "sleep 25").stdout.strip()
    proc = researcher(where, f"{PYHPC} train --epochs 3 --out {run} --json && "
                            f"for i in $(seq {BURST}); do sbatch --parsable -p cpu -J burst "
                            "--time=1 --wrap 'sleep 1'; done")
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    train = json.loads(lines[0])["job_id"]
    return anchor, train, lines[1:], took


def test_after_a_controller_crash_every_job_runs_or_is_lost_and_comes_back(work: Path) -> None:  # noqa: F811
    run = work / "run"
    # An epoch already trained: the lost job's resubmission resumes after it.
    pyhpc(work, "train", "--epochs", "1", "--out", str(run), "--wait")
    for _attempt in range(3):
        anchor, train, plain, took = burst(work, run)
        if took < WINDOW_S:
            kill_controller()
            break
        sh("scancel", anchor, train, *plain, check=False)  # too slow: the next save came
    else:
        pytest.fail(f"the burst took {took:.1f} s three times; it must fit in {WINDOW_S} s")
    ids = [anchor, train, *plain]
    print(f"burst of {len(ids)} jobs in {took:.2f} s, then SIGKILL")

    # The researcher: every job ends, the lost ones in one line each, exit non-zero.
    proc = pyhpc(work, "status", *ids[1:], "--watch", "--interval", "1", "--timeout", "120",
                 "--json", check=False)
    states = json.loads(proc.stdout)
    print(states, proc.stderr)
    assert set(states.values()) <= {"LOST", "COMPLETED"}, states
    lost = sorted(j for j, s in states.items() if s == "LOST")
    assert train in lost and proc.returncode != 0
    message = [line for line in proc.stderr.splitlines() if "lost" in line]
    assert message and all("pyhpc resubmit" in line for line in message)
    one = pyhpc(work, "status", train, check=False)
    assert one.returncode != 0 and one.stdout.split() == [train, "LOST"]
    assert len(one.stderr.strip().splitlines()) == 1 and "restarted" in one.stderr
    # The anchor was saved before the crash: slurmctld still knows it and it completes.
    assert wait(work, anchor) == "COMPLETED"

    # The admin: the doctor lists the runaway records, --fix-runaway closes them.
    doctor = sh(PYHPC, "doctor", check=False)
    print(doctor.stdout)
    row = next(line for line in doctor.stdout.splitlines() if "runaway" in line)
    assert f"{len(lost)} runaway" in row and "user1" in row
    fixed = sh(PYHPC, "doctor", "--fix-runaway")
    assert f"closed {len(lost)}" in fixed.stdout, fixed.stdout
    left = sh("sacctmgr", "-n", "-P", "show", "runawayjobs", check=False)
    assert not [line for line in left.stdout.splitlines() if line.split("|")[0] in lost]
    again = pyhpc(work, "status", train, check=False)  # accounting says COMPLETED now
    assert again.stdout.split() == [train, "LOST"], again.stdout + again.stderr

    # The researcher brings the training back: it resumes after the epoch it had.
    back = pyhpc(work, "resubmit", train, "--wait", "--json")
    result = json.loads(back.stdout)
    assert result["state"] == "COMPLETED", back.stdout
    history = read_history(run)
    assert [h["epoch"] for h in history] == [0, 1, 2], history
    log = "".join(p.read_text() for p in (work / "pyhpc-jobs" / result["job_id"]).glob("*_log.*"))
    assert "resuming from checkpoint after epoch 0" in log
