"""Issue 21 on the job side of ``pyhpc train``: a run directory others can write is
refused before any work, a FIFO planted as the checkpoint never hangs the job, and a
checkpoint that already holds every epoch asked for trains nothing and says so."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_isolation import fifo, within  # noqa: E402

from pyhpc.files import FileError  # noqa: E402
from pyhpc.train import loop as train  # noqa: E402
from pyhpc.train.config import TrainConfig, TrainError  # noqa: E402


def test_a_run_directory_others_can_write_is_refused_by_the_job(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    out.mkdir()
    os.chmod(out, 0o777)
    with pytest.raises(FileError, match=rf"^out: refusing {out}: {out} is writable by every "
                                        r"user \(mode 0777\)"):
        train.prepare(_cfg(tmp_path / "ok", out))
    assert list(out.iterdir()) == []


def _cfg(ok: Path, out: Path) -> TrainConfig:
    """A config checked while ``out`` was still fine (as on the login node), then used."""
    cfg = TrainConfig(out=str(ok))
    object.__setattr__(cfg, "out", str(out))
    return cfg


def test_a_fifo_planted_as_the_checkpoint_is_refused_at_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir(mode=0o700)
    fifo(out / "checkpoint.pt")
    with within(5), pytest.raises(TrainError, match=r"^checkpoint: .* is not a pyhpc "
                                                    r"checkpoint \(not a regular file\)$"):
        train.prepare(TrainConfig(out=str(out)))


def test_a_checkpoint_with_every_epoch_done_trains_nothing_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir(mode=0o700)
    torch.save({"model": {}, "optimizer": {}, "epoch": 99, "history": [], "attempts": 0},
               out / "checkpoint.pt")
    with pytest.raises(TrainError, match=r"^out: .*checkpoint\.pt has already trained 100 of 3 "
                                         r"epochs; nothing left to train"):
        train.prepare(TrainConfig(out=str(out), epochs=3))
