"""pyhpc's Grafana dashboards against the lab's real Prometheus: every panel's PromQL, with
its variables set to the lab's cluster, a running job of user1's and user1, answers without
error and with series (ansible/roles/monitoring/files/grafana/*.json).

Grafana itself is not run: Debian ships none and this machine reaches only Debian's, PyPI's
and npm's registries. The panels are what Grafana would send to the datasource.
"""
from __future__ import annotations

import json
import re
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_directory import sh
from test_monitoring import BUSY, api, query, submit, until

from pyhpc import cluster, paths

#: Its job is a plain sbatch one: no pyhpc code runs in it.
pytestmark = pytest.mark.integration

DASHBOARDS = sorted((paths.ROOT / "ansible" / "roles" / "monitoring" / "files" / "grafana")
                    .glob("*.json"))
#: What Grafana puts for $__rate_interval with the lab's 5 s scrapes is under this.
RATE_INTERVAL = "1m"
#: Panels on the GPUs' own figures answer only where a driver does (NVML); the lab's GPUs
#: are stand-ins.
NVML = "nvidia_gpu_"


def substituted(expr: str, values: dict[str, str]) -> str:
    """``expr`` as Grafana sends it: each ``$name`` replaced (longest names first)."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${name}", values[name])
    assert "$" not in expr, f"a variable the test does not set: {expr}"
    return expr


def targets(path: Path) -> list[tuple[str, str]]:
    data = json.loads(path.read_text())
    return [(f"{path.stem}: {panel['title']} ({t['refId']})", t["expr"])
            for panel in data["panels"] for t in panel["targets"]]


def variables(path: Path) -> dict[str, str]:
    """Each variable's label_values(METRIC, LABEL) query."""
    return {v["name"]: v["query"]["query"] for v in json.loads(path.read_text())
            ["templating"]["list"]}


def answer(promql: str) -> list[tuple[dict[str, str], float]] | str:
    """Prometheus' series for ``promql``, or its error in words."""
    try:
        found: list[tuple[dict[str, str], float]] = query(promql)
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}: {err.read().decode(errors='replace')[:300]}"
    return found


@pytest.fixture(scope="module")
def running_job() -> Iterator[str]:
    job = submit("user1", "--cpus-per-task=2", BUSY)
    try:
        until(f"job {job}'s CPU rate in Prometheus", lambda: query(
            f'rate(cgroup_cpu_total_seconds{{jobid="{job}"}}[{RATE_INTERVAL}]) > 0'), timeout=60)
        yield job
    finally:
        sh("scancel", job)


def test_every_panel_answers_with_series_for_a_running_job(running_job: str) -> None:
    values = {"cluster": cluster.load(paths.LAB_CLUSTER).name, "jobid": running_job,
              "user": "user1", "__rate_interval": RATE_INTERVAL}
    nvml = bool(query("nvidia_gpu_num_devices > 0"))
    asked, failed = 0, []
    for path in DASHBOARDS:
        for where, expr in targets(path):
            promql = substituted(expr, values)
            got = answer(promql)
            asked += 1
            if isinstance(got, str):
                failed.append(f"{where}: {promql}: {got}")
            elif not got and (nvml or NVML not in promql):
                failed.append(f"{where}: {promql}: no series")
    assert asked >= 20 and not failed, "\n".join(failed)


def test_every_variable_offers_the_running_jobs_values(running_job: str) -> None:
    values = {"cluster": cluster.load(paths.LAB_CLUSTER).name, "jobid": running_job,
              "user": "user1"}
    for path in DASHBOARDS:
        for name, text in variables(path).items():
            found = re.fullmatch(r"label_values\((.+), (\w+)\)", text)
            assert found and found.group(2) == name, f"{path.stem}: ${name}: {text}"
            metric = substituted(found.group(1), values)
            offered = api(f"label/{name}/values", **{"match[]": metric})
            assert values[name] in offered, (path.stem, name, offered)
