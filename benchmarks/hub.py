"""The hub under a workshop's first minute: twenty participants log in and start their
servers at once; prints figures, writes benchmarks/results/hub.json.

The stock lab has 8 CPUs for jobs, so the benchmark redeploys it with 16 CPUs declared on
each CPU node (Slurm's config_overrides: declared, not real; a server idles) and a
workshop of ``--participants`` reserving both CPU nodes. Each participant, in a thread of
its own, does over HTTPS what the browser does: GET the login page (its _xsrf), POST the
password, GET the spawn form and POST it as preselected. Then until every server is ready
(the hub's REST API, as the participant): the seconds from the first POST to each server's
readiness, the hub's and the proxy's resident memory before and after, and how many never
came (a lost spawn). At the end the workshop is deleted and the stock lab redeployed.

    python -m benchmarks.hub                    # ~10 min
    python -m benchmarks.hub --participants 5
"""
from __future__ import annotations

import argparse
import csv
import http.cookiejar
import json
import re
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from benchmarks import record
from pyhpc import paths

PYHPC = "/opt/pyhpc/venv/bin/pyhpc"
WORKSHOP = "hubload"
HUB = "https://localhost:8000/"
CA = Path("/etc/pyhpc/hub/ca.crt")
FIELDS = ("reservation", "account", "qos", "partition", "nodes", "gpus_per_node", "time")
READY_TIMEOUT_S = 900


def sh(argv: list[str], **kw: Any) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.hub: {' '.join(argv[:5])}: {proc.stderr.strip()[-400:]}")
    return proc.stdout if isinstance(proc.stdout, str) else ""


def definition(work: Path) -> Path:
    """The lab's definition with 16 CPUs declared on each CPU node."""
    data = yaml.safe_load(paths.LAB_CLUSTER.read_text())
    for node in data["nodes"]:
        if node["name"] == "cpu":
            node.update(cpus=16, memory_mb=8192)
    out = work / "hubload.yml"
    out.write_text(yaml.safe_dump(data))
    return out


def deploy(cluster: Path | None = None) -> float:
    start = time.monotonic()
    sh(["make", "-C", str(record.ROOT), "deploy", *([f"CLUSTER={cluster}"] if cluster else [])],
       timeout=1800)
    return time.monotonic() - start


def resident_kib(user: str) -> dict[str, int]:
    """Resident memory of the hub user's processes by command (the hub, the proxy)."""
    out: dict[str, int] = {}
    for line in sh(["ps", "-u", user, "-o", "rss=,comm="]).splitlines():
        rss, _, comm = line.strip().partition(" ")
        out[comm.strip()] = out.get(comm.strip(), 0) + int(rss)
    return out


class Participant:
    """One browser's worth of HTTPS: cookies, the _xsrf token, the forms."""

    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user, password
        context = ssl.create_default_context(cafile=str(CA))
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()),
            urllib.request.HTTPSHandler(context=context))
        self.asked = self.ready = 0.0
        self.error = ""

    def get(self, path: str) -> str:
        with self.opener.open(HUB + path, timeout=60) as reply:
            return str(reply.read().decode())

    def post(self, path: str, fields: dict[str, str]) -> str:
        data = urllib.parse.urlencode(fields).encode()
        with self.opener.open(urllib.request.Request(HUB + path, data=data), timeout=120) as reply:
            return str(reply.geturl())

    @staticmethod
    def xsrf(page: str) -> str:
        """The page's _xsrf token: a hidden field (the login form) or in the form's action
        (the spawn form: action="/hub/spawn?_xsrf=...")."""
        found = re.search(r'name="_xsrf" value="([^"]+)"|[?&]_xsrf=([^"&]+)"', page)
        return next((g for g in found.groups() if g), "") if found else ""

    def log_in_and_spawn(self, go: threading.Event) -> None:
        try:
            page = self.get("hub/login")
            self.post("hub/login", {"username": self.user, "password": self.password,
                                    "_xsrf": self.xsrf(page)})
            form = self.get("hub/spawn")
            fields = {}
            for name in FIELDS:  # each select's preselected option, as the browser sends it
                found = re.search(rf'name="{name}">.*?<option value="([^"]*)" selected', form, re.S)
                if found:
                    fields[name] = found.group(1)
            go.wait()
            self.asked = time.monotonic()
            self.post(f"hub/spawn/{self.user}", {**fields, "_xsrf": self.xsrf(form)})
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def is_ready(self) -> bool:
        model = json.loads(self.get(f"hub/api/users/{self.user}"))
        return bool(model.get("servers", {}).get("", {}).get("ready"))


def run(participants: int, work: Path) -> dict[str, Any]:
    sheet_dir = work / "sheet"
    sh([PYHPC, "workshop", "create", WORKSHOP, "--participants", str(participants),
        "--start", "now", "--hours", "2", "--nodes", "2", "--partition", "cpu",
        "--jobs-per-user", "2", "--out", str(sheet_dir)])
    try:
        with open(sheet_dir / f"{WORKSHOP}.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        people = [Participant(r["user"], r["password"]) for r in rows]
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
        deadline = time.monotonic() + READY_TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            for p in list(waiting):
                try:
                    if p.is_ready():
                        p.ready = time.monotonic()
                        waiting.remove(p)
                except OSError:
                    pass
            time.sleep(1)
        after = resident_kib("pyhpc-hub")
        done = sorted(p.ready - first for p in people if p.ready)
        return {"participants": participants, "ready": len(done),
                "not_ready": [p.user for p in people if not p.ready],
                "errors": {p.user: p.error for p in people if p.error},
                "seconds_to_ready": [round(s, 1) for s in done],
                "all_ready_s": round(done[-1], 1) if len(done) == participants else None,
                "median_ready_s": round(done[len(done) // 2], 1) if done else None,
                "hub_rss_kib_before": before, "hub_rss_kib_after": after}
    finally:
        sh([PYHPC, "workshop", "delete", WORKSHOP, "--homes"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--participants", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pyhpc-bench-hub-") as tmp:
        work = Path(tmp)
        deployed = deploy(definition(work))
        try:
            figures = run(args.participants, work)
        finally:
            restored = deploy()
    figures.update(deploy_s=round(deployed, 1), restore_s=round(restored, 1),
                   definition="the lab's, with 16 CPUs declared on each CPU node")
    print(json.dumps(figures, indent=1))
    print(record.write("hub", figures))
    return 0 if figures["ready"] == args.participants else 1


if __name__ == "__main__":
    raise SystemExit(main())
