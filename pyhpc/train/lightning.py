"""``pyhpc.meter.MeterCallback``: a Lightning callback that meters ``Trainer.fit`` with a
:class:`~pyhpc.train.meter.Meter`, so ``pyhpc report`` compares Lightning runs too.

pyhpc does not depend on Lightning: the callback derives from ``lightning.pytorch``'s
``Callback`` or ``pytorch_lightning``'s, whichever is importable, and from ``object``
where neither is (its hooks are plain methods, called by Lightning or by a test). A
step is one training batch (with gradient accumulation, one micro-batch).
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from pyhpc.train.meter import Meter


def _callback_base() -> type:
    for module in ("lightning.pytorch", "pytorch_lightning"):
        try:
            base: type = importlib.import_module(module).Callback
        except (ImportError, AttributeError):
            continue
        return base
    return object


def batch_size(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (a tensor, or the first
    of a tuple, list or dict of them)."""
    while isinstance(batch, (tuple, list, dict)) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else None


def _figures(metrics: dict[str, Any]) -> dict[str, float]:
    """Lightning's logged scalars (tensors or numbers) as floats; others are left out."""
    out = {}
    for name, value in metrics.items():
        try:
            out[name.replace("/", "_")] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class MeterCallback(_callback_base()):  # type: ignore[misc]  # a base chosen at import
    """Meter every training batch of ``Trainer.fit``; rank 0 writes ``out_dir``'s metrics.

    ``samples_per_batch``: samples one batch holds on one rank (default: read from each
    batch); the other arguments are :class:`~pyhpc.train.meter.Meter`'s.
    """

    def __init__(self, out_dir: str | os.PathLike[str], samples_per_batch: int | None = None,
                 warmup_steps: int = 5, model: str | None = None, mode: str = "custom") -> None:
        super().__init__()
        self.out_dir = out_dir
        self.samples_per_batch = samples_per_batch
        self.warmup_steps = warmup_steps
        self.model = model
        self.mode = mode
        self.meter: Meter | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        sync: Callable[[], None] | None = None
        device = getattr(pl_module, "device", None)
        if getattr(device, "type", "cpu") == "cuda":
            import torch

            def sync() -> None:
                torch.cuda.synchronize(device)

        self.meter = Meter(self.out_dir, local_batch=self.samples_per_batch,
                           warmup_steps=self.warmup_steps,
                           model=self.model or type(pl_module).__name__, mode=self.mode,
                           sync=sync, name="pyhpc.meter")

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.meter is not None:
            self.meter.restart()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.meter is not None:
            samples = self.samples_per_batch or batch_size(batch)
            self.meter.step(samples)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.meter is not None:
            self.meter.epoch_end(**_figures(dict(getattr(trainer, "callback_metrics", {}))))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.meter is not None:
            self.meter.close()
