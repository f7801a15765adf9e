"""Training options: one source for defaults, bounds, help and choices; checked up front."""
from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpc.errors import PyhpcError
from pyhpc.files import FileError
from pyhpc.paths import ROOT
from pyhpc.train import config as trainconfig
from pyhpc.train.config import MODES, TrainConfig, TrainError


def test_trainconfig_imports_neither_torch_nor_submitit_nor_numpy() -> None:
    code = ("import sys, pyhpc.train.config; "
            "print(sorted({'torch', 'submitit', 'numpy'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert proc.stdout.strip() == "[]"


def test_every_field_declares_its_help_and_its_rules() -> None:
    for f in dataclasses.fields(TrainConfig):
        assert f.metadata["help"], f.name
        if f.name == "out":
            continue
        assert ("choices" in f.metadata) != ("max" in f.metadata), f.name
    assert dataclasses.fields(TrainConfig)[1].metadata["choices"] is MODES


def parser(skip: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t", exit_on_error=False)
    trainconfig.add_arguments(p, skip)
    return p


def test_options_are_built_from_the_fields_with_the_dataclass_defaults(tmp_path: Path) -> None:
    args = parser().parse_args(["--out", str(tmp_path / "run")])
    assert trainconfig.from_mapping(vars(args)) == TrainConfig(out=str(tmp_path / "run"))
    actions = {a.dest: a for a in parser()._actions}
    for f in dataclasses.fields(TrainConfig):
        if f.name != "out":
            assert actions[f.name].default == f.default, f.name
        assert actions[f.name].option_strings == ["--" + f.name.replace("_", "-")]
    assert actions["mode"].choices is MODES and actions["out"].required
    assert "1 to 65536" in actions["batch_size"].help
    args = parser().parse_args(["--out", "x", "--batch-size", "64", "--lr", "0.1",
                                "--mode", "synthetic"])
    assert (args.batch_size, args.lr, args.mode) == (64, 0.1, "synthetic")


def test_skipped_fields_get_no_option() -> None:
    dests = {a.dest for a in parser(skip=("out", "batch_size"))._actions}
    assert "out" not in dests and "batch_size" not in dests and "epochs" in dests


BAD = [
    ("batch_size", 0, "batch_size: must be an integer from 1 to 65536, got 0"),
    ("batch_size", 65537, "batch_size: must be an integer from 1 to 65536, got 65537"),
    ("batch_size", True, "batch_size: must be an integer from 1 to 65536, got True"),
    ("epochs", 0, "epochs: must be an integer from 1 to 10000, got 0"),
    ("epochs", "3 epochs", "epochs: must be an integer from 1 to 10000, got '3 epochs'"),
    ("warmup_steps", -1, "warmup_steps: must be an integer from 0 to 100000, got -1"),
    ("lr", 0, "lr: must be a number above 0 and at most 100, got 0"),
    ("lr", -0.1, "lr: must be a number above 0 and at most 100, got -0.1"),
    ("lr", float("nan"), "lr: must be a number above 0 and at most 100, got nan"),
    ("lr", "inf", "lr: must be a number above 0 and at most 100, got 'inf'"),
    ("synthetic_samples", 10**9,
     "synthetic_samples: must be an integer from 16 to 100000, got 1000000000"),
    ("seed", -1, "seed: must be an integer from 0 to 4294967295, got -1"),
    ("threads", 0, "threads: must be an integer from 1 to 256, got 0"),
    ("threads", 257, "threads: must be an integer from 1 to 256, got 257"),
    ("mode", "mnist", "mode: 'mnist' is not allowed; allowed: digits, synthetic"),
    ("device", "gpu", "device: 'gpu' is not allowed; allowed: auto, cpu, cuda"),
    ("precision", "fp16", "precision: 'fp16' is not allowed; allowed: fp32, bf16"),
    ("out", "", "out: must be a directory path (at most 4096 characters), got ''"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_every_bound_is_one_train_error_naming_the_field(
        tmp_path: Path, key: str, value: object, message: str) -> None:
    out = tmp_path / "run"
    with pytest.raises(TrainError) as exc:
        trainconfig.from_mapping({"out": str(out), key: value})
    assert str(exc.value) == message and exc.value.arg == key
    assert isinstance(exc.value, PyhpcError)
    with pytest.raises(TrainError, match=f"^{key}: "):
        TrainConfig(**{"out": str(out), key: value})
    assert not out.exists()


def test_values_are_converted_from_their_text(tmp_path: Path) -> None:
    cfg = trainconfig.from_mapping({"out": tmp_path, "batch_size": "64", "lr": "0.1",
                                    "epochs": None})
    assert (cfg.out, cfg.batch_size, cfg.lr, cfg.epochs) == (str(tmp_path), 64, 0.1, 3)


def test_unknown_and_missing_keys(tmp_path: Path) -> None:
    with pytest.raises(TrainError, match="^nodes: not a training option; known: out, mode,"):
        trainconfig.from_mapping({"out": str(tmp_path), "nodes": 2})
    cfg = trainconfig.from_mapping({"out": str(tmp_path), "nodes": 2}, ignore_unknown=True)
    assert cfg == TrainConfig(out=str(tmp_path))
    with pytest.raises(TrainError, match=r"^out: required \(the run directory\)$"):
        trainconfig.from_mapping({"epochs": 2})


def test_out_naming_a_file_or_a_path_under_a_file_is_refused_up_front(tmp_path: Path) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("keep\n")
    cases = [(afile, f"out: {afile} exists and is not a directory"),
             (afile / "run", f"out: {afile / 'run'} is under a file, not a directory"),
             (afile / "a" / "b", f"out: {afile / 'a' / 'b'} is under a file, not a directory")]
    for out, message in cases:
        for check in (lambda o: trainconfig.check_out(o),
                      lambda o: trainconfig.from_mapping({"out": str(o)})):
            with pytest.raises(FileError) as exc:
                check(out)
            assert str(exc.value) == message and exc.value.arg == "out"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert afile.read_text() == "keep\n"


def test_out_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(FileError, match="^out: .*link is a symbolic link; name the directory"):
        trainconfig.check_out(tmp_path / "link")


@pytest.mark.skipif(os.geteuid() == 0, reason="runs as root here, and root may write in any "
                    "directory: the permission refusal needs an ordinary user")
def test_out_in_a_directory_this_user_cannot_write_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(FileError, match="^out: cannot create directory .*permission denied"):
        trainconfig.check_out(locked / "run")


def test_an_existing_or_creatable_directory_is_accepted_and_nothing_is_created(
        tmp_path: Path) -> None:
    assert trainconfig.check_out(tmp_path) == tmp_path
    assert trainconfig.check_out(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []


def test_short_runs_are_a_train_error_and_zero_workers_no_zero_division(tmp_path: Path) -> None:
    cfg = TrainConfig(out=str(tmp_path), mode="synthetic", batch_size=64, epochs=1)
    with pytest.raises(TrainError) as exc:
        trainconfig.check_steps(cfg, 2)
    assert exc.value.arg == "batch_size"
    with pytest.raises(TrainError, match="^workers: must be an integer from 1 to 1000000, got 0"):
        trainconfig.check_steps(cfg, 0)
