"""Pipeline-parallel training of the deep model: stages inside a node, data parallel across.

The job's ranks form a 2-D device mesh, data x pipeline, with the pipeline dimension
innermost: Slurm numbers a node's tasks consecutively, so each node holds whole pipelines
(``--pipeline`` at most its tasks) or a pipeline spans whole nodes. Each rank builds only
its stage of :mod:`pyhpc.train.deep`, wraps it in DDP over its data-parallel group (DDP,
not FSDP2: a stage's parameters are what one rank holds already, and the pipeline
schedule syncs DDP's gradients once per step, on the last micro-batch), and runs
``torch.distributed.pipelining``'s 1F1B or GPipe schedule over ``microbatches``.

The same lines run on GPUs (NCCL) and on the CPU (gloo). Every epoch each stage writes its
part (``stage{K}-epoch{E}.pt``), and only when all have, rank 0 commits the epoch in
``pipeline.json``; a requeued job resumes from the committed epoch, so none is lost or
repeated. Rank 0 writes the same ``history.json``, ``startup.json``, ``ranks.jsonl`` and
``metrics.jsonl`` as data-parallel runs, with each stage's peak memory and bubble (the
share of a step the stage spent waiting rather than computing) added.
"""
from __future__ import annotations

import gc
import json
import os
import stat
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as td
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from pyhpc import dist, files
from pyhpc.dist import device
from pyhpc.train import deep, loop, metrics, startup
from pyhpc.train.config import TrainConfig, TrainError
from pyhpc.train.meter import Meter

#: The commit record: the last epoch every stage has written.
COMMIT = "pipeline.json"
SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}


@dataclass(frozen=True)
class Layout:
    """Where this rank sits: its stage, its data-parallel replica, and how many of each."""

    stage: int
    stages: int
    replica: int
    replicas: int

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1


def stage_file(out: Path, stage: int, epoch: int) -> Path:
    return out / f"stage{stage}-epoch{epoch}.pt"


def bubble_theory(stages: int, microbatches: int) -> float:
    """The idle share of a step with equal stages and no communication cost:
    (P - 1) / (M + P - 1), the same for 1F1B and GPipe (1F1B keeps fewer activations)."""
    return (stages - 1) / (microbatches + stages - 1)


class Busy:
    """How long the stage computed in each step: its forward and backward passes, timed by
    hooks (the backward ends when the stage's first parameter has its gradient)."""

    def __init__(self, module: nn.Module, place: device.Placement) -> None:
        self.place = place
        self.started: dict[str, float] = {}
        self.seconds = 0.0
        # The first stage's input needs no gradient, so its pre-hook fires as the output's
        # gradient arrives, which is when its backward starts; torch warns of exactly that.
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients "
                                "are computed with respect to module outputs")
        module.register_forward_pre_hook(lambda *_: self._start("forward"))
        module.register_forward_hook(lambda *_: self._stop("forward"))
        module.register_full_backward_pre_hook(lambda *_: self._start("backward"))
        first = next(module.parameters())
        # torch declares no types for this method.
        first.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
            lambda _: self._stop("backward"))

    def _start(self, what: str) -> None:
        self.place.synchronize()
        self.started[what] = time.perf_counter()

    def _stop(self, what: str) -> None:
        start = self.started.pop(what, None)
        if start is not None:
            self.place.synchronize()
            self.seconds += time.perf_counter() - start

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def layout(info: dist.DistInfo, stages: int) -> tuple[Layout, Any]:
    """The rank's place in the data x pipeline mesh, and the mesh."""
    if info.world_size % stages:
        raise TrainError(f"pipeline: {stages} stages need a multiple of {stages} tasks, the job "
                         f"has {info.world_size}", "pipeline")
    mesh = init_device_mesh(info.place.type, (info.world_size // stages, stages),
                            mesh_dim_names=("dp", "pp"))
    return Layout(mesh["pp"].get_local_rank(), stages, mesh["dp"].get_local_rank(),
                  info.world_size // stages), mesh


def _read_commit(path: Path) -> Any:
    """The commit record's JSON: a regular file (never a link or a FIFO), at most 16 MiB."""
    bad = TrainError(f"checkpoint: {path} is not a pyhpc commit record", "checkpoint")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        raise bad from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise bad
        data = fh.read(16 << 20)
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise bad from None


def resume(out: Path, cfg: TrainConfig, where: Layout) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The committed epoch's stage state for this rank (or ``None``) and the commit record."""
    path = out / COMMIT
    if not os.path.lexists(path):
        return None, {"epoch": -1, "history": [], "attempts": -1}
    record = _read_commit(path)
    same = {"layers": cfg.layers, "stages": where.stages}
    if not isinstance(record, dict) or {k: record.get(k) for k in same} != same \
            or not isinstance(record.get("epoch"), int) or not isinstance(record.get("history"), list):
        raise TrainError(f"checkpoint: {path} is not this run's commit record (it must name "
                         f"layers {cfg.layers} and {where.stages} stages)", "checkpoint")
    state = loop.load_checkpoint(stage_file(out, where.stage, record["epoch"]))
    return state, record


def commit(out: Path, cfg: TrainConfig, where: Layout, epoch: int, history: list[dict[str, Any]],
           attempts: int, module: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Write this stage's part (one replica per stage writes), then rank 0 commits the epoch
    once every stage has, and the epoch before is dropped."""
    if where.replica == 0:
        loop._save(stage_file(out, where.stage, epoch), {
            "model": module.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch,
            "history": history, "attempts": attempts})
    td.barrier()
    if td.get_rank() == 0:
        files.write_text(out / COMMIT, json.dumps({"epoch": epoch, "layers": cfg.layers,
                                                   "stages": where.stages, "attempts": attempts,
                                                   "history": history}, indent=1))
        files.write_text(out / "history.json", json.dumps(history, indent=1))
    td.barrier()
    if where.replica == 0:
        stage_file(out, where.stage, epoch - 1).unlink(missing_ok=True)


def loaders(cfg: TrainConfig, where: Layout) -> tuple[DataLoader[Any], DistributedSampler[Any],
                                                       TensorDataset]:
    """This replica's shard of the generated images; every stage of a replica walks the same
    batches (the same sampler), the first stage feeds their images, the last their labels."""
    x, y = deep.data(cfg.synthetic_samples, cfg.seed)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(cfg.seed))
    cut = int(0.8 * len(x))
    train = TensorDataset(x[order[:cut]], y[order[:cut]])
    test = TensorDataset(x[order[cut:]], y[order[cut:]])
    sampler: DistributedSampler[Any] = DistributedSampler(
        train, num_replicas=where.replicas, rank=where.replica, shuffle=True, seed=cfg.seed,
        drop_last=True)
    return DataLoader(train, batch_size=cfg.batch_size, sampler=sampler, drop_last=True), sampler, test


def step(schedule: Any, where: Layout, batch: tuple[torch.Tensor, torch.Tensor],
         place: device.Placement) -> torch.Tensor | None:
    """One pipelined step: the mean loss of its micro-batches on the last stage."""
    x, y = batch
    losses: list[torch.Tensor] = []
    with place.autocast():
        if where.first:
            schedule.step(x.to(place.torch_device(), non_blocking=place.non_blocking))
        elif where.last:
            schedule.step(target=y.to(place.torch_device(), non_blocking=place.non_blocking),
                          losses=losses)
        else:
            schedule.step()
    return torch.stack([loss.detach().float() for loss in losses]).mean() if losses else None


def evaluate(schedule: Any, where: Layout, test: TensorDataset, microbatches: int,
             place: device.Placement) -> float:
    """Test accuracy through the pipeline, forward only (on the last stage; -1 elsewhere)."""
    n = len(test) - len(test) % microbatches
    if n == 0:
        return -1.0
    x, y = (t[:n].to(place.torch_device()) for t in test.tensors)
    with torch.no_grad(), place.autocast():
        if where.first:
            schedule.eval(x)
            return -1.0
        if not where.last:
            schedule.eval()
            return -1.0
        out = schedule.eval(target=y, losses=[])
    return float((out.argmax(1) == y).float().mean().item())


def _epoch_record(where: Layout, mesh: Any, loss_sum: torch.Tensor, steps: int,
                  accuracy: float, epoch: int, attempts: int) -> dict[str, Any]:
    """The epoch's loss (mean over replicas) and accuracy, from the last stage to every rank."""
    total = torch.stack([loss_sum, torch.tensor(float(steps), device=loss_sum.device)])
    td.all_reduce(total, group=mesh["dp"].get_group())
    record = [{"epoch": epoch, "loss": (total[0] / max(total[1].item(), 1.0)).item(),
               "test_accuracy": accuracy, "attempt": attempts}]
    pp = mesh["pp"].get_group()
    td.broadcast_object_list(record, group=pp, group_src=where.stages - 1)
    return dict(record[0])


def run(cfg: TrainConfig) -> metrics.Summary | None:
    """Train the deep model split over ``cfg.pipeline`` stages on every task of the job."""
    marks = startup.Marks(process_start=startup.this_process_start(), imported=loop.IMPORTED)
    ready = loop.prepare(cfg)
    cfg, out, place = ready.cfg, ready.out, ready.place
    loop.process_state(cfg)
    info = dist.setup(place)
    marks.rendezvous_done = time.time()
    where, mesh = layout(info, cfg.pipeline)
    state, record = resume(out, cfg, where)
    module = deep.build(cfg.layers, where.stage, where.stages, cfg.seed, place.torch_device(),
                        recompute=cfg.activation_checkpointing == "block")
    opt = torch.optim.SGD(module.parameters(), lr=cfg.lr, momentum=0.9)
    loop._mark_first_step(opt, marks, place)
    if state is not None:
        loop._restore(out / COMMIT, state, module, opt)
    start, history, attempts = record["epoch"] + 1, record["history"], record["attempts"] + 1
    if info.rank == 0:
        if state is not None:
            print(f"pyhpc.train: resuming from checkpoint after epoch {record['epoch']}", flush=True)
        print(f"pyhpc.train: {info.world_size} ranks: {where.replicas} x {where.stages} stages of a "
              f"{cfg.layers}-block model, {cfg.microbatches} micro-batches ({cfg.schedule}), "
              f"rank 0 on {place.name}, {place.precision}, backend {info.backend}", flush=True)
    busy = Busy(module, place)
    wrapped: nn.Module = module if where.replicas == 1 else DistributedDataParallel(
        module, process_group=mesh["dp"].get_group(), device_ids=place.device_ids)
    stage = PipelineStage(wrapped, where.stage, where.stages, place.torch_device(),
                          group=mesh["pp"].get_group())
    schedule = SCHEDULES[cfg.schedule](stage, cfg.microbatches, loss_fn=nn.CrossEntropyLoss())
    loader, sampler, test = loaders(cfg, where)
    meter = loop.run_meter(cfg, out, place, workers=where.replicas)
    busy_share: list[float] = []
    for epoch in range(start, cfg.epochs):
        sampler.set_epoch(epoch)
        loss_sum, steps = torch.zeros((), device=place.torch_device()), 0
        meter.restart()
        busy.take()
        for batch in loader:
            opt.zero_grad(set_to_none=True)
            loss = step(schedule, where, batch, place)
            opt.step()
            meter.step()
            busy_share.append(busy.take() / meter.times[-1])
            loss_sum += loss if loss is not None else 0.0
            steps += 1
        accuracy = evaluate(schedule, where, test, cfg.microbatches, place)
        history.append(_epoch_record(where, mesh, loss_sum, steps, accuracy, epoch, attempts))
        meter.epoch_end(loss=history[-1]["loss"], test_accuracy=history[-1]["test_accuracy"])
        commit(out, cfg, where, epoch, history, attempts, module, opt)
        if info.rank == 0:
            print(f"pyhpc.train: epoch {epoch} loss {history[-1]['loss']:.4f} "
                  f"test accuracy {history[-1]['test_accuracy']:.3f}", flush=True)
    summary = report(cfg, info, where, meter, busy_share, history, out, marks)
    del schedule, stage, wrapped, loader
    gc.collect()
    dist.teardown()
    return summary


def report(cfg: TrainConfig, info: dist.DistInfo, where: Layout, meter: Meter,
           busy_share: list[float], history: list[dict[str, Any]], out: Path,
           marks: startup.Marks) -> metrics.Summary | None:
    """Every rank's step times, stage, peak memory and bubble, gathered; rank 0 writes the
    run's files (as :func:`pyhpc.train.loop.run` does) with the pipeline's figures."""
    measured = busy_share[cfg.warmup_steps:] or busy_share
    gathered = meter.gather({
        **loop.rank_info(info, marks), "stage": where.stage,
        "bubble": 1.0 - sum(measured) / len(measured) if measured else None})
    summary = None
    if info.rank == 0 and gathered is not None:
        per_stage = [[r for r in gathered if r["stage"] == s] for s in range(where.stages)]
        bubbles = [[r["bubble"] for r in rows if r["bubble"] is not None] for rows in per_stage]
        extra = {
            "pipeline": where.stages, "replicas": where.replicas, "layers": cfg.layers,
            "microbatches": cfg.microbatches, "schedule": cfg.schedule,
            "activation_checkpointing": cfg.activation_checkpointing,
            "stage_peak_memory_bytes": [max(r["peak_memory_bytes"] for r in rows) for rows in per_stage],
            "stage_bubble": [round(sum(b) / len(b), 4) if b else None for b in bubbles],
            "bubble_theory": round(bubble_theory(where.stages, cfg.microbatches), 4)}
        summary = loop._write_report(cfg, gathered, history, out,
                                     int(0.8 * cfg.synthetic_samples), meter, extra=extra)
    td.barrier()
    return summary


class PipelineTrainer(loop.Trainer):
    """The submitit entry point of a pipelined run; requeue resumes from the commit."""

    def __call__(self) -> dict[str, Any] | None:
        summary = run(self.cfg)
        return summary.row() if summary else None


def main(cfg: TrainConfig) -> int:
    """``python -m pyhpc.train --pipeline N``: one rank; a refusal is one line, exit 2."""
    return loop.launch(lambda: run(cfg))
