"""hostlab: one podman container per inventory host, systemd as PID 1, brought up with make.

Real podman, mmdebstrap and Ansible (containers.podman connection). Brings the hosts
up through `make hostlab-image` and `make hostlab-up` (twice: the second restarts
nothing) and leaves them up; `make hostlab-down` removes them. Prints the image build
time, the time for the hosts to come up and each host's memory (run pytest with -s).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyhpc import paths

INVENTORY = paths.ROOT / "ansible" / "inventories" / "hostlab" / "hosts.yml"
HOSTLAB = (sys.executable, str(paths.ROOT / "hostlab" / "hostlab.py"))
BIN = Path(sys.executable).parent


def _skip_reason() -> str | None:
    for tool in ("podman", "mmdebstrap"):
        if shutil.which(tool) is None:
            return (f"hostlab needs {tool}, which is missing "
                    "(apt-get install -y podman netavark aardvark-dns mmdebstrap)")
    if os.geteuid() != 0:
        return "hostlab needs root (rootful podman)"
    return None


SKIP = _skip_reason()
pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]


def _hosts() -> list[str]:
    data = yaml.safe_load(INVENTORY.read_text())["all"]["children"]
    return list(dict.fromkeys(h for group in data.values() for h in (group.get("hosts") or {})))


HOSTS = _hosts()
COMPUTE = list(yaml.safe_load(INVENTORY.read_text())["all"]["children"]["compute"]["hosts"])


def _run(argv: list[str] | tuple[str, ...], timeout: int = 600) -> tuple[subprocess.CompletedProcess[str],
                                                                         float]:
    start = time.monotonic()
    proc = subprocess.run(list(argv), cwd=paths.ROOT, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - start
    print(f"$ {' '.join(argv)}  ({took:.1f} s)\n{proc.stdout}{proc.stderr}")
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stdout}\n{proc.stderr}"
    return proc, took


def _make(target: str, timeout: int = 900) -> tuple[str, float]:
    proc, took = _run(["make", "--no-print-directory", target], timeout=timeout)
    return proc.stdout, took


def on(host: str, *cmd: str) -> str:
    """Run a command on a host through hostlab (podman exec); its stdout."""
    proc, _ = _run([*HOSTLAB, "run", host, "--", *cmd], timeout=60)
    return proc.stdout.strip()


def status() -> dict[str, dict[str, Any]]:
    proc, _ = _run([*HOSTLAB, "status", "--json"])
    return {row["host"]: row for row in json.loads(proc.stdout)}


@pytest.fixture(scope="module")
def hostlab() -> dict[str, Any]:
    """The hosts up: image (built or cached), then `make hostlab-up`; the figures measured."""
    out, first = _make("hostlab-image", timeout=1800)
    built = "image built in" in out
    _, cached = _make("hostlab-image")
    out, up = _make("hostlab-up")
    figures = {"image_s": first, "image_built": built, "image_cached_s": cached, "up_s": up,
               "up_started": "started " in out, "status": status()}
    print(f"hostlab: image {'built (cold)' if built else 'was cached'} in {first:.1f} s, "
          f"cached in {cached:.1f} s; make hostlab-up {up:.1f} s "
          f"({'hosts started' if figures['up_started'] else 'hosts were already running'})")
    return figures


def test_second_up_restarts_no_running_host(hostlab: dict[str, Any]) -> None:
    before = hostlab["status"]
    out, took = _make("hostlab-up")
    after = status()
    assert "were already running" in out and "started" not in out
    for host in HOSTS:
        assert after[host]["state"] == "running"
        assert (after[host]["id"], after[host]["started_at"]) == \
            (before[host]["id"], before[host]["started_at"]), f"{host} was restarted"
    print(f"hostlab: idempotent make hostlab-up {took:.1f} s")


def test_every_host_booted_systemd(hostlab: dict[str, Any]) -> None:
    states = {}
    for host in HOSTS:
        proc = subprocess.run([*HOSTLAB, "run", host, "systemctl", "is-system-running"],
                              capture_output=True, text=True, timeout=60)
        states[host] = proc.stdout.strip()
        assert on(host, "cat", "/proc/1/comm") == "systemd"
    assert all(s in ("running", "degraded") for s in states.values()), states


def test_hostnames_are_the_inventory_names(hostlab: dict[str, Any]) -> None:
    names = [on(host, "hostname") for host in HOSTS]
    assert names == HOSTS and len(set(names)) == len(HOSTS)


def test_hosts_resolve_each_other_by_name(hostlab: dict[str, Any]) -> None:
    ctl_addr = on("ctl", "hostname", "-I").split()[0]
    for host in HOSTS:
        answer = on("login", "getent", "hosts", host).split()
        assert answer, f"login cannot resolve {host}"
        if host == "ctl":
            assert answer[0] == ctl_addr
        assert not answer[0].startswith("127."), f"{host} resolves to loopback: {answer}"


def test_ansible_sees_systemd_on_every_host(hostlab: dict[str, Any]) -> None:
    env = dict(os.environ, ANSIBLE_CONFIG=str(paths.ROOT / "ansible" / "ansible.cfg"),
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    proc = subprocess.run([str(BIN / "ansible"), "-i", str(INVENTORY), "all", "-m", "setup",
                           "-a", "filter=ansible_service_mgr"],
                          cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=300)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]
    managers = {host: r.get("ansible_facts", {}).get("ansible_service_mgr") for host, r in results.items()}
    assert managers == {host: "systemd" for host in HOSTS}


@pytest.mark.parametrize("host", COMPUTE)
def test_compute_host_has_a_writable_cgroup_subtree(hostlab: dict[str, Any], host: str) -> None:
    assert on(host, "systemctl", "is-active", "pyhpc-cgroup-rw.service") == "active"
    probe = "/sys/fs/cgroup/memory/pyhpc-hostlab-probe"
    on(host, "sh", "-c", f"mkdir {probe} && test -e {probe}/memory.limit_in_bytes && rmdir {probe}")


def test_memory_per_host(hostlab: dict[str, Any]) -> None:
    rows = status()
    mib = {h: rows[h]["usage_bytes"] / 2**20 for h in HOSTS}
    rss = {h: rows[h]["rss_bytes"] / 2**20 for h in HOSTS}
    print("hostlab: memory per host (MiB, cgroup usage / rss): "
          + ", ".join(f"{h} {mib[h]:.0f}/{rss[h]:.0f}" for h in HOSTS))
    assert all(m < 512 for m in mib.values()), mib
