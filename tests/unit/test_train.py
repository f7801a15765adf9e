"""The reference workload, run in-process (one rank, gloo): learning and resuming."""
from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pyhpc.train import config as trainconfig  # noqa: E402
from pyhpc.train import loop as train  # noqa: E402
from pyhpc.train import metrics  # noqa: E402
from pyhpc.train.config import TrainConfig, TrainError  # noqa: E402


def _run(cfg: TrainConfig, queue) -> None:
    summary = train.run(cfg)
    queue.put(summary.row() if summary else None)


def run_in_child(cfg: TrainConfig) -> dict | None:
    """A fresh process per run, as a job would be (process group, signal handler)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_run, args=(cfg, queue))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    return queue.get(timeout=5)


def test_digits_loss_decreases_and_metrics_have_every_field(tmp_path: Path) -> None:
    row = run_in_child(TrainConfig(out=str(tmp_path), epochs=3))
    history = json.loads((tmp_path / "history.json").read_text())
    assert [h["epoch"] for h in history] == [0, 1, 2]
    assert history[-1]["loss"] < history[0]["loss"]
    saved = metrics.read_jsonl(tmp_path / "metrics.jsonl")[-1].row()
    assert saved == row
    for key in ("samples_per_s", "samples_per_s_per_worker", "step_time_p50", "step_time_p90",
                "torch_version", "backend", "nodes", "job_id", "local_batch", "global_batch"):
        assert row[key] not in (None, ""), key
    # --device auto: the machine's GPU where torch sees one (the GPU suite), else the CPU.
    assert row["backend"] == ("nccl" if torch.cuda.is_available() else "gloo")
    assert row["workers"] == 1
    assert [r["deterministic"] for r in ranks(tmp_path)] == [False]  # --kernels default
    assert (tmp_path / "metrics.csv").read_text().startswith("backend,")


def ranks(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "ranks.jsonl").read_text().splitlines()]


def test_a_second_attempt_resumes_after_the_last_checkpointed_epoch(tmp_path: Path) -> None:
    # --kernels deterministic: on a GPU, torch's default kernels differ from run to run (two
    # straight runs' third losses were 1.1% apart on an H200), which would hide what this
    # checks. With it, a straight, a repeated and a resumed run agreed bit for bit there
    # (docs/benchmarks.md, "One GPU"); the CPU's kernels are deterministic anyway.
    run_in_child(TrainConfig(out=str(tmp_path), epochs=1, kernels="deterministic"))
    run_in_child(TrainConfig(out=str(tmp_path), epochs=3, kernels="deterministic"))
    history = json.loads((tmp_path / "history.json").read_text())
    assert [(h["epoch"], h["attempt"]) for h in history] == [(0, 0), (1, 1), (2, 1)]
    straight = tmp_path / "straight"
    run_in_child(TrainConfig(out=str(straight), epochs=3, kernels="deterministic"))
    # Fixed seeds and a full checkpoint: resuming gives the same losses as not stopping.
    assert [h["loss"] for h in history] == pytest.approx(
        [h["loss"] for h in json.loads((straight / "history.json").read_text())], rel=1e-5)
    assert [r["deterministic"] for r in ranks(tmp_path) + ranks(straight)] == [True] * 3


def test_synthetic_mode_uses_the_larger_model(tmp_path: Path) -> None:
    _, _, model = train.datasets(TrainConfig(out=str(tmp_path), mode="synthetic",
                                             synthetic_samples=64))
    params = sum(p.numel() for p in model.parameters())
    lenet = sum(p.numel() for p in train.LeNet().parameters())
    assert isinstance(model, train.WideCNN) and params > 10 * lenet


def test_unknown_mode_is_named(tmp_path: Path) -> None:
    with pytest.raises(TrainError,
                       match="mode: 'mnist' is not allowed; allowed: digits, synthetic"):
        train.run(TrainConfig(out=str(tmp_path), mode="mnist"))


def test_steps_per_epoch_matches_the_loader_and_short_runs_are_refused(tmp_path: Path) -> None:
    cfg = TrainConfig(out=str(tmp_path), mode="synthetic", synthetic_samples=512,
                      batch_size=64, epochs=1)
    assert trainconfig.steps_per_epoch(cfg, 1) == 6 and trainconfig.steps_per_epoch(cfg, 2) == 3
    digits = TrainConfig(out=str(tmp_path))
    assert trainconfig.steps_per_epoch(digits, 1) == len(train.datasets(digits)[0]) // 32
    trainconfig.check_steps(cfg, 1)
    with pytest.raises(TrainError, match="batch_size: 64 per worker on 2 workers gives 3 steps"):
        trainconfig.check_steps(cfg, 2)
