"""`pyhpc report --cluster`: the page and its plots from Prometheus' range queries, with the
query API faked (no network): GPU-hours per account, the least-used jobs, no figure invented
for stand-in GPUs, private files, one-line refusals, and every metric asked for is one the
exporters (or node_exporter) export."""
from __future__ import annotations

import io
import json
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
    times = [win.start + i * win.step for i in range(int((win.end - win.start) / win.step) + 1)]

    def series(labels: dict[str, str], value: float) -> dict[str, Any]:
        return {"metric": labels, "values": [[t, str(value)] for t in times]}

    return {
        "nodes": [series({"state": "idle"}, 2), series({"state": "allocated"}, 2)],
        "host_cpu": [series({"instance": "localhost"}, 0.5)],
        "gpus_allocated": [series({}, 0.5)],
        "jobs": [series({"state": "running"}, 3), series({"state": "pending"}, 1)],
        "gpus_by_account": [series({"account": "lab"}, 2)],
        "cpus_held": [series(JOBS[j], 2) for j in JOBS],
        "cpu_used": [series(JOBS["busy"], 2), series(JOBS["sleep"], 0.02),
                     series(JOBS["gpu"], 1)],
        "gpus_held": [series(JOBS["gpu"], 2)],
        "gpu_used": [],  # stand-ins: no driver, no utilization
    }


@pytest.fixture
def fake_prometheus(monkeypatch) -> list[str]:
    asked: list[str] = []
    win = cluster_report.window("24h", NOW)
    held = answers(win)
    by_query = {q.format(rate=win.rate): name for name, q in cluster_report.QUERIES.items()}

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
        names = metric_names(promql.format(rate="60s"))
        assert names and names <= known, (name, names - known)
