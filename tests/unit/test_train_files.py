"""Writes in a run directory never follow a planted link: replaced atomically (checkpoint,
history, CSV) or refused before any work (the files rank 0 appends to); private modes."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_train import run_in_child  # noqa: E402
from test_train_checkpoint import listing  # noqa: E402

from pyhpc.files import FileError  # noqa: E402
from pyhpc.train import loop as train  # noqa: E402
from pyhpc.train.config import TrainConfig  # noqa: E402


@pytest.mark.parametrize("name", ["metrics.jsonl", "ranks.jsonl"])
def test_a_planted_link_where_rank_0_appends_is_refused_before_any_work(
        tmp_path: Path, name: str) -> None:
    out, victim = tmp_path / "run", tmp_path / "victim"
    out.mkdir()
    victim.write_text("victim\n")
    (out / name).symlink_to(victim)
    before = listing(tmp_path)
    with pytest.raises(FileError) as exc:
        train.run(TrainConfig(out=str(out)))
    assert str(exc.value) == (f"out: {out / name} is not a regular file (a symlink is never "
                              "followed)")
    assert victim.read_text() == "victim\n" and listing(tmp_path) == before


def test_the_run_directory_is_created_private(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PYHPC_GROUP_READABLE", raising=False)
    ready = train.prepare(TrainConfig(out=str(tmp_path / "runs" / "a")))
    assert ready.out == tmp_path / "runs" / "a" and ready.checkpoint is None
    assert stat.S_IMODE(ready.out.stat().st_mode) == 0o700
    assert list(ready.out.iterdir()) == []


def test_planted_links_in_the_run_directory_are_never_followed(tmp_path: Path,
                                                                monkeypatch) -> None:
    monkeypatch.delenv("PYHPC_GROUP_READABLE", raising=False)
    out = tmp_path / "run"
    out.mkdir()
    planted = ("history.tmp", "checkpoint.tmp", "history.json", "metrics.csv")
    for name in planted:
        victim = tmp_path / f"victim-{name}"
        victim.write_text("victim\n")
        (out / name).symlink_to(victim)
    run_in_child(TrainConfig(out=str(out), epochs=1))
    for name in planted:
        assert (tmp_path / f"victim-{name}").read_text() == "victim\n", name
    for name in ("history.tmp", "checkpoint.tmp"):  # never used: left as they were
        assert os.readlink(out / name) == str(tmp_path / f"victim-{name}")
    assert [h["epoch"] for h in json.loads((out / "history.json").read_text())] == [0]
    assert (out / "metrics.csv").read_text().startswith("backend,")
    for name in ("checkpoint.pt", "history.json", "metrics.csv", "metrics.jsonl",
                 "ranks.jsonl"):
        st = (out / name).lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, name
    leftovers = [p.name for p in out.iterdir() if p.name.endswith(".tmp")
                 and p.name not in planted]
    assert leftovers == []
