"""The hub under a workshop's first minute: twenty participants log in and start their
servers at once, on the lab's CPU nodes declared two ways; prints figures, writes
benchmarks/results/hub.json.

Each way is one run on a workshop of ``--participants`` reserving both CPU nodes:
``real``, each CPU node declared with the CPUs this machine has (the lab's own definition
when it already does: run as ``make lab-up`` left it), and ``declared``, 16 CPUs and
8 GiB declared on each (Slurm's config_overrides: declared, not real; a server idles),
a redeploy with CLUSTER=. A server is a one-CPU job, so the real lab fits fewer than
twenty at once: the rest wait in Slurm until the hub's start timeout gives up on them,
and the run says how many ran, how many failed and with what message.

Each participant, in a thread of its own, does over HTTPS what the browser does: GET the
login page (its _xsrf), POST the password (the hub's __Host- cookies), GET the spawn form
and POST it as preselected. Then until every spawn has ended (the hub's REST API, as the
participant): the seconds from the first POST to the hub calling each server ready, and
to the server answering at its own origin, https://<user>.<hub name>:<port>/user/<user>/lab
(the hub's OAuth, as the browser follows it; *.localhost goes to the loopback as browsers
resolve it); the most server jobs running at once and why the others waited; the hub's
and the proxy's resident memory before and after. The workshop is deleted after each run
and the lab's definition deployed again at the end.

    python -m benchmarks.hub                    # ~10 min
    python -m benchmarks.hub --participants 5
"""
from __future__ import annotations

import argparse
import csv
import html
import http.client
import http.cookiejar
import json
import os
import re
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from benchmarks import lab, record
from pyhpc import cluster, paths
from pyhpc.hub import api

PYHPC = "/opt/pyhpc/venv/bin/pyhpc"
WORKSHOP = "hubload"
CONFIG = Path("/etc/pyhpc/hub/jupyterhub_config.py")
FIELDS = ("reservation", "account", "qos", "partition", "nodes", "gpus_per_node", "time")
#: CPUs and memory declared on each CPU node in the ``declared`` run.
DECLARED_CPUS, DECLARED_MEMORY_MB = 16, 8192
#: Past the hub's start timeout (300 s in the lab): every spawn has ended by then.
SETTLE_TIMEOUT_S = 900
DEPLOY_TIMEOUT_S = 1800


def sh(argv: list[str], **kw: Any) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.hub: {' '.join(argv[:5])}: {proc.stderr.strip()[-400:]}")
    return proc.stdout if isinstance(proc.stdout, str) else ""


def cpu_nodes(data: dict[str, Any]) -> dict[str, Any]:
    return next(n for n in data["nodes"] if n["name"] == "cpu")


def definition(work: Path, cpus: int, memory_mb: int) -> Path:
    """The lab's definition with ``cpus`` and ``memory_mb`` declared on each CPU node."""
    data = yaml.safe_load(paths.LAB_CLUSTER.read_text())
    cpu_nodes(data).update(cpus=cpus, memory_mb=memory_mb)
    out = work / f"hubload-{cpus}cpus.yml"
    out.write_text(yaml.safe_dump(data))
    return out


def deploy(definition_file: Path | None = None) -> float:
    start = time.monotonic()
    sh(["make", "--no-print-directory", "-C", str(record.ROOT), "deploy",
        *([f"CLUSTER={definition_file}"] if definition_file else [])], timeout=DEPLOY_TIMEOUT_S)
    return time.monotonic() - start


def start_timeout_s() -> int | None:
    """The hub's c.Spawner.start_timeout, as deployed."""
    found = re.search(r"^c\.Spawner\.start_timeout = (\d+)", CONFIG.read_text(), re.M)
    return int(found.group(1)) if found else None


def resident_kib(user: str) -> dict[str, int]:
    """Resident memory of the hub user's processes by command (the hub, the proxy)."""
    out: dict[str, int] = {}
    for line in sh(["ps", "-u", user, "-o", "rss=,comm="]).splitlines():
        rss, _, comm = line.strip().partition(" ")
        out[comm.strip()] = out.get(comm.strip(), 0) + int(rss)
    return out


def server_jobs() -> list[tuple[str, str]]:
    """(state, reason) of each hub server job in Slurm."""
    out = sh(["squeue", "-h", "-n", "pyhpc-hub", "-o", "%T|%r"])
    return [(s, r) for s, _, r in (line.partition("|") for line in out.split())]


def wait_no_server_jobs(timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while server_jobs() and time.monotonic() < deadline:
        time.sleep(2)


class Loopback(http.client.HTTPSConnection):
    """An HTTPS connection that reaches <name> and *.<name> at 127.0.0.1 when the hub's
    name is localhost (as browsers resolve *.localhost). TLS verifies the chain against the
    hub's CA, and the name, except a server's <user>.<name> where <name> is one label:
    OpenSSL matches no wildcard of one label (*.localhost, which the lab's certificate
    names), so there ``unnamed`` (the chain alone) is used and the figures say so."""

    hub_name = "localhost"
    unnamed: ssl.SSLContext | None = None

    def connect(self) -> None:
        host = self.host
        server = host.endswith("." + self.hub_name)
        address = "127.0.0.1" if self.hub_name == "localhost" and (
            host == "localhost" or server) else host
        sock = socket.create_connection((address, self.port), self.timeout)
        context = self.unnamed if server and "." not in self.hub_name and self.unnamed \
            else self._context  # type: ignore[attr-defined]
        self.sock = context.wrap_socket(sock, server_hostname=host)


class DotlessHostPolicy(http.cookiejar.DefaultCookiePolicy):
    """Python's cookie jar, with a host without a dot (localhost) matched by its own
    Domain= cookie as browsers match it: the jar makes the host localhost.local, so the
    hub's jupyterhub-session-id (Domain=localhost, shared with the users' subdomains)
    never went back, and every form's _xsrf was refused."""

    @staticmethod
    def _covers(domain: str, request: urllib.request.Request) -> bool:
        host = (urllib.parse.urlsplit(request.get_full_url()).hostname or "").lower()
        domain = domain.lower()
        return "." not in domain.lstrip(".") and domain.startswith(".") and (
            host == domain[1:] or host.endswith(domain))

    def return_ok_domain(self, cookie: http.cookiejar.Cookie,
                         request: urllib.request.Request) -> bool:
        return self._covers(cookie.domain, request) or super().return_ok_domain(cookie, request)

    def domain_return_ok(self, domain: str, request: urllib.request.Request) -> bool:
        return self._covers(domain, request) or super().domain_return_ok(domain, request)


class LoopbackHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self.context = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(Loopback, req, context=self.context)


class Participant:
    """One browser's worth of HTTPS: cookies, the _xsrf token, the forms."""

    def __init__(self, user: str, password: str, hub: str, server: str,
                 ca: Path | None) -> None:
        self.user, self.password, self.hub, self.server = user, password, hub, server
        context = ssl.create_default_context(cafile=str(ca) if ca else None)
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar(DotlessHostPolicy())),
            LoopbackHandler(context))
        self.asked = self.ready = self.serving = self.failed = 0.0
        self.error = self.failure = ""

    def get(self, url: str) -> tuple[str, str]:
        """The page at ``url`` (redirects followed) and the URL it ended at."""
        with self.opener.open(url, timeout=60) as reply:
            return str(reply.read().decode()), str(reply.geturl())

    def post(self, path: str, fields: dict[str, str]) -> str:
        data = urllib.parse.urlencode(fields).encode()
        with self.opener.open(urllib.request.Request(self.hub + path, data=data),
                              timeout=120) as reply:
            return str(reply.geturl())

    @staticmethod
    def xsrf(page: str) -> str:
        """The page's _xsrf token: a hidden field (the login form) or in the form's action
        (the spawn form: action="/hub/spawn?_xsrf=...")."""
        found = re.search(r'name="_xsrf" value="([^"]+)"|[?&]_xsrf=([^"&]+)"', page)
        return next((g for g in found.groups() if g), "") if found else ""

    def log_in_and_spawn(self, go: threading.Event) -> None:
        try:
            page, _ = self.get(self.hub + "hub/login")
            self.post("hub/login", {"username": self.user, "password": self.password,
                                    "_xsrf": self.xsrf(page)})
            form, _ = self.get(self.hub + "hub/spawn")
            fields = {}
            for name in FIELDS:  # each select's preselected option, as the browser sends it
                found = re.search(rf'name="{name}">.*?<option value="([^"]*)" selected', form, re.S)
                if found:
                    fields[name] = found.group(1)
            if "reservation" not in fields:
                raise OSError(f"the spawn form has no reservation preselected: {form[:200]!r}")
            go.wait()
            self.asked = time.monotonic()
            self.post(f"hub/spawn/{self.user}", {**fields, "_xsrf": self.xsrf(form)})
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def state(self) -> str:
        """"ready", "pending" or "none" (no server: the spawn ended without one)."""
        model = json.loads(self.get(self.hub + f"hub/api/users/{self.user}")[0])
        server = model.get("servers", {}).get("")
        if server and server.get("ready"):
            return "ready"
        return "pending" if (server and server.get("pending")) or model.get("pending") else "none"

    def answers(self) -> bool:
        """JupyterLab at the server's own origin, through the hub's OAuth."""
        page, where = self.get(self.server + "lab")
        return urllib.parse.urlparse(where).path.startswith(f"/user/{self.user}/lab") \
            and "JupyterLab" in page

    def failure_message(self) -> str:
        """What the hub's page tells the participant about the failed spawn (JupyterHub
        answers its spawn-pending page with an error page then: its text is the message)."""
        try:
            page, _ = self.get(self.hub + f"hub/spawn-pending/{self.user}")
            status = 200
        except urllib.error.HTTPError as exc:
            page, status = exc.read().decode(errors="replace"), exc.code
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        page = re.sub(r"(?is)<(script|style|head|nav)\b.*?</\1>", " ", page)
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
        found = re.search(r"The latest attempt to start your server has failed|"
                          rf"\b{status} : ", text)
        text = text[found.start():] if found else text
        return f"HTTP {status}: {text[:400]}"


def run(participants: int, work: Path, how: str) -> dict[str, Any]:
    lab_definition = cluster.load(paths.cluster_file())  # as deployed
    declared = yaml.safe_load(paths.cluster_file().read_text())
    hub, name = api.url(lab_definition), api.hostname(lab_definition)
    port = api.settings(lab_definition).port
    Loopback.hub_name = name
    ca = api.ca_file(lab_definition)
    Loopback.unnamed = ssl.create_default_context(cafile=str(ca) if ca else None)
    Loopback.unnamed.check_hostname = False
    sheet_dir = work / f"sheet-{how}"
    wait_no_server_jobs()
    sh([PYHPC, "workshop", "create", WORKSHOP, "--participants", str(participants),
        "--start", "now", "--hours", "2", "--nodes", "2", "--partition", "cpu",
        "--jobs-per-user", "2", "--out", str(sheet_dir)])
    try:
        with open(sheet_dir / f"{WORKSHOP}.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        people = [Participant(r["user"], r["password"], hub,
                              f"https://{r['user']}.{name}:{port}/user/{r['user']}/",
                              ca) for r in rows]
        before = resident_kib("pyhpc-hub")
        go = threading.Event()
        threads = [threading.Thread(target=p.log_in_and_spawn, args=(go,)) for p in people]
        for t in threads:
            t.start()
        time.sleep(5)  # every participant logged in and holds the form
        first = time.monotonic()
        go.set()
        for t in threads:
            t.join()
        waiting = [p for p in people if not p.error]
        most_running, reasons = 0, set()
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            jobs = server_jobs()
            most_running = max(most_running, sum(s == "RUNNING" for s, _ in jobs))
            reasons |= {r for s, r in jobs if s == "PENDING"}
            for p in list(waiting):
                try:
                    state = "ready" if p.ready else p.state()
                    if state == "ready" and not p.ready:
                        p.ready = time.monotonic()
                    if state == "ready" and p.answers():
                        p.serving = time.monotonic()
                        waiting.remove(p)
                    elif state == "none":
                        p.failed = time.monotonic()
                        p.failure = p.failure_message()
                        waiting.remove(p)
                except OSError:
                    pass
            time.sleep(1)
        after = resident_kib("pyhpc-hub")
        ready = sorted(p.ready - first for p in people if p.ready)
        serving = sorted(p.serving - first for p in people if p.serving)
        failed = sorted(p.failed - first for p in people if p.failed)
        cpu = cpu_nodes(declared)
        return {
            "cpus_per_node": cpu["cpus"], "memory_mb_per_node": cpu["memory_mb"],
            "nodes": cpu["count"], "start_timeout_s": start_timeout_s(),
            "participants": participants, "ready": len(ready), "serving": len(serving),
            "failed": len(failed), "most_running_at_once": most_running,
            "pending_reasons": sorted(reasons),
            "failures": sorted({p.failure for p in people if p.failure}),
            "never_ended": [p.user for p in people if not (p.serving or p.failed or p.error)],
            "errors": {p.user: p.error for p in people if p.error},
            "seconds_to_ready": [round(s, 1) for s in ready],
            "seconds_to_serving": [round(s, 1) for s in serving],
            "seconds_to_failure": [round(s, 1) for s in failed],
            "last_ready_s": round(ready[-1], 1) if ready else None,
            "all_ready_s": round(ready[-1], 1) if len(ready) == participants else None,
            "median_ready_s": round(ready[len(ready) // 2], 1) if ready else None,
            "last_serving_s": round(serving[-1], 1) if serving else None,
            "hub_rss_kib_before": before, "hub_rss_kib_after": after,
            "server_origin_tls": "chain verified against the hub's CA; the name not, where the "
                                 "hub's name is one label (OpenSSL matches no *.localhost)"
                                 if "." not in name else "chain and name verified"}
    finally:
        sh([PYHPC, "workshop", "delete", WORKSHOP, "--homes"])
        wait_no_server_jobs()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--participants", type=int, default=20)
    args = parser.parse_args()
    real_cpus = os.cpu_count() or 1
    stock = cpu_nodes(yaml.safe_load(paths.LAB_CLUSTER.read_text()))
    figures: dict[str, Any] = {"participants": args.participants, "machine_cpus": real_cpus}
    with tempfile.TemporaryDirectory(prefix="pyhpc-bench-hub-") as tmp:
        work = Path(tmp)
        try:
            if stock["cpus"] != real_cpus:
                figures["real_deploy_s"] = round(deploy(
                    definition(work, real_cpus, stock["memory_mb"])), 1)
                lab.wait_for_idle_nodes("cpu", stock["count"])
            figures["real"] = run(args.participants, work, "real")
            figures["real"]["definition"] = (
                f"each CPU node declared with the {real_cpus} CPUs this machine has, "
                f"{stock['memory_mb']} MiB")
            figures["declared_deploy_s"] = round(deploy(
                definition(work, DECLARED_CPUS, DECLARED_MEMORY_MB)), 1)
            lab.wait_for_idle_nodes("cpu", stock["count"])
            figures["declared"] = run(args.participants, work, "declared")
            figures["declared"]["definition"] = (
                f"each CPU node declared with {DECLARED_CPUS} CPUs and {DECLARED_MEMORY_MB} MiB "
                f"on this {real_cpus}-CPU machine (Slurm's config_overrides)")
        finally:
            figures["restore_s"] = round(deploy(), 1)
    print(json.dumps(figures, indent=1))
    print(record.write("hub", figures))
    return 0 if figures["declared"]["serving"] == args.participants else 1


if __name__ == "__main__":
    raise SystemExit(main())
