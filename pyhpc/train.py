"""The reference workload: a LeNet-style CNN on scikit-learn's bundled digits.

``mode="digits"`` trains on the 1,797 8x8 handwritten digits that ship with
scikit-learn (no download); ``mode="synthetic"`` trains a wider CNN on generated
32x32 images, for throughput. Data-parallel (DDP) over every task of the job,
fixed seeds, a checkpoint after every epoch. :class:`Trainer` is a submitit
Checkpointable: a preempted, timed-out or requeued job restarts from the last
completed epoch, so no epoch is lost or repeated.

Run it with ``pyhpc train`` or ``python -m pyhpc.train`` (under srun/torchrun).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
import torch
import torch.distributed as td
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from pyhpc import dist, metrics

MODES = ("digits", "synthetic")
DIGITS_SAMPLES = 1797  # sklearn.datasets.load_digits()


@dataclass(frozen=True)
class TrainConfig:
    """One training run. ``batch_size`` is per worker (weak scaling)."""

    out: str
    mode: str = "digits"
    epochs: int = 3
    batch_size: int = 32
    lr: float = 0.05
    seed: int = 0
    warmup_steps: int = 3
    synthetic_samples: int = 512
    threads: int = 1


def steps_per_epoch(cfg: TrainConfig, workers: int) -> int:
    """Optimizer steps per epoch on each worker (80% train split, partial batches dropped)."""
    samples = DIGITS_SAMPLES if cfg.mode == "digits" else cfg.synthetic_samples
    return (int(0.8 * samples) // workers) // cfg.batch_size


def check_steps(cfg: TrainConfig, workers: int) -> None:
    """Refuse a run too short to measure: every step would be a warm-up step."""
    steps = steps_per_epoch(cfg, workers)
    if steps * cfg.epochs <= cfg.warmup_steps:
        raise ValueError(
            f"batch_size: {cfg.batch_size} per worker on {workers} workers gives {steps} steps "
            f"per epoch, {steps * cfg.epochs} in all, not more than the {cfg.warmup_steps} "
            "warm-up steps; use a smaller batch size, more epochs or more synthetic samples")


class LeNet(nn.Module):
    """LeNet-5's shape, sized for 8x8 inputs."""

    def __init__(self, channels: int = 1, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 2 * 2, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class WideCNN(nn.Module):
    """A larger CNN for 3x32x32 synthetic images (throughput mode)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def datasets(cfg: TrainConfig) -> tuple[TensorDataset, TensorDataset, nn.Module]:
    """(train, test, model) for the mode, built identically on every rank."""
    gen = torch.Generator().manual_seed(cfg.seed)
    if cfg.mode == "digits":
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.tensor(bunch.target, dtype=torch.long)
        model: nn.Module = LeNet()
    else:
        n = cfg.synthetic_samples
        x = torch.randn(n, 3, 32, 32, generator=gen)
        teacher = torch.randn(3 * 32 * 32, 10, generator=gen)
        y = (x.flatten(1) @ teacher).argmax(1)
        model = WideCNN()
    order = torch.randperm(len(x), generator=gen)
    cut = int(0.8 * len(x))
    train, test = order[:cut], order[cut:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test]), model


def _save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-write leaves the previous checkpoint


@dataclass(frozen=True)
class EpochResult:
    """What one pass over the data gives back."""

    loss_sum: torch.Tensor
    steps: int
    #: Stopwatch from the end of step ``skip`` to the end of the pass (no timer only).
    plain_s: float


def train_epoch(model: nn.Module, loader: DataLoader, opt: torch.optim.Optimizer,
                loss_fn: nn.Module, timer: metrics.StepTimer | None, skip: int = 0,
                ) -> EpochResult:
    """The training loop, one epoch. With a timer every step is timed (the harness);
    without one only a stopwatch runs, after ``skip`` warm-up steps (its baseline)."""
    total, count = torch.zeros(()), 0
    if timer is not None:
        timer.restart()
    start = time.perf_counter()
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        total += loss.detach()
        count += 1
        if timer is not None:
            timer.step()
        elif count == skip:
            start = time.perf_counter()
    return EpochResult(total, count, time.perf_counter() - start)


def _stop_now(signum: int, frame: Any) -> None:
    """SIGTERM (scancel, scontrol requeue, preemption): leave at once.

    Checkpoints are written atomically after each epoch, so the requeued job resumes
    from the last completed epoch; the interrupted one is redone from its start.
    """
    print(f"pyhpc.train: signal {signum}: stopping; a requeued job resumes from the "
          "last checkpoint", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _evaluate(model: nn.Module, data: TensorDataset) -> float:
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def run(cfg: TrainConfig) -> metrics.Summary | None:
    """Train on every task of the job; rank 0 writes checkpoints and metrics."""
    if cfg.mode not in MODES:
        raise ValueError(f"mode: {cfg.mode!r} is not allowed; allowed: {', '.join(MODES)}")
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    signal.signal(signal.SIGTERM, _stop_now)
    info = dist.setup()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / "checkpoint.pt"
    train_set, test_set, model = datasets(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    start, history, attempts = 0, [], 0
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start, history = state["epoch"] + 1, state["history"]
        attempts = state["attempts"] + 1
        if info.rank == 0:
            print(f"pyhpc.train: resuming from checkpoint after epoch {state['epoch']}", flush=True)
    ddp = DistributedDataParallel(model)
    sampler = DistributedSampler(train_set, num_replicas=info.world_size, rank=info.rank,
                                 shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(train_set, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)
    loss_fn = nn.CrossEntropyLoss()
    timer = metrics.StepTimer()
    for epoch in range(start, cfg.epochs):
        sampler.set_epoch(epoch)
        result = train_epoch(ddp, loader, opt, loss_fn, timer)
        total = torch.stack([result.loss_sum, torch.tensor(float(result.steps))])
        td.all_reduce(total)
        record = {"epoch": epoch, "loss": (total[0] / total[1]).item(),
                  "test_accuracy": _evaluate(model, test_set), "attempt": attempts}
        history.append(record)
        if info.rank == 0:
            _save(ckpt_path, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                              "epoch": epoch, "history": history, "attempts": attempts})
            _write_json(out / "history.json", history)
            print(f"pyhpc.train: epoch {epoch} loss {record['loss']:.4f} "
                  f"test accuracy {record['test_accuracy']:.3f}", flush=True)
        td.barrier()
    summary = _report(cfg, info, timer, history, out)
    # Drop DDP's reference to the process group before tearing it down, so the gloo
    # group is freed now rather than at interpreter exit (where it can abort).
    del ddp, loader
    gc.collect()
    dist.teardown()
    return summary


def _report(cfg: TrainConfig, info: dist.DistInfo, timer: metrics.StepTimer,
            history: list[dict[str, Any]], out: Path) -> metrics.Summary | None:
    """Gather every rank's timings; rank 0 writes ranks.jsonl, metrics.jsonl and .csv."""
    mine = {"rank": info.rank, "host": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
            "step_times": timer.times, "pid": os.getpid()}
    gathered: list[Any] = [None] * info.world_size
    td.all_gather_object(gathered, mine)
    summary = None
    if info.rank == 0:
        with (out / "ranks.jsonl").open("a") as fh:
            for r in gathered:
                fh.write(json.dumps({k: v for k, v in r.items() if k != "step_times"}
                                    | {"steps": len(r["step_times"])}) + "\n")
        if gathered[0]["step_times"]:
            env = metrics.Environment(
                torch_version=torch.__version__, backend=info.backend,
                job_id=os.environ.get("SLURM_JOB_ID", "local"),
                nodes=sorted({r["host"] for r in gathered}), local_batch=cfg.batch_size,
                mode=cfg.mode, model="LeNet" if cfg.mode == "digits" else "WideCNN")
            ranks = [metrics.RankTimes(r["rank"], r["host"], r["step_times"]) for r in gathered]
            try:
                summary = metrics.summarize(ranks, cfg.warmup_steps, env, extra={
                    "epochs": cfg.epochs, "final_loss": history[-1]["loss"] if history else None,
                    "first_loss": history[0]["loss"] if history else None})
            except metrics.MetricsError as exc:  # e.g. a resumed run with too few steps left
                print(f"pyhpc.train: no throughput summary: {exc}", file=sys.stderr, flush=True)
            else:
                metrics.write_jsonl(out / "metrics.jsonl", [summary])
                metrics.write_csv(out / "metrics.csv", metrics.read_jsonl(out / "metrics.jsonl"))
    td.barrier()
    return summary


class Trainer(submitit.helpers.Checkpointable):
    """The submitit entry point: call it in each task; requeue resumes from disk."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg

    def __call__(self) -> dict[str, Any] | None:
        summary = run(self.cfg)
        return summary.row() if summary else None


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Command-line options of ``python -m pyhpc.train``."""
    parser = argparse.ArgumentParser(prog="python -m pyhpc.train", description=__doc__)
    parser.add_argument("--out", required=True, help="directory for checkpoint and metrics")
    parser.add_argument("--mode", choices=MODES, default="digits")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--synthetic-samples", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per task")
    args = parser.parse_args(argv)
    return TrainConfig(**{k: v for k, v in vars(args).items()})


def main(argv: list[str] | None = None) -> int:
    """Entry point for srun/torchrun launches (one process per rank)."""
    summary = run(parse_args(argv))
    if summary:
        print(json.dumps(summary.row(), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
