"""Resuming reads a checkpoint as data only: a planted pickle never runs, and a file that is
not a pyhpc checkpoint is one TrainError naming it, before any work and with nothing written."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pyhpc.train import loop as train  # noqa: E402
from pyhpc.train.config import TrainConfig, TrainError  # noqa: E402


def listing(path: Path) -> dict[str, str]:
    """Every entry under ``path`` and what it is (a link with its target)."""
    return {str(p.relative_to(path)): f"-> {os.readlink(p)}" if p.is_symlink()
            else "dir" if p.is_dir() else p.read_bytes().hex()[:64]
            for p in sorted(path.rglob("*"))}


class Payload:
    """Pickles as a call to open(marker, "w"): the file appears if the pickle is run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def planted_pickle(path: Path, marker: Path) -> None:
    state = {"model": Payload(marker), "optimizer": {}, "epoch": 0, "history": [],
             "attempts": 0}
    path.write_bytes(pickle.dumps(state))


def planted_torch_save(path: Path, marker: Path) -> None:
    torch.save({"model": Payload(marker), "optimizer": {}, "epoch": 0, "history": [],
                "attempts": 0}, path)


CHECKPOINTS = {
    "pickle": (planted_pickle, "UnpicklingError: not only tensors and plain data; "
                               "nothing in it was run"),
    "torch.save": (planted_torch_save, "UnpicklingError: not only tensors and plain data; "
                                       "nothing in it was run"),
    "garbage": (lambda p, m: p.write_bytes(b"\x00garbage\xff" * 10), "UnpicklingError"),
    "empty": (lambda p, m: p.write_bytes(b""), "EOFError"),
    "a list": (lambda p, m: torch.save([1, 2], p), "a list, not a dict"),
    "no epoch": (lambda p, m: torch.save({"model": {}, "optimizer": {}}, p),
                 "'epoch' is not a int"),
    "bad history": (lambda p, m: torch.save({"model": {}, "optimizer": {}, "epoch": 0,
                                             "history": [1], "attempts": 0}, p),
                    "'history' is not a list of dicts"),
    "symlink": (lambda p, m: p.symlink_to(m.parent / "elsewhere.pt"),
                "cannot open it: Too many levels of symbolic links; a symlink is never followed"),
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("kind", sorted(CHECKPOINTS))
def test_a_checkpoint_that_is_not_ours_is_one_train_error_and_never_runs(
        tmp_path: Path, kind: str) -> None:
    out, marker = tmp_path / "run", tmp_path / "pwned"
    out.mkdir()
    torch.save({"model": {}}, tmp_path / "elsewhere.pt")
    plant, why = CHECKPOINTS[kind]
    plant(out / "checkpoint.pt", marker)
    before = listing(tmp_path)
    with pytest.raises(TrainError) as exc:
        train.run(TrainConfig(out=str(out)))
    message = str(exc.value)
    assert message.startswith(f"checkpoint: {out / 'checkpoint.pt'} is not a pyhpc "
                              f"checkpoint ({why}")
    assert "\n" not in message and exc.value.arg == "checkpoint"
    assert not marker.exists()
    assert listing(tmp_path) == before


def test_load_checkpoint_reads_with_weights_only(tmp_path: Path, monkeypatch) -> None:
    seen = []
    real = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    path = tmp_path / "checkpoint.pt"
    state = {"model": {"w": torch.ones(2)}, "optimizer": {"param_groups": []}, "epoch": 1,
             "history": [{"epoch": 0, "loss": 1.5}], "attempts": 0}
    torch.save(state, path)
    back = train.load_checkpoint(path)
    assert seen == [True] and back["history"] == state["history"]
    assert torch.equal(back["model"]["w"], torch.ones(2))


def test_a_checkpoint_of_another_model_is_one_train_error(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    torch.save({"model": {"w": torch.ones(2)}, "optimizer": {}, "epoch": 0, "history": [],
                "attempts": 0}, out / "checkpoint.pt")
    model = train.LeNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = train.load_checkpoint(out / "checkpoint.pt")
    with pytest.raises(TrainError, match=r"^checkpoint: .* does not fit this run's model and "
                                         r"optimizer \(RuntimeError: [^\n]*\)$"):
        train._restore(out / "checkpoint.pt", state, model, opt)
