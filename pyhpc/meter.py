"""``pyhpc.meter``: the throughput of your own training loop, in the files ``pyhpc report``
reads, so it compares your runs as it compares ``pyhpc train``'s (which uses the same API).

    import pyhpc.meter

    meter = pyhpc.meter.Meter("runs/n2", local_batch=64, model="resnet50", mode="imagenet")
    for epoch in range(epochs):
        for x, y in loader:
            ...                      # forward, backward, optimizer step
            meter.step(len(x))       # once per step (the batch this rank trained)
        meter.epoch_end(loss=loss)   # evaluation after this is not timed
    meter.close()                    # every rank; rank 0 writes metrics.jsonl and .csv

With Lightning: ``Trainer(callbacks=[pyhpc.meter.MeterCallback("runs/n2")])``. The code
lives in :mod:`pyhpc.train.meter` and :mod:`pyhpc.train.lightning`; this is its name.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pyhpc.train.meter import Meter, MeterError

if TYPE_CHECKING:
    from pyhpc.train.lightning import MeterCallback as MeterCallback

__all__ = ["Meter", "MeterCallback", "MeterError"]


def __getattr__(name: str) -> Any:
    """``MeterCallback`` is imported on first use: it looks for Lightning."""
    if name == "MeterCallback":
        return importlib.import_module("pyhpc.train.lightning").MeterCallback
    raise AttributeError(f"module 'pyhpc.meter' has no attribute {name!r}")
