"""The monitoring role's Prometheus alert rules: rendered as Ansible renders them, valid
rules YAML, and every metric an expression names is one pyhpc's exporters export in a
scrape (Slurm and NVML faked), node_exporter's filesystem metric or Prometheus' own `up`.
promtool checks them too where it is installed."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_job_exporter import DETAILS, FakeNvml, v1_tree, v2_tree
from test_slurm_exporter import NODES, SDIAG, queue_text

from pyhpc import paths
from pyhpc.admin import backup
from pyhpc.monitor import gpus, job_exporter, serve, slurm_exporter
from tests.share import PROMTOOL_SKIP

TEMPLATE = Path("ansible/roles/monitoring/templates/etc/prometheus/pyhpc-rules.yml.j2")
NODE_EXPORTER = {"node_filesystem_avail_bytes", "node_filesystem_size_bytes"}
#: What Prometheus records of every scrape itself.
PROMETHEUS = {"up"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                "unless", "bool", "offset"}
ALERTS = {"SlurmNodeDown", "SlurmNodeDrained", "GpusMissing", "SlurmdbdUnreachable",
          "JobGpusIdle", "SlurmRunawayJobs", "FilesystemAlmostFull", "ExporterDown",
          "BackupTooOld"}
#: node_exporter's textfile collector serves these: pyhpc admin backup now's, and those the
#: backup role writes (read from its tasks).
BACKUP = set(backup.METRICS) | set(re.findall(
    r"^\s+(pyhpc_backup_\w+) ", (paths.ROOT / "ansible/roles/backup/tasks/present.yml")
    .read_text(), re.M))


def render(mountpoints: list[str], alert_for: str | None = None,
           extra: list[str] | None = None) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(paths.ROOT), trim_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return env.get_template(str(TEMPLATE)).render(
        monitoring_alert_mountpoints=mountpoints, monitoring_alert_extra_mountpoints=extra or [],
        monitoring_alert_for=alert_for)


def rules(alert_for: str | None = None) -> list[dict]:
    doc = yaml.safe_load(render(["/", "/var", "/home"], alert_for))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    expr = re.sub(r"\{[^}]*\}", "", expr)                       # label matchers
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # label lists
    names = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", expr))  # not functions
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"\d+[smhd]?", n)}


def exported(tmp_path: Path, fake_slurm) -> set[str]:
    fake_slurm.answers.update({"squeue": (0, queue_text(2)), "scontrol": (0, NODES),
                               "sdiag": (0, SDIAG), "sacct": (0, "100\n")})
    text = generate_latest(serve.registry(slurm_exporter.SlurmCollector())).decode()
    fake_slurm.answers["squeue"] = (0, DETAILS)
    nvml = gpus.Nvml(FakeNvml([(1, 50, 1, 2)]))
    text += generate_latest(serve.registry(job_exporter.JobCollector(
        ["gpu1"], v1_tree(tmp_path), tmp_path / "gres.conf", nvml))).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_the_rules_are_the_alerts_the_issue_asks_for_each_with_a_severity_and_summary() -> None:
    found = rules()
    assert {r["alert"] for r in found} == ALERTS
    for rule in found:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]


def test_every_metric_an_alert_names_is_exported(tmp_path, fake_slurm) -> None:
    known = exported(tmp_path, fake_slurm) | NODE_EXPORTER | PROMETHEUS | BACKUP
    for rule in rules():
        names = metric_names(rule["expr"])
        assert names and names <= known, (rule["alert"], names - known)


def test_the_node_alerts_keep_the_reason_label() -> None:
    by_name = {r["alert"]: r for r in rules()}
    for alert in ("SlurmNodeDown", "SlurmNodeDrained"):
        assert "by (" not in by_name[alert]["expr"]  # no aggregation drops labels
        assert "$labels.reason" in by_name[alert]["annotations"]["summary"]


def test_the_filesystem_alert_watches_the_configured_mountpoints() -> None:
    expr = {r["alert"]: r for r in rules()}["FilesystemAlmostFull"]["expr"]
    assert expr.count('mountpoint=~"/|/var|/home"') == 2 and "> 0.90" in expr
    extra = yaml.safe_load(render(["/", "/home"], extra=["/scratch"]))["groups"][0]["rules"]
    expr = next(r for r in extra if r["alert"] == "FilesystemAlmostFull")["expr"]
    assert expr.count('mountpoint=~"/|/home|/scratch"') == 2


def test_each_alert_waits_its_own_time_unless_the_definition_sets_one() -> None:
    own = {r["alert"]: r["for"] for r in rules()}
    assert own["SlurmNodeDrained"] == "5m" and own["JobGpusIdle"] == "30m"
    assert own["SlurmRunawayJobs"] == "1h" and own["ExporterDown"] == "2m"
    assert "for 30m" in {r["alert"]: r for r in rules()}["JobGpusIdle"]["annotations"]["summary"]
    lab = rules("30s")
    assert {r["for"] for r in lab} == {"30s"}
    assert {r["alert"]: r for r in lab}["JobGpusIdle"]["annotations"]["summary"].endswith(
        "for 30s")


def test_an_unset_mountpoint_list_fails_the_render() -> None:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(paths.ROOT),
                             undefined=jinja2.StrictUndefined)
    with pytest.raises(jinja2.UndefinedError):
        env.get_template(str(TEMPLATE)).render(monitoring_alert_for=None,
                                               monitoring_alert_extra_mountpoints=[])


@pytest.mark.skipif(shutil.which("promtool") is None, reason=PROMTOOL_SKIP)
def test_promtool_accepts_the_rules(tmp_path) -> None:
    path = tmp_path / "pyhpc-rules.yml"
    path.write_text(render(["/", "/home"]))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_metric_names_are_read_from_selectors_not_functions_or_label_lists() -> None:
    assert metric_names('avg by (jobid, user) (foo{jobid!="",a=~"x|y"}) < 0.10 and bar > 0') \
        == {"foo", "bar"}
    assert metric_names("max by (node) (a_b) > max by (node) (c:d)") == {"a_b", "c:d"}


def input_series(text: str, job: str) -> list[dict[str, str]]:
    """An exporter's scrape as promtool's input series, with the target labels Prometheus
    adds (instance, job), each sample unchanged for an hour."""
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, "instance": "gpu1", "job": job}
            inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            out.append({"series": f"{sample.name}{{{inner}}}", "values": f"{sample.value}x60"})
    return out


@pytest.mark.skipif(shutil.which("promtool") is None, reason=PROMTOOL_SKIP)
def test_promtool_fires_the_gpu_alerts_on_the_exporters_own_series(tmp_path, fake_slurm) -> None:
    """The lab's stand-ins have no NVML figures, so JobGpusIdle cannot fire there: here
    alice's job 41 holds GPUs 1 and 2 at 3% and 5% (NVML faked, the job exporter's real
    labels) and Slurm declares 4 GPUs on gpu1 where NVML answers for 3 (GpusMissing)."""
    fake_slurm.answers.update({"squeue": (0, queue_text(2)), "scontrol": (0, NODES),
                               "sdiag": (0, SDIAG), "sacct": (0, "100\n")})
    slurm = generate_latest(serve.registry(slurm_exporter.SlurmCollector())).decode()
    fake_slurm.answers["squeue"] = (0, DETAILS)
    nvml = gpus.Nvml(FakeNvml([(0, 0, 0, 80), (1, 3, 70, 80), (2, 5, 10, 80)]))
    jobs = generate_latest(serve.registry(job_exporter.JobCollector(
        ["gpu1"], v2_tree(tmp_path), tmp_path / "gres.conf", nvml))).decode()
    (tmp_path / "rules.yml").write_text(render(["/"]))
    idle = {"alertname": "JobGpusIdle", "jobid": "41", "user": "alice", "account": "lab",
            "severity": "warning"}
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": input_series(slurm, "slurm") + input_series(jobs, "jobs"),
        "alert_rule_test": [
            {"eval_time": "20m", "alertname": "JobGpusIdle", "exp_alerts": []},
            {"eval_time": "40m", "alertname": "JobGpusIdle", "exp_alerts": [{
                "exp_labels": idle, "exp_annotations": {
                    "summary": "job 41 (alice) has used under 10% of its GPUs for 30m"}}]},
            {"eval_time": "20m", "alertname": "GpusMissing", "exp_alerts": [{
                "exp_labels": {"node": "gpu1", "severity": "critical"}, "exp_annotations": {
                    "summary": "node gpu1 has fewer GPUs than its GRES declares"}}]}]}]}
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    proc = subprocess.run(["promtool", "test", "rules", "tests.yml"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
