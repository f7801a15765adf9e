"""Scaling report: table and PNG."""
from __future__ import annotations

from pathlib import Path

from pyhpc import metrics, report


def summary(workers: int, rate: float) -> metrics.Summary:
    env = metrics.Environment("2.13.0", "gloo", str(workers), ["cpu1"], 32, mode="synthetic")
    return metrics.summarize([metrics.RankTimes(r, "cpu1", [1.0, 32 * workers / rate])
                              for r in range(workers)], 1, env)


def test_report_collects_runs_prints_a_table_and_writes_a_png(tmp_path: Path) -> None:
    for workers, rate in ((1, 100.0), (2, 180.0)):
        run = tmp_path / f"nodes{workers}"
        run.mkdir()
        metrics.write_jsonl(run / "metrics.jsonl", [summary(workers, rate)])
    runs = metrics.efficiency(report.collect([tmp_path]))
    text = report.table(runs)
    assert "samples/s" in text.splitlines()[0]
    assert [line.split()[-2] for line in text.splitlines()[2:]] == ["100%", "90%"]
    png = report.plot(runs, tmp_path / "out" / "scaling.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
