"""Strangers on one hub (issue 51, items 3 and 7): a workshop's second participant attacks
the first, in a real headless chromium, on the lab's JupyterHub.

Item 3: the attacker plants a page with JavaScript in their own server (a static file of
theirs, which their server serves to anyone) and the victim, logged in, opens its link.
The script tries what a same-origin script could: read the victim's hub identity, mint a
hub API token for them, and list the victim's files through the victim's own server. Each
server has its own origin (``<user>.<hub host>``, ``c.JupyterHub.subdomain_host``), so
every try is refused by the browser or the hub.

Item 7: batchspawner's server reports its port to the hub before it binds it. The attacker
binds that port in the gap, on the victim's node, and answers everything. The hub adds no
route to it: the process at the reported port must prove it knows the server's own token
(:mod:`pyhpc.hub.proof`) before the spawn succeeds; the squatter cannot, the spawn fails in
one line and no request of the victim's browser reaches the squatter.

Participants of a workshop of their own (directory users with passwords from its sheet,
as the hub's other tests have): the lab's user1 and user2 have no password a test knows.
"""
from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from browser import chromium
from test_directory import as_user, workshop
from test_hub import SPAWN_S, login, new_workshop, server_jobs, spawn, url, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

WORKSHOP = "hubxo"
HUB_LOG = Path("/var/log/pyhpc-hub/hub.log")
#: The attacker's page, a static file of their server's (served without a login).
PAGE = "pyhpc-strangers.html"
#: Seconds the victim's server takes to load its configuration: the gap between the port's
#: report and its bind, which the squatter uses (a slow home file system does as much).
SLOW_START_S = 25

ATTACK = """<!doctype html><title>running</title><pre id="out"></pre>
<script>
const HUB = %(hub)s, VICTIM = %(victim)s, SERVER = %(server)s;
const out = {origin: location.origin};
const within = (ms, p) => Promise.race([p, new Promise((_, no) => setTimeout(() => no("timeout"), ms))]);
async function attempt(name, fn) {
  try { out[name] = await within(20000, fn()); } catch (e) { out[name] = "blocked: " + e; }
}
async function xsrf(page) {  // a hub page's XSRF token, as a same-origin script reads it
  const text = await (await fetch(page, {credentials: "include"})).text();
  const m = text.match(/xsrf_token: "([^"]*)"/);
  return m ? m[1] : "";
}
function framed(src) {  // a page of another origin, framed: its document, if the browser lets
  return new Promise((ok, no) => {
    const f = document.createElement("iframe");
    f.onload = () => { try { ok(f.contentDocument.cookie); } catch (e) { no(e); } };
    f.src = src; document.body.appendChild(f);
  });
}
(async () => {
  await attempt("hub_user", async () => {
    const token = await xsrf(HUB + "hub/home");
    const r = await fetch(HUB + "hub/api/user",
                          {credentials: "include", headers: {"X-XSRFToken": token}});
    return r.status + " " + (await r.text()).slice(0, 300);
  });
  let minted = "";  // a hub API token of the victim's, if the hub gives one
  await attempt("hub_token", async () => {
    const token = await xsrf(HUB + "hub/token");
    const r = await fetch(HUB + "hub/api/users/" + VICTIM + "/tokens", {
      method: "POST", credentials: "include", body: JSON.stringify({note: "stolen"}),
      headers: {"X-XSRFToken": token, "Content-Type": "application/json"}});
    const text = await r.text();
    try { minted = JSON.parse(text).token || ""; } catch (e) {}
    return r.status + " " + text.slice(0, 300);
  });
  async function victimServer(path, method) {  // with the minted token, else the session
    let headers = {};
    if (minted) {
      headers = {Authorization: "token " + minted};
    } else {
      const m = String(await framed(SERVER + "lab")).match(/_xsrf=([^;]*)/);
      headers = {"X-XSRFToken": m ? decodeURIComponent(m[1]) : ""};
    }
    const r = await fetch(SERVER + path, {method: method, credentials: "include", headers: headers});
    return r.status + " " + (await r.text()).slice(0, 300);
  }
  await attempt("server_contents", () => victimServer("api/contents", "GET"));
  await attempt("server_terminal", () => victimServer("api/terminals", "POST"));
  document.getElementById("out").textContent = JSON.stringify(out);
  document.title = "done";
})();
</script>
"""

#: The attacker's squatter: binds the victim's reported port on the victim's node and
#: answers every request with 200, keeping each request's line and headers (its loot).
SQUATTER = r"""
import http.server, json, os, sys
addr, port, loot = sys.argv[1], int(sys.argv[2]), sys.argv[3]
class Squat(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(loot, "a") as fh:
            fh.write(json.dumps({"line": self.requestline, "headers": dict(self.headers)}) + "\n")
        body = b'{"proof": "0000", "version": "5.5.4"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_HEAD = do_GET
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer((addr, port), Squat)
open(loot + ".bound", "w").close()
server.serve_forever()
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """(victim, attacker): two participants of a workshop of 2 nodes (a server each); the
    workshop is deleted afterwards, which stops their servers."""
    rows = new_workshop(tmp_path_factory, WORKSHOP, 2, 2)
    yield rows[0], rows[1]
    workshop("delete", WORKSHOP, "--homes", check=False)


def write_as(user: str, path: str, text: str) -> None:
    """``text`` into ``path`` (under the user's home, ~ allowed), written by the user."""
    data = base64.b64encode(text.encode()).decode()
    as_user(user, f"mkdir -p \"$(dirname {path})\" && echo {data} | base64 -d > {path}")


def submit_form(driver: Any) -> None:
    """The spawn form, submitted as preselected (test_hub.spawn without its wait)."""
    from selenium.webdriver.common.by import By

    driver.get(url() + "hub/spawn")
    button = driver.find_element(By.ID, "spawn_form").find_element(By.CSS_SELECTOR, "[type=submit]")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].click();",
                          button)


def server_base(driver: Any, user: str) -> str:
    """The user's server's URL (``…/user/NAME/``) as their browser reached it."""
    found = re.match(rf"(https://[^/]+/user/{user}/)", driver.current_url)
    assert found, driver.current_url
    return found.group(1)


def reported_port(user: str, since: int, timeout: float) -> int:
    """The port the hub was told for ``user``'s new server (batchspawner's log line)."""
    def look() -> int | None:
        with open(HUB_LOG, errors="replace") as fh:
            fh.seek(since)
            text = fh.read()
        for job in server_jobs_ids(user):
            found = re.search(rf"Notebook server job {job} started at [^:\s]+:(\d+)", text)
            if found:
                return int(found.group(1))
        return None
    port: int = wait_for(f"the port of {user}'s server in {HUB_LOG}", look, timeout, every=0.2)
    return port


def server_jobs_ids(user: str) -> list[str]:
    proc = subprocess.run(["squeue", "-h", "-u", user, "-n", "pyhpc-hub", "-o", "%i"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.split()


@pytest.fixture
def slow_start(pair: tuple[dict[str, str], dict[str, str]]) -> Iterator[None]:
    """The victim's server loads a configuration of theirs that takes SLOW_START_S."""
    victim = pair[0]["user"]
    write_as(victim, "~/.jupyter/jupyter_server_config.py",
             f"import time\ntime.sleep({SLOW_START_S})\n")
    yield
    as_user(victim, "rm -f ~/.jupyter/jupyter_server_config.py")


def test_a_squatter_on_the_reported_port_gets_no_route_and_no_request(
        pair: tuple[dict[str, str], dict[str, str]], slow_start: None, tmp_path: Path) -> None:
    victim, attacker = pair
    home = as_user(attacker["user"], "echo $HOME").stdout.strip()
    write_as(attacker["user"], "~/squat.py", SQUATTER)
    loot = f"{home}/loot.jsonl"
    as_user(attacker["user"], f"rm -f {loot} {loot}.bound")
    since = HUB_LOG.stat().st_size
    squatter = None
    try:
        with chromium(insecure_tls=True) as driver:
            login(driver, victim["user"], victim["password"])
            submit_form(driver)
            port = reported_port(victim["user"], since, SPAWN_S)
            # The attacker, on the victim's node (the lab: this host), in the gap.
            squatter = subprocess.Popen(
                ["su", "-", attacker["user"], "-c",
                 f"exec python3 ~/squat.py 127.0.0.1 {port} {loot}"], start_new_session=True)
            wait_for("the squatter's bind", lambda: os.path.exists(f"{loot}.bound"), 30, every=0.2)
            refused = "did not prove it is"
            mine = f"/user/{victim['user']}/"
            wait_for("the spawn's end", lambda: refused in driver.page_source
                     or urlparse(driver.current_url).path.startswith(mine), SPAWN_S, every=2)
            landed = driver.current_url
            page = driver.page_source
        requests = [json.loads(line) for line in Path(loot).read_text().splitlines()] \
            if Path(loot).exists() else []
        browser = [r for r in requests if "Cookie" in r["headers"] or "cookie" in r["headers"]]
        assert not browser, f"the squatter on port {port} got the victim's requests: {browser}"
        assert not urlparse(landed).path.startswith(mine), landed
        assert refused in page, page[-2000:]
        # One line in the hub's log names the node, the port and what happened.
        log = HUB_LOG.read_text(errors="replace")[since:]
        lines = [line for line in log.splitlines() if refused in line]
        assert lines and f":{port}" in lines[0], lines
        wait_for("the refused server's job to end", lambda: not server_jobs(victim["user"]), 120)
    finally:
        if squatter is not None:
            os.killpg(squatter.pid, signal.SIGTERM)
            squatter.wait(timeout=30)


def test_another_users_page_cannot_use_the_victims_hub_session_or_server(
        pair: tuple[dict[str, str], dict[str, str]]) -> None:
    victim, attacker = pair
    home = as_user(attacker["user"], "echo $HOME").stdout.strip()
    write_as(attacker["user"], "~/.jupyter/jupyter_server_config.py",
             f"c.ServerApp.extra_static_paths = [{json.dumps(home + '/public')}]\n")
    with chromium(insecure_tls=True) as attacker_browser:
        login(attacker_browser, attacker["user"], attacker["password"])
        spawn(attacker_browser, attacker["user"], workshop_name=WORKSHOP)
        link = server_base(attacker_browser, attacker["user"]) + "static/" + PAGE
    with chromium(insecure_tls=True) as driver:
        login(driver, victim["user"], victim["password"])
        spawn(driver, victim["user"], workshop_name=WORKSHOP)
        victim_server = server_base(driver, victim["user"])
        write_as(attacker["user"], f"~/public/{PAGE}", ATTACK % {
            "hub": json.dumps(url()), "victim": json.dumps(victim["user"]),
            "server": json.dumps(victim_server)})
        driver.get(link)  # the victim clicks the attacker's link
        wait_for("the attacker's script", lambda: driver.title == "done", 120, every=1)
        out = json.loads(driver.find_element("id", "out").text)
    print(f"the attacker's script at {link}: {out}")
    # The page is the attacker's, served by their server, and its script ran to the end.
    assert set(out) == {"origin", "hub_user", "hub_token", "server_contents",
                        "server_terminal"}, out
    assert not out["hub_user"].startswith("200"), f"read the victim's hub identity: {out}"
    assert victim["user"] not in out["hub_user"], out
    assert not out["hub_token"].startswith(("200", "201")), f"minted a token: {out}"
    assert not out["server_contents"].startswith("200"), f"listed the victim's files: {out}"
    assert not out["server_terminal"].startswith("200"), f"opened a terminal of theirs: {out}"
    # The servers' origins are each their own, the hub's another.
    origins = {out["origin"], victim_server.split("/user/")[0], url().rstrip("/")}
    assert len(origins) == 3, origins
