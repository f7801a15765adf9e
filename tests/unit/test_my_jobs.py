"""The hub's "my jobs" page without a hub: its queries always name the user, its HTML escapes
what it shows and draws clock-time axes, its configuration is the monitoring role's file,
and that role gives Prometheus' web user `hub` only where the definition runs a hub. The
page in a real hub, with two users, in Chromium: tests/integration/test_my_jobs.py."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from test_monitoring_role import ROLE, Roles

from pyhpc import cluster, paths
from pyhpc.errors import PyhpcError
from pyhpc.hub import api as hub_api
from pyhpc.monitor import my_jobs, my_jobs_html, my_jobs_page, prometheus

T0 = 1_764_000_000.0  # a Tuesday, 16:00 UTC
GROUPS = {g: ["localhost"] for g in ("controller", "login", "compute")}


def job(job_id: str = "42", account: str = "physics", running: bool = True) -> my_jobs.Job:
    return my_jobs.Job(job_id=job_id, account=account, nodes=("cpu1", "cpu2"), cpus=8, gpus=0,
                       start=T0, end=T0 + 600, running=running)


def chart(unit: str = "cores", peak: float = 3.0) -> my_jobs.Chart:
    points = [(T0 + 10 * i, peak * i / 60) for i in range(61)]
    return my_jobs.Chart("CPU", unit, [my_jobs.Line("used", points)])


def test_every_query_names_the_user_and_a_charts_the_job_too() -> None:
    for promql in my_jobs.LIST.values():
        text = promql.format(sel=my_jobs.selector("alice"), window="24h", step="5s")
        assert '{user="alice"}' in text and "jobid=" not in text
    sel = my_jobs.selector("alice", "4242_7")
    assert sel == '{jobid="4242_7",user="alice"}'
    for _, _, lines in my_jobs.CHARTS:
        for _, promql in lines:
            assert sel in promql.format(sel=sel, rate="15s")


@pytest.mark.parametrize("user, job_id", [('alice",user=~".*', None), ("alice", '1"} or up{'),
                                          ("Alice", None), ("alice", "12 ")])
def test_a_name_that_could_widen_a_selector_is_refused(user: str, job_id: str | None) -> None:
    with pytest.raises(PyhpcError):
        my_jobs.selector(user, job_id)


def test_the_page_escapes_what_it_shows_and_loads_nothing_from_elsewhere() -> None:
    hostile = job(account='<script>alert(1)</script>"')
    found = my_jobs.Overview("alice", T0 + 600, 24, [hostile], {"42": [chart()]})
    html = my_jobs_html.page("alice", my_jobs_html.part(found, "alice", 30, 24), 30, "2|ab|cd")
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;&#34;" in html
    assert re.findall(r'(?:src|href)="([^"]*)"', html) == ["refresh.js"]
    assert 'data-refresh="30" data-xsrf="2|ab|cd"' in html
    assert 'updated <time id="updated">16:10:00</time>' in html
    assert '<tr data-job="42">' in html and "cpu1, cpu2" in html and "0:10:00" in html


def test_a_user_without_jobs_or_without_prometheus_gets_one_line() -> None:
    empty = my_jobs.Overview("alice", T0, 24, [], {})
    assert "No job of yours in the last 24 hours." in my_jobs_html.part(empty, "alice", 30, 24)
    down = my_jobs_html.part(None, "alice", 30, 24, "prometheus: https://x:9090 did not answer")
    assert '<p class="error">prometheus: https://x:9090 did not answer</p>' in down


def test_a_chart_has_clock_times_and_a_round_top_in_its_unit() -> None:
    svg = my_jobs_html.svg(chart())
    labels = re.findall(r'text-anchor="middle">([^<]+)</text>', svg)
    assert labels == ["16:00", "16:02", "16:04", "16:06", "16:08", "16:10"]
    assert "CPU (cores)" in svg and svg.count("<polyline") == 1
    memory = my_jobs_html.svg(chart("bytes", 3.3 * (1 << 30)))
    assert "CPU (GiB)" in memory and ">5</text>" in memory  # 3.3 GiB under a top of 5
    short = my_jobs.Chart("GPU", "%", [my_jobs.Line("busy", [(T0, 40.0), (T0 + 50, 90.0)])])
    assert re.findall(r'text-anchor="middle">([^<]+)</text>', my_jobs_html.svg(short))[0] \
        == "16:00:00"


@pytest.mark.parametrize("value, top", [(0, 1), (0.7, 1), (1.2, 2), (2.2, 2.5), (3.3, 5),
                                        (7, 10), (13, 20), (1024, 2000)])
def test_the_y_axis_top_is_a_round_number_at_least_the_peak(value: float, top: float) -> None:
    assert my_jobs_html.nice_top(value) == pytest.approx(top)


def test_the_page_reads_the_monitoring_roles_file_and_says_what_is_wrong(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (prometheus.USER_ENV, prometheus.PASSWORD_ENV, prometheus.CA_ENV):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "hub.json"
    with pytest.raises(my_jobs_page.PageError, match=r"hub.json cannot be read \(No such file"):
        my_jobs_page.prometheus_url(config)
    config.write_text('{"url": "https://ctl:9090"}')
    with pytest.raises(my_jobs_page.PageError, match="not the monitoring role's file"):
        my_jobs_page.prometheus_url(config)
    config.write_text(json.dumps({"url": "https://ctl:9090/", "user": "hub",
                                  "password_file": "/etc/pyhpc/monitoring/hub.password",
                                  "ca": "/etc/pyhpc/monitoring/ca.crt"}))
    assert my_jobs_page.prometheus_url(config) == "https://ctl:9090"
    import os
    assert os.environ[prometheus.USER_ENV] == "hub"
    assert os.environ[prometheus.PASSWORD_ENV] == "/etc/pyhpc/monitoring/hub.password"


@pytest.mark.parametrize("args, message", [
    (["--scrape-interval", "5"], "monitoring.scrape_interval: '5' is not allowed"),
    (["--scrape-interval", "5s", "--refresh", "1"], "--refresh: must be an integer from 5"),
    (["--scrape-interval", "5s", "--hours", "9999"], "--hours: must be an integer from 1")])
def test_bad_settings_get_one_line_and_exit_2(args: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert my_jobs_page.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def definition(hub: bool) -> dict[str, object]:
    data = yaml.safe_load(paths.LAB_CLUSTER.read_text())
    data["jupyterhub"]["enabled"] = hub
    return cluster.parse(data, 24 * 1024).to_dict()


def test_prometheus_has_a_web_user_for_the_page_only_where_a_hub_runs() -> None:
    names = "monitoring_web_users | map(attribute='name') | list"
    with_hub = Roles(GROUPS, definition(True), {"localhost": "192.0.2.7"}, sysv=True)["localhost"]
    assert "hub" in with_hub.get(names)
    assert with_hub.get("(monitoring_web_users_hub | first).path") == "/etc/pyhpc/monitoring/hub.password"
    without = Roles(GROUPS, definition(False), {"localhost": "192.0.2.7"}, sysv=True)["localhost"]
    assert "hub" not in without.get(names)
    assert with_hub.get("monitoring_hub_config") == str(my_jobs_page.CONFIG)


def test_the_monitoring_role_gives_the_hubs_own_user_and_host() -> None:
    hub = yaml.safe_load((ROLE.parent / "jupyterhub" / "defaults" / "main.yml").read_text())
    monitoring = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert monitoring["monitoring_hub_user"] == hub["jupyterhub_user"]
    assert monitoring["monitoring_hub_host"] == hub["jupyterhub_host"]
    task = (ROLE / "tasks" / "hub.yml").read_text()
    assert all(f"'{key}'" in task for key in ("url", "user", "password_file", "ca"))


def test_the_doctor_asks_the_hubs_name_for_the_pages_script_with_its_host(
        fake_hub, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = cluster.load(paths.LAB_CLUSTER)
    seen = []

    def answer(request, timeout_s, ca_file):
        seen.append((request.full_url, request.get_header("Host")))
        return fake_hub(request, timeout_s, ca_file)

    monkeypatch.setattr(hub_api, "OPEN", answer)
    page = "https://my-jobs--service.localhost:8000/services/my-jobs/"
    assert hub_api.my_jobs_health(lab) == (True, page)
    assert seen == [("https://localhost:8000/services/my-jobs/refresh.js",
                     "my-jobs--service.localhost:8000")]
    monkeypatch.setattr(hub_api, "OPEN", lambda request, timeout_s, ca_file: (404, b"no route"))
    assert hub_api.my_jobs_health(lab) == (
        False, f"{page}: HTTP 404, not the my-jobs page (the hub starts it)")
    assert my_jobs_html.REFRESH_JS.count(hub_api.MY_JOBS_PART) == 1
