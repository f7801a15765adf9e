"""The one way steps become throughput files: :class:`Meter`, public as ``pyhpc.meter``.

A researcher's loop and ``pyhpc train`` alike call ``step()`` once per training step,
``epoch_end()`` after each epoch and ``close()`` at the end; rank 0 then writes
``metrics.jsonl`` and ``metrics.csv`` (:mod:`pyhpc.train.metrics`), which ``pyhpc report``
reads and compares. Under ``torch.distributed`` every rank meters its own steps and
``close()`` gathers them: the job moves at its slowest rank's pace, so a step's time is
the slowest rank's. No torch is imported here; a process group is used only if the
caller already started one.
"""
from __future__ import annotations

import os
import socket
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

from pyhpc import files, validate
from pyhpc.errors import PyhpcError
from pyhpc.train import metrics

#: ``gather(this rank's record)``: every rank's records on rank 0, None on the others.
Gather = Callable[[dict[str, Any]], "list[dict[str, Any]] | None"]
#: Largest sample count one step may report.
MAX_SAMPLES = 1 << 31


class MeterError(PyhpcError):
    """A step without a sample count, or a count that is not a positive integer."""


def torch_gather() -> Gather | None:
    """All-gather over torch.distributed's default group, if the caller started one."""
    td = sys.modules.get("torch.distributed")
    if td is None or not td.is_available() or not td.is_initialized():
        return None

    def gather(mine: dict[str, Any]) -> list[dict[str, Any]] | None:
        out: list[Any] = [None] * td.get_world_size()
        td.all_gather_object(out, mine)
        return out if td.get_rank() == 0 else None

    return gather


def _alone(mine: dict[str, Any]) -> list[dict[str, Any]]:
    return [mine]


def _rank() -> int:
    """This process's rank: torch.distributed's where a group is started, else 0."""
    td = sys.modules.get("torch.distributed")
    if td is None or not td.is_available() or not td.is_initialized():
        return 0
    return int(td.get_rank())


def _versions() -> tuple[str, str]:
    """torch's version and the process group's backend, where the caller imported torch."""
    torch = sys.modules.get("torch")
    td = sys.modules.get("torch.distributed")
    backend = str(td.get_backend()) if td is not None and td.is_available() \
        and td.is_initialized() else "none"
    return (str(getattr(torch, "__version__", "")), backend)


class Meter:
    """Throughput of a training loop, written to ``out_dir``'s metrics files on ``close()``.

    ``local_batch``: samples one step of this rank trains when ``step()`` is not told;
    ``warmup_steps``: first steps left out of the figures; ``model`` and ``mode`` (the
    data) name the run in ``pyhpc report``, which compares only runs of one model and
    mode; ``workers``: data-parallel workers (default every rank); ``sync``: called before
    each clock reading (``torch.cuda.synchronize`` on a GPU, so a step's time is its
    kernels' and not the time to queue them); ``gather``: how rank 0 gets every rank's
    steps (default: torch.distributed's group if one is started, else this process alone).
    """

    def __init__(self, out_dir: str | os.PathLike[str], *, local_batch: int | None = None,
                 warmup_steps: int = 5, model: str = "custom", mode: str = "custom",
                 workers: int | None = None, sync: Callable[[], None] | None = None,
                 gather: Gather | None = None, name: str = "pyhpc.meter") -> None:
        self.out = files.make_dir(os.fspath(out_dir), "out_dir")
        self.local_batch = None if local_batch is None else validate.integer(
            "local_batch", local_batch, 1, MAX_SAMPLES, MeterError)
        self.warmup_steps = validate.integer("warmup_steps", warmup_steps, 0, 1_000_000,
                                             MeterError)
        self.model = validate.name("model", model, "job", MeterError)
        self.mode = validate.name("mode", mode, "job", MeterError)
        self.workers = None if workers is None else validate.integer(
            "workers", workers, 1, 1 << 20, MeterError)
        self.gather_fn = gather
        self.name = name
        self.timer = metrics.StepTimer(sync)
        self.samples: list[int] = []
        self.epochs: list[dict[str, float]] = []

    @property
    def times(self) -> list[float]:
        """This rank's step times so far, in seconds."""
        return self.timer.times

    def restart(self) -> None:
        """Time the next step from now (before an epoch's first step)."""
        self.timer.restart()

    def step(self, samples: int | None = None) -> None:
        """The end of one training step that trained ``samples`` samples on this rank."""
        if samples is None:
            if self.local_batch is None:
                raise MeterError("samples: step() needs the step's sample count, or "
                                 "Meter(local_batch=...)", "samples")
            count = self.local_batch
        elif type(samples) is int and 0 < samples <= MAX_SAMPLES:  # the per-step fast path
            count = samples
        else:
            count = validate.integer("samples", samples, 1, MAX_SAMPLES, MeterError, text=False)
        self.timer.step()
        self.samples.append(count)

    def epoch_end(self, **figures: float) -> None:
        """The end of an epoch, with its figures (``loss=``, ``accuracy=``); the last epoch's
        become ``extra_final_<name>`` in the metrics. The clock restarts, so evaluation
        between epochs is not counted as a step."""
        self.epochs.append({k: float(v) for k, v in figures.items()})
        self.timer.restart()

    def gather(self, rank_info: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
        """Every rank's record (its steps, ``rank_info`` added) on rank 0; None elsewhere."""
        mine = {"rank": _rank(), "step_times": self.timer.times,
                "samples": self.samples,
                "host": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
                **(rank_info or {})}
        gather = self.gather_fn or torch_gather() or _alone
        return gather(mine)

    def _extra(self, extra: dict[str, Any] | None) -> dict[str, Any]:
        auto: dict[str, Any] = {"epochs": len(self.epochs)} if self.epochs else {}
        if self.epochs:
            auto.update({f"final_{k}": v for k, v in self.epochs[-1].items()})
        return {**auto, **(extra or {})}

    def write(self, gathered: list[dict[str, Any]] | None,
              extra: dict[str, Any] | None = None) -> metrics.Summary | None:
        """Rank 0's summary of ``gathered``, appended to metrics.jsonl and rewritten into
        metrics.csv; None on other ranks, or (said on stderr) when no step is left after
        warm-up."""
        if not gathered or not gathered[0]["step_times"]:
            return None
        counts = [r["samples"] for r in gathered]
        typical = Counter(counts[0]).most_common(1)[0][0] if counts[0] else 1
        local = self.local_batch if self.local_batch is not None else typical
        steady = all(c == local for rank in counts for c in rank)
        torch_version, backend = _versions()
        env = metrics.Environment(
            torch_version=torch_version, backend=backend,
            job_id=os.environ.get("SLURM_JOB_ID", "local"),
            nodes=sorted({r["host"] for r in gathered}), local_batch=local, mode=self.mode,
            model=self.model)
        ranks = [metrics.RankTimes(r["rank"], r["host"], r["step_times"]) for r in gathered]
        per_step = None if steady or len({len(c) for c in counts}) != 1 else \
            [sum(rank[i] for rank in counts) for i in range(len(counts[0]))]
        try:
            summary = metrics.summarize(ranks, self.warmup_steps, env, extra=self._extra(extra),
                                        workers=self.workers, step_samples=per_step)
        except metrics.MetricsError as exc:  # e.g. a resumed run with too few steps left
            print(f"{self.name}: no throughput summary: {exc}", file=sys.stderr, flush=True)
            return None
        metrics.write_jsonl(self.out / "metrics.jsonl", [summary])
        metrics.write_csv(self.out / "metrics.csv", metrics.read_jsonl(self.out / "metrics.jsonl"))
        return summary

    def close(self, extra: dict[str, Any] | None = None,
              rank_info: dict[str, Any] | None = None) -> metrics.Summary | None:
        """Gather every rank's steps and, on rank 0, write the metrics files. Every rank
        calls it (under torch.distributed it is a collective)."""
        return self.write(self.gather(rank_info), extra)

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
