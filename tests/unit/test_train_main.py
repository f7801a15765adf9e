"""``python -m pyhpc.train``: options built from TrainConfig's fields; a bad option or run
directory is one line and exit status 2, before anything is written."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from pyhpc.train import loop as train  # noqa: E402
from pyhpc.train.config import TrainConfig  # noqa: E402


@pytest.mark.parametrize(("args", "message"), [
    (["--batch-size", "0"], "batch_size: must be an integer from 1 to 65536, got 0"),
    (["--warmup-steps", "-1"], "warmup_steps: must be an integer from 0 to 100000, got -1"),
    (["--lr", "0"], "lr: must be a number above 0 and at most 100, got 0.0"),
])
def test_python_m_pyhpc_train_refuses_bad_options_in_one_line(
        tmp_path: Path, capsys, args: list[str], message: str) -> None:
    out = tmp_path / "run"
    assert train.main(["--out", str(out), *args]) == 2
    assert capsys.readouterr().err == f"pyhpc.train: {message}\n"
    assert not out.exists()


def test_python_m_pyhpc_train_refuses_out_naming_a_file_or_under_one(tmp_path: Path,
                                                                    capsys) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("keep\n")
    assert train.main(["--out", str(afile)]) == 2
    assert capsys.readouterr().err == (f"pyhpc.train: out: {afile} exists and is not a "
                                       "directory\n")
    assert train.main(["--out", str(afile / "run")]) == 2
    assert capsys.readouterr().err == (f"pyhpc.train: out: {afile / 'run'} is under a file, "
                                       "not a directory\n")
    assert afile.read_text() == "keep\n" and [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.skipif(train.torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_python_m_pyhpc_train_refuses_cuda_without_a_gpu_before_writing(tmp_path: Path,
                                                                        capsys) -> None:
    out = tmp_path / "run"
    assert train.main(["--out", str(out), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyhpc.train: device: cuda requested, but no GPU is visible to this "
                          "task (CUDA sees 0 devices") and err.count("\n") == 1
    assert not out.exists()


def test_python_m_pyhpc_train_options_come_from_trainconfig(tmp_path: Path) -> None:
    assert train.parse_args(["--out", str(tmp_path)]) == TrainConfig(out=str(tmp_path))
    cfg = train.parse_args(["--out", str(tmp_path), "--threads", "2", "--mode", "synthetic",
                            "--device", "cpu", "--precision", "bf16"])
    assert (cfg.threads, cfg.mode, cfg.device, cfg.precision) == (2, "synthetic", "cpu", "bf16")


def test_train_does_not_reexport_what_moved() -> None:
    for name in ("MODES", "DIGITS_SAMPLES", "steps_per_epoch", "check_steps"):
        assert not hasattr(train, name), name
