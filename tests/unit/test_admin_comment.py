"""jobstats' job summary (pyhpc.monitor.admin_comment): what reportseff's own decoder reads
back from it, jobstats' markers, its bound, the Prometheus queries it asks and the labels
it keeps; the AdminComment's one sacctmgr call and the Slurm versions that get it.
Prometheus is faked at its HTTP call, Slurm through pyhpc.slurm's RUNNER."""
from __future__ import annotations

import io
import json
import urllib.parse
from typing import Any

import pytest
from reportseff.job import Job, _get_node_data, _parse_admin_comment_to_dict

from pyhpc.errors import PyhpcError
from pyhpc.monitor import admin_comment, prometheus, record
from pyhpc.slurm import slurm

G = 1 << 30
#: One node, 2 CPUs busy 90 s of a 100 s run, 1.5 GiB of 2 GiB at most; one GPU.
NODE = {"cpus": 2, "total_time": 180.0, "used_memory": 3 * G // 2, "total_memory": 2 * G,
        "gpu_total_memory": {"0": 80 * G}, "gpu_used_memory": {"0": 20 * G},
        "gpu_utilization": {"0": 75.0}}


def test_reportseffs_decoder_reads_back_the_figures() -> None:
    comment = admin_comment.encode({"gpu1": NODE}, 100, 1, 5)
    data = _parse_admin_comment_to_dict(comment)
    assert data == {"gpus": 1, "nodes": {"gpu1": NODE}, "total_time": 100}
    node = _get_node_data(data, data["nodes"]["gpu1"])
    assert (node["CPUEff"], node["MemEff"], node["GPUEff"], node["GPUMem"]) == (
        90.0, 75.0, 75.0, 25.0)
    assert admin_comment.decode(comment) == data


def test_reportseff_takes_its_columns_from_the_comment_over_sacct() -> None:
    """sacct's TotalCPU says 10%; the comment's 90% wins, as for jobstats' own."""
    job = Job("7", "7", None)
    job.update({"JobID": "7", "State": "COMPLETED", "Elapsed": "00:01:40",
                "TotalCPU": "00:20.000", "AllocCPUS": "2", "ReqMem": "2G", "NNodes": "1",
                "AdminComment": admin_comment.encode({"cpu1": NODE}, 100, 0, 5)})
    assert (job.get_entry("CPUEff"), job.get_entry("MemEff")) == (90.0, 75.0)


def test_the_same_figures_give_the_same_text() -> None:
    nodes = {"b": {"cpus": 1, "total_time": 1.0}, "a": {"total_time": 2.0, "cpus": 2}}
    again = dict(reversed(list(nodes.items())))
    assert admin_comment.encode(nodes, 60, 0, 5) == admin_comment.encode(again, 60, 0, 5)


@pytest.mark.parametrize(("nodes", "total_time", "marker"), [
    ({"cpu1": NODE}, 9, "JS1:Short"),  # under two samples of 5 s
    ({}, 60, "JS1:None")])
def test_jobstats_markers_which_reportseff_leaves_alone(nodes, total_time, marker) -> None:
    assert admin_comment.encode(nodes, total_time, 0, 5) == marker
    assert admin_comment.decode(marker) is None
    job = Job("7", "7", None)
    job.update({"JobID": "7", "State": "COMPLETED", "Elapsed": "00:01:40",
                "TotalCPU": "00:20.000", "AllocCPUS": "2", "AdminComment": marker})
    assert job.get_entry("CPUEff") == 10.0  # sacct's figure: the marker has none


def test_a_summary_past_the_bound_is_refused_not_cut() -> None:
    many = {f"n{i:05d}": {"cpus": i, "total_time": i * 7.3, "used_memory": i * 7919}
            for i in range(4000)}
    with pytest.raises(PyhpcError, match=r"^admin comment: the summary of 4000 nodes takes "
                                         r"\d+ characters, more than 16384$"):
        admin_comment.encode(many, 600, 0, 5)


@pytest.mark.parametrize("text", ["JS1:ab cd", "JS1:None\n", "js1:none", "JS2:abc"])
def test_decode_takes_only_what_this_module_writes(text) -> None:
    with pytest.raises(PyhpcError, match="^admin comment: not a jobstats summary$"):
        admin_comment.decode(text)


@pytest.mark.parametrize(("text", "seconds"), [("5s", 5), ("1m", 60), ("2h", 7200)])
def test_scrape_interval(text, seconds) -> None:
    assert admin_comment.interval_seconds(text) == seconds


@pytest.mark.parametrize("text", ["0s", "5", "5 s", "-5s", "1d"])
def test_a_scrape_interval_that_is_not_one_is_one_line(text) -> None:
    with pytest.raises(PyhpcError, match="^--scrape-interval: .* is not a duration"):
        admin_comment.interval_seconds(text)


def fake_prometheus(monkeypatch, answers: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Prometheus' query API: each query's series by the first metric name it names."""
    asked: list[str] = []

    def urlopen(req, timeout: float, context=None):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(req.full_url).query)["query"][0]
        asked.append(query)
        name = next((n for n in answers if n in query), None)
        body = {"status": "success", "data": {"resultType": "vector",
                                              "result": answers.get(name, []) if name else []}}
        return io.BytesIO(json.dumps(body).encode())

    monkeypatch.setattr(prometheus.urllib.request, "urlopen", urlopen)
    return asked


def series(value: float, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [1, str(value)]}


def test_the_summary_asks_jobstats_queries_and_keeps_only_node_and_minor_labels(
        monkeypatch) -> None:
    asked = fake_prometheus(monkeypatch, {
        "pyhpc_job_gpus": [series(1)],
        "cgroup_memory_total_bytes": [series(2 * G, node="gpu1"),
                                      series(G, node='gpu1",evil="1')],  # no host name
        "cgroup_memory_rss_bytes": [series(1.5 * G, node="gpu1")],
        "cgroup_cpu_total_seconds": [series(180.04, node="gpu1")],
        "cgroup_cpus": [series(2, node="gpu1")],
        "nvidia_gpu_memory_total_bytes": [series(80 * G, node="gpu1", minor_number="0")],
        "nvidia_gpu_memory_used_bytes": [series(20 * G, node="gpu1", minor_number="0"),
                                         series(G, node="gpu1", minor_number="x")],
        "nvidia_gpu_duty_cycle": [series(74.96, node="gpu1", minor_number="0")]})
    comment = admin_comment.summary("http://p:1", "4242", 1000.0, 1100.0, 5)
    assert _parse_admin_comment_to_dict(comment) == {
        "gpus": 1, "nodes": {"gpu1": NODE}, "total_time": 100}
    own = 'jobid="4242",step="",task=""'
    assert f"max_over_time(cgroup_cpu_total_seconds{{{own}}}[100s])" in asked
    assert (f"max_over_time(((cgroup_memory_rss_bytes{{{own}}} + cgroup_memory_shmem_bytes"
            f"{{{own}}}) or 1 * cgroup_memory_rss_bytes{{{own}}})[100s:])") in asked
    assert 'avg_over_time(nvidia_gpu_duty_cycle{jobid="4242"}[100s])' in asked


def test_a_cpu_job_is_not_asked_about_gpus_and_a_short_one_about_nothing(monkeypatch) -> None:
    asked = fake_prometheus(monkeypatch, {"cgroup_cpus": [series(1, node="cpu1")]})
    comment = admin_comment.summary("http://p:1", "7", 0.0, 60.0, 5)
    assert _parse_admin_comment_to_dict(comment)["nodes"] == {"cpu1": {"cpus": 1}}
    assert not any("nvidia" in q for q in asked)
    asked.clear()
    assert admin_comment.summary("http://p:1", "7", 0.0, 9.0, 5) == "JS1:Short" and not asked


@pytest.mark.parametrize(("printed", "stores"), [
    ("slurm-wlm 22.05.8\n", False), ("slurm 23.02.1\n", True), ("slurm 25.11.0\n", True),
    ("", False)])
def test_only_a_slurm_whose_sacctmgr_keeps_case_gets_the_comment(fake_slurm, printed,
                                                                 stores) -> None:
    fake_slurm.answers["sacctmgr"] = (0, printed)
    assert slurm.stores_admin_comment() is stores


def test_the_comment_is_one_sacctmgr_update_of_the_raw_job(fake_slurm) -> None:
    rec = record.Record("4242", "alice", 0.0, 60.0, None, None, "JS1:None")
    fake_slurm.answers["sacctmgr"] = (0, "slurm 23.02.1\n")
    record.store_admin_comment(rec)
    assert fake_slurm.calls == [
        ["sacctmgr", "--version"],
        ["sacctmgr", "--immediate", "update", "job", "where", "jobid=4242", "set",
         "AdminComment=JS1:None"]]
    fake_slurm.calls.clear()
    fake_slurm.answers["sacctmgr"] = (0, "slurm-wlm 22.05.8\n")
    record.store_admin_comment(rec)
    assert fake_slurm.calls == [["sacctmgr", "--version"]]  # 22.05 would lowercase it


@pytest.mark.parametrize(("job", "text"), [("4242", "JS1:a b"), ("4242", "x'; drop"),
                                           ("4242_1", "JS1:None"), ("4242", "")])
def test_a_comment_or_job_id_outside_the_alphabet_never_reaches_sacctmgr(fake_slurm, job,
                                                                         text) -> None:
    with pytest.raises(PyhpcError, match="^sacctmgr: an AdminComment is letters"):
        slurm.set_admin_comment(job, text)
    assert fake_slurm.calls == []


def test_the_record_keeps_the_summary_and_older_records_still_read(tmp_path) -> None:
    store = tmp_path / "store"
    store.mkdir(mode=0o750)
    record.write(store, record.Record("1", "a", 0.0, 60.0, None, None, "JS1:None"), None)
    assert record.read(store, "1").admin_comment == "JS1:None"
    data = json.loads((store / "1.json").read_text())
    del data["admin_comment"]
    (store / "1.json").write_text(json.dumps(data))
    assert record.read(store, "1").admin_comment is None


def test_a_summary_too_large_costs_the_record_nothing_but_its_summary(monkeypatch,
                                                                     capsys) -> None:
    def too_large(*args: object) -> str:
        raise admin_comment.CommentError("admin comment: the summary of 4000 nodes takes "
                                         "20000 characters, more than 16384", "admin comment")

    monkeypatch.setattr(admin_comment, "summary", too_large)
    assert record.jobstats_summary("http://p:1", "7", 0.0, 60.0, 5) is None
    assert capsys.readouterr().err == ("pyhpc-jobstats-record: job 7: admin comment: the "
                                       "summary of 4000 nodes takes 20000 characters, more "
                                       "than 16384\n")
