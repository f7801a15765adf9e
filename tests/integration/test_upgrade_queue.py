"""Issue 46 on the lab: the job queue across Slurm's unsupported jump, where slurmctld
24.11 does not read 22.05's StateSaveLocation and starts with an empty queue.

user1 has a `pyhpc train` running with checkpoints, a job held by them and a job that
depends on it; user2 has a plain job running and an array of four tasks not yet due.
Root runs `pyhpc admin upgrade queue save` with a short deadline: the pending jobs are
recorded and held, the train job is requeued and held, the plain one cancelled, and
nothing runs. The jump's state loss exactly as the upgrade meets it: slurmctld stopped,
its StateSaveLocation moved aside (kept), slurmctld started on an empty one. Then
`restore`, which refuses in one line: the empty slurmctld would number jobs from 1, ids
old jobs have. The deploy, limited to the slurm role, sets FirstJobId from save's record;
then `restore`: every pending job is back as its user with its script and options, under
new ids above every old one, which it lists, the dependency on the held job's new id, the
user's hold kept, the array's tasks pending; the training resumes and runs each epoch
once; a second restore submits nothing; the held job, released, runs with the variable
and umask it was submitted with.
The lab is put back whatever happens: the original state and slurm.conf, no job left.

Real slurmctld, slurmd, slurmdbd, sbatch as the users, runuser and pyhpc. Jobs run the
deployed pyhpc (train, resubmit), which this command does not change; the command itself
runs from this checkout, as an admin would run it on the controller.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_directory import as_user, sh
from test_jobs import home, pyhpc, read_history, work  # noqa: F401
from test_lost_jobs import config, controller_up

from pyhpc import paths
from pyhpc.slurm import queue_control
from tests.unit.roleplay import other_plays_off

pytestmark = pytest.mark.integration  # not alone: as test_lost_jobs, its restarts touch only the lab

EPOCHS = 8
SLURM_CONF = Path("/etc/slurm/slurm.conf")
#: `make deploy` limited to the slurm role, with site.yml's own switches: every other play
#: off, and slurm.conf's job-end record kept as the whole deploy renders it.
SLURM_ONLY = {**other_plays_off("slurm"), "slurm_jobstats_record": True}
#: The fields of `scontrol show job` a resubmitted job must have as its old one had them.
SAME = ("JobName", "UserId", "Partition", "Account", "QOS", "TimeLimit", "NumNodes",
        "NumTasks", "CPUs/Task", "MinMemoryNode", "MinMemoryCPU", "Comment", "StdOut", "StdErr",
        "WorkDir", "ArrayTaskId", "OverSubscribe", "Requeue")


def admin(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`pyhpc admin upgrade queue ARGS` as root, from this checkout."""
    proc = subprocess.run([sys.executable, "-m", "pyhpc", "admin", "upgrade", "queue", *args],
                          capture_output=True, text=True, timeout=300, check=False)
    if check:
        assert proc.returncode == 0, f"{args}: {proc.stdout}\n{proc.stderr}"
    return proc


def job(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as fields (these jobs' names and comments hold no blank)."""
    line = sh("scontrol", "show", "job", "-o", job_id).stdout.splitlines()[0]
    fields: dict[str, str] = {}
    for word in line.split():
        key, _, value = word.partition("=")
        fields.setdefault(key, value)
    return fields


def script(job_id: str) -> str:
    return sh("scontrol", "write", "batch_script", job_id, "-").stdout


def submit(user: str, options: str, before: str = "") -> str:
    return as_user(user, f"{before}sbatch --parsable {options}").stdout.strip()


def state(job_id: str) -> str:
    return sh("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()


def wait_for(what: str, done: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def deploy_slurm() -> None:
    """The deploy of the slurm role (site.yml, its other plays switched off), as root."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(paths.ROOT / "ansible" / "ansible.cfg"))
    began = time.monotonic()
    proc = subprocess.run([str(paths.ROOT / ".venv" / "bin" / "ansible-playbook"), "-e",
                           f"pyhpc_cluster_file={paths.LAB_CLUSTER}", "-e", json.dumps(SLURM_ONLY),
                           str(paths.ROOT / "ansible" / "site.yml")],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    print(f"deploy of the slurm role: {time.monotonic() - began:.1f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.fixture
def lab_put_back() -> Iterator[dict[str, list[str]]]:
    """The jobs the test makes, old and new, cancelled and the original StateSaveLocation
    and slurm.conf (no FirstJobId) in place with slurmctld on them, whatever happens; the
    test's record removed."""
    record = paths.UPGRADE_QUEUE
    assert not os.path.lexists(record), f"{record} exists: an admin's queue record, left alone"
    assert not queue_control.blocked(), "reservation pyhpc-upgrade exists: not this test's"
    made: dict[str, list[str]] = {"old": [], "new": [], "aside": []}
    conf = SLURM_CONF.read_bytes()
    try:
        yield made
    finally:
        if made["new"]:
            sh("scancel", *made["new"], check=False)
        # slurm.conf back first (without FirstJobId): slurmctld starts on the old state with it.
        conf_changed = SLURM_CONF.read_bytes() != conf
        if conf_changed:
            temp = SLURM_CONF.with_name(".slurm.conf.pyhpc-test")
            temp.write_bytes(conf)
            temp.chmod(0o644)
            temp.replace(SLURM_CONF)
        if made["aside"]:
            state_dir, aside = Path(made["aside"][0]), Path(made["aside"][1])
            sh("service", "pyhpc-slurmctld", "stop")
            shutil.rmtree(state_dir)
            aside.rename(state_dir)
            sh("service", "pyhpc-slurmctld", "start")
            controller_up()
        elif conf_changed:
            sh("service", "pyhpc-slurmctld", "restart")
            controller_up()
        if conf_changed:  # the deploy restarted them on its slurm.conf
            sh("service", "pyhpc-slurmd", "restart")
        if made["old"]:
            sh("scancel", *made["old"], check=False)
        if queue_control.blocked():
            sh("scontrol", "delete", f"ReservationName={queue_control.RESERVATION}", check=False)
        shutil.rmtree(record, ignore_errors=True)
        if conf_changed:  # idle, not maint: after the reservation
            wait_for("the nodes did not come back",
                     lambda: "idle" in sh("sinfo", "-h", "-o", "%t").stdout)


def lose_the_state(made: dict[str, list[str]]) -> None:
    """As the jump: slurmctld stopped, its StateSaveLocation aside, started empty."""
    state_dir = Path(config("StateSaveLocation"))
    aside = state_dir.with_name(f"{state_dir.name}.pyhpc-test-aside")
    info = state_dir.stat()
    sh("service", "pyhpc-slurmctld", "stop")
    state_dir.rename(aside)
    made["aside"] = [str(state_dir), str(aside)]
    state_dir.mkdir(mode=0o750)
    os.chown(state_dir, info.st_uid, info.st_gid)
    sh("service", "pyhpc-slurmctld", "start")
    controller_up()
    wait_for("the nodes did not come back", lambda: "idle" in sh("sinfo", "-h", "-o", "%t").stdout)


def test_the_queue_survives_the_state_loss_of_an_unsupported_jump(
        work: Path, lab_put_back: dict[str, list[str]]) -> None:  # noqa: F811
    made, run = lab_put_back, work / "run"
    sh("scancel", "-u", "user1", check=False)
    sh("scancel", "-u", "user2", check=False)
    train = json.loads(pyhpc(work, "train", "--nodes", "1", "--mode", "synthetic",
                             "--synthetic-samples", "2048", "--epochs", str(EPOCHS), "--out",
                             str(run), "--json").stdout)["job_id"]
    made["old"].append(train)
    plain = submit("user2", "-p cpu -c 1 --mem=200M --time=10 -J plain --wrap 'sleep 600'")
    # Its environment and umask at submission: the new job runs with them.
    held = submit("user1", f"--hold -p cpu --time=3 --mem=100M -J held -o {work}/held-%j.out "
                           "--comment kept-as-it-was --wrap 'echo \"$PYHPC_TEST_VAR\"'",
                  before="umask 077; export PYHPC_TEST_VAR='two words'; ")
    after = submit("user1", f"-p cpu --time=4 -J after --dependency=afterok:{held} "
                            "--wrap 'echo after'")
    array = submit("user2", "-p cpu --time=2 -J tasks --array=1-4%2 --begin=now+10minutes "
                            "--wrap 'echo $SLURM_ARRAY_TASK_ID'")
    made["old"] += [plain, held, after, array]
    pending = {held: job(held), after: job(after), array: job(array)}
    scripts = {j: script(j) for j in pending}
    wait_for("the train job checkpointed no epoch", lambda: (run / "history.json").exists()
             and len(read_history(run)) >= 1, 180)
    assert state(plain) == "RUNNING" and len(read_history(run)) < EPOCHS

    began = time.monotonic()
    saved = json.loads(admin("save", "--deadline", "2", "--json").stdout)
    print(f"save: {time.monotonic() - began:.1f} s")
    fates = {r["job_id"]: (r["fate"], r["held"]) for r in saved["jobs"]}
    assert fates == {train: ("requeued", ""), plain: ("cancelled", ""), held: ("held", "user"),
                     after: ("held", ""), array: ("held", "")}, saved
    assert not [line for line in sh("squeue", "-h", "-o", "%T").stdout.split()
                if line in ("RUNNING", "COMPLETING")]
    assert {j: job(j)["Priority"] for j in (*pending, train)} == dict.fromkeys((*pending, train), "0")
    record = sorted((p.name, p.read_bytes()) for p in (paths.UPGRADE_QUEUE / "jobs").iterdir())
    assert oct(paths.UPGRADE_QUEUE.stat().st_mode & 0o777) == "0o700"
    assert json.loads(admin("save", "--json").stdout)["jobs"] == saved["jobs"]  # the same record
    assert sorted((p.name, p.read_bytes()) for p in (paths.UPGRADE_QUEUE / "jobs").iterdir()) \
        == record

    lose_the_state(made)
    assert not sh("squeue", "-h", "-o", "%i").stdout.split()

    # Numbered from 1 again, new jobs would take old ones' ids: restore refuses, does nothing.
    first = json.loads((paths.UPGRADE_QUEUE / "save.json").read_text())["first_job_id"]
    assert first == saved["first_job_id"] > max(int(j) for j in made["old"])
    refused = admin("restore", check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("pyhpc: error: FirstJobId: ")
    assert f"set FirstJobId={first} in slurm.conf" in refused.stderr
    assert not sh("squeue", "-h", "-o", "%i").stdout.split() and not queue_control.blocked()
    assert not (paths.UPGRADE_QUEUE / "restored.json").exists()

    deploy_slurm()
    assert f"\nFirstJobId={first}\n" in SLURM_CONF.read_text()
    assert int(config("NEXT_JOB_ID")) == first

    began = time.monotonic()
    restored = json.loads(admin("restore", "--json").stdout)
    print(f"restore: {time.monotonic() - began:.1f} s; {restored['restored']}")
    new = restored["restored"]
    made["new"] += list(new.values())
    assert sorted(new) == sorted([train, held, after, array]), restored
    assert min(int(j) for j in new.values()) >= first  # above every old job's id
    assert next(r for r in restored["jobs"] if r["job_id"] == plain)["new_job_id"] is None
    assert not queue_control.blocked()
    for old, before in pending.items():
        now, was = job(new[old]), {k: before.get(k, "") for k in SAME}
        for k in ("StdOut", "StdErr"):  # slurm-%j.out: the new job writes under its new id
            was[k] = was[k].replace(f"-{old}", f"-{new[old]}")
        assert {k: now.get(k, "") for k in SAME} == was, old
        assert script(new[old]) == scripts[old]
    assert job(new[held])["Reason"] == "JobHeldUser"
    assert job(new[after])["Dependency"] == f"afterok:{new[held]}(unfulfilled)"
    assert job(new[array])["ArrayTaskId"] == "1-4%2"

    again = json.loads(admin("restore", "--json").stdout)
    assert again["restored"] == new
    assert sorted(sh("squeue", "-h", "-o", "%F").stdout.split()) == sorted(set(new.values()))

    as_user("user1", f"scontrol release {new[held]}")
    out = work / f"held-{new[held]}.out"
    wait_for("the held job, released, did not run", lambda: state(new[held]) in ("", "COMPLETED"))
    assert out.read_text() == "two words\n" and out.stat().st_mode & 0o777 == 0o600

    done = pyhpc(work, "status", new[train], "--watch", "--interval", "1", "--json")
    assert json.loads(done.stdout) == {new[train]: "COMPLETED"}
    assert [h["epoch"] for h in read_history(run)] == list(range(EPOCHS))


def test_a_restore_where_slurmctld_kept_its_state_releases_the_same_jobs(
        work: Path, lab_put_back: dict[str, list[str]]) -> None:  # noqa: F811
    """The upgrade called off after save: slurmctld still holds the jobs, and restore
    releases them (the user's hold kept) instead of submitting them twice."""
    made = lab_put_back
    held = submit("user1", "--hold -p cpu --time=1 -J held-here --wrap true")
    after = submit("user2", f"-p cpu --time=1 -J after-here --begin=now+10minutes "
                            f"--dependency=afterany:{held} --wrap true")
    made["old"] += [held, after]
    admin("save", "--deadline", "0")
    assert job(held)["Priority"] == job(after)["Priority"] == "0"
    restored = json.loads(admin("restore", "--json").stdout)
    assert restored["restored"] == {held: held, after: after}
    assert job(held)["Reason"] == "JobHeldUser" and job(after)["Priority"] != "0"
    assert sorted(sh("squeue", "-h", "-o", "%i").stdout.split()) == sorted([held, after])
    assert not queue_control.blocked()
