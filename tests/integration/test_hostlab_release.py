"""The upgrade to Debian 13 on hostlab's Debian 12 cluster (issue 46): `pyhpc admin upgrade
run` up to the accounting host, then rolled back.

- Bad input first: a pattern that names no host, a host without room and a host that is
  down each stop `make debian-release` in one line, nothing changed.
- The run (from here, as an admin runs it where they deploy from), stopped after the
  backups: the plan, the queue saved, the backups; called off there, the controller gives
  the queue back.
- The run again, to the accounting host: db moved in place (the debian_release role:
  apt's sources, apt's two steps, a reboot, checks), the move's test (every host moves
  the same way): Debian 13 with every package installed and slurmdbd 24.11 held, the
  other hosts as they were; the move again on its own (`make debian-release HOSTS=db`)
  changes nothing. Then its database converted: a refusal stops the run at that step and
  goes back to the dump; the next run goes on from that step and keeps every job; a run
  after changes nothing. The run's release-finish step on its own unmasks what the move
  held, once.
- The upgrade given up there: `pyhpc admin upgrade rollback` refuses while db runs
  Debian 13; once db is reinstalled with Debian 12 (a new container, new volumes), it
  deploys, restores db's accounting from the run's backup, and gives the queue back:
  every job of before the upgrade as it was, and jobs run again.

Runs after test_hostlab_pyhpc_restore, on the hosts it converged (the repository's
topology: the run's inventory is the one they were deployed from). A next converge
replaces hosts left moved where the rollback failed. The move's figures, each host and
the package cache, are `make bench-upgrade-hosts`'s (benchmarks/upgrade_hosts.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# pytest puts this directory on sys.path (rootdir-relative, no package).
from test_hostlab import HOSTLAB, HOSTS, SKIP, _run, mark_converged, on, run_on, status
from test_hostlab_life import INVENTORY_DIR, MOVED_HOSTS, converge, make_with, node_states, wait_for

from benchmarks.hostlab import recap
from pyhpc import paths
from pyhpc.admin.upgrade_run import PYHPC, RUN_DIR

pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

HOST, DB = MOVED_HOSTS
STATE_DIR = "/var/lib/pyhpc/release"
DATABASE = "slurm_acct_db"
BACKUP = "/var/backups/pyhpc"  # backup.path in hostlab's cluster.yml
#: What accounting held before db moved (test_the_run_moves_the_accounting_host's).
BEFORE: dict[str, dict[str, object]] = {}


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
    """Whether hostlab's hosts all run, on Debian 12, deployed from the repository's
    inventory (one controller), with Slurm answering and HOST's slurmd up: as
    test_hostlab_pyhpc_restore leaves them, when it ran just before."""
    rows = status()
    if any(rows.get(host, {}).get("state") != "running" for host in HOSTS):
        return False
    host = looks()
    controllers = run_on("login", "grep", "-c", "^SlurmctldHost=", "/etc/slurm/slurm.conf")
    return (host["release"] == "bookworm" and host["slurmd"] == "active"
            and controllers.stdout.strip() == "1"
            and all(run_on(h, "test", "-e", STATE_DIR).returncode == 1 for h in MOVED_HOSTS)
            and node_states().get("cpu1") == "idle"
            and run_on(DB, "systemctl", "is-active", "slurmdbd").stdout.strip() == "active")


def called_off() -> None:
    """What the run's steps left on hosts it did not move, away: the queue's reservation and
    record on ctl (restore gives back what save held), the run's record here."""
    if "pyhpc-upgrade" in reservation():
        # After db's move, restore fails at the reservation: 22.05's slurmctld cannot reach
        # 24.11's slurmdbd. slurmctld deletes it all the same.
        run_on("ctl", *PYHPC, "admin", "upgrade", "queue", "restore")
        run_on("login", "scontrol", "delete", "reservation=pyhpc-upgrade")
        assert "pyhpc-upgrade" not in reservation()
    run_on("ctl", "rm", "-rf", "/var/lib/pyhpc/upgrade-queue")
    shutil.rmtree(RUN_DIR, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """Debian 12 hosts deployed from the repository's inventory, the run's (the rollback
    deploys from it): as the module before left them where it converged them, else
    converged. Hosts left moved (the rollback failed): the next converge replaces them (it
    knows a moved host by the move's state directory)."""
    if not deployed_debian_12():
        converge("bookworm")
    called_off()
    yield
    called_off()
    if any(run_on(h, "test", "-e", STATE_DIR).returncode == 0 for h in MOVED_HOSTS):
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


def upgrade(command: str, *args: str) -> tuple[int, str, str]:
    """`pyhpc admin upgrade COMMAND` (run, rollback) from here, where hostlab is deployed
    from, on its inventory."""
    argv = [sys.executable, "-m", "pyhpc", "admin", "upgrade", command, "--inventory",
            str(INVENTORY_DIR / "hosts.yml"), *args]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=paths.ROOT, capture_output=True, text=True, timeout=3600,
                          env=dict(os.environ, PYHPC_CLUSTER=str(INVENTORY_DIR / "cluster.yml")))
    print(f"$ {' '.join(argv[1:])}  ({time.monotonic() - start:.1f} s, exit {proc.returncode})\n"
          f"{proc.stdout[-4000:]}{proc.stderr}")
    return proc.returncode, proc.stdout, proc.stderr


def steps_run(out: str) -> list[str]:
    return [line.split()[3].rstrip(":") for line in out.splitlines()
            if line.startswith("--- upgrade run: ")]


def reservation() -> str:
    """The upgrade's reservation as scontrol shows it; "" where there is none."""
    proc = run_on("login", "scontrol", "show", "reservation", "pyhpc-upgrade")
    return proc.stdout if proc.returncode == 0 else ""


def test_the_run_saves_the_queue_and_backs_up_and_can_be_called_off_then(cluster: None) -> None:
    """`pyhpc admin upgrade run --stop-after backup`: the plan, the queue saved (no job
    starts), the backups, the controller's with slurmctld's state. Called off there: queue
    restore on the controller, which kept its state, gives the queue back."""
    rc, out, err = upgrade("run", "--deadline", "0", "--stop-after", "backup")
    assert rc == 0, err
    assert steps_run(out) == ["plan", "queue-save", "backup"]
    assert "Phases, in order:" in out  # the plan, printed first
    assert "Flags=MAINT" in reservation()  # no job starts
    newest = on("ctl", "bash", "-c", f"ls -d {BACKUP}/ctl-* | tail -1")
    assert "slurmctld-state.tar.gz" in on("ctl", "ls", newest)
    state = on("ctl", "awk", "-F=", 'tolower($1) == "statesavelocation" {print $2}',
               "/etc/slurm/slurm.conf")
    assert on("ctl", "bash", "-c", f"tar -tzf {newest}/slurmctld-state.tar.gz | head -1") \
        == state.lstrip("/") + "/"
    record = json.loads(Path(RUN_DIR / "run.json").read_text())
    print({name: d["seconds"] for name, d in record["done"].items()})

    on("ctl", *PYHPC, "admin", "upgrade", "queue", "restore")
    assert "pyhpc-upgrade" not in reservation()
    job = on("login", "sbatch", "--parsable", "-p", "cpu", "-o", "/dev/null", "--wrap", "true")
    wait_for(f"job {job} done", lambda: run_on(
        "login", "sacct", "-nXP", "-j", job, "--format=State").stdout.strip() == "COMPLETED")
    called_off()


def test_the_run_moves_the_accounting_host(cluster: None) -> None:
    """`pyhpc admin upgrade run` from the start again, up to the accounting host's move: db
    moved with slurmdbd held. Before it, history of its own: an array of six tasks, half of
    them failing, with their steps."""
    array = on("login", "sbatch", "--parsable", "-p", "cpu", "-o", "/dev/null", "--array=0-5",
               "--wrap", 'srun true; exit $((SLURM_ARRAY_TASK_ID % 2))')
    wait_for(f"array {array} done", lambda: sorted(run_on(
        "login", "sacct", "-nXP", "-j", array, "--format=State").stdout.split()) == [
            "COMPLETED"] * 3 + ["FAILED"] * 3, timeout=300)
    before = history()
    assert before["schema"] == ["12"] and len(before["jobs"]) >= 6, before
    assert len(before["steps"]) >= 12, before  # each task's batch step and its srun
    BEFORE["history"] = before

    rc, out, err = upgrade("run", "--deadline", "0", "--stop-after", "move-dbd")
    assert rc == 0, err
    assert steps_run(out) == ["plan", "queue-save", "backup", "move-dbd"]
    assert "Flags=MAINT" in reservation()  # no job starts
    assert on(DB, "bash", "-c", ". /etc/os-release; echo $VERSION_CODENAME") == "trixie"
    assert on(DB, "dpkg", "--audit") == ""
    assert on(DB, "dpkg-query", "--showformat=${Version}", "--show", "slurmdbd").startswith("24.11")
    # held for the upgrade's next step: the database is converted first
    assert slurmdbd_unit() == ("masked", "inactive")
    held = on(DB, "cat", f"{STATE_DIR}/masked").split()  # slurmctld too on a backup controller
    assert "slurmdbd.service" in held and set(held) <= {"slurmdbd.service", "slurmctld.service"}
    # apt's sources name trixie; the old file is kept beside; the move's proxy is gone
    assert "bookworm" not in on(DB, "cat", "/etc/apt/sources.list")
    assert "bookworm" in on(DB, "bash", "-c", "cat /etc/apt/sources.list.*~")
    assert run_on(DB, "test", "-e", "/etc/apt/apt.conf.d/80pyhpc-release-proxy").returncode == 1
    assert "packages done" in on(DB, "cat", f"{STATE_DIR}/trixie.log")
    assert history() == before  # MariaDB 11.8 took the tables over as they were
    record = json.loads(Path(RUN_DIR / "run.json").read_text())
    assert sorted(record["done"]) == ["backup", "move-dbd", "plan", "queue-save"]
    print({name: d["seconds"] for name, d in record["done"].items()})
    # the hosts that did not move go on as they were (no job starts: the run's reservation)
    for other in ("cpu1", "gpu1", HOST):
        assert run_on(other, "systemctl", "is-active", "slurmd").stdout.strip() == "active"
    assert {node_states()[n] for n in ("cpu1", "gpu1", HOST)} <= {"idle", "maint", "resv"}


def test_a_second_move_changes_nothing(cluster: None) -> None:
    """The move on its own (make debian-release, the run's move step) on the moved host."""
    mark = on(DB, "stat", "--format=%Y", f"{STATE_DIR}/trixie")
    rc, out, took = debian_release(DB)
    assert rc == 0, out[-3000:]
    assert recap(out)[DB]["changed"] == 0
    assert on(DB, "stat", "--format=%Y", f"{STATE_DIR}/trixie") == mark
    assert slurmdbd_unit() == ("masked", "inactive")
    print(f"second run: {took:.1f} s")


def test_a_refused_conversion_stops_the_run_and_goes_back_to_its_dump(cluster: None) -> None:
    """The conversion with slurmdbd.conf readable by others, which the new slurmdbd refuses
    after the replayed step changed the database: the run stops at that step in one line,
    the database goes back to the dump, slurmdbd stays held."""
    before = history()
    on(DB, "chmod", "0644", "/etc/slurm/slurmdbd.conf")
    try:
        rc, out, err = upgrade("run", "--stop-after", "accounting")
    finally:
        on(DB, "chmod", "0600", "/etc/slurm/slurmdbd.conf")
    assert rc == 1
    assert steps_run(out) == ["accounting"]  # the steps done are not run again
    assert err == (f"pyhpc: error: step accounting failed (exit 2; its output: {RUN_DIR}/"
                   "accounting.log); fix the cause and run again: the run goes on from "
                   "accounting\n")
    log = (RUN_DIR / "accounting.log").read_text()
    line = next(line for line in log.splitlines() if f"host {DB}: pyhpc-accounting-convert:" in line)
    assert "slurmdbd 24.11" in line and "the database is back as it was" in line, line
    assert history() == before
    assert slurmdbd_unit() == ("masked", "inactive")
    assert run_on(DB, "test", "-e", f"{STATE_DIR}/accounting-24.11").returncode == 1


def test_the_next_run_converts_from_the_dump_keeps_every_job_and_starts_slurmdbd(
        cluster: None) -> None:
    before = history()
    rc, out, err = upgrade("run", "--stop-after", "accounting")
    assert rc == 0, err
    assert steps_run(out) == ["accounting"]
    after = history()
    assert after["schema"] == ["16"]
    assert {k: v for k, v in after.items() if k != "schema"} == {
        k: v for k, v in before.items() if k != "schema"}
    assert slurmdbd_unit() == ("enabled", "active")
    assert "started" in on(DB, "cat", f"{STATE_DIR}/accounting-24.11.log")
    # the dump it went back to, private; the second try reloaded it before the replay
    assert on(DB, "stat", "--format=%a %U", f"{STATE_DIR}/accounting-before-24.11.sql") == "600 root"
    record = json.loads(Path(RUN_DIR / "run.json").read_text())
    print(f"conversion: {record['done']['accounting']['seconds']} s")

    rc, out, err = upgrade("run", "--stop-after", "accounting")
    assert rc == 0, err
    assert steps_run(out) == [] and "nothing changed" in out
    rc, out, _ = make("upgrade-accounting")
    assert rc == 0, out[-3000:]
    assert recap(out)[DB]["changed"] == 0


def test_release_finish_unmasks_what_the_moves_held_once(cluster: None) -> None:
    """The run's release-finish step on its own (ansible/release_finish.yml): the moved
    host's held units unmasked for the deploy to start, the move marked finished; hosts
    not moved left alone; a second run changes nothing. (Setting slurmctld's state aside
    needs a moved controller: the whole run's.)"""
    # db's move held slurmdbd, and slurmctld too where db was a backup controller (as
    # test_hostlab_takeover leaves it).
    held = on(DB, "cat", f"{STATE_DIR}/masked").split()
    assert "slurmdbd.service" in held and set(held) <= {"slurmdbd.service", "slurmctld.service"}
    rc, out = release_finish()
    assert rc == 0, out[-3000:]
    assert on(DB, "cat", f"{STATE_DIR}/finished").split() == held
    for unit in held:  # unmasked, as they were before (slurmctld there: disabled)
        assert run_on(DB, "systemctl", "is-enabled", unit).stdout.strip() != "masked", unit
    assert slurmdbd_unit() == ("enabled", "active")
    for other in ("ctl", HOST):
        assert run_on(other, "test", "-e", f"{STATE_DIR}/finished").returncode == 1
    rc, out = release_finish()
    assert rc == 0, out[-3000:]
    assert all(row["changed"] == 0 for row in recap(out).values()), out[-3000:]


def release_finish() -> tuple[int, str]:
    argv = [str(paths.ROOT / ".venv" / "bin" / "ansible-playbook"), "-i",
            str(INVENTORY_DIR / "hosts.yml"), str(paths.ROOT / "ansible" / "release_finish.yml")]
    proc = subprocess.run(argv, cwd=paths.ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(paths.ROOT / "ansible" /
                                                                  "ansible.cfg")))
    print(proc.stdout[-4000:], proc.stderr)
    return proc.returncode, proc.stdout + proc.stderr


def reinstall(*hosts: str) -> None:
    """Hosts reinstalled with Debian 12, as an admin re-images them: their containers and
    volumes gone, new ones up from the Debian 12 image (hostlab's share of backups kept)."""
    proc, _ = _run([*HOSTLAB, "podman", "volume", "ls", "--format", "{{.Name}}"])
    _run([*HOSTLAB, "podman", "rm", "--force", *hosts])
    for volume in (v for v in proc.stdout.split() if any(f"-{h}-" in v for h in hosts)):
        _run([*HOSTLAB, "podman", "volume", "rm", volume])
    make_with("hostlab-up", release="bookworm")


def test_the_upgrade_rolls_back_to_debian_12_from_the_runs_backups(cluster: None) -> None:
    """Given up after db's move and conversion: refused in one line while db runs Debian 13,
    nothing changed; db reinstalled with Debian 12, the rollback deploys (db's slurmdbd
    held for its restore), loads the run's backup on db, gives the queue back. Then every
    job accounting held before the move is there as it was, and a job runs."""
    assert "history" in BEFORE, "test_the_run_moves_the_accounting_host did not run first"
    record = json.loads(Path(RUN_DIR / "run.json").read_text())
    assert sorted(record["backups"]) == ["ctl", DB], record
    rc, out, err = upgrade("rollback")
    assert rc == 2 and out == ""
    assert err == (f"pyhpc: error: host {DB} (trixie): not on the controller's release, "
                   "bookworm; reinstall it with bookworm (or return to a snapshot taken "
                   "before the move), then roll back again (nothing changed)\n")
    assert json.loads(Path(RUN_DIR / "run.json").read_text()) == record

    reinstall(DB)
    started = time.monotonic()
    rc, out, err = upgrade("rollback")
    assert rc == 0, err
    took = time.monotonic() - started
    assert f"{DB}: accounting restored from {record['backups'][DB]}" in out
    assert not (RUN_DIR / "run.json").exists()  # the next run starts a new upgrade
    assert "pyhpc-upgrade" not in reservation()
    assert run_on("ctl", "test", "-e", "/var/lib/pyhpc/upgrade-queue").returncode == 1
    assert on(DB, "bash", "-c", ". /etc/os-release; echo $VERSION_CODENAME") == "bookworm"
    assert on(DB, "dpkg-query", "--showformat=${Version}", "--show", "slurmdbd").startswith("22.05")
    assert slurmdbd_unit() == ("enabled", "active")
    after = history()
    before = BEFORE["history"]
    assert after["schema"] == before["schema"] == ["12"]
    assert after["associations"] == before["associations"]
    for key in ("jobs", "steps"):  # slurmctld may add what it queued; none lost or changed
        assert set(before[key]) <= set(after[key]), (key, before[key], after[key])
    wait_for("every node idle", lambda: set(node_states().values()) == {"idle"}, timeout=300)
    job = on("login", "sbatch", "--parsable", "-p", "all", "-N", "3", "-o", "/dev/null",
             "--wrap", "srun true")
    wait_for(f"job {job} done in accounting", lambda: run_on(
        "login", "sacct", "-nXP", "-j", job, "--format=State").stdout.strip() == "COMPLETED")
    print(f"rollback: {took:.1f} s")
    mark_converged("bookworm")  # every host deployed from the repository's inventory

    rc, out, err = upgrade("rollback")
    assert rc == 2 and "no upgrade run under way" in err
