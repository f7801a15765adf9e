"""The reference workload: a LeNet-style CNN on scikit-learn's bundled digits.

``mode="digits"`` trains on the 1,797 8x8 handwritten digits that ship with
scikit-learn (no download); ``mode="synthetic"`` trains a wider CNN on generated
32x32 images, for throughput. Data-parallel (DDP) over every task of the job,
fixed seeds, a checkpoint after every epoch. Each task computes on the device
:mod:`pyhpc.dist.device` chooses (``--device``, ``--precision``); the loop is the same on every
device, only the placement's flags differ. :class:`Trainer` is checkpointable as
submitit asks (a ``checkpoint`` method): a preempted, timed-out or requeued job restarts
from the last completed epoch, so no epoch is lost or repeated.

Run it with ``pyhpc train`` or ``python -m pyhpc.train`` (under srun/torchrun).
"""
from __future__ import annotations

import argparse
import gc
import gzip
import importlib.util
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as td
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from pyhpc import dist, files, validate
from pyhpc.dist import device
from pyhpc.errors import PyhpcError
from pyhpc.train import config as trainconfig
from pyhpc.train import deep, metrics, startup
from pyhpc.train.config import TrainConfig, TrainError
from pyhpc.train.meter import Meter

#: When this module's imports (torch's among them) were done: a :mod:`pyhpc.train.startup` mark.
IMPORTED = time.time()

CHECKPOINT = "checkpoint.pt"
#: Files rank 0 appends to: refused up front if something other than a file is there.
APPENDED = ("ranks.jsonl", "metrics.jsonl")
#: One batch of a TensorDataset: inputs and labels.
Batch = tuple[torch.Tensor, ...]


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
        out: torch.Tensor = self.classifier(self.features(x))
        return out


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
        out: torch.Tensor = self.net(x)
        return out


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1,797 digits: images (N, 8, 8) of 0..16 and labels, as load_digits
    gives them. Read from the file scikit-learn ships, without importing it: importing
    sklearn.datasets takes longer than importing torch, reading the file 10 ms. Where the
    file is not, load_digits itself."""
    spec = importlib.util.find_spec("sklearn")  # finds the package, runs none of it
    roots = spec.submodule_search_locations if spec is not None else None
    path = Path(roots[0], "datasets", "data", "digits.csv.gz") if roots else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return torch.tensor(bunch.images), torch.tensor(bunch.target)
    import numpy as np  # already imported by torch

    with gzip.open(path, "rt", encoding="utf-8") as fh:
        table = torch.tensor(np.loadtxt(fh, delimiter=","))
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].long()


def datasets(cfg: TrainConfig) -> tuple[TensorDataset, TensorDataset, nn.Module]:
    """(train, test, model) for the mode, built identically on every rank."""
    gen = torch.Generator().manual_seed(cfg.seed)
    model: nn.Module
    if cfg.model == "deep":
        x, y = deep.data(cfg.synthetic_samples, cfg.seed)
        model = deep.build(cfg.layers, seed=cfg.seed,
                           recompute=cfg.activation_checkpointing == "block")
    elif cfg.mode == "digits":
        images, labels = digits()
        x = images.to(torch.float32).unsqueeze(1) / 16.0
        y = labels.to(torch.long)
        model = LeNet()
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
    """Atomically, through a fresh private temp file: a kill mid-write leaves the previous
    checkpoint, and a link planted at the path is replaced, never written through."""
    files.write_with(path, lambda fh: torch.save(state, fh))


#: What a checkpoint holds, and the type of each entry.
CHECKPOINT_KEYS: dict[str, type] = {"model": dict, "optimizer": dict, "epoch": int,
                                    "history": list, "attempts": int}


def _not_a_checkpoint(path: Path, why: str) -> TrainError:
    return TrainError(f"checkpoint: {path} is not a pyhpc checkpoint ({why})", "checkpoint")


def _why(exc: BaseException) -> str:
    """One short line about why a checkpoint would not load."""
    if "Weights only load failed" in str(exc):
        return f"{type(exc).__name__}: not only tensors and plain data; nothing in it was run"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:80]}" if lines else type(exc).__name__


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path``, read with ``weights_only=True``: tensors, dicts, lists,
    numbers and strings come back, nothing in the file is executed. A link, a planted
    pickle, garbage or the wrong shape is one :class:`TrainError` naming the file."""
    fh, why = files.try_open_regular(path)  # never blocks on a planted FIFO
    if fh is None:
        raise _not_a_checkpoint(path, why)
    with fh:
        try:
            # On the CPU first: a checkpoint written on a GPU resumes on any device.
            state = torch.load(fh, weights_only=True, map_location="cpu")
        except Exception as exc:  # any failure to load means the same: not ours
            raise _not_a_checkpoint(path, _why(exc)) from None
    if not isinstance(state, dict):
        raise _not_a_checkpoint(path, f"a {type(state).__name__}, not a dict")
    for key, kind in CHECKPOINT_KEYS.items():
        value = state.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _not_a_checkpoint(path, f"{key!r} is not a {kind.__name__}")
    if state["epoch"] < 0 or state["attempts"] < 0:
        raise _not_a_checkpoint(path, "a negative epoch or attempt count")
    if not all(isinstance(h, dict) for h in state["history"]):
        raise _not_a_checkpoint(path, "'history' is not a list of dicts")
    return state


def _restore(path: Path, state: dict[str, Any], model: nn.Module,
             opt: torch.optim.Optimizer) -> None:
    """Load a checkpoint's model and optimizer state; a mismatch is a :class:`TrainError`."""
    try:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise TrainError(f"checkpoint: {path} does not fit this run's model and optimizer "
                         f"({_why(exc)})", "checkpoint") from None


def _check_appends(out: Path) -> None:
    """Refuse, before any work, a run directory where a file rank 0 appends to is a link
    or anything but a regular file (the append itself would refuse it, after training)."""
    for name in APPENDED:
        path = out / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            raise files.FileError(f"out: {path} is not a regular file (a symlink is never "
                                  "followed)", "out")


def place_model(model: nn.Module, place: device.Placement) -> nn.Module:
    """The model's parameters on the task's device (NHWC on GPUs, as they are on the CPU)."""
    # Module.to takes memory_format (torch._C._nn._parse_to), its type stubs do not say so.
    moved: nn.Module = model.to(place.torch_device(),  # type: ignore[call-overload]
                                memory_format=place.memory_format())
    return moved


def to_device(batch: Batch, place: device.Placement) -> Batch:
    """A batch on the task's device: an asynchronous copy from pinned memory on GPUs."""
    x, y = batch
    where = place.torch_device()
    return (x.to(where, non_blocking=place.non_blocking, memory_format=place.memory_format()),
            y.to(where, non_blocking=place.non_blocking))


def make_loader(data: TensorDataset, batch_size: int, sampler: DistributedSampler[Batch],
                place: device.Placement) -> DataLoader[Batch]:
    """Batches in page-locked host memory on GPUs, so their copies can overlap compute."""
    return DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=True,
                      pin_memory=place.pin_memory)


@dataclass(frozen=True)
class EpochResult:
    """What one pass over the data gives back."""

    loss_sum: torch.Tensor
    steps: int
    #: Stopwatch from the end of step ``skip`` to the end of the pass (no timer only).
    plain_s: float


def train_epoch(model: nn.Module, loader: DataLoader[Batch], opt: torch.optim.Optimizer,
                loss_fn: nn.Module, timer: metrics.Clock | None, skip: int = 0,
                place: device.Placement = device.CPU) -> EpochResult:
    """The training loop, one epoch, on ``place`` (the model is already there). With a
    timer (the run's :class:`~pyhpc.train.meter.Meter`, or a bare StepTimer) every step is
    timed (the harness); without one only a stopwatch runs, after ``skip`` warm-up steps
    (its baseline). The loss sum stays on the device: no host synchronisation per step
    for it."""
    total, count = torch.zeros((), device=place.torch_device()), 0
    if timer is not None:
        timer.restart()
    start = time.perf_counter()
    for batch in loader:
        x, y = to_device(batch, place)
        opt.zero_grad(set_to_none=True)
        with place.autocast():
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        total += loss.detach()
        count += 1
        if timer is not None:
            timer.step()
        elif count == skip:
            place.synchronize()
            start = time.perf_counter()
    place.synchronize()
    return EpochResult(total, count, time.perf_counter() - start)


def _stop_now(signum: int, frame: Any) -> None:
    """SIGTERM (scancel, scontrol requeue, preemption): leave at once.

    Checkpoints are written atomically after each epoch, so the requeued job resumes
    from the last completed epoch; the interrupted one is redone from its start.
    """
    print(f"pyhpc.train: signal {signum}: stopping; a requeued job resumes from the "
          "last checkpoint", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def _evaluate(model: nn.Module, data: TensorDataset, place: device.Placement) -> float:
    """Test accuracy: computed on the device, one value brought back."""
    model.eval()
    x, y = to_device((data.tensors[0], data.tensors[1]), place)
    with torch.no_grad(), place.autocast():
        acc: float = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


@dataclass(frozen=True)
class Prepared:
    """Where a run starts: its checked config, its run directory, its checkpoint if any,
    and the device this task computes on."""

    cfg: TrainConfig
    out: Path
    checkpoint: dict[str, Any] | None
    place: device.Placement


def prepare(cfg: TrainConfig) -> Prepared:
    """Everything that can be refused, refused before any work starts: the options and the
    run directory (:func:`pyhpc.train.config.from_mapping`), a device or precision this task
    cannot use (:func:`pyhpc.dist.device.resolve`, before the run directory exists), a link
    where rank 0 appends, a checkpoint that is not one of ours. Creates the run directory
    (private) and nothing else; touches no process-wide state (threads, seeds, signals,
    current device, process group)."""
    cfg = trainconfig.from_mapping(asdict(cfg))  # an unpickled config was never checked
    place = device.resolve(cfg.device, cfg.precision)
    out = files.make_dir(cfg.out)
    _check_appends(out)
    ckpt_path = out / CHECKPOINT
    state = load_checkpoint(ckpt_path) if os.path.lexists(ckpt_path) else None
    if state is not None and state["epoch"] + 1 >= cfg.epochs:
        raise TrainError(f"out: {ckpt_path} has already trained {state['epoch'] + 1} of "
                         f"{cfg.epochs} epochs; nothing left to train (use a new --out, or "
                         "more --epochs)", "out")
    return Prepared(cfg, out, state, place)


def _mark_first_step(opt: torch.optim.Optimizer, marks: startup.Marks,
                     place: device.Placement) -> None:
    """Have ``opt`` mark the end of its first step in ``marks`` (its kernels done, on a
    GPU: one synchronisation, once); later steps pay one attribute check."""
    def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if marks.first_step is None:
            place.synchronize()
            marks.first_step = time.time()

    opt.register_step_post_hook(hook)


def process_state(cfg: TrainConfig) -> None:
    """This process's threads, seed, kernels and stop signal, once :func:`prepare` has
    accepted the run. ``--kernels deterministic``: torch's deterministic algorithms (cuDNN's
    among them); cuBLAS reads its workspace setting at its first call, which is later."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if cfg.kernels == "deterministic":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    signal.signal(signal.SIGTERM, _stop_now)


def run(cfg: TrainConfig) -> metrics.Summary | None:
    """Train on every task of the job; rank 0 writes checkpoints and metrics.
    Nothing starts before :func:`prepare` has accepted the run."""
    marks = startup.Marks(process_start=startup.this_process_start(), imported=IMPORTED)
    ready = prepare(cfg)
    cfg, out, state = ready.cfg, ready.out, ready.checkpoint
    ckpt_path = out / CHECKPOINT
    process_state(cfg)
    place = ready.place
    info = dist.setup(place)
    marks.rendezvous_done = time.time()
    train_set, test_set, model = datasets(cfg)
    model = place_model(model, place)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    _mark_first_step(opt, marks, place)
    start, history, attempts = 0, [], 0
    if state is not None:
        _restore(ckpt_path, state, model, opt)
        start, history = state["epoch"] + 1, state["history"]
        attempts = state["attempts"] + 1
        if info.rank == 0:
            print(f"pyhpc.train: resuming from checkpoint after epoch {state['epoch']}", flush=True)
    if info.rank == 0:
        print(f"pyhpc.train: {info.world_size} ranks, rank 0 on {place.name} ({place.reason}), "
              f"{place.precision}, backend {info.backend}", flush=True)
    ddp = DistributedDataParallel(model, device_ids=place.device_ids)
    sampler: DistributedSampler[Batch] = DistributedSampler(
        train_set, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=cfg.seed,
        drop_last=True)
    loader = make_loader(train_set, cfg.batch_size, sampler, place)
    loss_fn = nn.CrossEntropyLoss()
    meter = run_meter(cfg, out, place)
    for epoch in range(start, cfg.epochs):
        sampler.set_epoch(epoch)
        result = train_epoch(ddp, loader, opt, loss_fn, meter, place=place)
        steps = torch.tensor(float(result.steps), device=result.loss_sum.device)
        total = torch.stack([result.loss_sum, steps])
        td.all_reduce(total)
        record = {"epoch": epoch, "loss": (total[0] / total[1]).item(),
                  "test_accuracy": _evaluate(model, test_set, place), "attempt": attempts}
        history.append(record)
        meter.epoch_end(loss=record["loss"], test_accuracy=record["test_accuracy"])
        if info.rank == 0:
            _save(ckpt_path, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                              "epoch": epoch, "history": history, "attempts": attempts})
            files.write_text(out / "history.json", json.dumps(validate.json_safe(history),
                                                                 indent=1))
            print(f"pyhpc.train: epoch {epoch} loss {record['loss']:.4f} "
                  f"test accuracy {record['test_accuracy']:.3f}", flush=True)
        td.barrier()
    summary = _report(cfg, info, meter, history, out, len(train_set), marks)
    # Drop DDP's reference to the process group before tearing it down, so the gloo
    # group is freed now rather than at interpreter exit (where it can abort).
    del ddp, loader
    gc.collect()
    dist.teardown()
    return summary


def run_meter(cfg: TrainConfig, out: Path, place: device.Placement,
              workers: int | None = None) -> Meter:
    """The run's :class:`~pyhpc.train.meter.Meter` (``pyhpc.meter``, the API researchers
    use too): the batch per rank, warm-up, model and data of the config; on a GPU each
    clock reading waits for the step's kernels."""
    return Meter(out, local_batch=cfg.batch_size, warmup_steps=cfg.warmup_steps,
                 model=model_name(cfg), mode=cfg.mode, workers=workers,
                 sync=place.synchronize, name="pyhpc.train")


def rank_info(info: dist.DistInfo, marks: startup.Marks) -> dict[str, Any]:
    """What each rank adds to its steps in the gathered records (ranks.jsonl, startup): its
    device and precision, whether torch ran deterministic kernels only, its peak memory (the
    GPU's allocator on a GPU, else the process's peak resident set) and start-up marks."""
    return {"rank": info.rank, "pid": os.getpid(), "device": info.place.name,
            "precision": info.place.precision,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "peak_memory_bytes": device.peak_memory_bytes(info.place), "marks": asdict(marks)}


def _report(cfg: TrainConfig, info: dist.DistInfo, meter: Meter,
            history: list[dict[str, Any]], out: Path, samples_per_epoch: int,
            marks: startup.Marks) -> metrics.Summary | None:
    """Gather every rank's timings and startup marks; rank 0 writes ranks.jsonl,
    startup.json (this attempt's: a requeued job's replaces it), metrics.jsonl and .csv."""
    gathered = meter.gather(rank_info(info, marks))
    summary = None
    if info.rank == 0 and gathered is not None:
        summary = _write_report(cfg, gathered, history, out, samples_per_epoch, meter)
    td.barrier()
    return summary


def model_name(cfg: TrainConfig) -> str:
    """The model's name in the metrics: LeNet, WideCNN or DeepResNet-<blocks>."""
    if cfg.model == "deep":
        return f"DeepResNet-{cfg.layers}"
    return "LeNet" if cfg.mode == "digits" else "WideCNN"


def _write_report(cfg: TrainConfig, gathered: list[dict[str, Any]],
                  history: list[dict[str, Any]], out: Path, samples_per_epoch: int,
                  meter: Meter, extra: dict[str, Any] | None = None,
                  ) -> metrics.Summary | None:
    """Rank 0's files from every rank's gathered record: ranks.jsonl, startup.json, and
    the meter's metrics.jsonl and .csv (with the run's figures from the whole history,
    earlier attempts included)."""
    files.append_text(out / "ranks.jsonl", "".join(
        json.dumps({k: v for k, v in r.items() if k not in ("step_times", "samples", "marks")}
                   | {"steps": len(r["step_times"])}) + "\n" for r in gathered))
    files.write_text(out / "startup.json", json.dumps(startup.report(
        [{k: r[k] for k in ("rank", "host", "pid", "marks")} for r in gathered],
        os.environ), indent=1))
    return meter.write(gathered, extra={
        "epochs": cfg.epochs, "final_loss": history[-1]["loss"] if history else None,
        "first_loss": history[0]["loss"] if history else None,
        "final_test_accuracy": history[-1]["test_accuracy"] if history else None,
        "samples_per_epoch": samples_per_epoch, **(extra or {})})


class Trainer:
    """The submitit entry point: call it in each task; requeue resumes from disk."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg

    def __call__(self) -> dict[str, Any] | None:
        summary = run(self.cfg)
        return summary.row() if summary else None

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """What submitit requeues on timeout or preemption (it looks for this method, as
        for its Checkpointable's): the same call, which resumes from the last checkpoint.
        submitit is imported here, not with this module: a torchrun task never needs it."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Command-line options of ``python -m pyhpc.train``, from the fields of TrainConfig."""
    parser = argparse.ArgumentParser(prog="python -m pyhpc.train", description=__doc__)
    trainconfig.add_arguments(parser)
    return trainconfig.from_mapping(vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    """Entry point for srun/torchrun launches (one process per rank)."""
    return launch(lambda: run(parse_args(argv)))


def launch(train: Callable[[], metrics.Summary | None]) -> int:
    """One rank's run (data parallel, or pipelined): its summary as one JSON line on
    stdout. A refused option, run directory or checkpoint is one line on stderr and exit
    status 2."""
    try:
        summary = train()
    except PyhpcError as exc:
        print(f"pyhpc.train: {exc}", file=sys.stderr, flush=True)
        return 2
    if summary:
        print(json.dumps(summary.row(), sort_keys=True), flush=True)
    return 0

