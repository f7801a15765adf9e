"""`pyhpc report --cluster`: the page and its plots from Prometheus' range queries, with the
query API faked (no network): GPU-hours per account, the least-used jobs, no figure invented
for stand-in GPUs, private files, one-line refusals, and every metric asked for is one the
exporters (or node_exporter) export."""
from __future__ import annotations

import io
import json
import math
import re
import stat
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from test_alert_rules import NODE_EXPORTER, exported, metric_names

from pyhpc.cli import main as cli
from pyhpc.errors import PyhpcError
from pyhpc.monitor import cluster_report, prometheus

NOW = 1_800_000_000.0
PNG = b"\x89PNG\r\n\x1a\n"
JOBS = {"busy": {"jobid": "101", "user": "user1", "account": "lab"},
        "sleep": {"jobid": "102", "user": "user2", "account": "teaching"},
        "gpu": {"jobid": "103", "user": "user1", "account": "lab"}}


def answers(win: cluster_report.Window) -> dict[str, list[dict[str, Any]]]:
    """What the faked Prometheus holds: two CPU jobs of 2 CPUs each (one busy, one asleep)
    and a job on 2 stand-in GPUs (held, no utilization), over the whole window."""
    def series(labels: dict[str, str], value: float) -> dict[str, Any]:
        return {"metric": labels, "values": [[t, str(value)] for t in win.times]}

    return {
        "nodes": [series({"state": "idle"}, 2), series({"state": "allocated"}, 2)],
        "nodes_ok": [series({}, 1)],
        "host_cpu": [series({"instance": "localhost"}, 0.5)],
        "gpus_allocated": [series({}, 0.5)],
        "jobs": [series({"state": "running"}, 3), series({"state": "pending"}, 1)],
        "jobs_ok": [series({}, 1)],
        "gpus_by_account": [series({"account": "lab"}, 2)],
        "cpus_held": [series(JOBS[j], 2) for j in JOBS],
        "cpu_used": [series(JOBS["busy"], 2), series(JOBS["sleep"], 0.02),
                     series(JOBS["gpu"], 1)],
        "gpus_held": [series(JOBS["gpu"], 2)],
        "gpu_used": [],  # stand-ins: no driver, no utilization
    }


def serve(monkeypatch, win: cluster_report.Window,
          held: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Prometheus' query_range API, faked: each query's answer from ``held``, in the
    API's own JSON."""
    asked: list[str] = []
    by_query = {q.format(rate=win.rate, step=f"{int(win.step)}s"): name
                for name, q in cluster_report.QUERIES.items()}

    def urlopen(req, timeout: float, context=None):
        address = req.full_url  # a Request: pyhpc adds the credentials
        asked.append(address)
        params = dict(urllib.parse.parse_qsl(address.split("?", 1)[1]))
        result = held[by_query[params["query"]]]
        body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        return io.BytesIO(json.dumps(body).encode())

    monkeypatch.setattr(prometheus.urllib.request, "urlopen", urlopen)
    monkeypatch.delenv(prometheus.ENV, raising=False)
    return asked


@pytest.fixture
def fake_prometheus(monkeypatch) -> list[str]:
    win = cluster_report.window("24h", NOW)
    return serve(monkeypatch, win, answers(win))


def test_the_window_is_aligned_to_a_step_of_at_most_240_points() -> None:
    win = cluster_report.window("24h", NOW + 17)
    assert (win.end - win.start, win.step, win.end % win.step) == (86400, 360, 0)
    assert win.rate == "720s"
    short = cluster_report.window("10m", NOW)
    assert (short.step, short.rate) == (15, "60s")


@pytest.mark.parametrize("since", ["5m", "32d", "24", "1w", "-1h", "24 h", ""])
def test_a_bad_window_is_one_line(since: str) -> None:
    with pytest.raises(cluster_report.ReportError, match=r"^--since: .* from 10m to 31d"):
        cluster_report.window(since, NOW)


def test_the_page_shows_every_plot_gpu_hours_and_the_least_used_jobs(tmp_path: Path,
                                                                     fake_prometheus) -> None:
    out = tmp_path / "report"
    data = cluster_report.write("http://prom:9090", "24h", out, now=NOW)
    assert len(fake_prometheus) == len(cluster_report.QUERIES)
    assert all("/api/v1/query_range?" in a and "step=360" in a for a in fake_prometheus)
    page = (out / "index.html").read_text()
    for name, png in cluster_report.PNG.items():
        assert (out / png).read_bytes()[:8] == PNG
        assert f'<figure id="{name}"><img src="{png}"' in page
    # 2 GPUs held through 241 points of 360 s: 48.2 GPU-hours.
    assert data["gpu_hours"] == {"lab": pytest.approx(48.2)}
    assert "<tr><td>lab</td><td>48.2</td></tr>" in page
    least = [(j["job_id"], j["share"]) for j in data["least_used"]]
    assert least == [("102", pytest.approx(0.01)), ("103", 0.5), ("101", 1.0)]
    assert "<tr><td>102</td><td>user2</td><td>teaching</td><td>2</td><td>1%</td><td>0</td>" in page
    # The stand-in GPU job: 2 GPUs held, their use unknown (n/a), never a made-up figure.
    assert "<tr><td>103</td><td>user1</td><td>lab</td><td>2</td><td>50%</td><td>2</td>" \
           "<td>n/a</td>" in page
    assert data["least_used"][1]["gpu_use"] is None
    assert "From 2027-01-14 08:00 UTC to 2027-01-15 08:00 UTC, a point every 360 s" in page


def test_the_page_is_private_and_the_same_answers_give_the_same_bytes(tmp_path: Path,
                                                                     fake_prometheus) -> None:
    one = cluster_report.write("http://prom:9090", "24h", tmp_path / "a", now=NOW)
    cluster_report.write("http://prom:9090", "24h", tmp_path / "b", now=NOW)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    for path in [Path(one["html"]), *map(Path, one["pngs"])]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes()


def test_a_directory_others_can_write_is_refused_and_nothing_is_written(tmp_path: Path,
                                                                       fake_prometheus) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PyhpcError, match=r"^html: refusing"):
        cluster_report.write("http://prom:9090", "24h", shared / "report", now=NOW)
    assert list(shared.iterdir()) == []


def test_prometheus_that_does_not_answer_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    def urlopen(req, timeout: float, context=None):
        raise prometheus.urllib.error.URLError("Connection refused")

    monkeypatch.setattr(prometheus.urllib.request, "urlopen", urlopen)
    with pytest.raises(PyhpcError, match=r"^prometheus: http://p:1 did not answer"):
        cluster_report.write("http://p:1", "24h", tmp_path / "report", now=NOW)
    assert not (tmp_path / "report").exists()


def test_an_empty_prometheus_gives_a_page_that_says_so(tmp_path: Path, monkeypatch) -> None:
    def urlopen(req, timeout: float, context=None):
        return io.BytesIO(b'{"status": "success", "data": {"resultType": "matrix", "result": []}}')

    monkeypatch.setattr(prometheus.urllib.request, "urlopen", urlopen)
    data = cluster_report.write("http://p:1", "1h", tmp_path / "r", now=NOW)
    page = Path(data["html"]).read_text()
    assert "<td colspan=\"2\">none</td>" in page and "no jobs in this window" in page
    assert data["gpu_hours"] == {} and data["least_used"] == []


def test_cli_writes_the_page_and_names_its_files(tmp_path: Path, fake_prometheus, capsys,
                                                 monkeypatch) -> None:
    monkeypatch.setattr(cluster_report.time, "time", lambda: NOW)
    out = tmp_path / "page"
    assert cli.main(["report", "--cluster", "--html", str(out), "--prometheus",
                     "http://prom:9090"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"page: {out / 'index.html'}" and len(lines) == 5


@pytest.mark.parametrize("argv, message", [
    (["report"], "report: name run or sweep directories, or --cluster --html DIR"),
    (["report", "--cluster"], "report: --cluster takes --html DIR"),
    (["report", "--html", "x"], "report: --cluster takes --html DIR"),
    (["report", "--cluster", "--html", "x", "runs/a"], "; got DIR"),
    (["report", "--cluster", "--html", "x"], "--prometheus: none given and "
                                             "$PYHPC_PROMETHEUS_URL is not set"),
    (["report", "--cluster", "--html", "x", "--prometheus", "ftp://p"], "--prometheus: "),
    (["report", "--cluster", "--html", "x", "--prometheus", "http://p", "--since", "1y"],
     "--since: '1y' is not allowed"),
])
def test_cli_refusals_are_one_line_with_exit_2(argv: list[str], message: str, capsys,
                                               monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(prometheus.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyhpc: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_every_metric_the_report_asks_for_is_exported(tmp_path: Path, fake_slurm) -> None:
    known = exported(tmp_path, fake_slurm) | NODE_EXPORTER | {"node_cpu_seconds_total"}
    for name, promql in cluster_report.QUERIES.items():
        names = metric_names(promql.format(rate="60s", step="15s"))
        assert names and names <= known, (name, names - known)


def ticks(fig: Any) -> list[list[str]]:
    """Each panel's x tick labels as matplotlib draws them."""
    fig.canvas.draw()
    return [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes]


def test_time_axes_show_clock_times_in_utc_with_the_date_across_days() -> None:
    day = cluster_report.window("24h", NOW)  # 2027-01-14 08:00 to 01-15 08:00
    hour = cluster_report.window("1h", NOW)  # 07:00 to 08:00 the same day
    for win, shape in ((day, r"\d\d-\d\d\n\d\d:\d\d"), (hour, r"\d\d:\d\d")):
        held = {name: [(s["metric"], [(float(t), float(v)) for t, v in s["values"]])
                       for s in series] for name, series in answers(win).items()}
        for fig in (cluster_report.utilization_figure(held, win),
                    cluster_report.jobs_figure(held, win)):
            for ax, labels in zip(fig.axes, ticks(fig), strict=True):
                assert ax.get_xlabel() == "time (UTC)"
                assert labels and all(re.fullmatch(shape, t) for t in labels), labels
    hour_fig = cluster_report.jobs_figure({"jobs": [], "jobs_ok": []}, hour)
    assert ticks(hour_fig)[0][0] == "07:00" and ticks(hour_fig)[0][-1] == "08:00"
    assert "01-15\n00:00" in ticks(cluster_report.jobs_figure({"jobs": [], "jobs_ok": []},
                                                             day))[0]


def test_a_state_seen_at_one_point_is_drawn_with_its_zeros_and_a_gap_stays_a_gap() -> None:
    """A short job shows at one point only (the exporter has no series for a state with no
    jobs); where squeue answered, the other points are 0; where it did not, nothing."""
    win = cluster_report.window("10m", NOW)
    times = win.times
    ok = [(t, 1.0) for t in times if t != times[5]]
    held = {"jobs": [({"state": "running"}, [(times[3], 2.0)])], "jobs_ok": [({}, ok)]}
    fig = cluster_report.jobs_figure(held, win)
    (line,) = fig.axes[0].get_lines()
    y = list(line.get_ydata())
    assert y[3] == 2.0 and y[:3] == [0.0] * 3 and math.isnan(y[5])
    assert sum(1 for v in y if v == 0.0) == len(times) - 2
    assert line.get_marker() == "."  # a point alone is drawn too
    assert not list(fig.axes[0].texts)  # not "no jobs"
    empty = cluster_report.jobs_figure({"jobs": [], "jobs_ok": [({}, ok)]}, win)
    assert [t.get_text() for t in empty.axes[0].texts] == ["no jobs in this window"]


def test_gpu_hours_agree_between_table_chart_and_json(tmp_path: Path, monkeypatch) -> None:
    """One GPU held for 30 s: 0.00833 GPU-hours everywhere (3 significant digits)."""
    win = cluster_report.window("10m", NOW)
    held = {name: [] for name in cluster_report.QUERIES}
    held["gpus_by_account"] = [{"metric": {"account": "lab"},
                                "values": [[win.times[-2], "1"], [win.times[-1], "1"]]}]
    serve(monkeypatch, win, held)
    data = cluster_report.write("http://prom:9090", "10m", tmp_path / "r", now=NOW)
    assert data["gpu_hours"] == {"lab": 0.00833}
    assert "<tr><td>lab</td><td>0.00833</td></tr>" in Path(data["html"]).read_text()
    fig = cluster_report.gpu_hours_figure(data["gpu_hours"])
    assert [t.get_text() for t in fig.axes[0].texts] == ["0.00833"]


@pytest.mark.parametrize("value, text", [(48.2, "48.2"), (0.008333, "0.00833"),
                                         (1234.5, "1230"), (2.0, "2.00"), (0.0, "0")])
def test_every_figure_has_three_significant_digits(value: float, text: str) -> None:
    assert cluster_report.shown(value) == text
    assert cluster_report.rounded(value) == float(text)


def test_the_least_used_chart_labels_its_bars_as_the_table_does(tmp_path: Path,
                                                                fake_prometheus) -> None:
    data = cluster_report.write("http://prom:9090", "24h", tmp_path / "r", now=NOW)
    jobs = cluster_report.job_use(
        {name: [(s["metric"], [(float(t), float(v)) for t, v in s["values"]]) for s in series]
         for name, series in answers(cluster_report.window("24h", NOW)).items()}, 360)
    fig = cluster_report.least_figure(jobs)
    ax = fig.axes[0]
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["102 (user2)", "103 (user1)",
                                                            "101 (user1)"]
    assert [t.get_text() for t in ax.texts] == ["1%", "50%", "100%"]
    page = Path(data["html"]).read_text()
    for job, pct in (("102", "1%"), ("103", "50%"), ("101", "100%")):
        assert re.search(rf"<tr><td>{job}</td><td>[^<]*</td><td>[^<]*</td><td>2</td>"
                         rf"<td>{pct}</td>", page)
