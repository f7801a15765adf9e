"""A workshop participant at a terminal: a real login shell (`su -`) of a directory user the
instructor's `pyhpc workshop create` made. Every pyhpc command that submits runs inside the
workshop's reservation without naming it, and each refusal of Slurm's reaches the
participant as one line that says what to do, exit 2.

One workshop serves the module (GPU partition, both GPU nodes, tight per-user limits); the
states a refusal needs (a QOS limit, a partition limit) are made with sacctmgr and scontrol
for that test and undone after it. The jobs are tiny and waited for.
"""
from __future__ import annotations

import csv
import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from test_directory import PYHPC, sh, workshop

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

NAME = "termws"
LATER = "termlater"
#: The workshop's per-participant limits: one job running, two queued, one GPU.
LIMITS = ("--jobs-per-user", "1", "--submitted-per-user", "2", "--gpus-per-user", "1")
PART = "gpu"


def login(user: str, command: str, timeout: int = 420) -> subprocess.CompletedProcess[str]:
    """``command`` in ``user``'s login shell, from their home, as a participant types it."""
    return subprocess.run(["su", "-", user, "-c", command], capture_output=True, text=True,
                          timeout=timeout, check=False)


def pyhpc(user: str, *args: str, timeout: int = 420) -> subprocess.CompletedProcess[str]:
    return login(user, shlex.join([PYHPC, *args]), timeout)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The refusal: exit 2, one line on stderr (after --wait's progress lines, if any), no
    traceback; the line without its prefix."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines()
             if not re.match(r"\[\s*\d+s\] \d+/\d+ jobs? finished", line)]
    assert len(lines) == 1 and lines[0].startswith("pyhpc: error: "), proc.stderr
    return lines[0].removeprefix("pyhpc: error: ")


def reservation_of(job_id: str) -> str:
    """The reservation slurmctld holds the job in (it knows a finished job until MinJobAge)."""
    text = sh("scontrol", "-o", "show", "job", job_id).stdout
    found = re.search(r"\bReservation=(\S+)", text)
    return found.group(1) if found else ""


def job_id_in(text: str) -> str:
    found = re.search(r"\b(\d+)\b", text)
    assert found, text
    return found.group(1)


@pytest.fixture(scope="module")
def participant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The first participant of a new workshop on the GPU partition, as the sheet has them."""
    workshop("delete", NAME, "--homes", check=False)
    out = tmp_path_factory.mktemp("sheet") / NAME
    workshop("create", NAME, "--participants", "1", "--start", "now", "--hours", "1",
             "--nodes", "2", "--partition", PART, *LIMITS, "--out", str(out))
    with open(out / f"{NAME}.csv", newline="") as fh:
        row = next(csv.DictReader(fh))
    yield row
    sh("scancel", f"--account={NAME}", check=False)
    workshop("delete", NAME, "--homes", check=False)


# -- inside the reservation, without naming it ------------------------------------------

def test_the_readmes_terminal_steps_train_and_report_in_the_reservation(
        participant: dict[str, str]) -> None:
    user = participant["user"]
    readme = Path(f"/home/{user}/workshop/README").read_text()
    steps = re.findall(r"^\s+\d\. (pyhpc .*)$", readme, re.M)
    assert steps == [f"pyhpc train --partition {PART} --nodes 1 --epochs 1 --out run1 --wait",
                     "pyhpc report run1"], readme
    assert f"ssh {user}@" in readme and "Start My Server" in readme  # the lab runs the hub
    train = login(user, steps[0].replace("pyhpc", PYHPC, 1))
    assert train.returncode == 0, train.stdout + train.stderr
    assert reservation_of(job_id_in(train.stdout)) == NAME
    report = login(user, steps[1].replace("pyhpc", PYHPC, 1))
    assert report.returncode == 0 and "plot:" in report.stdout, report.stdout + report.stderr


def test_submit_of_a_template_a_script_and_a_function_runs_in_the_reservation(
        participant: dict[str, str]) -> None:
    user = participant["user"]
    login(user, "printf '#!/bin/bash\\nhostname\\n' > job.sh")
    for args in (["single", "--set", "command=hostname"], ["job.sh"], ["posixpath:join", "a"]):
        proc = pyhpc(user, "submit", *args, "--partition", PART, "--wait")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert reservation_of(proc.stdout.split()[-1]) == NAME, args


def test_the_jupyter_and_container_templates_queue_in_the_reservation(
        participant: dict[str, str]) -> None:
    user = participant["user"]
    for args in (["jupyter", "--time", "00:05:00"],
                 ["container", "--nodes", "1", "--time", "00:05:00", "--set", "module=pyhpc.train"]):
        proc = pyhpc(user, "submit", *args, "--partition", PART)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        job = proc.stdout.split()[-1]
        try:
            assert reservation_of(job) == NAME, args
        finally:
            login(user, f"scancel {job}")


def test_scale_and_bench_run_in_the_reservation(participant: dict[str, str]) -> None:
    user = participant["user"]
    folders = Path(f"/home/{user}/pyhpc-jobs")
    before = set(folders.glob("[0-9]*"))
    proc = pyhpc(user, "scale", "--partition", PART, "--nodes", "1", "--batch-sizes", "32",
                 "--out", "sweep", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    swept = set(folders.glob("[0-9]*")) - before
    assert swept and {reservation_of(p.name) for p in swept} == {NAME}
    proc = pyhpc(user, "bench", "--partition", PART, "--tests", "copy", "--max-bytes", "64K",
                 "--out", "bench", "--wait", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert reservation_of(str(json.loads(proc.stdout)["job_id"])) == NAME


def test_resubmit_runs_the_job_again_in_the_reservation(participant: dict[str, str]) -> None:
    user = participant["user"]
    first = pyhpc(user, "submit", "single", "--set", "command=true", "--partition", PART, "--wait")
    assert first.returncode == 0, first.stderr
    again = pyhpc(user, "resubmit", first.stdout.split()[-1], "--force", "--wait")
    assert again.returncode == 0, again.stdout + again.stderr
    assert reservation_of(again.stdout.split()[-1]) == NAME


# -- Slurm's refusals, one line each --------------------------------------------------------

def test_outside_its_partition_the_qos_that_requires_the_reservation_is_explained(
        participant: dict[str, str]) -> None:
    line = one_line(pyhpc(participant["user"], "submit", "single", "--set", "command=true",
                          "--partition", "cpu"))
    assert line.startswith("reservation: your account's QOS runs jobs only in a reservation, "
                           f"and yours, {NAME}, holds nodes of partition {PART}; add "
                           f"--partition {PART} (Slurm: Invalid qos specification)"), line


def test_an_account_the_participant_has_not_got_is_explained(participant: dict[str, str]) -> None:
    user = participant["user"]
    login(user, "printf '#!/bin/bash\\n#SBATCH --account=nosuchacct\\ntrue\\n' > acct.sh")
    line = one_line(pyhpc(user, "submit", "acct.sh", "--partition", PART))
    assert line.startswith(f"account: your accounts on cluster lab are {NAME}"), line
    assert line.endswith("(Slurm: Invalid account or account/partition combination specified)")


def test_more_gpus_than_a_participant_may_hold_is_explained(participant: dict[str, str]) -> None:
    line = one_line(pyhpc(participant["user"], "submit", "single", "--set", "command=true",
                          "--partition", PART, "--gpus-per-node", "2"))
    assert line.startswith("gpus_per_node: your jobs together would hold more GPUs than your "
                           "QOS allows each user"), line
    assert line.endswith("(Slurm: QOSMaxGRESPerUser: Job violates accounting/QOS policy (job "
                         "submit limit, user's size and/or time limits))")


@pytest.fixture
def one_node_per_user() -> Iterator[None]:
    sh("sacctmgr", "-i", "modify", "qos", NAME, "set", "MaxTRESPerUser=node=1,gres/gpu=1")
    yield
    sh("sacctmgr", "-i", "modify", "qos", NAME, "set", "MaxTRESPerUser=node=2,gres/gpu=1")


def test_more_nodes_than_a_participant_may_hold_is_explained(participant: dict[str, str],
                                                             one_node_per_user: None) -> None:
    line = one_line(pyhpc(participant["user"], "train", "--partition", PART, "--nodes", "2",
                          "--epochs", "1", "--out", "run2"))
    assert line.startswith("nodes: your jobs together would hold more nodes than your QOS "
                           "allows each user"), line
    assert "QOSMaxNodePerUserLimit" in line


def test_more_jobs_than_a_participant_may_queue_is_explained(participant: dict[str, str]) -> None:
    user = participant["user"]
    held = [login(user, f"sbatch --parsable --hold --reservation={NAME} -p {PART} --time=1 "
                        "--wrap true").stdout.strip() for _ in range(2)]
    try:
        assert all(held), held
        line = one_line(pyhpc(user, "submit", "single", "--set", "command=true",
                              "--partition", PART))
        assert line.startswith("jobs: you have as many jobs queued and running as your QOS "
                               "allows each user; wait for one to end, or cancel one"), line
        assert "QOSMaxSubmitJobPerUserLimit" in line
    finally:
        login(user, f"scancel {' '.join(held)}")


@pytest.fixture
def partition_limits() -> Iterator[None]:
    """The GPU partition's limits tightened in Slurm (not in cluster.yml, which pyhpc checks
    first): five minutes, one node a job."""
    sh("scontrol", "update", f"PartitionName={PART}", "MaxTime=5", "MaxNodes=1")
    yield
    sh("scontrol", "update", f"PartitionName={PART}", "MaxTime=1-00:00:00", "MaxNodes=UNLIMITED")
    sh("scancel", f"--account={NAME}", check=False)  # the jobs that could never start


def test_partition_time_and_node_limits_are_explained(participant: dict[str, str],
                                                      partition_limits: None) -> None:
    user = participant["user"]
    line = one_line(pyhpc(user, "submit", "single", "--set", "command=true", "--partition",
                          PART, "--time", "00:10:00", "--wait", "--timeout", "120"))
    assert re.fullmatch(r"job: (\d+) can never start \(PartitionTimeLimit\): time: longer than "
                        r"the job's partition allows \(sinfo shows its limit\); ask for less "
                        r"\(--time\); or pyhpc cancel \1", line), line
    line = one_line(pyhpc(user, "train", "--partition", PART, "--nodes", "2", "--epochs", "1",
                          "--out", "run3", "--wait", "--timeout", "120"))
    assert re.fullmatch(r"job: (\d+) can never start \(PartitionNodeLimit\): nodes: more than "
                        r"the job's partition gives one job \(sinfo shows its nodes\); ask for "
                        r"fewer \(--nodes\); or pyhpc cancel \1", line), line


@pytest.fixture(scope="module")
def later(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A participant of a workshop that starts in two hours."""
    workshop("delete", LATER, "--homes", check=False)
    out = tmp_path_factory.mktemp("sheet") / LATER
    start = (datetime.now() + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    workshop("create", LATER, "--participants", "1", "--start", start, "--hours", "1",
             "--out", str(out))
    with open(out / f"{LATER}.csv", newline="") as fh:
        row = next(csv.DictReader(fh))
    yield row
    workshop("delete", LATER, "--homes", check=False)


def test_before_its_window_the_reservation_says_when_it_starts(later: dict[str, str]) -> None:
    user = later["user"]
    line = one_line(pyhpc(user, "train", "--nodes", "1", "--epochs", "1", "--out", "run1"))
    assert re.fullmatch(rf"reservation: your account's QOS runs jobs only in a reservation, "
                        rf"and yours, {LATER}, starts at \S+ \(in 1 h 5\d min\); submit then "
                        r"\(Slurm: Invalid qos specification\)", line), line
    line = one_line(pyhpc(user, "submit", "single", "--set", "command=true",
                          "--reservation", LATER))
    assert re.fullmatch(rf"reservation: reservation {LATER} starts at \S+ \(in 1 h 5\d min\); "
                        "submit then", line), line


def test_after_its_window_the_reservation_is_said_to_have_ended(later: dict[str, str]) -> None:
    sh("scontrol", "delete", f"ReservationName={LATER}")  # what slurmctld does at its end
    line = one_line(pyhpc(later["user"], "submit", "single", "--set", "command=true",
                          "--reservation", LATER))
    assert line == (f"reservation: Slurm has no reservation {LATER} now: it has ended, or was "
                    "never made (those you may use: none)"), line
