"""Time to first step: the marks, the process start read from /proc, the phases between
them, startup.json; and what pyhpc.train leaves out of its way to the first step."""
from __future__ import annotations

import json
import pickle
import stat
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import ModuleType

import pytest

from pyhpc.train import startup
from pyhpc.train.startup import Marks

# /proc/<pid>/stat of a process whose name holds a space and a ')': field 22 is 4242.
STAT = ("1234 (py thon) x) S 1 1234 1234 0 -1 4194560 900 0 0 0 5 2 0 0 20 0 1 0 "
        "4242 123456 789 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0")
MARKS = Marks(process_start=100.0, imported=101.5, rendezvous_done=101.75, first_step=103.0)


@pytest.fixture
def train() -> ModuleType:
    pytest.importorskip("torch")
    from pyhpc.train import loop as train

    return train


def test_start_ticks_counts_fields_after_a_name_with_spaces_and_parentheses() -> None:
    assert startup.start_ticks(STAT) == 4242
    assert startup.process_start(STAT, 100, booted_at=1_000_000.0) == 1_000_042.42


def test_this_process_start_is_before_its_first_statement_by_under_a_tick() -> None:
    code = ("import time; t = time.time(); from pyhpc.train.startup import this_process_start; "
            "print(t - this_process_start())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    # The start is truncated to a clock tick (10 ms): never after the first statement.
    assert 0.0 <= float(out) < 5.0


def test_btime_is_the_boot_time_truncated_to_the_second() -> None:
    btime = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                 if line.startswith("btime "))
    assert 0.0 <= startup.booted_at() - btime < 1.01


def test_marks_from_a_gathered_dict_ignore_other_keys_and_miss_as_none() -> None:
    assert Marks.from_mapping({"imported": 2.0, "rank": 3}) == Marks(imported=2.0)
    assert Marks.from_mapping(asdict(MARKS)) == MARKS


def test_durations_are_the_phases_between_marks() -> None:
    assert startup.durations(MARKS, job_start=99.0, submitted=90.0) == {
        "queue": 9.0, "launch": 1.0, "import": 1.5, "rendezvous": 0.25, "first_step": 1.25,
        "in_process": 3.0}


def test_a_phase_with_a_missing_bound_has_no_duration() -> None:
    seconds = startup.durations(Marks(process_start=100.0, imported=101.0))
    assert seconds == {"queue": None, "launch": None, "import": 1.0, "rendezvous": None,
                       "first_step": None, "in_process": None}


def test_report_orders_ranks_takes_the_job_from_slurm_and_the_slowest_phases() -> None:
    late = Marks(process_start=100.5, imported=101.7, rendezvous_done=101.75, first_step=103.0)
    ranks = [{"rank": 1, "host": "n2", "marks": asdict(late)},
             {"rank": 0, "host": "n1", "marks": asdict(MARKS)}]
    doc = startup.report(ranks, {"SLURM_JOB_ID": "42", "SLURM_JOB_START_TIME": "99"})
    assert (doc["job_id"], doc["job_start"]) == ("42", 99.0)
    assert [(r["rank"], r["host"]) for r in doc["ranks"]] == [(0, "n1"), (1, "n2")]
    assert doc["ranks"][1]["seconds"]["launch"] == 1.5
    assert doc["slowest"]["launch"] == 1.5 and doc["slowest"]["import"] == 1.5
    assert doc["slowest"]["queue"] is None
    assert json.loads(json.dumps(doc)) == doc


def test_report_outside_slurm_or_with_a_bad_start_time_has_no_job() -> None:
    ranks = [{"rank": 0, "marks": asdict(MARKS)}]
    assert startup.report(ranks, {})["job_id"] is None
    assert startup.report(ranks, {"SLURM_JOB_START_TIME": "soon"})["job_start"] is None


def test_startup_imports_neither_torch_nor_submitit() -> None:
    code = "import sys, pyhpc.train.startup; print(sorted({'torch', 'submitit'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_train_imports_neither_submitit_nor_sklearn(train: ModuleType) -> None:
    code = ("import sys, pyhpc.train.loop; "
            "print(sorted({'submitit', 'sklearn'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_digits_are_load_digits_without_importing_sklearn(train: ModuleType) -> None:
    datasets = pytest.importorskip("sklearn.datasets")
    import torch

    images, labels = train.digits()
    bunch = datasets.load_digits()
    assert torch.equal(images, torch.tensor(bunch.images))
    assert torch.equal(labels, torch.tensor(bunch.target))


def test_trainer_checkpoint_requeues_the_same_call(train: ModuleType, tmp_path: Path) -> None:
    from pyhpc.train.config import TrainConfig

    trainer = train.Trainer(TrainConfig(out=str(tmp_path)))
    delayed = trainer.checkpoint()
    assert delayed.function is trainer and delayed.args == () and delayed.kwargs == {}
    assert pickle.loads(pickle.dumps(trainer)).cfg == trainer.cfg


def test_the_first_step_is_marked_once(train: ModuleType) -> None:
    import torch

    param = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([param], lr=0.1)
    marks = Marks()
    train._mark_first_step(opt, marks, train.device.CPU)
    before = time.time()
    param.grad = torch.ones(1)
    opt.step()
    first = marks.first_step
    assert first is not None and first >= before
    opt.step()
    assert marks.first_step == first


def test_a_run_writes_startup_json_privately_through_no_link(
        train: ModuleType, tmp_path: Path, monkeypatch) -> None:
    from test_train import run_in_child

    from pyhpc.train.config import TrainConfig

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("PYHPC_GROUP_READABLE", raising=False)
    out, victim = tmp_path / "run", tmp_path / "victim"
    out.mkdir()
    victim.write_text("victim\n")
    (out / "startup.json").symlink_to(victim)
    run_in_child(TrainConfig(out=str(out), epochs=1))
    assert victim.read_text() == "victim\n"
    st = (out / "startup.json").lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    doc = json.loads((out / "startup.json").read_text())
    assert doc["job_id"] is None and [r["rank"] for r in doc["ranks"]] == [0]
    marks = doc["ranks"][0]["marks"]
    order = [marks[k] for k in ("process_start", "imported", "rendezvous_done", "first_step")]
    assert None not in order and order == sorted(order)
    assert doc["ranks"][0]["seconds"]["in_process"] > 0
    ranks = [json.loads(line) for line in (out / "ranks.jsonl").read_text().splitlines()]
    assert "marks" not in ranks[0]
    # The rank's peak memory (here the process's peak resident set: torch alone is > 64 MiB).
    assert ranks[0]["peak_memory_bytes"] > 64 << 20
