"""Throughput maths on synthetic timings."""
from __future__ import annotations

import csv
import json
import math
import re
import stat
from pathlib import Path

import pytest

from pyhpc.errors import PyhpcError
from pyhpc.files import FileError
from pyhpc.train import metrics

ENV = metrics.Environment(torch_version="2.13.0", backend="gloo", job_id="42",
                          nodes=["cpu1", "cpu2"], local_batch=10)


def two_ranks() -> list[metrics.RankTimes]:
    # Steps 0-1 are warm-up (slow on purpose); afterwards rank 1 is the slow one on
    # steps 2 and 4, rank 0 on step 3.
    return [metrics.RankTimes(0, "cpu1", [9.0, 5.0, 0.10, 0.30, 0.10]),
            metrics.RankTimes(1, "cpu2", [9.0, 5.0, 0.20, 0.10, 0.40])]


def test_warmup_steps_are_excluded_and_the_slowest_rank_sets_the_pace() -> None:
    assert metrics.slowest_steps(two_ranks(), warmup=2) == [0.20, 0.30, 0.40]


def test_global_rate_is_global_batch_over_slowest_step_time() -> None:
    s = metrics.summarize(two_ranks(), warmup=2, env=ENV)
    assert s.workers == 2 and s.global_batch == 20 and s.steps == 3
    assert s.step_time_mean == pytest.approx(0.30)
    assert s.samples_per_s == pytest.approx(20 / 0.30)
    assert s.samples_per_s_per_worker == pytest.approx(10 / 0.30)


def test_percentiles_interpolate_like_numpy() -> None:
    s = metrics.summarize(two_ranks(), warmup=2, env=ENV)
    assert s.step_time_p50 == pytest.approx(0.30)
    assert s.step_time_p90 == pytest.approx(0.38)
    assert metrics.percentile([1, 2, 3, 4], 25) == pytest.approx(1.75)


def test_environment_is_recorded() -> None:
    row = metrics.summarize(two_ranks(), 2, ENV, extra={"epochs": 3}).row()
    assert row["torch_version"] == "2.13.0" and row["backend"] == "gloo"
    assert row["job_id"] == "42" and row["nodes"] == "cpu1,cpu2"
    assert row["local_batch"] == 10 and row["global_batch"] == 20 and row["extra_epochs"] == 3


def test_ragged_ranks_and_all_warmup_are_errors() -> None:
    ragged = [metrics.RankTimes(0, "a", [1.0, 1.0]), metrics.RankTimes(1, "b", [1.0])]
    with pytest.raises(metrics.MetricsError, match="different step counts"):
        metrics.slowest_steps(ragged, 0)
    with pytest.raises(metrics.MetricsError, match="all within the 5 warm-up steps"):
        metrics.slowest_steps(two_ranks(), 5)


def run(workers: int, local: int, rate: float, mode: str = "digits") -> metrics.Summary:
    s = metrics.summarize([metrics.RankTimes(r, "n", [1.0, local * workers / rate])
                           for r in range(workers)], 1,
                          metrics.Environment("t", "gloo", "1", ["n"], local, mode=mode))
    assert s.samples_per_s == pytest.approx(rate)
    return s


def test_weak_scaling_efficiency_is_x_n_over_n_x_1() -> None:
    runs = [run(1, 32, 100.0), run(2, 32, 190.0), run(4, 32, 360.0), run(1, 64, 150.0),
            run(2, 64, 300.0)]
    eff = {(s.local_batch, s.workers): s.efficiency for s in metrics.efficiency(runs, "weak")}
    assert eff[(32, 1)] == pytest.approx(1.0)
    assert eff[(32, 2)] == pytest.approx(0.95)
    assert eff[(32, 4)] == pytest.approx(0.90)
    assert eff[(64, 2)] == pytest.approx(1.0)


def test_strong_scaling_compares_runs_with_the_same_global_batch() -> None:
    runs = [run(1, 64, 100.0), run(2, 32, 160.0), run(4, 16, 200.0)]
    out = metrics.efficiency(runs, "strong")
    assert [s.workers for s in out] == [1, 2, 4]
    assert [s.efficiency for s in out] == pytest.approx([1.0, 0.8, 0.5])
    assert {s.scaling for s in out} == {"strong"}


def test_efficiency_baseline_is_the_smallest_run_of_the_series() -> None:
    out = metrics.efficiency([run(2, 8, 100.0), run(4, 8, 150.0)])
    assert [s.efficiency for s in out] == pytest.approx([1.0, 0.75])


def test_a_run_alone_in_its_series_has_no_efficiency() -> None:
    out = metrics.efficiency([run(2, 8, 100.0), run(2, 16, 150.0)])
    assert [s.efficiency for s in out] == [None, None]


def test_unknown_scaling_mode_is_named() -> None:
    with pytest.raises(metrics.MetricsError,
                       match="scaling: 'linear' is not allowed; allowed: weak, strong"):
        metrics.efficiency([], "linear")


def test_json_lines_and_csv_round_trip(tmp_path: Path) -> None:
    s = metrics.summarize(two_ranks(), 2, ENV, extra={"final_loss": 0.5})
    metrics.write_jsonl(tmp_path / "m.jsonl", [s])
    metrics.write_jsonl(tmp_path / "m.jsonl", [s])
    back = metrics.read_jsonl(tmp_path / "m.jsonl")
    assert back == [s, s]
    metrics.write_csv(tmp_path / "m.csv", back)
    rows = list(csv.DictReader((tmp_path / "m.csv").open()))
    assert len(rows) == 2 and float(rows[0]["samples_per_s"]) == pytest.approx(s.samples_per_s)
    assert rows[0]["extra_final_loss"] == "0.5"


def test_step_timer_records_one_time_per_step() -> None:
    timer = metrics.StepTimer()
    for _ in range(3):
        timer.step()
    assert len(timer.times) == 3 and all(t >= 0 for t in timer.times)


def test_metrics_error_is_a_pyhpc_error() -> None:
    assert issubclass(metrics.MetricsError, PyhpcError)


def test_appending_to_a_planted_link_is_a_clean_error_and_the_victim_is_untouched(
        tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    (tmp_path / "metrics.jsonl").symlink_to(victim)
    s = metrics.summarize(two_ranks(), 2, ENV)
    with pytest.raises(FileError, match=r"^out: cannot append to .*metrics\.jsonl \(.*a symlink "
                                        r"is never followed\)$"):
        metrics.write_jsonl(tmp_path / "metrics.jsonl", [s])
    assert victim.read_text() == "victim\n"
    assert (tmp_path / "metrics.jsonl").is_symlink()


def test_csv_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path,
                                                                   monkeypatch) -> None:
    monkeypatch.delenv("PYHPC_GROUP_READABLE", raising=False)
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    (tmp_path / "metrics.csv").symlink_to(victim)
    metrics.write_csv(tmp_path / "metrics.csv", [metrics.summarize(two_ranks(), 2, ENV)])
    assert victim.read_text() == "victim\n"
    st = (tmp_path / "metrics.csv").lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert (tmp_path / "metrics.csv").read_text().startswith("backend,")


def test_new_metrics_files_are_private(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PYHPC_GROUP_READABLE", raising=False)
    metrics.write_jsonl(tmp_path / "m.jsonl", [metrics.summarize(two_ranks(), 2, ENV)])
    assert stat.S_IMODE((tmp_path / "m.jsonl").stat().st_mode) == 0o600


def good_line() -> str:
    return json.dumps(metrics.summarize(two_ranks(), 2, ENV).row(), sort_keys=True)


def with_field(**changes: object) -> str:
    return json.dumps({**json.loads(good_line()), **changes})


BAD_FILES = {
    "json": (good_line() + '\n{"workers": 1,\n', r"2: not valid JSON \(Expecting property "
                                                 r"name enclosed in double quotes at column 15\)"),
    "utf-8": (good_line() + "\n", None),  # bytes below
    "a list": ("[1, 2]\n", r"1: expected a JSON object, got list"),
    "a number": (good_line() + "\n\n42\n", r"3: expected a JSON object, got int"),
    "shape": ('{"workers": 2}\n', r"1: not a metrics record; missing local_batch, "
                                  r"global_batch, steps, "),
    "type": (with_field(workers="2") + "\n", r"1: workers: must be an integer, got '2'"),
    "bool": (with_field(steps=True) + "\n", r"1: steps: must be an integer, got True"),
    "float": (with_field(step_time_p50="fast") + "\n",
              r"1: step_time_p50: must be a number, got 'fast'"),
    "null": (with_field(job_id=None) + "\n", r"1: job_id: must not be null"),
    "zero rate": (with_field(samples_per_s=0) + "\n",
                  r"1: samples_per_s: must be above 0, got 0"),
    "escape": (with_field(job_id="\x1b[2J") + "\n",
               r"1: job_id: must be printable text, got '\\x1b\[2J'"),
    "nested": ("[" * 100_000 + "\n", r"1: not valid JSON \(nested too deeply\)"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_a_bad_metrics_file_is_one_metrics_error_naming_file_and_line(
        tmp_path: Path, kind: str) -> None:
    path = tmp_path / "metrics.jsonl"
    text, pattern = BAD_FILES[kind]
    if kind == "utf-8":
        path.write_bytes(text.encode() + b"\xff\xfe{}\n")
        pattern = r"2: not UTF-8 text"
    else:
        path.write_text(text)
    with pytest.raises(metrics.MetricsError) as exc:
        metrics.read_jsonl(path)
    assert re.match(re.escape(str(path)) + ":" + pattern, str(exc.value)), str(exc.value)
    assert "\n" not in str(exc.value)


def test_records_read_back_keep_extras_nulls_and_unknown_keys_ignored(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(with_field(efficiency=None, extra_final_loss=float("nan"), future=1) + "\n")
    (back,) = metrics.read_jsonl(path)
    assert back.efficiency is None and math.isnan(back.extra["final_loss"])


def test_a_device_or_directory_is_not_read_as_metrics(tmp_path: Path) -> None:
    with pytest.raises(metrics.MetricsError, match=r"^/dev/zero: not a regular file$"):
        metrics.read_jsonl(Path("/dev/zero"))
    with pytest.raises(metrics.MetricsError, match=r": not a regular file$"):
        metrics.read_jsonl(tmp_path)
