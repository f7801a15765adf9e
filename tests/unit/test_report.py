"""Scaling report: table and PNG."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from pyhpc import plots
from pyhpc.errors import PyhpcError
from pyhpc.files import FileError
from pyhpc.train import metrics, report


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


PNG = b"\x89PNG\r\n\x1a\n"


def sweep(top: Path, *names: str) -> list[Path]:
    """Run directories under ``top``, each with one metrics.jsonl (1, 2, ... workers; 90%
    weak-scaling efficiency from 2 workers on)."""
    dirs = []
    for workers, name in enumerate(names, start=1):
        run = top / name
        run.mkdir(parents=True)
        rate = 100.0 * workers * (1.0 if workers == 1 else 0.9)
        metrics.write_jsonl(run / "metrics.jsonl", [summary(workers, rate)])
        dirs.append(run)
    return dirs


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_write_report_puts_the_png_beside_the_runs_it_compares(tmp_path: Path) -> None:
    a, b = sweep(tmp_path / "sweep", "nodes1", "nodes2")
    runs, (png, *_) = report.write_report([a, b], "weak", None)
    assert png == tmp_path / "sweep" / "scaling.png"
    assert png.read_bytes()[:8] == PNG
    assert [r.workers for r in runs] == [1, 2] and runs[1].efficiency == pytest.approx(0.9)
    assert {r.scaling for r in runs} == {"weak"}
    _, (png, *_) = report.write_report([tmp_path / "sweep"], "strong", None)
    assert png == tmp_path / "sweep" / "scaling.png"
    _, (png, *_) = report.write_report([a / "metrics.jsonl"], "weak", None)
    assert png == a / "scaling.png"


def test_write_report_into_an_existing_directory_says_where(tmp_path: Path) -> None:
    dirs = sweep(tmp_path / "sweep", "nodes1", "nodes2")
    (tmp_path / "plots").mkdir()
    _, (png, *_) = report.write_report(dirs, "weak", tmp_path / "plots")
    assert png == tmp_path / "plots" / "scaling.png" and png.read_bytes()[:8] == PNG


def test_write_report_creates_a_missing_parent_and_leaves_no_temp_file(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PYHPC_GROUP_READABLE", raising=False)
    dirs = sweep(tmp_path / "sweep", "nodes1", "nodes2")
    _, (png, *_) = report.write_report(dirs, "weak", tmp_path / "new" / "deep" / "weak.png")
    assert png == tmp_path / "new" / "deep" / "weak.png" and png.read_bytes()[:8] == PNG
    assert listing(tmp_path / "new") == ["deep", "deep/weak.png"]
    assert stat.S_IMODE(png.stat().st_mode) == 0o600


def test_write_report_replaces_a_planted_link_instead_of_writing_through_it(
        tmp_path: Path) -> None:
    dirs = sweep(tmp_path / "sweep", "nodes1", "nodes2")
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    (tmp_path / "sweep" / "scaling.png").symlink_to(victim)
    _, (png, *_) = report.write_report(dirs, "weak", None)
    assert victim.read_text() == "victim\n"
    assert not png.is_symlink() and png.read_bytes()[:8] == PNG


@pytest.mark.parametrize(("png", "message"), [
    ("plot.jpg", "png: must end in .png, got 'plot.jpg'"),
    ("plot", "png: must end in .png, got 'plot'"),
    ("notes.txt/plot.png", "png: notes.txt exists and is not a directory"),
    ("notes.txt/a/plot.png", "png: notes.txt/a is under a file, not a directory"),
])
def test_a_bad_png_is_one_line_and_nothing_is_written(tmp_path: Path, monkeypatch, png: str,
                                                      message: str) -> None:
    monkeypatch.chdir(tmp_path)
    dirs = sweep(tmp_path / "sweep", "nodes1", "nodes2")
    (tmp_path / "notes.txt").write_text("keep\n")
    before = listing(tmp_path)
    with pytest.raises(FileError) as exc:
        report.write_report(dirs, "weak", Path(png))
    assert str(exc.value) == message and exc.value.arg == "png"
    assert listing(tmp_path) == before and (tmp_path / "notes.txt").read_text() == "keep\n"


@pytest.mark.parametrize(("content", "where", "what"), [
    (b'{"workers": \n', 1, "not valid JSON"),
    (b"[]\n", 1, "expected a JSON object, got list"),
    (b'{"workers": 1}\n', 1, "not a metrics record; missing"),
    (b"\n\xff\n", 2, "not UTF-8 text"),
])
def test_a_bad_metrics_file_fails_the_report_naming_file_and_line(
        tmp_path: Path, content: bytes, where: int, what: str) -> None:
    dirs = sweep(tmp_path / "sweep", "nodes1", "nodes2")
    bad = tmp_path / "sweep" / "nodes3" / "metrics.jsonl"
    bad.parent.mkdir()
    bad.write_bytes(content)
    before = listing(tmp_path)
    with pytest.raises(metrics.MetricsError) as exc:
        report.write_report([*dirs, bad.parent], "weak", None)
    assert str(exc.value).startswith(f"{bad}:{where}: {what}")
    assert "\n" not in str(exc.value) and isinstance(exc.value, PyhpcError)
    assert listing(tmp_path) == before


def test_write_report_refuses_an_unknown_scaling_or_no_runs_first(tmp_path: Path) -> None:
    dirs = sweep(tmp_path / "sweep", "nodes1")
    before = listing(tmp_path)
    with pytest.raises(metrics.MetricsError,
                       match="^scaling: 'linear' is not allowed; allowed: weak, strong$"):
        report.write_report(dirs, "linear", None)
    with pytest.raises(metrics.MetricsError, match="^dirs: no metrics.jsonl under "):
        report.write_report([tmp_path / "empty"], "weak", None)
    assert listing(tmp_path) == before


def with_epoch(run: metrics.Summary, samples: int) -> metrics.Summary:
    return metrics.Summary(**{**run.__dict__, "extra": {"samples_per_epoch": samples}})


def test_throughput_axis_starts_at_zero_and_shows_ideal_scaling(tmp_path: Path,
                                                               monkeypatch) -> None:
    saved = {}
    monkeypatch.setattr(plots, "save", lambda fig, path: saved.setdefault("fig", fig) and path)
    runs = metrics.efficiency([summary(1, 100.0), summary(2, 180.0), summary(4, 320.0)])
    report.plot(runs, tmp_path / "scaling.png")
    rate = saved["fig"].axes[0]
    assert rate.get_ylim()[0] == 0
    lines = {line.get_label(): list(line.get_ydata()) for line in rate.get_lines()}
    measured = next(k for k in lines if not k.endswith("ideal"))
    assert lines[f"{measured}: ideal"] == pytest.approx([100.0, 200.0, 400.0])


def test_time_to_train_is_epochs_of_samples_at_the_measured_rate() -> None:
    run = with_epoch(summary(2, 200.0), 1500)
    assert report.time_to_train(run, 10) == pytest.approx(10 * 1500 / 200.0)
    with pytest.raises(PyhpcError, match=r"^time_to_train: run 1 has no samples_per_epoch"):
        report.time_to_train(summary(1, 100.0), 10)


def test_report_draws_time_to_train_beside_the_scaling_plot(tmp_path: Path) -> None:
    for workers, batch in ((1, 32), (2, 32), (1, 64), (2, 64)):
        run = tmp_path / f"b{batch}-n{workers}"
        run.mkdir()
        env = metrics.Environment("2.13.0", "gloo", "7", ["cpu1"], batch, mode="digits")
        one = metrics.summarize([metrics.RankTimes(r, "cpu1", [1.0, 0.1]) for r in range(workers)],
                                1, env, extra={"samples_per_epoch": 1437})
        metrics.write_jsonl(run / "metrics.jsonl", [one])
    runs, written = report.write_report([tmp_path], "weak", None, epochs_to_train=30)
    assert [p.name for p in written] == ["scaling.png", "time-to-train.png"]
    assert all(p.parent == tmp_path and p.read_bytes()[:8] == PNG for p in written)


def test_time_to_train_without_the_figure_writes_nothing(tmp_path: Path) -> None:
    dirs = sweep(tmp_path, "n1", "n2")
    before = listing(tmp_path)
    with pytest.raises(PyhpcError, match="^time_to_train: run 1 has no samples_per_epoch"):
        report.write_report(dirs, "weak", None, epochs_to_train=5)
    assert listing(tmp_path) == before


def test_run_summary_reads_accuracy_throughput_and_paths(tmp_path: Path) -> None:
    metrics.write_jsonl(tmp_path / "metrics.jsonl", [summary(2, 180.0)])
    (tmp_path / "history.json").write_text('[{"epoch": 0, "loss": 2.1, "test_accuracy": 0.5},'
                                           ' {"epoch": 1, "loss": 0.25, "test_accuracy": 0.961}]')
    data = report.run_summary(tmp_path)
    assert (data["epochs"], data["test_accuracy"], data["loss"], data["workers"]) == (2, 0.961, 0.25, 2)
    text = report.summary_text(data)
    assert "test accuracy  0.961 after 2 epochs" in text and "samples/s on 2 workers" in text
    assert f"checkpoint     {tmp_path / 'checkpoint.pt'}" in text
    assert "p50 " in text and "p90 " in text


def test_run_summary_of_a_run_that_wrote_nothing_says_so(tmp_path: Path) -> None:
    (tmp_path / "history.json").write_text("{not json")
    text = report.summary_text(report.run_summary(tmp_path))
    assert "test accuracy  - after 0 epochs" in text and "throughput     - samples/s" in text
