"""pyhpc jobstats: accounting read from sacct's text, hints from figures (table cases), the
job-end record (private, readable by its owner), Prometheus' answers, and the CLI's one
line for a job that is not yours. Slurm is faked through pyhpc.slurm's RUNNER."""
from __future__ import annotations

import errno
import io
import json
import os
import stat
from pathlib import Path

import pytest

from pyhpc import files
from pyhpc.cli import main as cli
from pyhpc.errors import PyhpcError
from pyhpc.monitor import hints, jobstats, prometheus, record

G = 1 << 30
# JobID|JobIDRaw|User|Account|Partition|State|ElapsedRaw|TimelimitRaw|TotalCPU|AllocCPUS|
# NNodes|NTasks|MaxRSS|ReqMem|AllocTRES|Start|End
SACCT = (
    "4242|4242|alice|lab|gpu|COMPLETED|3600|600|1:00:00|8|1|||8G|billing=8,cpu=8,gres/gpu=4,"
    "mem=8G,node=1|2026-11-25T10:00:00|2026-11-25T11:00:00\n"
    "4242.batch|4242.batch||lab||COMPLETED|3600||59:00.000|8|1|1|200M||cpu=8,mem=8G,node=1|"
    "2026-11-25T10:00:00|2026-11-25T11:00:00\n"
    "4242.0|4242.0||lab||COMPLETED|3500||01:00.500|4|1|4|64M||cpu=4,mem=8G,node=1|"
    "2026-11-25T10:00:00|2026-11-25T11:00:00\n")


@pytest.fixture
def sacct(fake_slurm, monkeypatch):
    fake_slurm.answers["sacct"] = (0, SACCT)
    monkeypatch.delenv(prometheus.ENV, raising=False)
    return fake_slurm


def test_accounting_reads_the_job_line_and_its_steps_largest_node_memory(sacct) -> None:
    (job,) = jobstats.parse_accounting(SACCT)
    assert (job.job_id, job.user, job.state, job.elapsed_s, job.cpus, job.gpus) == \
        ("4242", "alice", "COMPLETED", 3600, 8, 4)
    assert job.total_cpu_s == 3600.0 and job.time_limit_s == 36000
    assert job.mem_requested_bytes == 8 * G
    assert job.step_mem_peak_bytes == 4 * 64 << 20  # 4 tasks of 64M on one node > 200M


@pytest.mark.parametrize("text, seconds", [("00:00.366", 0.366), ("59:00.000", 3540.0),
                                           ("01:02:03", 3723.0), ("1-00:00:01", 86401.0)])
def test_total_cpu_in_every_form_sacct_prints(text, seconds) -> None:
    assert jobstats.cpu_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, cpus, nodes, per_node", [
    ("8G", 8, 2, 4 * G), ("1024M", 1, 1, G), ("4000Mn", 8, 2, 4000 << 20),
    ("1000Mc", 8, 2, 4000 << 20), ("", 1, 1, None), ("2048", 1, 1, 2 << 30)])
def test_requested_memory_per_node_in_old_and_new_forms(text, cpus, nodes, per_node) -> None:
    assert jobstats.requested_memory(text, cpus, nodes) == per_node


def figures(**kw) -> hints.Figures:
    base = dict(state="COMPLETED", elapsed_s=3600, time_limit_s=7200, cpus=1, nodes=1,
                cpu_efficiency=0.95, mem_peak_bytes=3 * G, mem_requested_bytes=4 * G, gpus=0)
    return hints.Figures(**{**base, **kw})


@pytest.mark.parametrize("kw, expected", [
    ({}, []),
    ({"gpus": 4, "gpus_used": 1, "gpu_util_mean": 0.2},
     ["asked for 4 GPUs, used 1: use --gpus-per-node 1"]),
    ({"gpus": 8, "nodes": 2, "gpus_used": 4, "gpu_util_mean": 0.5},
     ["asked for 8 GPUs, used 4: use --gpus-per-node 2"]),
    ({"gpus": 2, "gpus_used": 0, "gpu_util_mean": 0.0},
     ["asked for 2 GPUs, used none: run it on CPUs, or check that the code puts its work on "
      "the GPU (torch.cuda.is_available() in the job)"]),
    ({"gpus": 2, "gpus_used": 2, "gpu_util_mean": 0.3},
     ["GPU utilization 30% on average: the GPUs waited for data; try more DataLoader workers "
      "(--cpus-per-task) or larger batches"]),
    ({"gpus": 2}, []),  # no GPU figures: no GPU hint, never a guess
    ({"mem_peak_bytes": int(0.03 * 64 * G), "mem_requested_bytes": 64 * G},
     ["memory peak 3% of the request: ask for --mem 3G"]),
    ({"mem_peak_bytes": 100 << 20, "mem_requested_bytes": 4 * G},
     ["memory peak 2% of the request: ask for --mem 256M"]),
    ({"mem_peak_bytes": int(3.8 * G)},
     ["memory peak 95% of the request: close to the limit; ask for --mem 5G"]),
    ({"state": "OUT_OF_MEMORY"}, ["the job ran out of memory: ask for --mem 8G (twice the "
                                  "request)"]),
    ({"mem_peak_bytes": None}, []),
    ({"cpus": 8, "cpu_efficiency": 0.12},
     ["CPU efficiency 12%: about 1 of 8 CPUs were busy; ask for 1 (--cpus-per-task), or give "
      "the others work (threads, workers)"]),
    ({"cpu_efficiency": 0.2},
     ["CPU efficiency 20%: the CPU mostly waited (on files or the network); read data in "
      "larger pieces or from node-local storage"]),
    ({"cpu_efficiency": 0.2, "gpus": 1, "gpus_used": 1, "gpu_util_mean": 0.9}, []),
    ({"cpus": 8, "cpu_efficiency": 0.1, "elapsed_s": 30, "time_limit_s": None}, []),
    ({"time_limit_s": 86400},
     ["ran 4% of its time limit: ask for --time 01:15:00; shorter jobs start sooner "
      "(backfill)"]),
    ({"state": "TIMEOUT", "time_limit_s": 3600}, []),
])
def test_hints(kw, expected) -> None:
    assert hints.hints(figures(**kw)) == expected


@pytest.mark.parametrize("nbytes, option", [(1, "256M"), (300 << 20, "512M"), (G, "1G"),
                                            (G + 1, "2G"), (int(2.5 * G), "3G")])
def test_mem_option_never_asks_for_less_than_was_used(nbytes, option) -> None:
    assert hints.mem_option(nbytes) == option


def test_summary_without_gpu_figures_has_nulls_and_the_sacct_hints(sacct, tmp_path) -> None:
    data = jobstats.summary(jobstats.find("4242", me="alice"), jobstats.Sources(tmp_path))
    assert data["cpu_efficiency"] == pytest.approx(3600 / (3600 * 8))
    assert data["mem_peak_bytes"] == 256 << 20 and data["mem_requested_bytes"] == 8 * G
    for key in ("gpu_util_mean", "gpu_util_peak", "gpu_mem_peak_bytes", "gpu_source"):
        assert data[key] is None
    assert any(h.startswith("memory peak 3% of the request") for h in data["hints"])
    assert [c[0] for c in sacct.calls] == ["sacct"]


def stored(tmp_path: Path, gpu: prometheus.GpuFigures | None) -> Path:
    store = tmp_path / "store"
    store.mkdir(mode=0o750)
    record.write(store, record.Record("4242", "alice", 0.0, 3600.0, gpu, 3 * G), None)
    return store


def test_the_job_end_record_gives_gpu_figures_and_the_cgroups_peak(sacct, tmp_path) -> None:
    store = stored(tmp_path, prometheus.GpuFigures(0.2, 0.9, 20 * G, 4, 1))
    data = jobstats.summary(jobstats.find("4242", me="alice"), jobstats.Sources(store))
    assert (data["gpu_util_mean"], data["gpu_util_peak"], data["gpu_mem_peak_bytes"]) == \
        (0.2, 0.9, 20 * G)
    assert data["mem_peak_bytes"] == 3 * G and data["gpu_source"] == "record"
    assert data["hints"][0] == "asked for 4 GPUs, used 1: use --gpus-per-node 1"


def test_the_record_is_written_privately_and_never_through_a_link(tmp_path) -> None:
    store = stored(tmp_path, None)
    path = store / "4242.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert json.loads(path.read_text())["schema"] == record.SCHEMA
    (store / "4243.json").symlink_to(tmp_path / "elsewhere")
    record.write(store, record.Record("4243", "bob", 0.0, 1.0, None, None), None)
    assert not (tmp_path / "elsewhere").exists() and not (store / "4243.json").is_symlink()


def test_writing_a_record_leaves_the_process_private(tmp_path) -> None:
    """0640 is for the record alone: what the process writes next is private again."""
    assert not files.group_readable()
    path = stored(tmp_path, None) / "4242.json"
    assert path.stat().st_mode & 0o777 == 0o640 and not files.group_readable()


def test_a_store_others_can_write_is_refused(tmp_path) -> None:
    store = tmp_path / "open"
    store.mkdir()
    store.chmod(0o777)
    with pytest.raises(PyhpcError, match="^store: refusing"):
        record.write(store, record.Record("1", "a", 0.0, 1.0, None, None), None)


def test_the_owner_gets_read_access_by_an_acl_entry(tmp_path) -> None:
    blob = files.acl_reader(0o640, 1234)
    assert blob[:4] == (2).to_bytes(4, "little") and len(blob) == 4 + 5 * 8
    assert (0x02, 4, 1234) in [tuple(int.from_bytes(blob[i:i + n], "little") for i, n in
                                     ((o, 2), (o + 2, 2), (o + 4, 4))) for o in range(4, 44, 8)]
    path = tmp_path / "f"
    path.write_text("x")
    path.chmod(0o640)
    try:
        assert files.let_read(path, 1234) in (True, False)
    except PyhpcError as exc:  # a filesystem that refuses xattrs outright
        assert str(exc).startswith("store:")
    else:
        try:
            assert os.getxattr(path, files.ACL_XATTR) == blob
        except OSError as exc:
            assert exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA)


def test_a_record_that_is_not_ours_is_one_line(tmp_path) -> None:
    (tmp_path / "7.json").write_text('{"job_id_raw": "7"}')
    with pytest.raises(PyhpcError, match=r"^record: .*not a pyhpc jobstats record$"):
        record.read(tmp_path, "7")


def test_prometheus_figures_come_from_the_query_api(sacct, tmp_path, monkeypatch) -> None:
    asked: list[str] = []

    def urlopen(req, timeout: float, context=None):
        address = req.full_url  # a Request: pyhpc adds the credentials
        asked.append(address)
        # nvidia_gpu_duty_cycle is a percentage, as the Jobstats GPU exporter's.
        value = "20e9" if "memory" in address else ("90" if "max_over" in address else "50")
        body = {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"minor_number": "0"}, "value": [1, value]},
            {"metric": {"minor_number": "1"}, "value": [1, "1" if "avg" in address else value]}]}}
        return io.BytesIO(json.dumps(body).encode())

    monkeypatch.setattr(prometheus.urllib.request, "urlopen", urlopen)
    data = jobstats.summary(jobstats.find("4242", me="alice"),
                            jobstats.Sources(tmp_path, "http://prom:9090"))
    assert data["gpu_util_mean"] == pytest.approx(0.255) and data["gpus_used"] == 1
    assert data["gpu_source"] == "prometheus" and data["gpu_mem_peak_bytes"] == 20e9
    assert all(a.startswith("http://prom:9090/api/v1/query?query=") for a in asked)
    assert any("jobid%3D%224242%22" in a and "3600s" in a for a in asked)
    assert any("nvidia_gpu_duty_cycle" in a for a in asked)


def test_prometheus_that_does_not_answer_is_one_line(monkeypatch) -> None:
    def urlopen(req, timeout: float, context=None):
        raise prometheus.urllib.error.URLError("Connection refused")

    monkeypatch.setattr(prometheus.urllib.request, "urlopen", urlopen)
    with pytest.raises(PyhpcError, match=r"^prometheus: http://p:1 did not answer"):
        prometheus.gpu_figures("http://p:1", "4242", 0.0, 10.0)


def test_someone_elses_job_is_refused_in_one_line_with_exit_2(sacct, capsys, monkeypatch) -> None:
    monkeypatch.setattr(jobstats, "caller", lambda: "mallory")
    monkeypatch.setattr(jobstats.os, "geteuid", lambda: 1000)
    assert cli.main(["jobstats", "4242"]) == 2
    err = capsys.readouterr().err
    assert err == "pyhpc: error: job: 4242 is not yours; pyhpc jobstats shows only your own jobs\n"
    assert "alice" not in err


def test_a_job_accounting_does_not_show_is_one_line(sacct, capsys) -> None:
    sacct.answers["sacct"] = (0, "")
    assert cli.main(["jobstats", "999"]) == 2
    assert capsys.readouterr().err.startswith("pyhpc: error: job: 999 is not in accounting")


def test_jobstats_json_has_every_documented_key(sacct, capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(jobstats, "caller", lambda: "alice")
    assert cli.main(["jobstats", "4242", "--json", "--store", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("cpu_efficiency", "mem_peak_bytes", "mem_requested_bytes", "gpu_util_mean",
                "gpu_util_peak", "gpu_mem_peak_bytes", "hints"):
        assert key in data
    assert 0 <= data["cpu_efficiency"] <= 1


def test_jobstats_text_names_the_figures_and_the_hints(sacct, capsys, monkeypatch,
                                                       tmp_path) -> None:
    monkeypatch.setattr(jobstats, "caller", lambda: "alice")
    assert cli.main(["jobstats", "4242", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "CPU efficiency   12% of 8 CPUs" in out and "(no GPU samples)" in out
    assert "hint: memory peak 3% of the request" in out


@pytest.mark.parametrize("job", ["42;rm", "-j", "4242_", "x"])
def test_a_job_id_that_is_not_one_is_refused_before_sacct_runs(sacct, capsys, job) -> None:
    assert cli.main(["jobstats", "--", job]) == 2
    assert capsys.readouterr().err.startswith("pyhpc: error: job: ") and sacct.calls == []
