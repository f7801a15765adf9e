"""A model too deep for one rank, on the lab, as the researcher (user1) would train it.

The deep model with 200 residual blocks at batch 32 peaks at about 1.4 GiB in one process,
over the 1 GiB a task holds on the lab (DefMemPerCPU): Slurm's cgroup kills it, and pyhpc
says so in one line. Split over 2 stages (1F1B, 4 micro-batches) each stage peaks near
0.6 GiB and it trains: from the CLI on one node, and from the Python API over 2 nodes x
2 stages (data parallel across them), resuming after a requeue with no epoch lost or
repeated. Real slurmctld, slurmd, cgroups, submitit and torch.distributed (gloo).
"""
from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest
from test_jobs import RESEARCHER, home, pyhpc, read_history, requeue, researcher, wait  # noqa: F401

from pyhpc import paths

pytestmark = pytest.mark.integration

#: The lab's memory per task (DefMemPerCPU, one CPU a task).
TASK_MEMORY = 1 << 30
DEEP = ["--model", "deep", "--layers", "200", "--synthetic-samples", "160", "--batch-size", "32",
        "--microbatches", "4", "--warmup-steps", "1"]


@pytest.fixture
def work(home: Path, request: pytest.FixtureRequest) -> Path:  # noqa: F811
    path = home / "ci-deep" / request.node.name[:60]
    researcher(home, f"rm -rf {shlex.quote(str(path))} && mkdir -p {shlex.quote(str(path))}")
    return path


def metrics_row(run: Path) -> dict:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])


def test_a_model_too_deep_for_one_rank_is_killed_and_pyhpc_suggests_a_pipeline(work: Path) -> None:
    run = work / "one-rank"
    proc = pyhpc(work, "train", *DEEP, "--epochs", "1", "--out", str(run), "--wait", check=False)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 1
    job = re.match(r"job (\d+) FAILED", proc.stdout)
    assert job, proc.stdout
    lines = [line.strip() for line in proc.stdout.splitlines() if "out of memory" in line]
    assert lines == [f"out of memory: Slurm's cgroup killed a task of job {job.group(1)} for using "
                     "more memory than it holds (OUT_OF_MEMORY); split the model with --pipeline 2 "
                     "--model deep, or give each task more memory"]


def test_a_stage_killed_for_memory_in_a_job_across_nodes_is_the_same_one_line(work: Path) -> None:
    """4 stages over 2 nodes, too deep for them: the cgroup kills a stage's task, its peers on
    the other node then fail on the closed connection, and Slurm 22.05's accounting calls the
    step FAILED, not OUT_OF_MEMORY. pyhpc still names the kill (then from srun's own line)."""
    run = work / "four-too-deep"
    deep = [*DEEP[:2], "--layers", "800", *DEEP[4:]]
    proc = pyhpc(work, "train", *deep, "--pipeline", "4", "--nodes", "2", "--tasks-per-node", "2",
                 "--epochs", "1", "--out", str(run), "--wait", check=False)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 1
    job = re.match(r"job (\d+) FAILED", proc.stdout)
    assert job, proc.stdout
    lines = [line.strip() for line in proc.stdout.splitlines() if "out of memory" in line]
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith(f"out of memory: Slurm's cgroup killed a task of job {job.group(1)} ")
    assert lines[0].endswith("split the model with --pipeline 8 --model deep, or give each task more memory")
    assert "no epoch reached" not in proc.stdout


def test_the_same_model_trains_split_over_two_stages_of_a_node(work: Path) -> None:
    run = work / "two-stages"
    proc = pyhpc(work, "train", *DEEP, "--pipeline", "2", "--epochs", "2", "--out", str(run), "--wait")
    print(proc.stdout)
    assert re.search(r"pipeline\s+2 stages x 1 replicas, 200 blocks, 4 micro-batches \(1f1b\)",
                     proc.stdout)
    assert re.search(r"stage memory\s+\d+ MiB, \d+ MiB \(peak, per stage\)", proc.stdout)
    history = read_history(run)
    assert [h["epoch"] for h in history] == [0, 1] and history[1]["loss"] < history[0]["loss"]
    row = metrics_row(run)
    assert row["model"] == "DeepResNet-200" and row["workers"] == 1 and row["extra_pipeline"] == 2
    assert all(0 < peak < TASK_MEMORY for peak in row["extra_stage_peak_memory_bytes"])
    assert all(0.0 <= b < 1.0 for b in row["extra_stage_bubble"])
    assert row["extra_bubble_theory"] == 0.2
    assert json.loads((run / "startup.json").read_text())
    assert sorted(p.name for p in run.glob("stage*.pt")) == ["stage0-epoch1.pt", "stage1-epoch1.pt"]


API = """
import json, pyhpc
job = pyhpc.submit_training(nodes=2, out={out!r}, model="deep", layers=200, pipeline=2,
                            epochs=4, synthetic_samples=320, batch_size=32, microbatches=4,
                            warmup_steps=1)
print(json.dumps({{"job_id": str(job.job_id)}}))
"""


def test_two_nodes_by_two_stages_from_the_python_api_resume_after_a_requeue(work: Path) -> None:
    run = work / "api"
    script = work / "submit_deep.py"
    researcher(work, f"printf %s {shlex.quote(API.format(out=str(run)))} > {script}")
    proc = researcher(work, f"{paths.SHARED_VENV / 'bin' / 'python'} {script}")
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout.splitlines()[-1])["job_id"]
    deadline = time.monotonic() + 240
    while not (run / "pipeline.json").exists() or json.loads(
            (run / "pipeline.json").read_text())["epoch"] < 1:
        assert time.monotonic() < deadline, "no two epochs committed in time"
        time.sleep(0.5)
    requeue(job)
    assert wait(work, job, timeout=600) == "COMPLETED"
    history = read_history(run)
    assert [h["epoch"] for h in history] == [0, 1, 2, 3], history
    assert history[0]["attempt"] == 0 and history[-1]["attempt"] == 1, history
    assert history[-1]["loss"] < history[0]["loss"]
    log = "".join(p.read_text() for p in (work / "pyhpc-jobs" / job).glob("*_log.*"))
    assert "pyhpc.train: resuming from checkpoint after epoch" in log
    row = metrics_row(run)
    assert row["workers"] == 2 and row["extra_replicas"] == 2 and row["global_batch"] == 64
    assert set(row["nodes"].split(",")) == {"cpu1", "cpu2"}


def test_four_stages_span_two_nodes_of_two_tasks(work: Path) -> None:
    """The lab's nodes have 2 CPUs: 4 stages of one task each run over both nodes."""
    run = work / "four"
    pyhpc(work, "train", *DEEP, "--pipeline", "4", "--nodes", "2", "--tasks-per-node", "2",
          "--epochs", "2", "--out", str(run), "--wait")
    history = read_history(run)
    assert history[1]["loss"] < history[0]["loss"]
    row = metrics_row(run)
    assert row["extra_pipeline"] == 4 and len(row["extra_stage_peak_memory_bytes"]) == 4
    assert row["extra_bubble_theory"] == round(3 / 7, 4)
