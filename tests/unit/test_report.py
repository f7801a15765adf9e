"""Scaling report: table and PNG."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from pyhpc import metrics, report
from pyhpc.errors import PyhpcError
from pyhpc.files import FileError


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
    runs, png = report.write_report([a, b], "weak", None)
    assert png == tmp_path / "sweep" / "scaling.png"
    assert png.read_bytes()[:8] == PNG
    assert [r.workers for r in runs] == [1, 2] and runs[1].efficiency == pytest.approx(0.9)
    assert {r.scaling for r in runs} == {"weak"}
    _, png = report.write_report([tmp_path / "sweep"], "strong", None)
    assert png == tmp_path / "sweep" / "scaling.png"
    _, png = report.write_report([a / "metrics.jsonl"], "weak", None)
    assert png == a / "scaling.png"


def test_write_report_into_an_existing_directory_says_where(tmp_path: Path) -> None:
    dirs = sweep(tmp_path / "sweep", "nodes1", "nodes2")
    (tmp_path / "plots").mkdir()
    _, png = report.write_report(dirs, "weak", tmp_path / "plots")
    assert png == tmp_path / "plots" / "scaling.png" and png.read_bytes()[:8] == PNG


def test_write_report_creates_a_missing_parent_and_leaves_no_temp_file(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PYHPC_GROUP_READABLE", raising=False)
    dirs = sweep(tmp_path / "sweep", "nodes1", "nodes2")
    _, png = report.write_report(dirs, "weak", tmp_path / "new" / "deep" / "weak.png")
    assert png == tmp_path / "new" / "deep" / "weak.png" and png.read_bytes()[:8] == PNG
    assert listing(tmp_path / "new") == ["deep", "deep/weak.png"]
    assert stat.S_IMODE(png.stat().st_mode) == 0o600


def test_write_report_replaces_a_planted_link_instead_of_writing_through_it(
        tmp_path: Path) -> None:
    dirs = sweep(tmp_path / "sweep", "nodes1", "nodes2")
    victim = tmp_path / "victim"
    victim.write_text("victim\n")
    (tmp_path / "sweep" / "scaling.png").symlink_to(victim)
    _, png = report.write_report(dirs, "weak", None)
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
