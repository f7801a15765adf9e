"""The options of one training run: one source for their defaults, bounds, help and choices.

Each field of :class:`TrainConfig` declares its help text and its bounds (``min``/``max``,
or ``above`` for an exclusive lower bound) or ``choices`` in its dataclass metadata.
:func:`add_arguments` builds command-line options from them, and every ``TrainConfig``
checks its fields with :mod:`pyhpc.validate` when it is made, so a config that exists is
a valid one. This module imports neither torch nor submitit: the CLI checks a run here
before anything is submitted or started.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from pyhpc import files, validate
from pyhpc.dist.device import DEVICES, PRECISIONS
from pyhpc.errors import PyhpcError, echo

MODES = ("digits", "synthetic")
#: auto: the mode's model (LeNet, or the wider CNN); deep: the very deep residual CNN on
#: generated 3x62x62 images (pyhpc.train.deep), the one model that can be split.
MODELS = ("auto", "deep")
SCHEDULES = ("1f1b", "gpipe")
RECOMPUTE = ("off", "block")
KERNELS = ("default", "deterministic")
#: Deepest model (residual blocks) and most pipeline stages taken.
MAX_LAYERS = 16_000
MAX_STAGES = 64
MAX_BATCH_SIZE = 65_536
DIGITS_SAMPLES = 1797  # sklearn.datasets.load_digits()
#: Longest run directory path taken (PATH_MAX on Linux).
MAX_OUT_LEN = 4096


class TrainError(PyhpcError):
    """A training option or run that cannot be used; the message starts with its name."""


def _option(default: object, help: str, **rules: object) -> Any:
    """A field with its default, help text and rules (min, max, above, choices)."""
    return field(default=default, metadata={"help": help, **rules})


@dataclass(frozen=True)
class TrainConfig:
    """One training run. ``batch_size`` is per worker (weak scaling)."""

    out: str = field(metadata={"help": "directory for checkpoint and metrics"})
    mode: str = _option("digits", "workload: digits (LeNet on 8x8 digits) or synthetic "
                        "(a wider CNN on generated 32x32 images)", choices=MODES)
    epochs: int = _option(3, "passes over the training data", min=1, max=10_000)
    batch_size: int = _option(32, "samples per step per worker", min=1, max=MAX_BATCH_SIZE)
    lr: float = _option(0.05, "learning rate (SGD, momentum 0.9)", above=0.0, max=100.0)
    seed: int = _option(0, "seed of the data split, the model and the sampler",
                        min=0, max=2**32 - 1)
    warmup_steps: int = _option(3, "first steps left out of the throughput figures",
                                min=0, max=100_000)
    synthetic_samples: int = _option(512, "generated images in synthetic mode",
                                     min=16, max=100_000)
    threads: int = _option(1, "torch threads per task", min=1, max=256)
    device: str = _option("auto", "where each task computes: auto (the task's GPU when Slurm "
                          "gave it one, else the CPU), cpu, or cuda (a GPU, or an error)",
                          choices=DEVICES)
    precision: str = _option("fp32", "arithmetic: fp32, or bf16 (bfloat16 autocast; GPUs of "
                             "compute capability 8.0+, or the CPU, emulated where it lacks "
                             "bf16 instructions)", choices=PRECISIONS)
    model: str = _option("auto", "auto: the mode's model; deep: a residual CNN of --layers "
                         "blocks on generated 3x62x62 images (synthetic_samples of them), "
                         "the model --pipeline splits", choices=MODELS)
    layers: int = _option(32, "residual blocks of the deep model", min=1, max=MAX_LAYERS)
    pipeline: int = _option(1, "pipeline stages per node, one task (GPU) each, for a model too "
                            "deep for one; data parallel across nodes", min=1, max=MAX_STAGES)
    microbatches: int = _option(4, "micro-batches each step's batch is cut into (pipeline); at "
                                "least the stage count, and a divisor of the batch size",
                                min=1, max=4096)
    schedule: str = _option("1f1b", "pipeline schedule: 1f1b (one forward, one backward: "
                            "activations of at most the stage count in flight) or gpipe "
                            "(all forwards, then all backwards)", choices=SCHEDULES)
    activation_checkpointing: str = _option(
        "off", "block: keep only each residual block's input and recompute the rest in the "
        "backward pass (less memory, about a third more compute)", choices=RECOMPUTE)
    kernels: str = _option(
        "default", "default: torch's usual kernels, whose results on a GPU can differ slightly "
        "from run to run; deterministic: only deterministic ones, so a run, its repeat and a "
        "resumed run agree bit for bit on the same hardware (an operation without one is an "
        "error)", choices=KERNELS)

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _check_field(f.name, getattr(self, f.name)))
        _check_pipeline(self)


#: Each field's type (the annotations are strings here) and its rules.
_TYPES: dict[str, Any] = get_type_hints(TrainConfig)
_RULES: dict[str, Mapping[str, Any]] = {f.name: f.metadata for f in fields(TrainConfig)}


def _check_field(name: str, value: object) -> object:
    """``value`` as the field's type if it keeps the field's rules, else :class:`TrainError`."""
    rules, kind = _RULES[name], _TYPES[name]
    if name == "out":
        return _check_out_text(value)
    if "choices" in rules:
        if value not in rules["choices"]:
            raise TrainError(f"{name}: {echo(value)} is not allowed; "
                             f"allowed: {', '.join(rules['choices'])}", name)
        return value
    if kind is int:
        return validate.integer(name, value, rules["min"], rules["max"], error=TrainError)
    above = rules.get("above")
    if above is None:
        return validate.number(name, value, rules["min"], rules["max"], error=TrainError)
    try:
        number: float | None = validate.number(name, value, above, rules["max"],
                                               error=TrainError)
    except TrainError:
        number = None
    if number is None or number <= above:
        raise TrainError(f"{name}: must be a number above {above:g} and at most "
                         f"{rules['max']:g}, got {echo(value)}", name)
    return number


def _check_pipeline(cfg: TrainConfig) -> None:
    """The options that only make sense together: a split needs the deep model, at least
    one layer per stage, and micro-batches that cut the batch evenly, at least one a stage."""
    if cfg.model == "deep":
        object.__setattr__(cfg, "mode", "synthetic")  # the deep model's images are generated
    if cfg.pipeline == 1:
        return
    if cfg.model != "deep":
        raise TrainError(f"pipeline: only the deep model is split into stages; add --model deep "
                         f"(got --pipeline {cfg.pipeline} with --model {cfg.model})", "pipeline")
    if cfg.layers + 2 < cfg.pipeline:
        raise TrainError(f"pipeline: {cfg.pipeline} stages need at least {cfg.pipeline - 2} "
                         f"residual blocks, got --layers {cfg.layers}", "pipeline")
    if cfg.microbatches < cfg.pipeline:
        raise TrainError(f"microbatches: at least one per stage ({cfg.pipeline}), got "
                         f"{cfg.microbatches}", "microbatches")
    if cfg.batch_size % cfg.microbatches:
        raise TrainError(f"microbatches: {cfg.microbatches} does not divide the batch size "
                         f"{cfg.batch_size}; use a divisor of it", "microbatches")


def _check_out_text(value: object) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if (not isinstance(value, str) or not value or "\0" in value
            or len(value) > MAX_OUT_LEN):
        raise TrainError(f"out: must be a directory path (at most {MAX_OUT_LEN} characters), "
                         f"got {echo(value)}", "out")
    return value


def check_out(path: str | os.PathLike[str], arg: str = "out") -> Path:
    """``path`` resolved, if it is a run directory pyhpc may create or write in and later
    read back from; creates nothing. The one check of :func:`pyhpc.files.safe_dir`: a
    file or link where the directory belongs, a directory that is not the user's alone
    (or under one another user could replace), or one the user cannot write in, is one
    :class:`~pyhpc.files.FileError` line."""
    return files.safe_dir(path, arg)


def names() -> tuple[str, ...]:
    """The field names, in order."""
    return tuple(f.name for f in fields(TrainConfig))


def from_mapping(values: Mapping[str, object], ignore_unknown: bool = False) -> TrainConfig:
    """A checked config from option values (``vars(args)``, parsed YAML...).

    Values may be typed or their decimal strings; a missing or ``None`` value takes the
    field's default (``out`` has none). Every field is checked (:class:`TrainError` naming
    it), then ``out`` with :func:`check_out` (:class:`~pyhpc.files.FileError`). A key that
    is no field is refused unless ``ignore_unknown`` (an argparse namespace with other
    commands' options).
    """
    known = names()
    unknown = sorted(k for k in values if k not in known)
    if unknown and not ignore_unknown:
        raise TrainError(f"{unknown[0]}: not a training option; known: {', '.join(known)}",
                         str(unknown[0]))
    given = {k: v for k, v in values.items() if k in known and v is not None}
    if "out" not in given:
        raise TrainError("out: required (the run directory)", "out")
    cfg = TrainConfig(**given)  # type: ignore[arg-type]  # checked and converted in __post_init__
    check_out(cfg.out)
    return cfg


def add_arguments(parser: argparse.ArgumentParser, skip: Collection[str] = ()) -> None:
    """Add ``--batch-size`` etc. for every field not in ``skip`` (field names, underscored).

    Defaults come from :class:`TrainConfig`, ``choices`` are its constants; bounds are in
    the help and checked by :func:`from_mapping` (or ``TrainConfig`` itself).
    """
    for f in fields(TrainConfig):
        if f.name in skip:
            continue
        rules, flag = f.metadata, "--" + f.name.replace("_", "-")
        if f.name == "out":
            parser.add_argument(flag, required=True, help=rules["help"])
            continue
        if "choices" in rules:
            parser.add_argument(flag, choices=rules["choices"], default=f.default,
                                help=f"{rules['help']} (default: %(default)s)")
            continue
        if "above" in rules:
            bounds = f"above {rules['above']:g}, at most {rules['max']:g}"
        else:
            bounds = f"{rules['min']} to {rules['max']}"
        parser.add_argument(flag, type=_TYPES[f.name], default=f.default,
                            metavar=f.name.upper(),
                            help=f"{rules['help']}; {bounds} (default: %(default)s)")


def samples(cfg: TrainConfig) -> int:
    """Images in the run's data set (training and test split together)."""
    return DIGITS_SAMPLES if cfg.mode == "digits" else cfg.synthetic_samples


def steps_per_epoch(cfg: TrainConfig, workers: int) -> int:
    """Optimizer steps per epoch on each data-parallel worker (80% train split, partial
    batches dropped)."""
    return (int(0.8 * samples(cfg)) // workers) // cfg.batch_size


def check_steps(cfg: TrainConfig, tasks: int) -> None:
    """Refuse a run too short to measure: every step would be a warm-up step. ``tasks``:
    the job's tasks; each ``pipeline`` of them hold one data-parallel copy of the model."""
    tasks = validate.integer("workers", tasks, 1, 1_000_000, error=TrainError, text=False)
    if tasks % cfg.pipeline:
        raise TrainError(f"pipeline: {cfg.pipeline} stages per node need a multiple of "
                         f"{cfg.pipeline} tasks, got {tasks}", "pipeline")
    workers = tasks // cfg.pipeline
    steps = steps_per_epoch(cfg, workers)
    if steps * cfg.epochs <= cfg.warmup_steps:
        raise TrainError(
            f"batch_size: {cfg.batch_size} per worker on {workers} workers gives {steps} steps "
            f"per epoch, {steps * cfg.epochs} in all, not more than the {cfg.warmup_steps} "
            "warm-up steps; use a smaller batch size, more epochs or more synthetic samples",
            "batch_size")
