"""The workshop notebooks run as written: executed top to bottom on the lab, from the
login node's environment (/opt/pyhpc/venv's Jupyter), as a new workshop participant:
the instructor creates the workshop, the participant logs in with `su -` as the sheet
says, exports the reservation as the sheet says, and executes them in their home.
Notebook 4's container jobs run podman rootless, as the participant.

`jupyter nbconvert --execute` stops at the first cell that raises, exactly as a
participant would see it; each notebook also asserts its own results (accuracy,
COMPLETED states, a full benchmark record).
"""
from __future__ import annotations

import csv
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_directory import as_user, workshop

from pyhpc import paths

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

NOTEBOOKS = sorted((paths.ROOT / "workshops").glob("*.ipynb"))
JUPYTER = paths.SHARED_VENV / "bin" / "jupyter"


PARTICIPANTS_WORKSHOP = "nbws"


@pytest.fixture(scope="module")
def participant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The first row of a new workshop's sheet: a participant who never logged in, and
    the moment the instructor handed the sheet over."""
    workshop("delete", PARTICIPANTS_WORKSHOP, "--homes", check=False)
    out = tmp_path_factory.mktemp("sheet") / PARTICIPANTS_WORKSHOP
    workshop("create", PARTICIPANTS_WORKSHOP, "--participants", "1", "--start", "now",
             "--hours", "2", "--nodes", "2", "--out", str(out))
    with open(out / f"{PARTICIPANTS_WORKSHOP}.csv", newline="") as fh:
        row = next(csv.DictReader(fh))
    # sacct keeps earlier runs' jobs of a participant of the same name: count from now.
    yield {**row, "handed_out": str(time.monotonic()),
           "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
    workshop("delete", PARTICIPANTS_WORKSHOP, "--homes", check=False)


#: What nbconvert gives one cell, and the participant's whole run of a notebook.
CELL_S = 900


def execute_as(row: dict[str, str], notebook: Path) -> dict:
    """What the sheet says: log in, make jobs use the reservation, run the notebook in the
    participant's own home (their copy of the workshop's notebook)."""
    user, name = row["user"], notebook.name
    home = as_user(user, "cd && pwd").stdout.strip()
    steps = [f"export SBATCH_RESERVATION={row['reservation']} "
             f"SLURM_RESERVATION={row['reservation']}",
             "mkdir -p ~/workshop && cd ~/workshop",
             f"cp {shlex.quote(str(paths.SHARED_SRC / 'workshops' / name))} .",
             f"{JUPYTER} nbconvert --to notebook --execute --inplace "
             f"--ExecutePreprocessor.timeout={CELL_S} {shlex.quote(name)}"]
    # The whole notebook may take what one cell may: 180 s ran out in CI for notebook 5
    # (a pipeline across nodes) while hostlab's worker converged its hosts on both cores.
    proc = as_user(user, " && ".join(steps), check=False, timeout=CELL_S)
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    assert proc.returncode == 0, f"{name} as {user} failed:\n{proc.stderr[-4000:]}"
    return json.loads((Path(home) / "workshop" / name).read_text())


def accounted(user: str, since: str, after: int = 0, wait: float = 60) -> list[str]:
    """User|Reservation|State of the user's jobs since ``since`` numbered above ``after``,
    once sacct has them all ended. Accounting lags the job: slurmctld sends its records to
    slurmdbd afterwards, and after a slurmdbd restart (an earlier test's deploy) it
    reconnects within 10 s. ``-S`` also selects a job that ended in the second ``since``
    names, an earlier notebook's: the job number, not the clock, tells one notebook's jobs
    from the one's before."""
    start = time.monotonic()
    while True:
        jobs = [j.split("|", 1)[1] for j in ended_or_not(user, since)
                if int(j.split("|", 1)[0]) > after]
        ended = jobs and not any(j.endswith(("|PENDING", "|RUNNING", "|COMPLETING")) for j in jobs)
        if ended or time.monotonic() - start > wait:
            print(f"sacct had {len(jobs)} job(s) of {user} ended after {time.monotonic() - start:.0f} s")
            return jobs
        time.sleep(2)


def ended_or_not(user: str, since: str) -> list[str]:
    """JobIDRaw|User|Reservation|State of the user's jobs since ``since``, as sacct has them."""
    return as_user(user, "sacct -X -n -P -o JobIDRaw,User,Reservation,State "
                         f"-S {since}").stdout.split()


def last_job(user: str, since: str) -> int:
    """The number of the user's last job since ``since``, once sacct has every one of them
    ended (0 when they have none): the jobs a notebook submits next are numbered above it."""
    if not ended_or_not(user, since):
        return 0
    accounted(user, since)
    return max(int(j.split("|", 1)[0]) for j in ended_or_not(user, since))


def text_output(nb: dict) -> str:
    return "".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                   for o in c.get("outputs", []))


def test_the_workshop_has_the_five_notebooks() -> None:
    assert [n.name for n in NOTEBOOKS] == ["01-hello-cluster.ipynb", "02-one-node-to-two.ipynb",
                                           "03-why-gpus-data-movement.ipynb", "04-containers.ipynb",
                                           "05-too-deep-for-one-gpu.ipynb"]


def test_notebook_1_hello_cluster_as_a_new_participant(participant: dict[str, str]) -> None:
    out = text_output(execute_as(participant, NOTEBOOKS[0]))
    assert "#SBATCH --job-name=hello" in out and "test accuracy" in out and "samples/s" in out
    user = participant["user"]
    jobs = accounted(user, participant["since"])
    assert jobs and all(j == f"{user}|{participant['reservation']}|COMPLETED" for j in jobs), jobs


def test_notebook_2_one_node_to_two_as_a_new_participant(participant: dict[str, str]) -> None:
    out = text_output(execute_as(participant, NOTEBOOKS[1]))
    home = Path(as_user(participant["user"], "cd && pwd").stdout.strip())
    plot = home / "workshop" / "workshop-runs" / "scale" / "time-to-train.png"
    assert "efficiency" in out and plot.is_file()
    assert plot.stat().st_uid == (home / "workshop").stat().st_uid != 0
    print(f"sheet to notebook 2 done: {time.monotonic() - float(participant['handed_out']):.0f} s")


def test_notebook_3_why_gpus_data_movement_as_a_new_participant(participant: dict[str, str]) -> None:
    out = text_output(execute_as(participant, NOTEBOOKS[2]))
    assert "all-reduce backend gloo" in out


def test_notebook_4_containers_as_a_new_participant(participant: dict[str, str]) -> None:
    # The admin's step before the workshop (`make containers`); cached when built already.
    subprocess.run([sys.executable, "-m", "pyhpc", "containers", "build", "--variant", "cpu"],
                   cwd=paths.ROOT, check=True, timeout=1800)
    user = participant["user"]
    before = last_job(user, participant["since"])
    out = text_output(execute_as(participant, NOTEBOOKS[3]))
    assert "2 workers, torch 2.13.0+cpu" in out
    home = Path(as_user(user, "cd && pwd").stdout.strip())
    # What the container wrote in the participant's directory is theirs (rootless podman).
    metrics = home / "workshop" / "workshop-runs" / "container" / "metrics.jsonl"
    assert metrics.stat().st_uid == home.stat().st_uid != 0
    jobs = accounted(user, participant["since"], after=before)
    assert jobs and all(j == f"{user}|{participant['reservation']}|COMPLETED" for j in jobs), jobs


def test_notebook_5_a_model_too_deep_for_one_gpu_as_a_new_participant(
        participant: dict[str, str]) -> None:
    before = last_job(participant["user"], participant["since"])
    out = text_output(execute_as(participant, NOTEBOOKS[4]))
    assert "out of memory: Slurm's cgroup killed a task" in out
    assert "2 stages x 2 replicas, 200 blocks" in out
    home = Path(as_user(participant["user"], "cd && pwd").stdout.strip())
    plot = home / "workshop" / "workshop-runs" / "deep" / "pipeline.png"
    assert plot.is_file() and plot.stat().st_uid == home.stat().st_uid != 0
    jobs = accounted(participant["user"], participant["since"], after=before)
    user, reservation = participant["user"], participant["reservation"]
    # The one-rank run is the notebook's own failure; the pipelined runs complete.
    assert sorted(jobs) == sorted([f"{user}|{reservation}|COMPLETED"] * 2
                                  + [f"{user}|{reservation}|FAILED"]), jobs
