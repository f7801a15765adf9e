"""A host moved in place from Debian 12 to Debian 13 (issue 46 item 3): `make debian-release
HOSTS=gpu2` on hostlab's Debian 12 cluster, as an admin runs it on a real one (the
debian_release role: apt's sources, apt's two steps, a reboot, checks). After it gpu2 runs
Debian 13 with every package installed and Slurm 24.11's slurmd held (masked, stopped)
for the upgrade's next step, and the rest of the cluster runs jobs. A second run changes
nothing. Before it, a host without the room the move needs stops it in one line, nothing
changed. Runs last of hostlab's modules: it removes gpu2 afterwards (the next converge
makes it again). The move's figures, each host and the package cache, are
`make bench-upgrade-hosts`'s (benchmarks/upgrade_hosts.py).
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

# pytest puts this directory on sys.path (rootdir-relative, no package).
from test_hostlab import HOSTLAB, HOSTS, SKIP, _run, mark_converged, on, run_on, status
from test_hostlab_life import INVENTORY_DIR, MOVED_HOST, converge, node_states, wait_for

from benchmarks.hostlab import recap
from pyhpc import paths

pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

HOST = MOVED_HOST
STATE_DIR = "/var/lib/pyhpc/release"


def debian_release(hosts: str, *flags: str, timeout: int = 2400) -> tuple[int, str, float]:
    """`make debian-release HOSTS=hosts` against hostlab's inventory, whatever its status."""
    argv = ["make", "--no-print-directory", "debian-release", f"INVENTORY={INVENTORY_DIR}",
            f"HOSTS={hosts}", *([f"ANSIBLE_FLAGS={' '.join(flags)}"] if flags else [])]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=paths.ROOT, env=dict(os.environ), capture_output=True,
                          text=True, timeout=timeout)
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    print(f"$ {' '.join(argv)}  ({took:.1f} s, exit {proc.returncode})\n{out[-4000:]}")
    return proc.returncode, out, took


def looks() -> dict[str, str]:
    """What a refused move must leave as it was on HOST."""
    return {"sources": on(HOST, "sha256sum", "/etc/apt/sources.list"),
            "release": on(HOST, "bash", "-c", ". /etc/os-release; echo $VERSION_CODENAME"),
            "state dir": run_on(HOST, "ls", "-A", STATE_DIR).stdout,
            "slurmd": run_on(HOST, "systemctl", "is-active", "slurmd").stdout.strip()}


def deployed_debian_12() -> bool:
    """Whether hostlab's hosts all run, on Debian 12, with Slurm answering and HOST's slurmd
    up: as test_hostlab_takeover leaves them, when it ran just before."""
    rows = status()
    if any(rows.get(host, {}).get("state") != "running" for host in HOSTS):
        return False
    host = looks()
    return (host["release"] == "bookworm" and host["slurmd"] == "active"
            and node_states().get("cpu1") == "idle")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """Debian 12 hosts with the deploy's Slurm; HOST removed after. The move needs a
    deployed Debian 12 host, not the repository's topology: hosts as the module before
    left them are used as they are; else the repository's hostlab is converged."""
    if not deployed_debian_12():
        converge("bookworm")
    yield
    _run([*HOSTLAB, "podman", "rm", "--force", "--ignore", HOST])
    mark_converged(None)


def test_a_move_without_hosts_or_room_stops_in_one_line_and_changes_nothing(cluster: None) -> None:
    before = looks()
    assert before["release"] == "bookworm" and before["slurmd"] == "active", before

    rc, out, _ = debian_release("")
    assert rc != 0
    assert "debian_release_hosts: name the hosts to move" in out

    rc, out, _ = debian_release(HOST, "-e debian_release_min_free_mib=100000000")
    assert rc != 0
    line = next(line for line in out.splitlines() if f"host {HOST}: bookworm with" in line)
    assert "debian_release_min_free_mib" in out, line
    assert looks() == before


def test_the_host_moves_to_debian_13_with_slurm_held_and_the_cluster_runs_on(cluster: None) -> None:
    rc, out, took = debian_release(HOST)
    assert rc == 0, out[-3000:]
    print(f"{HOST} moved in {took:.1f} s")

    assert on(HOST, "bash", "-c", ". /etc/os-release; echo $VERSION_CODENAME") == "trixie"
    assert on(HOST, "dpkg", "--audit") == ""
    assert on(HOST, "dpkg-query", "--showformat=${Version}", "--show", "slurmd").startswith("24.11")
    # held for the upgrade's next step: a 24.11 slurmd does not join a 22.05 controller
    assert run_on(HOST, "systemctl", "is-enabled", "slurmd").stdout.strip() == "masked"
    assert run_on(HOST, "systemctl", "is-active", "slurmd").stdout.strip() == "inactive"
    assert on(HOST, "cat", f"{STATE_DIR}/masked") == "slurmd.service"
    # apt's sources name trixie; the old file is kept beside; the move's proxy is gone
    assert "bookworm" not in on(HOST, "cat", "/etc/apt/sources.list")
    assert "bookworm" in on(HOST, "bash", "-c", "cat /etc/apt/sources.list.*~")
    assert run_on(HOST, "test", "-e", "/etc/apt/apt.conf.d/80pyhpc-release-proxy").returncode == 1
    assert "packages done" in on(HOST, "cat", f"{STATE_DIR}/trixie.log")

    # the hosts that did not move run jobs as before
    job = on("login", "sbatch", "--parsable", "-p", "cpu", "-o", "/dev/null", "--wrap", "true")
    wait_for(f"job {job} on cpu1 done", lambda: run_on(
        "login", "sacct", "-nXP", "-j", job, "--format=State").stdout.strip() == "COMPLETED")


def test_a_second_move_changes_nothing(cluster: None) -> None:
    mark = on(HOST, "stat", "--format=%Y", f"{STATE_DIR}/trixie")
    rc, out, took = debian_release(HOST)
    assert rc == 0, out[-3000:]
    assert recap(out)[HOST]["changed"] == 0
    assert on(HOST, "stat", "--format=%Y", f"{STATE_DIR}/trixie") == mark
    print(f"second run: {took:.1f} s")
