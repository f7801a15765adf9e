"""Monitoring on the lab: the real Prometheus scraping the real exporters (the monitoring
role, `make deploy`), jobs seen as they run and summed up when they end, alerts firing,
and the cluster report's page in a real browser.

Jobs run as the directory users user1 and user2 (`su -`), as in test_jobs.py; what an
admin does (draining a node, a queue of held jobs) runs as root. Each job is small: the
machine has two cores. The lab scrapes every 5 s and every alert fires after 30 s
(ansible/inventories/lab/cluster.yml, monitoring:).
"""
from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import SCREENSHOTS, chromium, screenshot
from test_directory import as_user, sh

from pyhpc import cluster, paths
from pyhpc.monitor import cluster_report, prometheus

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

LAB = cluster.load(paths.LAB_CLUSTER).monitoring
#: Over TLS, to a password: the tests ask as root, with the admins' (prometheus.request).
PROMETHEUS = f"https://127.0.0.1:{LAB.prometheus_port}"
PORTS = {"prometheus": LAB.prometheus_port, "node": LAB.node_exporter_port,
         "slurm": LAB.slurm_exporter_port, "jobs": LAB.job_exporter_port}
EXPORTERS = {"pyhpc-slurm-exporter": "pyhpc.monitor.slurm_exporter",
             "pyhpc-job-exporter": "pyhpc.monitor.job_exporter"}
PYHPC = str(paths.SHARED_VENV / "bin" / "pyhpc")
STORE = Path("/var/lib/pyhpc/jobstats")
#: Two CPUs busy for 20 s, and nothing busy for 20 s.
BUSY = 'for i in 1 2; do timeout 20 sh -c "while :; do :; done" & done; wait'
SLEEP = "sleep 20"


def api(path: str, **params: str) -> Any:
    """Prometheus' HTTP API: the answer's data."""
    address = f"{PROMETHEUS}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    req, context = prometheus.request(address)
    with urllib.request.urlopen(req, timeout=10, context=context) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return body["data"]


def query(promql: str) -> list[tuple[dict[str, str], float]]:
    return [(r["metric"], float(r["value"][1])) for r in api("query", query=promql)["result"]]


def until(what: str, check: Callable[[], Any], timeout: float = 90, every: float = 2) -> Any:
    """``check()``'s first true answer, polled; the test fails with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(every)


def submit(user: str, options: str, command: str) -> str:
    """A plain sbatch job of ``user``'s (no pyhpc), from their home; its id."""
    proc = as_user(user, f"cd && sbatch --parsable --time=2 --output=/dev/null {options} "
                         f"--wrap {shlex.quote(command)}")
    return proc.stdout.strip().split(";")[0]


def ended(job: str) -> bool:
    out = sh("sacct", "-n", "-P", "-X", f"-j{job}", "-oState").stdout.split()
    return bool(out) and out[0] not in ("PENDING", "RUNNING", "COMPLETING")


def jobstats(user: str, job: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return as_user(user, f"{PYHPC} jobstats {job} --json", check=check)


def test_prometheus_scrapes_every_target_and_each_is_up() -> None:
    targets = until("every target up", lambda: (
        found if (found := api("targets")["activeTargets"]) and
        all(t["health"] == "up" for t in found) else None), timeout=60)
    assert {t["labels"]["job"] for t in targets} == set(PORTS)
    assert {t["scrapeUrl"] for t in targets} == {
        f"https://127.0.0.1:{port}/metrics" for port in PORTS.values()}
    assert {t["labels"]["instance"] for t in targets} == {"localhost"}


def test_prometheus_ui_answers_on_localhost_9090() -> None:
    """Its certificate names localhost too; an admin's password opens the UI."""
    for path in ("/-/ready", "/graph"):
        req, context = prometheus.request(f"https://localhost:9090{path}")
        with urllib.request.urlopen(req, timeout=10, context=context) as answer:
            assert answer.status == 200 and (path != "/graph" or b"Prometheus" in answer.read())


def test_every_listener_is_on_127_0_0_1_only() -> None:
    listening = [line.split() for line in sh("ss", "-Hltnp").stdout.splitlines()]
    for name, port in PORTS.items():
        local = {row[3] for row in listening if row[3].rsplit(":", 1)[-1] == str(port)}
        assert local == {f"127.0.0.1:{port}"}, (name, local)


def test_the_exporters_run_as_slurm_from_their_pid_files() -> None:
    for service, module in EXPORTERS.items():
        pid = Path(f"/run/{service}.pid").read_text().strip()
        assert sh("ps", "-o", "user=", "-p", pid).stdout.strip() == "slurm"
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert [a.decode() for a in args[1:5]] == ["-P", "-m", module, "--listen"], args
        assert sh("service", service, "status").returncode == 0


def cpu_rate(job: str) -> float:
    found = query(f'sum(rate(cgroup_cpu_total_seconds{{jobid="{job}"}}[20s]))')
    return found[0][1] if found else 0.0


@pytest.mark.alone  # its rate is of two cores: another worker's test would take a share
def test_a_busy_job_is_seen_with_its_cpu_rate_and_jobstats_says_about_100_percent() -> None:
    job = submit("user1", "--cpus-per-task=2", BUSY)
    rate = until(f"job {job}'s CPU rate in Prometheus", lambda: r if (r := cpu_rate(job)) > 1.2
                 else None, timeout=45)
    assert rate <= 2.2
    held = query(f'cgroup_cpus{{jobid="{job}"}}')
    assert [(labels["user"], labels["account"], value) for labels, value in held] == [
        ("user1", "lab", 2.0)]
    # Princeton's jobstats asks in these words: its cluster label, the job's own cgroup.
    name = cluster.load(paths.LAB_CLUSTER).name
    asked = query(f"max_over_time(cgroup_cpus{{cluster='{name}',jobid='{job}',step='',"
                  "task=''}[60s])")
    assert [value for _, value in asked] == [2.0]
    until(f"job {job} ended in accounting", lambda: ended(job), timeout=90)
    data = json.loads(until("jobstats answers", lambda: (
        p.stdout if (p := jobstats("user1", job, check=False)).returncode == 0 else None),
        timeout=30))
    assert data["cpus"] == 2 and data["cpu_efficiency"] > 0.8, data
    # The job-end record: slurmctld's, 0640, readable by its owner (ACL) and nobody else.
    record = STORE / f"{job}.json"
    until(f"{record} written", record.exists, timeout=30)
    assert sh("stat", "--format=%a %U", str(record)).stdout.split() == ["640", "slurm"]
    assert json.loads(as_user("user1", f"cat {record}").stdout)["user"] == "user1"
    assert as_user("user2", f"cat {record}", check=False).returncode != 0


def test_a_sleeping_job_is_about_0_percent() -> None:
    job = submit("user1", "--cpus-per-task=1", SLEEP)
    until(f"job {job} ended in accounting", lambda: ended(job), timeout=90)
    data = json.loads(until("jobstats answers", lambda: (
        p.stdout if (p := jobstats("user1", job, check=False)).returncode == 0 else None),
        timeout=30))
    assert data["cpus"] == 1 and data["state"] == "COMPLETED", data
    assert data["cpu_efficiency"] is not None and data["cpu_efficiency"] < 0.1, data


def test_a_gpu_job_on_the_stand_ins_gets_no_invented_gpu_figures() -> None:
    job = submit("user1", "--partition=gpu --gpus-per-node=1", SLEEP)
    held = until(f"job {job}'s GPUs in Prometheus",
                 lambda: query(f'pyhpc_job_gpus{{jobid="{job}"}}'), timeout=45)
    assert [value for _, value in held] == [1.0]
    assert query("nvidia_gpu_duty_cycle") == []  # no driver: no utilization at all
    seen = {labels["node"]: value for labels, value in
            query('pyhpc_node_gpus_seen{source="devices"}')}
    assert seen == {"cpu1": 0.0, "cpu2": 0.0, "gpu1": 2.0, "gpu2": 2.0}  # counted, not measured
    until(f"job {job} ended in accounting", lambda: ended(job), timeout=90)
    data = json.loads(until("jobstats answers", lambda: (
        p.stdout if (p := jobstats("user1", job, check=False)).returncode == 0 else None),
        timeout=30))
    assert data["gpus"] == 1
    assert (data["gpu_util_mean"], data["gpu_util_peak"], data["gpu_source"]) == (None, None,
                                                                                   None)


def forgery(victim: str) -> str:
    """A job name and comment that name another job, owner, account and GPUs in the words
    of scontrol's one line per job, which prints them unescaped (issue 51, item 4)."""
    return (f"x JobId={victim} UserId=root(0) Account=victim GRES=gpu:8 Nodes=gpu1 "
            "CPU_IDs=0-31 Mem=0 GRES=gpu:lab:2(IDX:0-1)")


def test_a_job_whose_name_and_comment_forge_another_jobs_fields_changes_no_label() -> None:
    victim = submit("user2", "--partition=gpu --gpus-per-node=1", SLEEP)
    text = shlex.quote(forgery(victim))
    attacker = submit("user1", f"--partition=gpu --gpus-per-node=1 --job-name={text} "
                               f"--comment={text}", SLEEP)
    try:
        for job, user in ((victim, "user2"), (attacker, "user1")):
            held = until(f"job {job}'s CPUs in Prometheus", lambda job=job: query(
                f'cgroup_cpus{{jobid="{job}"}}'), timeout=45)
            assert [(labels["user"], labels["account"], value) for labels, value in held] == \
                [(user, "lab", 1.0)]
        assert query('cgroup_cpus{account="victim"}') == []  # no such account
        until(f"job {attacker} ended in accounting", lambda: ended(attacker), timeout=90)
        path = STORE / f"{attacker}.json"
        stored = until(f"job {attacker}'s record", lambda: path.exists(), timeout=30)
        assert stored and json.loads(path.read_text())["user"] == "user1"
    finally:
        sh("scancel", victim, attacker, check=False)


def test_another_users_job_is_refused_in_one_line_with_exit_2() -> None:
    job = submit("user1", "--hold", "true")
    try:
        proc = jobstats("user2", job, check=False)
    finally:
        sh("scancel", job)
    assert proc.returncode == 2, proc
    assert proc.stdout == "" and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"pyhpc: error: job: {job} ")
    assert "user1" not in proc.stderr


def scrape_commands() -> dict[str, float]:
    return {labels["command"]: value
            for labels, value in query("pyhpc_exporter_scrape_slurm_commands{job=\"slurm\"}")}


def test_the_slurm_exporter_runs_one_of_each_command_a_scrape_with_many_jobs_queued() -> None:
    array = sh("sbatch", "--parsable", "--hold", "--array=0-199", "--time=1",
               "--output=/dev/null", "--wrap", "true").stdout.strip().split(";")[0]
    try:
        pending = until("200 pending jobs counted", lambda: (
            n if (n := sum(v for _, v in query('pyhpc_slurm_jobs{state="pending"}'))) >= 200
            else None), timeout=60)
        assert pending >= 200
        time.sleep(2 * 5)  # two more scrapes, both with the whole queue
        assert scrape_commands() == {"squeue": 1.0, "scontrol": 1.0, "sdiag": 1.0, "sacct": 1.0}
    finally:
        sh("scancel", array)


def firing(name: str) -> list[dict[str, str]]:
    return [a["labels"] for a in api("alerts")["alerts"]
            if a["labels"]["alertname"] == name and a["state"] == "firing"]


def test_a_drained_node_fires_slurm_node_drained_with_its_reason() -> None:
    reason = "pyhpc monitoring test"
    sh("scontrol", "update", "NodeName=cpu2", "State=DRAIN", f"Reason={reason}")
    try:
        alerts = until("SlurmNodeDrained fires for cpu2", lambda: [
            a for a in firing("SlurmNodeDrained") if a["node"] == "cpu2"], timeout=120)
        assert alerts[0]["state"] in ("drained", "draining")
        assert alerts[0]["reason"].startswith(reason)
        assert alerts[0]["severity"] == "warning"
        # The admin's doctor names the node with the same reason (its later checks skip).
        doctor = json.loads(sh(PYHPC, "doctor", "--json", check=False).stdout)
        idle = next(c for c in doctor["checks"] if c["name"] == "nodes idle")
        assert f"cpu2 (drain: {reason})" in idle["detail"], idle
        sh("scontrol", "update", "NodeName=cpu2", "State=RESUME")
        until("SlurmNodeDrained resolved for cpu2", lambda: not [
            a for a in api("alerts")["alerts"] if a["labels"]["alertname"] == "SlurmNodeDrained"
            and a["labels"].get("node") == "cpu2"], timeout=120)
    finally:
        sh("scontrol", "update", "NodeName=cpu2", "State=RESUME", check=False)


@pytest.fixture(scope="module")
def report_page() -> Iterator[Path]:
    """`pyhpc report --cluster` as root in a login shell (PYHPC_PROMETHEUS_URL set by the
    deploy's profile script; the report shows every user's jobs: admins only, and
    test_monitoring_access.py shows user1 refused), into root's home."""
    out = Path("/root/ci-cluster-report")
    sh("rm", "-rf", str(out))
    proc = as_user("root", f"{PYHPC} report --cluster --since 1h --html {shlex.quote(str(out))}")
    assert proc.stdout.splitlines()[0] == f"page: {out / 'index.html'}"
    yield out / "index.html"


def test_the_cluster_report_is_written_privately(report_page: Path) -> None:
    out = report_page.parent
    assert sh("stat", "--format=%a %U", str(out)).stdout.split() == ["700", "root"]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["gpu-hours.png", "index.html", "jobs.png", "least-used.png",
                     "utilization.png"]
    page = report_page.read_text()
    assert "<h2>GPU-hours held per account</h2>" in page
    # The jobs of the tests above (user1's, within the hour), when they ran before this one.
    assert re.search(r"<tr><td>\d+</td><td>user1</td>", page) or "no jobs in this window" in page


def test_the_cluster_report_shows_its_figures_in_a_browser(report_page: Path) -> None:
    """Debian's chromium loads the page as a person would; every figure's image is drawn.
    Its screenshot goes to build/screenshots (`make docs-pictures`: docs/monitoring-report.png)."""
    with chromium(width=1200, height=2200) as driver:
        driver.get(report_page.as_uri())
        figures = driver.find_elements("css selector", "figure")
        assert [f.get_attribute("id") for f in figures] == ["utilization", "jobs", "gpu_hours",
                                                            "least"]
        for figure in figures:
            image = figure.find_element("css selector", "img")
            width = driver.execute_script("return arguments[0].naturalWidth", image)
            assert width > 0, image.get_attribute("src")
            assert figure.find_element("css selector", "figcaption").text
        assert "GPU-hours held per account" in driver.page_source
        screenshot(driver, SCREENSHOTS / "monitoring-report.png")


def scraped(promql: str, times: int) -> bool:
    """Prometheus holds at least ``times`` samples of each series of ``promql`` in the
    last minute, and some series."""
    found = query(f"count_over_time({promql}[1m])")
    return bool(found) and all(v >= times for _, v in found)


@pytest.fixture(scope="module")
def busy_report() -> Iterator[dict[str, Any]]:
    """`pyhpc report --cluster --since 10m --json` as root while two of user1's jobs run
    (one on a stand-in GPU), once Prometheus has scraped them for about 40 s (8 scrapes):
    what it printed, with the page's text under "page"."""
    jobs = [submit("user1", "", "sleep 100"), submit("user1", "-p gpu --gres=gpu:1", "sleep 100")]
    try:
        for job in jobs:
            until(f"job {job} running, scraped 8 times", lambda job=job: scraped(
                f'pyhpc_job_gpus{{jobid="{job}"}}', 8), timeout=150)
        until("user1's running jobs counted 8 times", lambda: scraped(
            'pyhpc_slurm_jobs{user="user1", state="running"}', 8))
        out = Path("/root/ci-cluster-report-busy")
        sh("rm", "-rf", str(out))
        proc = as_user("root", f"{PYHPC} report --cluster --since 10m --json "
                               f"--html {shlex.quote(str(out))}")
        data: dict[str, Any] = json.loads(proc.stdout)
        data["page"] = (out / "index.html").read_text()
        yield data
    finally:
        sh("scancel", *jobs)


def test_the_busy_cluster_report_draws_running_jobs_as_a_line(
        busy_report: dict[str, Any]) -> None:
    """The jobs chart's series (--json prints what it plotted): running at two points in
    a row at least, a line and not a lone dot."""
    step = busy_report["window"]["step"]
    running = busy_report["jobs"]["running"]
    assert any(b[0] - a[0] == step and a[1] >= 1 and b[1] >= 1
               for a, b in itertools.pairwise(running)), running


def test_no_chart_of_the_busy_report_is_empty_and_each_time_axis_reads_clock_times(
        busy_report: dict[str, Any]) -> None:
    """The report's figures, drawn again here from the same window's answers (the jobs
    series as the report printed them, but for the last point, which a scrape ingested
    after the report asked may still change): every panel has data, every axis HH:MM."""
    win = cluster_report.Window(**busy_report["window"])
    answers = cluster_report.ask(PROMETHEUS, win)

    def before_end(series: dict[str, list[list[float]]]) -> dict[str, list[list[float]]]:
        return {state: [p for p in points if p[0] < win.end] for state, points in series.items()}

    jobs = {s[0]["state"]: [list(p) for p in s[1]]
            for s in cluster_report.counts(answers["jobs"], answers["jobs_ok"])}
    assert before_end(jobs) == before_end(busy_report["jobs"])
    hours = cluster_report.gpu_hours(answers["gpus_by_account"], win.step)
    figures = [cluster_report.utilization_figure(answers, win),
               cluster_report.jobs_figure(answers, win), cluster_report.gpu_hours_figure(hours),
               cluster_report.least_figure(cluster_report.job_use(answers, win.step))]
    for fig in figures:
        fig.canvas.draw()
        for ax in fig.axes:
            texts = [t.get_text() for t in ax.texts]
            assert not any("in this window" in t for t in texts), (ax.get_title(), texts)
    for fig in figures[:2]:
        for ax in fig.axes:
            labels = [t.get_text() for t in ax.get_xticklabels()]
            assert ax.get_xlabel() == "time (UTC)"
            assert labels and all(re.fullmatch(r"\d\d:\d\d", t) for t in labels), labels


def test_the_busy_reports_gpu_hours_agree_between_its_table_and_json(
        busy_report: dict[str, Any]) -> None:
    hours = busy_report["gpu_hours"]
    assert hours.get("lab", 0) > 0, hours
    for account, value in hours.items():
        assert value == cluster_report.rounded(value)
        assert f"<tr><td>{account}</td><td>{cluster_report.shown(value)}</td></tr>" \
            in busy_report["page"]
