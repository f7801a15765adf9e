"""The training step on an explicit device: every parameter, gradient and batch tensor is
there. The same test runs on a GPU where one is visible; only the device differs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from pyhpc import dist  # noqa: E402
from pyhpc.dist import device  # noqa: E402
from pyhpc.dist.device import Placement  # noqa: E402
from pyhpc.train import loop as train  # noqa: E402
from pyhpc.train import metrics  # noqa: E402
from pyhpc.train.config import TrainConfig  # noqa: E402

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                             reason="no CUDA device on this machine")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_CUDA)]
PRECISIONS = ["fp32", "bf16"]


class Watched(nn.Module):
    """Loss that records where its inputs (the model's output, the labels) were."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = nn.CrossEntropyLoss()
        self.seen: list[torch.device] = []

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.seen += [out.device, y.device]
        result: torch.Tensor = self.loss(out, y)
        return result


def one_rank_sampler(data: Any) -> DistributedSampler[Any]:
    return DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kind", DEVICES)
def test_the_training_step_keeps_everything_on_the_device(
        tmp_path: Path, kind: str, precision: str) -> None:
    place = device.resolve(kind, precision)
    where = place.torch_device()
    cfg = TrainConfig(out=str(tmp_path), mode="synthetic", synthetic_samples=64, batch_size=8)
    train_set, test_set, model = train.datasets(cfg)
    model = train.place_model(model, place)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    loader = train.make_loader(train_set, cfg.batch_size, one_rank_sampler(train_set), place)
    inputs: list[torch.Tensor] = []
    hook = model.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    loss_fn = Watched()
    timer = metrics.StepTimer(sync=place.synchronize)
    before = [p.detach().clone() for p in model.parameters()]
    result = train.train_epoch(model, loader, opt, loss_fn, timer, place=place)
    hook.remove()
    assert result.steps == len(loader) == len(timer.times) > 0
    assert inputs and all(x.device == where for x in inputs)
    assert len(loss_fn.seen) == 2 * result.steps and set(loss_fn.seen) == {where}
    for p, old in zip(model.parameters(), before, strict=True):
        assert p.device == where and p.dtype == torch.float32  # autocast keeps fp32 masters
        assert p.grad is not None and p.grad.device == where
        assert not torch.equal(p.detach(), old)  # it trained
    for state in opt.state.values():
        assert all(t.device == where for t in state.values() if torch.is_tensor(t))
    assert result.loss_sum.device == where and torch.isfinite(result.loss_sum)
    assert 0.0 <= train._evaluate(model, test_set, place) <= 1.0
    if place.channels_last:
        conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
        assert conv.weight.is_contiguous(memory_format=torch.channels_last)
        assert all(x.is_contiguous(memory_format=torch.channels_last) for x in inputs)


@pytest.mark.parametrize("kind", DEVICES)
def test_autocast_runs_the_forward_pass_in_bf16(tmp_path: Path, kind: str) -> None:
    place = device.resolve(kind, "bf16")
    model = train.place_model(train.LeNet(), place)
    x = torch.randn(4, 1, 8, 8)
    with place.autocast():
        out = model(train.to_device((x, torch.zeros(4, dtype=torch.long)), place)[0])
    assert out.dtype == torch.bfloat16 and out.device == place.torch_device()


def test_cpu_fp32_placement_leaves_tensors_untouched() -> None:
    """On the CPU in fp32 the placement changes nothing: the results stay bit for bit."""
    x, y = torch.randn(2, 1, 8, 8), torch.tensor([1, 2])
    moved = train.to_device((x, y), device.CPU)
    assert moved[0] is x and moved[1] is y
    model = train.LeNet()
    weights = [p.detach().clone() for p in model.parameters()]
    placed = train.place_model(model, device.CPU)
    assert all(torch.equal(p, w) for p, w in zip(placed.parameters(), weights, strict=True))


class FakeGroup:
    """torch.distributed's default group, recorded instead of created."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.backend = ""

    def init_process_group(self, backend: str) -> None:
        self.calls.append(("init_process_group", backend))
        self.backend = backend


@pytest.mark.parametrize(("place", "backend", "current"), [
    (Placement("cpu", None), "gloo", None),
    (Placement("cuda", 1), "nccl", 1),
])
def test_dist_setup_picks_the_backend_from_the_device(monkeypatch, place: Placement,
                                                      backend: str, current: int | None) -> None:
    import torch.distributed as td

    group = FakeGroup()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda index: group.calls.append(("set_device", index)))
    monkeypatch.setattr(td, "is_initialized", lambda: bool(group.backend))
    monkeypatch.setattr(td, "init_process_group", group.init_process_group)
    monkeypatch.setattr(td, "get_backend", lambda: group.backend)
    monkeypatch.setattr(td, "get_rank", lambda: 0)
    monkeypatch.setattr(td, "get_world_size", lambda: 1)
    info = dist.setup(place)
    expected = ([("set_device", current)] if current is not None else []) + [
        ("init_process_group", backend)]
    assert group.calls == expected  # the current GPU is set before the group exists
    assert info.backend == backend and info.place is place
