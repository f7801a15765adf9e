"""Throughput maths on synthetic timings."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from pyhpc import metrics

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
    with pytest.raises(metrics.MetricsError, match="scaling: 'linear' is not allowed; allowed: weak, strong"):
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
