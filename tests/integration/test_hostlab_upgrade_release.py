"""Hosts moved in place from Debian 12 to Debian 13 (issue 46 item 3), and the accounting
database converted (item 2's route): `make debian-release HOSTS=gpu2` on hostlab's Debian
12 cluster, as an admin runs it on a real one (the debian_release role: apt's sources,
apt's two steps, a reboot, checks). After it gpu2 runs Debian 13 with every package
installed and Slurm 24.11's slurmd held (masked, stopped), and the rest of the cluster runs
jobs. A second run changes nothing. Before it, a pattern that names no host, a host without
room and a host that is down each stop it in one line, nothing changed. Then db moves and
`make upgrade-accounting` converts its database: a refusal goes back to the dump, a second
try keeps every job, a third changes nothing. Runs last of hostlab's modules: the next
converge replaces the hosts it moved. The move's figures, each host and the package cache,
are `make bench-upgrade-hosts`'s (benchmarks/upgrade_hosts.py).
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

# pytest puts this directory on sys.path (rootdir-relative, no package).
from test_hostlab import HOSTLAB, HOSTS, SKIP, _run, mark_converged, on, run_on, status
from test_hostlab_life import INVENTORY_DIR, MOVED_HOSTS, converge, node_states, wait_for

from benchmarks.hostlab import recap
from pyhpc import paths

pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

HOST, DB = MOVED_HOSTS
STATE_DIR = "/var/lib/pyhpc/release"
DATABASE = "slurm_acct_db"


def debian_release(hosts: str, *flags: str, timeout: int = 2400) -> tuple[int, str, float]:
    """`make debian-release HOSTS=hosts` against hostlab's inventory, whatever its status."""
    return make("debian-release", f"HOSTS={hosts}", *flags, timeout=timeout)


def make(target: str, *args: str, timeout: int = 2400) -> tuple[int, str, float]:
    """`make TARGET [ARGS]` against hostlab's inventory (a flag in ARGS: ANSIBLE_FLAGS)."""
    flags = [a for a in args if a.startswith("-")]
    argv = ["make", "--no-print-directory", target, f"INVENTORY={INVENTORY_DIR}",
            *[a for a in args if not a.startswith("-")],
            *([f"ANSIBLE_FLAGS={' '.join(flags)}"] if flags else [])]
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
            and node_states().get("cpu1") == "idle"
            and run_on(DB, "systemctl", "is-active", "slurmdbd").stdout.strip() == "active")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """Debian 12 hosts with the deploy's Slurm. The move needs a deployed Debian 12 host,
    not the repository's topology: hosts as the module before left them are used as they
    are; else the repository's hostlab is converged. The moved hosts stay: the next
    converge replaces them (it knows a moved host by the move's state directory)."""
    if not deployed_debian_12():
        converge("bookworm")
    yield
    mark_converged(None)


def test_a_move_without_hosts_room_or_answer_stops_in_one_line_and_changes_nothing(cluster: None) -> None:
    before = looks()
    assert before["release"] == "bookworm" and before["slurmd"] == "active", before

    rc, out, _ = debian_release("")
    assert rc != 0
    assert "debian_release_hosts: name the hosts to move" in out

    rc, out, _ = debian_release("nosuch")
    assert rc != 0
    assert "debian_release_hosts: nosuch names no host of the inventory" in out

    rc, out, _ = debian_release(HOST, "-e debian_release_min_free_mib=100000000")
    assert rc != 0
    line = next(line for line in out.splitlines() if f"host {HOST}: bookworm with" in line)
    assert "debian_release_min_free_mib" in out, line
    assert looks() == before

    # A host that is down stops the move of every host named, before any changes.
    _run([*HOSTLAB, "podman", "stop", HOST])
    try:
        rc, out, _ = debian_release(f"cpu1:{HOST}", "-e reachable_timeout_s=5")
    finally:
        _run([*HOSTLAB, "podman", "start", HOST])
    assert rc != 0
    assert f"host {HOST}: down or unreachable (no answer within 5 s); nothing changed" in out
    assert "TASK [debian_release" not in out
    wait_for(f"{HOST} back", lambda: run_on(HOST, "systemctl", "is-active", "slurmd").stdout.strip()
             == "active")
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


def db_sql(query: str) -> list[str]:
    return on(DB, "mysql", "-N", "-B", DATABASE, "-e", query).splitlines()


def history() -> dict[str, object]:
    """What accounting holds of every job, read from its tables (sacct needs a slurmctld
    of the same release, which the moved db does not have yet)."""
    cluster = db_sql("select name from cluster_table where deleted = 0")[0]
    return {"schema": db_sql("select version from convert_version_table"),
            "jobs": db_sql(f"select id_job, id_user, account, exit_code, time_end - time_start, "
                           f"tres_alloc from {cluster}_job_table order by job_db_inx"),
            "steps": db_sql(f"select job_db_inx, id_step, exit_code, tres_alloc from "
                            f"{cluster}_step_table order by job_db_inx, id_step"),
            "associations": db_sql(f"select user, acct, max_jobs from {cluster}_assoc_table "
                                   "where deleted = 0 order by id_assoc")}


def slurmdbd_unit() -> tuple[str, str]:
    return (run_on(DB, "systemctl", "is-enabled", "slurmdbd").stdout.strip(),
            run_on(DB, "systemctl", "is-active", "slurmdbd").stdout.strip())


def test_the_accounting_host_moves_and_a_failed_conversion_goes_back_to_its_dump(
        cluster: None) -> None:
    """db moved (slurmdbd 24.11 held), then the conversion with slurmdbd.conf readable by
    others, which the new slurmdbd refuses after the replayed step changed the database:
    the database goes back to the dump, slurmdbd stays held, one line. Before it, history
    of its own: an array of six tasks, half of them failing, with their steps."""
    array = on("login", "sbatch", "--parsable", "-p", "cpu", "-o", "/dev/null", "--array=0-5",
               "--wrap", 'srun true; exit $((SLURM_ARRAY_TASK_ID % 2))')
    wait_for(f"array {array} done", lambda: sorted(run_on(
        "login", "sacct", "-nXP", "-j", array, "--format=State").stdout.split()) == [
            "COMPLETED"] * 3 + ["FAILED"] * 3, timeout=300)
    before = history()
    assert before["schema"] == ["12"] and len(before["jobs"]) >= 7, before
    assert len(before["steps"]) >= 12, before  # each task's batch step and its srun
    rc, out, took = debian_release(DB)
    assert rc == 0, out[-3000:]
    print(f"{DB} moved in {took:.1f} s")
    assert slurmdbd_unit() == ("masked", "inactive")
    assert history() == before  # MariaDB 11.8 took the tables over as they were

    on(DB, "chmod", "0644", "/etc/slurm/slurmdbd.conf")
    try:
        rc, out, _ = make("upgrade-accounting")
    finally:
        on(DB, "chmod", "0600", "/etc/slurm/slurmdbd.conf")
    assert rc != 0
    line = next(line for line in out.splitlines() if f"host {DB}: pyhpc-accounting-convert:" in line)
    assert "slurmdbd 24.11" in line and "the database is back as it was" in line, line
    assert history() == before
    assert slurmdbd_unit() == ("masked", "inactive")
    assert run_on(DB, "test", "-e", f"{STATE_DIR}/accounting-24.11").returncode == 1


def test_the_conversion_resumes_from_the_dump_keeps_every_job_and_starts_slurmdbd(
        cluster: None) -> None:
    before = history()
    start = time.monotonic()
    rc, out, _ = make("upgrade-accounting")
    assert rc == 0, out[-3000:]
    print(f"conversion: {time.monotonic() - start:.1f} s")
    after = history()
    assert after["schema"] == ["16"]
    assert {k: v for k, v in after.items() if k != "schema"} == {
        k: v for k, v in before.items() if k != "schema"}
    assert slurmdbd_unit() == ("enabled", "active")
    assert "started" in on(DB, "cat", f"{STATE_DIR}/accounting-24.11.log")
    # the dump it went back to, private; the second try reloaded it before the replay
    assert on(DB, "stat", "--format=%a %U", f"{STATE_DIR}/accounting-before-24.11.sql") == "600 root"

    rc, out, _ = make("upgrade-accounting")
    assert rc == 0, out[-3000:]
    assert recap(out)[DB]["changed"] == 0
