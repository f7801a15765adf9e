"""The browser is the door: the lab's JupyterHub (https://localhost:8000/), driven by a real
headless chromium (tests/integration/browser.py) as a workshop participant would use it.

A participant logs in with the sheet's password, starts a server (the form preselects the
workshop's reservation), opens notebook 1 in their home, runs all cells and sees its
accuracy; squeue shows the server as their job in the reservation. A wrong password and a
directory user without an association are refused; a second participant gets 403 at the
first's server; the idle culler stops an idle server (a redeploy with a one-minute
timeout, then the lab's definition again); a deploy that changes pyhpc's code restarts
the hub. Screenshots of the form and of the running notebook go to build/screenshots
(`make docs-pictures` makes them the docs' pictures).
The same on hosts: test_hostlab_notebooks.py.
"""
from __future__ import annotations

import csv
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from browser import SCREENSHOTS, chromium, screenshot
from test_directory import as_user, lab_directory, sh, workshop

from benchmarks import deploy as deploy_bench
from pyhpc import cluster, paths
from pyhpc.admin import directory, directory_sync
from pyhpc.hub import api, running

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

LAB = cluster.load(paths.LAB_CLUSTER)
WORKSHOP = "hubws"
MAKE_DEPLOY = ["make", "--no-print-directory", "-C", str(paths.ROOT), "deploy"]
#: A server's job may wait for its node, then JupyterLab starts on two cores.
SPAWN_S = 420
#: Notebook 1 trains on the lab's nodes (its own jobs, in the reservation).
NOTEBOOK_S = 900


def url() -> str:
    if LAB.jupyterhub is None or not LAB.jupyterhub.enabled:
        pytest.fail("the lab's cluster.yml runs no hub (jupyterhub.enabled)")
    return api.url(LAB)


def server_url(user: str) -> str:
    """A user's server at its own origin, <user>.<the hub's name> (the hub's subdomain_host)."""
    assert LAB.jupyterhub is not None
    return f"https://{user}.{api.hostname(LAB)}:{LAB.jupyterhub.port}/user/{user}/"


def new_workshop(tmp_path_factory: pytest.TempPathFactory, name: str, hours: int,
                 nodes: int) -> list[dict[str, str]]:
    """The sheet's rows of a new workshop of two participants, starting now (an earlier
    run's of that name deleted first)."""
    workshop("delete", name, "--homes", check=False)
    out = tmp_path_factory.mktemp("sheet") / name
    workshop("create", name, "--participants", "2", "--start", "now", "--hours", str(hours),
             "--nodes", str(nodes), "--out", str(out))
    with open(out / f"{name}.csv", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def participants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, str]]]:
    """Two rows of a new workshop's sheet (2 nodes reserved, so a server and the notebook's
    jobs fit); the workshop is deleted afterwards, which stops their servers."""
    rows = new_workshop(tmp_path_factory, WORKSHOP, 2, 2)
    assert all(r["notebooks"] == url() for r in rows)
    yield rows
    done = json.loads(workshop("delete", WORKSHOP, "--homes", "--json", check=False).stdout or "{}")
    print(f"workshop delete: {done}")


def login(driver: Any, user: str, password: str, base: str | None = None) -> None:
    """The hub's login form (at `base`, the lab's hub by default), filled and sent; back
    once the hub's answer has replaced the form and loaded. A navigation started earlier
    races the form's own, and chromium may drop it: the 403 test on hostlab once asked for
    the first participant's server right after the click, and nothing of that request
    reached the hub in 60 s (its log: the login, then the spawn page, then nothing)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get((base or url()) + "hub/login")
    driver.find_element(By.ID, "username_input").send_keys(user)
    driver.find_element(By.ID, "password_input").send_keys(password)
    button = driver.find_element(By.ID, "login_submit")
    button.click()
    answered = WebDriverWait(driver, 60)
    answered.until(expected_conditions.staleness_of(button))
    answered.until(lambda d: d.execute_script("return document.readyState") == "complete")


def wait_for(what: str, check: Any, timeout: float, every: float = 2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    pytest.fail(f"waited {timeout:.0f} s for {what}")


def spawn(driver: Any, user: str, shot: Path | None = None, base: str | None = None,
          workshop_name: str = WORKSHOP) -> None:
    """The form as the user sees it, submitted as preselected (the workshop's reservation
    and account); until JupyterLab is up."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get((base or url()) + "hub/spawn")
    form = driver.find_element(By.ID, "spawn_form")
    assert Select(form.find_element(By.NAME, "reservation")).first_selected_option \
        .get_attribute("value") == workshop_name
    assert Select(form.find_element(By.NAME, "account")).first_selected_option \
        .get_attribute("value") == workshop_name
    if shot:
        screenshot(driver, shot)
    button = form.find_element(By.CSS_SELECTOR, "[type=submit]")
    # The button's own click event (it submits the form, as a user's click does): selenium's
    # pointer click was intercepted at the bottom edge of the headless window.
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].click();",
                          button)
    wait_for(f"{user}'s JupyterLab", lambda: f"/user/{user}/lab" in driver.current_url, SPAWN_S)


def run_notebook_1(driver: Any, user: str, base: str | None = None) -> None:
    """Notebook 1 opened from the user's home, Run All Cells, until its accuracy shows."""
    from selenium.webdriver.common.by import By

    driver.get((base or url()) + f"user/{user}/lab/tree/workshop/01-hello-cluster.ipynb")
    wait_for("the notebook", lambda: driver.find_elements(By.CSS_SELECTOR, ".jp-Notebook"), 120)
    time.sleep(5)  # the kernel starts
    # By its label: the item's command id differs between JupyterLab releases.
    run_all = ("//li[contains(@class,'lm-Menu-item')]//div[contains(@class,'lm-Menu-itemLabel')"
               " and text()='Run All Cells']")

    def menu() -> list[Any]:  # the Run menu, opened (again) until its item shows
        if not driver.find_elements(By.XPATH, run_all):
            driver.find_element(By.XPATH, "//div[contains(@class,'lm-MenuBar-itemLabel') "
                                "and text()='Run']").click()
            time.sleep(1)
        found: list[Any] = driver.find_elements(By.XPATH, run_all)
        return found

    wait_for("the Run menu", menu, 60, every=2)
    driver.find_element(By.XPATH, run_all).click()

    def accuracy() -> bool:  # a cell that failed ends the wait at once, with what it printed
        text = "\n".join(e.text for e in driver.find_elements(By.CSS_SELECTOR,
                                                              ".jp-OutputArea-output"))
        if "Traceback" in text:
            pytest.fail(f"notebook 1 failed:\n{text[-3000:]}")
        return "test accuracy" in text

    wait_for("notebook 1's accuracy", accuracy, NOTEBOOK_S, every=10)


def server_jobs(user: str) -> list[str]:
    """The user's hub server jobs: name|reservation|account|qos|state."""
    return [line for line in sh("squeue", "-h", "-u", user, "-o", "%j|%v|%a|%q|%T").stdout
            .split() if line.startswith("pyhpc-hub|")]


def test_the_hub_answers_over_tls_verified_by_the_generated_ca() -> None:
    ok, detail = api.health(LAB)
    assert ok, detail
    assert detail == f"{url()}: JupyterHub 5.5.4"


def test_the_hub_runs_as_its_own_user_with_private_secrets_and_database() -> None:
    pid = Path("/run/pyhpc-hub.pid").read_text().strip()
    assert sh("ps", "-o", "user=", "-p", pid).stdout.strip() == "pyhpc-hub"
    for name in ("cookie-secret", "proxy-token", "workshop-token", "jupyterhub.sqlite"):
        info = (api.STATE_DIR / name).stat()
        assert (info.st_mode & 0o777, sh("stat", "-c", "%U", str(api.STATE_DIR / name))
                .stdout.strip()) == (0o600, "pyhpc-hub"), name
    log = (paths.ROOT / ".deploy" / "deploy.log").read_text(errors="replace")
    for name in ("cookie-secret", "proxy-token", "workshop-token"):
        assert (api.STATE_DIR / name).read_text().strip() not in log


def test_the_sudo_rule_is_valid_and_allows_nothing_else() -> None:
    sh("visudo", "-cf", "/etc/sudoers.d/pyhpc-hub")
    listed = sh("sudo", "-l", "-U", "pyhpc-hub").stdout
    assert "/usr/bin/sbatch ^--parsable$" in listed and "(ALL, " in listed
    # Never root, nor an account of this host's own files: slurm (SlurmUser) may cancel any job.
    assert all(f"!{name}" in listed for name in ("root", "slurm", "munge", "pyhpc-hub")), listed
    refused = sh("runuser", "-u", "pyhpc-hub", "--", "sudo", "-n", "-u", "slurm", "/usr/bin/scancel",
                 "1", check=False)
    assert refused.returncode != 0
    refused = sh("runuser", "-u", "pyhpc-hub", "--", "sudo", "-n", "-u", "root", "/usr/bin/squeue",
                 "-h", "-j", "1", "-o", "%T %B", check=False)
    assert refused.returncode != 0
    refused = sh("runuser", "-u", "pyhpc-hub", "--", "sudo", "-n", "-u", "user1", "/usr/bin/scancel",
                 "-u", "user2", check=False)
    assert refused.returncode != 0


#: Attempts to bind the hub's ports as user2, while the hub is stopped (a restart's gap).
SQUAT = ("import socket, sys\nfor port in map(int, sys.argv[1:]):\n    s = socket.socket()\n"
         "    try:\n        s.bind(('127.0.0.1', port)); print(port, 'bound')\n"
         "    except OSError as exc:\n        print(port, exc.strerror)\n")


def test_no_user_can_take_the_hubs_ports_while_it_restarts() -> None:
    """Issue 51 item 1: the hub's API (where every server checks its tokens) and the proxy's
    (which the hub sends its token) are privileged ports: user2 cannot bind them in the
    gap of a restart; the hub, with CAP_NET_BIND_SERVICE alone, binds them again."""
    ports = (cluster.HUB_API_PORT, cluster.PROXY_API_PORT)
    sh("service", "pyhpc-hub", "stop")
    try:
        tried = as_user("user2", f"python3 -c {shlex.quote(SQUAT)} {ports[0]} {ports[1]}").stdout
        assert tried.splitlines() == [f"{port} Permission denied" for port in ports], tried
        # The hub's user cannot plant a link where root opens the hub's log.
        planted = sh("runuser", "-u", "pyhpc-hub", "--", "ln", "-s", "/etc/shadow",
                     "/var/log/pyhpc-hub/planted", check=False)
        assert planted.returncode != 0 and "Permission denied" in planted.stderr
    finally:
        sh("service", "pyhpc-hub", "start")
    wait_for("the hub's answer", lambda: api.health(LAB)[0], 60)
    pid = Path("/run/pyhpc-hub.pid").read_text().strip()
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":\t" in line)
    net_bind_service = f"{1 << 10:016x}"
    assert (status["CapEff"], status["CapAmb"]) == (net_bind_service, net_bind_service), status
    listening = sh("ss", "-Hltnp").stdout
    assert all(f"127.0.0.1:{port} " in listening for port in ports), listening


def test_a_wrong_password_is_refused(participants: list[dict[str, str]]) -> None:
    with chromium(insecure_tls=True) as driver:
        login(driver, participants[0]["user"], participants[0]["password"] + "x")
        assert "/hub/login" in driver.current_url
        assert "Invalid username or password" in driver.page_source


def test_a_directory_user_without_an_association_cannot_log_in() -> None:
    d = lab_directory()
    name, password = "hubnoassoc1", "correct-horse-battery"
    directory_sync.add_members(d, "hubnoassoc", [name], "pyhpc: integration test", {name: password})
    try:
        assert sh("getent", "passwd", name).returncode == 0
        with chromium(insecure_tls=True) as driver:
            login(driver, name, password)
            assert "/hub/login" in driver.current_url
            assert f"/user/{name}" not in driver.current_url
    finally:
        directory.delete(d, [directory.user_dn(d, name), directory.group_dn(d, "hubnoassoc")])


def test_a_participant_starts_a_server_in_the_reservation_and_runs_notebook_1(
        participants: list[dict[str, str]]) -> None:
    user, password = participants[0]["user"], participants[0]["password"]
    with chromium(width=1400, height=1000, insecure_tls=True) as driver:
        login(driver, user, password)
        spawn(driver, user, SCREENSHOTS / "hub-spawn-form.png")
        jobs = server_jobs(user)
        assert jobs == [f"pyhpc-hub|{WORKSHOP}|{WORKSHOP}|{WORKSHOP}|RUNNING"], jobs
        # Listening on the node's address only (the lab: the loopback), never on all.
        uid = sh("id", "-u", user).stdout.strip()
        mine = [line for line in sh("ss", "-H", "-ltne").stdout.splitlines() if f"uid:{uid} " in line]
        assert mine and all(line.split()[3].startswith("127.0.0.1:") for line in mine), mine
        run_notebook_1(driver, user)
        screenshot(driver, SCREENSHOTS / "hub-notebook.png")
    # The notebook's own jobs went where the server went: the reservation.
    jobs = as_user(user, "sacct -X -n -P -o JobName,Reservation -S now-1hour").stdout.split()
    assert jobs and all(j.endswith(f"|{WORKSHOP}") for j in jobs), jobs


def test_a_second_participant_gets_403_at_the_first_ones_server(
        participants: list[dict[str, str]]) -> None:
    first, second = participants[0]["user"], participants[1]
    assert server_jobs(first), "the first participant's server is not running (test order)"
    with chromium(insecure_tls=True) as driver:
        login(driver, second["user"], second["password"])
        # At the first's server, its own origin: the server asks the hub, which says no.
        driver.get(server_url(first) + "lab")
        wait_for("the refusal", lambda: "403" in driver.page_source, 60)
        assert "jp-LabShell" not in driver.page_source
        # The hub's link to it: the hub knows no such server of the second's (404).
        driver.get(url() + f"user/{first}/lab")
        wait_for("the hub's refusal", lambda: "404" in driver.page_source, 60)
        assert not driver.current_url.startswith(server_url(first)), driver.current_url


@pytest.fixture
def short_timeout(tmp_path: Path) -> Iterator[None]:
    """The lab redeployed with a one-minute idle timeout, then with its own definition."""
    data = yaml.safe_load(paths.LAB_CLUSTER.read_text())
    data["jupyterhub"] = {**(data.get("jupyterhub") or {}), "idle_timeout_min": 1}
    short = tmp_path / "cluster.yml"
    short.write_text(yaml.safe_dump(data))
    subprocess.run([*MAKE_DEPLOY, f"CLUSTER={short}"], check=True, timeout=1800)
    try:
        yield
    finally:
        subprocess.run(MAKE_DEPLOY, check=True, timeout=1800)


def test_the_culler_stops_an_idle_server(participants: list[dict[str, str]],
                                         short_timeout: None) -> None:
    user, password = participants[1]["user"], participants[1]["password"]
    with chromium(insecure_tls=True) as driver:
        login(driver, user, password)
        spawn(driver, user)
    assert server_jobs(user)
    wait_for("the culler", lambda: not server_jobs(user), 6 * 60, every=10)
    log = (Path("/var/log/pyhpc-hub/hub.log")).read_text(errors="replace")
    assert re.search(rf"Culling server {re.escape(user)}\b|{re.escape(user)}.*inactive", log)


def test_a_submission_slurmctld_did_not_answer_is_found_by_its_comment(monkeypatch) -> None:
    """The hub's own calls, as its user through its sudo rule, with the lab's slurmctld
    paused (SIGSTOP) past sbatch's 10 s MessageTimeout: sbatch gives up, slurmctld takes the
    submission when it resumes, and the job is found by its comment. The spawner does this
    for a notebook server (tests/unit/test_hub_loads.py); hostlab's busy ctl once made a
    spawn fail so while its job ran on."""
    from pyhpc.slurm import as_user, slurm

    def as_hub(argv: list[str], stdin: str | None, timeout_s: float) -> Any:
        return slurm.run_command(["runuser", "-u", "pyhpc-hub", "--", *argv], stdin, timeout_s)

    monkeypatch.setattr(slurm, "RUNNER", as_hub)
    comment = f"pyhpc-hub-{secrets.token_hex(8)}"
    text = (f"#!/bin/bash\n#SBATCH --comment={comment}\n#SBATCH --job-name=pyhpc-hub-test\n"
            "#SBATCH --time=1\nsleep 300\n")
    pid = int(Path("/run/slurmctld.pid").read_text().split()[0])
    job = None
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(15, os.kill, (pid, signal.SIGCONT))
    resume.start()
    try:
        with pytest.raises(slurm.AmbiguousSubmit, match="may have accepted the job"):
            as_user.submit("user1", text)
        job = as_user.submitted("user1", comment)
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)
    try:
        assert job is not None, f"no job of user1's with the comment {comment}"
        assert sh("squeue", "-h", "-j", job, "-o", "%u %k").stdout.split() == ["user1", comment]
    finally:
        if job:
            sh("scancel", job, check=False)


def hub_runs_the_copy() -> bool:
    """The running hub recorded the copy's code (the deploy's check, in the hub's virtualenv)."""
    return sh("/opt/pyhpc/hub/bin/python", "-c", "import sys, pyhpc.hub.running as r; "
              f"sys.exit(r.stale({str(api.STATE_DIR)!r}))", check=False).returncode == 0


def test_a_deploy_that_changes_pyhpcs_code_restarts_the_hub() -> None:
    """The hub imports pyhpc once, when it starts. Here it is restarted on a copy with one
    module edited by hand, as a hub started before an upgrade runs older code than the
    copy's; the deploy puts the module back and, because the code changed, restarts the
    hub, which then runs the copy's code. test_deploy.py's re-runs and drift show the hub
    is not restarted otherwise."""
    module = paths.SHARED_SRC / "pyhpc" / "hub" / "choices.py"
    original = module.read_bytes()
    try:
        module.write_bytes(original + b"# an older pyhpc\n")
        sh("service", "pyhpc-hub", "restart")
        wait_for("the hub's record of the edited code", hub_runs_the_copy, 60, every=1)
        before = Path("/run/pyhpc-hub.pid").read_text().strip()
        proc = subprocess.run(MAKE_DEPLOY, capture_output=True, text=True, timeout=1800,
                              check=False)
        assert proc.returncode == 0, proc.stdout[-4000:]
    finally:
        if module.read_bytes() != original:  # the deploy failed before its copy
            module.write_bytes(original)
    changed = deploy_bench.changed_tasks(proc.stdout)
    assert "pyhpc_login : Copy the repository to the host" in changed
    assert ("jupyterhub : Check that the hub's virtualenv runs pyhpc from the copy, and the hub "
            "the copy's code") in changed
    assert "RUNNING HANDLER [jupyterhub : Restart the hub]" in proc.stdout
    assert Path("/run/pyhpc-hub.pid").read_text().strip() != before
    wait_for("the restarted hub's record", hub_runs_the_copy, 60, every=1)
    assert running.digest(paths.SHARED_SRC / "pyhpc") == running.digest(paths.ROOT / "pyhpc")
    wait_for("the hub's answer", lambda: api.health(LAB)[0], 60)
