"""The deep model: a residual CNN on 3x62x62 images, from a handful of layers to 16,000.

The workload this project grew from: a very deep image classifier (62x62 RGB, batch 32)
that no longer fit one GPU, split over the GPUs of a node as pipeline stages. Its layers
are a stem (3x3 convolution, stride 2: 62x62 -> 31x31), ``layers`` pre-activation
residual blocks (GroupNorm, ReLU, 3x3 convolution; the branch scaled by 1/sqrt(layers) so
any depth trains) and a head (average pool, linear). GroupNorm works per sample, so
splitting a batch into micro-batches changes no result.

:func:`build` makes one pipeline stage's part. The stage boundaries balance the layers'
cost (computed from their shapes, not from modules); the stage's own layers are made on
the meta device and only then given memory and initialized, each from a seed of its
own, so a stage holds exactly the weights those layers have in the unsplit model, and no
rank ever holds all of it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

IMAGE = (3, 62, 62)
#: Channels of every block, and the feature map's side after the stem.
CHANNELS = 16
SIDE = 31
CLASSES = 10
GROUPS = 4


class Stem(nn.Module):
    """3x62x62 -> CHANNELSx31x31."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(IMAGE[0], CHANNELS, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.relu(self.conv(x))
        return out


class Block(nn.Module):
    """x + scale * conv(relu(norm(x))); with ``recompute`` its activations are recomputed in
    the backward pass instead of kept (activation checkpointing)."""

    def __init__(self, scale: float, recompute: bool = False) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(GROUPS, CHANNELS)
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False)
        self.scale = scale
        self.recompute = recompute

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv(torch.relu(self.norm(x)))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            out: torch.Tensor = checkpoint(self.branch, x, use_reentrant=False)
        else:
            out = self.branch(x)
        return x + self.scale * out


class Head(nn.Module):
    """CHANNELSx31x31 -> CLASSES logits."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(CHANNELS, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x.mean(dim=(2, 3)))
        return out


def layer_costs(layers: int) -> list[int]:
    """Multiply-adds of each layer for one image: stem, ``layers`` blocks, head."""
    area = SIDE * SIDE
    stem = IMAGE[0] * CHANNELS * 9 * area
    block = CHANNELS * CHANNELS * 9 * area + 4 * CHANNELS * area  # the convolution, the norm
    head = CHANNELS * area + CHANNELS * CLASSES
    return [stem, *([block] * layers), head]


def balance(costs: Sequence[int], stages: int) -> list[int]:
    """Where each stage starts: contiguous parts of ``costs`` whose largest sum is the
    smallest possible (binary search on that sum, each part filled greedily)."""
    if not 1 <= stages <= len(costs):
        raise ValueError(f"stages: {stages} stages need 1 to {len(costs)} layers each")

    def parts(limit: int) -> list[int] | None:
        starts, total = [0], 0
        for i, cost in enumerate(costs):
            if total + cost > limit and total > 0:
                starts.append(i)
                total = 0
            total += cost
        return starts if len(starts) <= stages else None

    low, high = max(costs), sum(costs)
    while low < high:
        mid = (low + high) // 2
        if parts(mid) is None:
            low = mid + 1
        else:
            high = mid
    starts = parts(low)
    assert starts is not None
    # Fewer parts than stages: split the largest parts until every stage has one.
    while len(starts) < stages:
        bounds = [*starts, len(costs)]
        widest = max(range(len(starts)), key=lambda k: (bounds[k + 1] - bounds[k] > 1,
                                                         sum(costs[bounds[k]:bounds[k + 1]])))
        starts.insert(widest + 1, (bounds[widest] + bounds[widest + 1] + 1) // 2)
    return starts


def _layer(index: int, layers: int, recompute: bool) -> nn.Module:
    if index == 0:
        return Stem()
    if index == layers + 1:
        return Head()
    return Block(1.0 / math.sqrt(layers), recompute)


def _initialize(module: nn.Module, seed: int, index: int) -> None:
    """The layer's weights from a seed of its own: the same wherever the layer lives."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 1_000_003 + index)
        for sub in module.modules():
            reset = getattr(sub, "reset_parameters", None)
            if callable(reset):
                reset()


def stage_range(layers: int, stage: int, stages: int) -> range:
    """The indices (stem 0, blocks 1..layers, head layers+1) of the stage's layers."""
    starts = [*balance(layer_costs(layers), stages), layers + 2]
    return range(starts[stage], starts[stage + 1])


def build(layers: int, stage: int = 0, stages: int = 1, seed: int = 0,
          device: torch.device | str = "cpu", recompute: bool = False) -> nn.Sequential:
    """Stage ``stage`` of ``stages`` of the model with ``layers`` blocks, on ``device``.

    The stage's layers are made on the meta device, then given memory on ``device`` and
    initialized; no other stage's layer is ever made. ``stages=1`` is the unsplit model.
    """
    mine = stage_range(layers, stage, stages)
    with torch.device("meta"):
        part = nn.Sequential(*(_layer(i, layers, recompute) for i in mine))
    part = part.to_empty(device=device)
    for index, module in zip(mine, part, strict=True):
        _initialize(module, seed, index)
    return part


def data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Generated 3x62x62 images and labels a fixed random teacher gives them."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, *IMAGE, generator=gen)
    teacher = torch.randn(IMAGE[0], CLASSES, generator=gen)
    # Labels from the images' mean colour: learnable by any depth of this model.
    y = (x.mean(dim=(2, 3)) @ teacher).argmax(1)
    return x, y
