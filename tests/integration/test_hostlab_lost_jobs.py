"""Issue 23 on hosts: the controller host loses power seconds after a burst of submissions.

hostlab on Debian 12 hosts (Slurm 22.05; the hosts have the pyhpc environment there): root
holds cpu1 with an anchor job, the researcher (the directory user `user1`, on the login
host, under PrivateData) submits a `pyhpc train` and, once accounting has its record, a few
plain `sbatch` jobs behind it, and the ctl host is killed (`podman kill`: every process of
the host at once, nothing saved on the way down). slurmctld saves its job state at most
every 5 s, so whether it saved the train job first is a race: as on the lab
(test_lost_jobs.py), the job_state ctl had saved after the anchor started is put back on
ctl's disk before the host starts again, as if it had died before the next save. What
slurmctld then does with the jobs accounting knows and it does not is real.

Then: every job either runs or pyhpc reports it LOST (none waits for ever); the doctor on
the login host lists the runaway records and --fix-runaway closes them; and `pyhpc
resubmit` brings the lost training back, resuming from its checkpoint.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

# pytest puts this directory on sys.path (rootdir-relative, no package).
from test_hostlab import HOSTLAB, SKIP, _run, on, run_on
from test_hostlab_life import converge, wait_for
from test_hostlab_pyhpc import HOME, RESEARCHER, as_researcher, history
from test_lost_jobs import held_until, lost_after_the_crash

pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

BURST = 3
#: slurm_state_dir (the slurm role's default): on ctl's own disk, not a hostlab volume.
JOB_STATE = "var/lib/slurm/slurmctld/job_state"


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    """The repository's hostlab on Debian 12 hosts, converged, no job of the researcher's."""
    converge("bookworm")
    on("login", "scancel", f"--user={RESEARCHER}")
    return {}


def ctl_root() -> Path:
    """ctl's root filesystem as this machine sees it (`podman mount`, running or not)."""
    proc, _ = _run([*HOSTLAB, "podman", "mount", "ctl"])
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip())


def researcher(workdir: str, command: str) -> subprocess.CompletedProcess[str]:
    """A shell command as the researcher on the login host, from workdir (created first)."""
    return as_researcher(f"mkdir -p {shlex.quote(workdir)} && cd {shlex.quote(workdir)} && {command}")


def controller_answers() -> bool:
    return "UP" in run_on("login", "scontrol", "ping").stdout


def test_after_the_controller_host_dies_every_job_runs_or_is_lost_and_comes_back(
        cluster: dict[str, Any]) -> None:
    work, queue = f"{HOME}/hostlab-lost", "cpu"
    run = f"{work}/run"
    on("login", "rm", "-rf", work)
    # Runaway records an earlier, interrupted run left: Slurm's own tool closes them.
    run_on("login", "sacctmgr", "-i", "show", "runawayjobs")
    # An epoch already trained: the lost job's resubmission resumes after it.
    first = researcher(work, f"pyhpc train --epochs 1 --out {run} --wait")
    assert first.returncode == 0, first.stdout + first.stderr

    # The anchor holds cpu1 until the test releases it, after ctl's boot (see held_until).
    release = "/run/pyhpc-test-anchor"
    on("cpu1", "rm", "-f", release)
    anchor = on("login", "sbatch", "--parsable", "-p", queue, "-N", "1", "--exclusive", "-J", "anchor",
                "-o", "/dev/null", "--time=10", "--wrap", held_until(release))
    wait_for("the anchor running", lambda: on("login", "squeue", "-h", "-j", anchor, "-o", "%T")
             == "RUNNING", timeout=60, every=0.2)
    # A save after the anchor started: the state put back holds it running (cpu1's slurmd
    # runs it), as the state of a real crash would. slurmctld saves only after a change: the
    # comment is one made after `started` (the start's own save may come before it, seen
    # with the lab's tests running beside these).
    state = ctl_root() / JOB_STATE
    started = time.time()
    on("login", "scontrol", "update", f"jobid={anchor}", "comment=running")
    wait_for("a state save after the anchor started", lambda: state.stat().st_mtime > started,
             timeout=30, every=0.05)
    saved = state.read_bytes()

    proc = researcher(work, f"pyhpc train --epochs 3 --out {run} --json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    train = str(json.loads(proc.stdout)["job_id"])
    wait_for("accounting's record of the train job",
             lambda: on("login", "sacct", "-n", "-X", "-o", "JobID", "-j", train), timeout=30, every=0.1)
    plain = researcher(work, f"for i in $(seq {BURST}); do sbatch --parsable -p {queue} -J burst "
                             "--time=1 --wrap 'sleep 1'; done").stdout.split()
    assert len(plain) == BURST, plain

    # The premise: nothing of the researcher's started before the crash.
    assert on("login", "squeue", "-h", "-j", train, "-o", "%T") == "PENDING"
    # Power lost: every process of the host at once. Its disk holds the state saved
    # before the train job came; then the host boots and systemd starts slurmctld.
    _run([*HOSTLAB, "podman", "kill", "ctl"], timeout=60)
    ctl_root().joinpath(JOB_STATE).write_bytes(saved)  # the file keeps its owner, slurm
    _run([*HOSTLAB, "podman", "start", "ctl"], timeout=120)
    wait_for("slurmctld answering after the boot", controller_answers, timeout=180, every=1)
    released = run_on("cpu1", "touch", release)
    assert released.returncode == 0, released.stderr
    ids = [anchor, train, *plain]
    print(f"hostlab: jobs {ids}, then ctl killed and started")

    # The researcher: every job ends, the lost ones in one line, exit non-zero.
    proc = researcher(work, f"pyhpc status {shlex.join(ids[1:])} --watch --interval 1 --json")
    print(proc.stdout, proc.stderr)
    lost = lost_after_the_crash(proc, train)
    # root's anchor was saved before the crash: slurmctld still knows it and it completes.
    done = run_on("login", "pyhpc", "status", anchor, "--watch", "--interval", "1", "--json", timeout=120)
    assert json.loads(done.stdout) == {anchor: "COMPLETED"}, done.stdout + done.stderr

    # The admin on the login host: the doctor lists the runaway records, --fix-runaway closes them.
    doctor = run_on("login", "pyhpc", "doctor", timeout=300)
    row = next((line for line in doctor.stdout.splitlines() if "runaway" in line), "")
    assert f"{len(lost)} open in accounting, lost by slurmctld" in row and RESEARCHER in row, doctor.stdout
    fixed = run_on("login", "pyhpc", "doctor", "--fix-runaway", timeout=300)
    assert f"closed {len(lost)}" in fixed.stdout, fixed.stdout + fixed.stderr
    left = run_on("login", "sacctmgr", "-n", "-P", "show", "runawayjobs").stdout
    assert not [line for line in left.splitlines() if line.split("|")[0] in lost], left
    again = researcher(work, f"pyhpc status {train}")
    assert again.stdout.split() == [train, "LOST"], again.stdout + again.stderr

    # The researcher brings the training back: it resumes after the epoch it had.
    back = researcher(work, f"pyhpc resubmit {train} --wait --json")
    assert back.returncode == 0, back.stdout + back.stderr
    result = json.loads(back.stdout)
    assert result["state"] == "COMPLETED", back.stdout
    assert [h["epoch"] for h in history(run)] == [0, 1, 2], history(run)
    log = on("login", "sh", "-c", f"cat {work}/pyhpc-jobs/{result['job_id']}/*_log.*")
    assert re.search(r"resuming from checkpoint after epoch 0", log), log
