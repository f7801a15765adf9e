"""The hub on hosts: hostlab's definition runs JupyterHub on `login` (Debian 12 hosts, the
only ones with the pyhpc environment), and each notebook server is a Slurm job on a compute
host, as on a real cluster. A real headless chromium on this machine reaches the hub at the
address of `login` under the name on the workshop sheet, as a participant's browser would.

What differs from the lab's hub (test_hub.py) and so is checked here: the hub answers at
the login host's name over TLS from the generated CA, its API (where servers call back) on
the cluster network; a participant's server runs on a compute host, in their workshop's
reservation, listening on that host's own address, never on every interface, and the hub
on another host reaches it; notebook 1 runs from there; a wrong password is refused; a
second participant gets 403 at the first's server; a directory user without a Slurm
association cannot log in; the my-jobs page shows the first their server's job, and the
second nothing. (The sudo rule and the culler are the same files and code on
both, and the culler's test redeploys with a one-minute timeout: test_hub.py's, on the lab.)
"""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from browser import chromium

# pytest puts this directory on sys.path (rootdir-relative, no package).
from test_hostlab import COMPUTE, SKIP, address, on, run_on
from test_hostlab_life import converge
from test_hub import login, run_notebook_1, spawn, wait_for
from test_my_jobs import SHOWN_S, shown_jobs

from pyhpc import cluster

pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

WORKSHOP = "hlhub"
SHEET = "/root/pyhpc-workshops-hostlab-hub"
#: On login: the hub's health as pyhpc doctor checks it (GET /hub/api over TLS verified by
#: the generated CA), and its URL.
HEALTH = ("import json; from pyhpc import cluster; from pyhpc.hub import api; "
          "c = cluster.load('/etc/pyhpc/cluster.yml'); "
          "print(json.dumps([api.url(c), *api.health(c)]))")


#: On login, as root: a directory user and group of its own, or (argv "delete") away with
#: them again, through pyhpc's directory code (the login host holds the directory's
#: admin bind, as `pyhpc workshop` uses it).
NO_ASSOCIATION = ("import sys; from pyhpc import cluster; "
                  "from pyhpc.admin import directory, directory_sync; "
                  "d = cluster.load('/etc/pyhpc/cluster.yml').directory; "
                  "name, group, password = sys.argv[1:4]; "
                  "directory.delete(d, [directory.user_dn(d, name), directory.group_dn(d, group)]) "
                  "if password == 'delete' else directory_sync.add_members("
                  "d, group, [name], 'pyhpc: integration test', {name: password})")


@pytest.fixture(scope="module")
def hub() -> dict[str, Any]:
    """Debian 12 hosts converged; the hub's URL as login gives it, and its address."""
    converge("bookworm")
    where, ok, detail = json.loads(on("login", "/opt/pyhpc/venv/bin/python", "-c", HEALTH))
    assert ok, detail
    name = urlsplit(where).hostname
    # Each user's server is at <user>.<name> (the hub's subdomain_host).
    return {"url": where, "resolve": {name: address("login"), f"*.{name}": address("login")}}


@pytest.fixture(scope="module")
def participants(hub: dict[str, Any]) -> Iterator[list[dict[str, str]]]:
    """Two rows of a new workshop's sheet, made by root on login (2 hosts reserved in the
    `all` partition: a server and notebook 1's job fit); deleted afterwards, which stops
    their servers."""
    run_on("login", "pyhpc", "workshop", "delete", WORKSHOP, "--homes")  # an earlier run's
    on("login", "pyhpc", "workshop", "create", WORKSHOP, "--participants", "2", "--start", "now",
       "--hours", "1", "--nodes", "2", "--partition", "all", "--out", SHEET)
    rows = list(csv.DictReader(io.StringIO(on("login", "cat", f"{SHEET}/{WORKSHOP}.csv"))))
    assert [r["notebooks"] for r in rows] == [hub["url"]] * 2, rows
    yield rows
    print(run_on("login", "pyhpc", "workshop", "delete", WORKSHOP, "--homes").stdout)


def server_jobs(user: str) -> list[str]:
    """The user's hub server jobs: name|reservation|account|state|node."""
    out = on("login", "squeue", "-h", "-u", user, "-o", "%j|%v|%a|%T|%N")
    return [line for line in out.split() if line.startswith("pyhpc-hub|")]


def test_the_hub_listens_on_login_and_its_api_on_the_cluster_network(hub: dict[str, Any]) -> None:
    assert urlsplit(hub["url"]).port == 8000
    listening = {row.split()[3] for row in on("login", "ss", "-Hltn").splitlines()}
    api, proxy = cluster.HUB_API_PORT, cluster.PROXY_API_PORT
    assert {"*:8000", f"0.0.0.0:{api}"} <= listening or {"[::]:8000", f"0.0.0.0:{api}"} <= listening, \
        listening
    # The proxy's own API stays on the loopback, behind its token.
    assert f"127.0.0.1:{proxy}" in listening and not {f"0.0.0.0:{proxy}", f"*:{proxy}"} & listening
    # A compute host reaches the hub's API, where a server calls back.
    reach = run_on(COMPUTE[0], "python3", "-I", "-c",
                   f"import socket; socket.create_connection(('login', {api}), 5)")
    assert reach.returncode == 0, reach.stderr


def test_a_wrong_password_is_refused_on_hosts(hub: dict[str, Any],
                                              participants: list[dict[str, str]]) -> None:
    with chromium(insecure_tls=True, resolve=hub["resolve"]) as driver:
        login(driver, participants[0]["user"], participants[0]["password"] + "x", hub["url"])
        assert "/hub/login" in driver.current_url
        assert "Invalid username or password" in driver.page_source


def test_a_participants_server_runs_on_a_compute_host_and_runs_notebook_1(
        hub: dict[str, Any], participants: list[dict[str, str]]) -> None:
    user, password = participants[0]["user"], participants[0]["password"]
    with chromium(width=1400, height=1000, insecure_tls=True, resolve=hub["resolve"]) as driver:
        login(driver, user, password, hub["url"])
        spawn(driver, user, base=hub["url"], workshop_name=WORKSHOP)
        jobs = server_jobs(user)
        assert len(jobs) == 1 and jobs[0].startswith(f"pyhpc-hub|{WORKSHOP}|{WORKSHOP}|RUNNING|"), jobs
        node = jobs[0].rsplit("|", 1)[1]
        assert node in COMPUTE, jobs
        # On that host's own address only, never on every interface; the hub is on login.
        uid = on(node, "id", "-u", user)
        mine = [line.split()[3] for line in on(node, "ss", "-H", "-ltne").splitlines()
                if f"uid:{uid} " in line]
        assert mine and all(local.startswith(f"{address(node)}:") for local in mine), mine
        run_notebook_1(driver, user, hub["url"])
    # Notebook 1's own training job went where the server went: the reservation.
    ran = on("login", "su", "-", user, "-c", "sacct -X -n -P -o JobName,Reservation -S now-1hour")
    assert ran.split() and all(j.endswith(f"|{WORKSHOP}") for j in ran.split()), ran


def test_a_second_participant_gets_403_at_the_first_ones_server_on_hosts(
        hub: dict[str, Any], participants: list[dict[str, str]]) -> None:
    first, second = participants[0]["user"], participants[1]
    assert server_jobs(first), "the first participant's server is not running (test order)"
    with chromium(insecure_tls=True, resolve=hub["resolve"]) as driver:
        login(driver, second["user"], second["password"], hub["url"])
        # At the first's server, its own origin (the hub's subdomain_host): 403.
        where = urlsplit(hub["url"])
        driver.get(f"https://{first}.{where.hostname}:{where.port}/user/{first}/lab")
        wait_for("the refusal", lambda: "403" in driver.page_source, 60)


def test_the_my_jobs_page_shows_a_participant_their_server_and_the_other_nothing_on_hosts(
        hub: dict[str, Any], participants: list[dict[str, str]]) -> None:
    """The hub on login, Prometheus on ctl, the job exporter on the server's compute host:
    the page's password and hub.json came from ctl (the monitoring role's copy)."""
    first, second = participants
    jobs = on("login", "squeue", "-h", "-u", first["user"], "-n", "pyhpc-hub", "-o", "%i").split()
    assert len(jobs) == 1, "the first participant's server is not running (test order)"
    where = urlsplit(hub["url"])
    page = f"https://my-jobs--service.{where.hostname}:{where.port}/services/my-jobs/"
    for who, shown in ((first, True), (second, False)):
        with chromium(insecure_tls=True, resolve=hub["resolve"]) as driver:
            login(driver, who["user"], who["password"], hub["url"])
            driver.get(page)
            # (an earlier run's participants of the same names may have jobs of the last day)
            if shown:
                wait_for(f"{who['user']}'s server job on the page",
                         lambda d=driver: jobs[0] in shown_jobs(d) or d.refresh(), SHOWN_S, every=10)
            else:
                wait_for("the page", lambda d=driver: 'id="updated"' in d.page_source, 60)
                assert jobs[0] not in shown_jobs(driver)


def test_a_directory_user_without_an_association_cannot_log_in_on_hosts(hub: dict[str, Any]) -> None:
    name, group, password = "hubnoassoc1", "hubnoassoc", "correct-horse-battery"
    python = "/opt/pyhpc/venv/bin/python"
    run_on("login", python, "-c", NO_ASSOCIATION, name, group, "delete")  # an earlier run's
    on("login", python, "-c", NO_ASSOCIATION, name, group, password)
    try:
        assert run_on("login", "getent", "passwd", name).returncode == 0
        assert not on("login", "sacctmgr", "-n", "-P", "show", "associations", f"users={name}")
        with chromium(insecure_tls=True, resolve=hub["resolve"]) as driver:
            login(driver, name, password, hub["url"])
            assert "/hub/login" in driver.current_url
            assert f"/user/{name}" not in driver.current_url
    finally:
        on("login", python, "-c", NO_ASSOCIATION, name, group, "delete")
