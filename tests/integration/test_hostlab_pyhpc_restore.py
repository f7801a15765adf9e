"""The db host lost and restored on hostlab's Debian 12 hosts (issue 47): the runbook of
docs/admin/backups.md ("Accounting"), and no record of a job that ended meanwhile lost.

A backup of db while a job runs; db removed with its volumes (MariaDB's data goes with the
container); jobs end while slurmdbd is gone, and slurmctld queues their records. Then the
runbook: `make hostlab-up` (db anew), `make hostlab-deploy` (it holds the new slurmdbd
stopped, and says so), `pyhpc admin restore` on db (it loads the backup and starts
slurmdbd, which gets slurmctld's queue). The hosts stay converged for the next module.

After test_hostlab_pyhpc_backup.py, whose converged Debian 12 hosts it reuses.
"""
from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

# pytest puts this directory on sys.path (rootdir-relative, no package).
from test_hostlab import HOSTLAB, HOSTS, RECAP, SKIP, _run, main_pids, mark_converged, run_on
from test_hostlab_life import converge, make_with, wait_for
from test_hostlab_pyhpc_backup import PYHPC, ok

from pyhpc.admin import backup

pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

HOLD = str(backup.HOLD)  # the deploy's mark (the slurm role's slurm_dbd_hold_file)
DBD_LOG = "/var/log/slurm/slurmdbd.log"


#: Submissions that time out while db is gone, before one is taken (seen in CI: slurmctld,
#: still reaching for the lost host's slurmdbd, did not answer sbatch within MessageTimeout).
TRIES = 5


def job(tag: str) -> str:
    """A job of user1 run to its end (sbatch --wait). A submission that times out is made
    again, as a user would; any other failure, or TRIES timeouts, fails the test."""
    for _ in range(TRIES):
        proc = run_on("login", "su", "-", "user1", "-c", f"sbatch --parsable --wait -J {tag} "
                      "--time=1 --output=/dev/null --wrap true", timeout=300)
        if proc.returncode == 0:
            return proc.stdout.strip()
        assert "Socket timed out" in proc.stderr, proc.stderr
    pytest.fail(f"sbatch timed out {TRIES} times in a row")


def jobs(count: int, tag: str) -> list[str]:
    """``count`` jobs of user1 run to their end."""
    return [job(tag) for _ in range(count)]


def ended(ids: list[str]) -> dict[str, str]:
    """Each job accounting holds as COMPLETED -> its end time."""
    out = run_on("login", "sacct", "-n", "-X", "-P", "-j", ",".join(ids),
                 "-o", "JobID,State,End").stdout
    return {f[0]: f[2] for f in (line.split("|") for line in out.splitlines())
            if len(f) == 3 and f[1] == "COMPLETED"}


def queued() -> int:
    """slurmctld's records waiting for slurmdbd (sdiag's DBD Agent queue size)."""
    found = re.search(r"DBD Agent queue size:\s*(\d+)", ok("login", "sdiag"))
    assert found, "sdiag shows no DBD Agent queue size"
    return int(found.group(1))


def remove_db() -> None:
    """db lost with its disks: the container (MariaDB's data is in it) and its volumes."""
    proc, _ = _run([*HOSTLAB, "podman", "volume", "ls", "--format", "{{.Name}}"])
    _run([*HOSTLAB, "podman", "rm", "--force", "db"])
    for volume in (v for v in proc.stdout.split() if "-db-" in v):
        _run([*HOSTLAB, "podman", "volume", "rm", volume])


@pytest.fixture(scope="module")
def restored() -> dict[str, Any]:
    converge("bookworm")
    started = time.monotonic()
    before = jobs(2, "before")
    wait_for("the jobs before the backup recorded", lambda: len(ended(before)) == 2, 120)
    # Running at the backup, ended in the outage: the backup holds it as running.
    running = ok("login", "su", "-", "user1", "-c", "sbatch --parsable -J running --time=2 "
                 "--output=/dev/null --wrap 'sleep 25'").strip()
    wait_for("the long job running", lambda: ok("login", "squeue", "-h", "-j", running,
                                                  "-o", "%T").strip() == "RUNNING", 60)
    taken = json.loads(ok("db", PYHPC, "admin", "backup", "now", "--json"))
    pids = main_pids()
    mark_converged(None)
    remove_db()
    try:
        return {**_outage_and_restore(started, taken, before, running), "pids_before": pids}
    except BaseException:
        # The next module's deploy would hold slurmdbd again: restore what can be.
        if run_on("db", "test", "-e", HOLD).returncode == 0:
            run_on("db", PYHPC, "admin", "restore", timeout=300)
        raise


def _outage_and_restore(started: float, taken: dict[str, Any], before: list[str],
                        running: str) -> dict[str, Any]:
    outage = jobs(3, "outage")
    wait_for("the long job ended", lambda: not ok("login", "squeue", "-h", "-j", running,
                                                    "-o", "%T").strip(), 90)
    in_queue = queued()
    make_with("hostlab-up", release="bookworm")
    deployed, deploy_s = make_with("hostlab-deploy", release="bookworm")
    pids = main_pids()
    held = {"active": run_on("db", "systemctl", "is-active", "slurmdbd").stdout.strip(),
            "enabled": run_on("db", "systemctl", "is-enabled", "slurmdbd").stdout.strip(),
            "mark": run_on("db", "test", "-e", HOLD).returncode == 0,
            "queued": queued()}
    done = json.loads(ok("db", PYHPC, "admin", "restore", "--json"))
    start = time.monotonic()
    every = [*before, running, *outage]
    wait_for("the queued records in accounting", lambda: len(ended(every)) == len(every), 180, 3)
    arrived_s = time.monotonic() - start
    mark_converged("bookworm")
    figures = {"queued_at_loss": in_queue, "redeploy_s": round(deploy_s, 1),
               "records_arrived_s": round(arrived_s, 1),
               "wall_s": round(time.monotonic() - started, 1)}
    print(f"test_hostlab_pyhpc_restore: {json.dumps(figures)}")
    return {"backup": taken, "deployed": deployed, "pids_after": pids, "held": held, "done": done,
            "before": before, "running": running, "outage": outage, "figures": figures}


def test_the_new_dbs_deploy_holds_slurmdbd_and_says_what_to_do(restored: dict[str, Any]) -> None:
    # The queue waits in slurmctld, the new slurmdbd off, in the hold's mark.
    assert restored["figures"]["queued_at_loss"] >= 4, restored["figures"]
    held = restored["held"]
    assert held["active"] != "active" and held["enabled"] == "disabled" and held["mark"], held
    assert held["queued"] >= restored["figures"]["queued_at_loss"], held
    # One message, which the deploy's YAML output wraps.
    line = ("slurmdbd on db is held stopped (a new, empty accounting database; slurmctld on ctl "
            "keeps the records of the jobs that ended meanwhile): run `pyhpc admin restore` on "
            "db; to start it empty instead, deploy with -e slurm_dbd_start_empty=true")
    assert line in re.sub(r"\s+", " ", restored["deployed"]), restored["deployed"][-3000:]


def test_the_new_dbs_deploy_changes_nothing_on_the_other_hosts_and_restarts_none_of_their_daemons(
        restored: dict[str, Any]) -> None:
    """A host replaced disturbs no other: for them the deploy is a second deploy, which
    changes nothing and restarts nothing (the deploy's idempotence on hosts)."""
    recap = {m[0]: m[2] for m in RECAP.findall(restored["deployed"])}
    others = [host for host in HOSTS if host != "db"]
    assert {host: recap.get(host) for host in others} == dict.fromkeys(others, "0"), recap
    kept = {unit: pid for unit, pid in restored["pids_before"].items() if not unit.startswith("db/")}
    assert all(pid not in ("", "0") for pid in kept.values()), kept
    assert {unit: restored["pids_after"][unit] for unit in kept} == kept


def test_the_restore_releases_slurmdbd_and_every_queued_record_arrives(
        restored: dict[str, Any]) -> None:
    assert restored["done"]["accounting"]["released"] is True
    assert ok("db", "systemctl", "is-active", "slurmdbd").strip() == "active"
    assert ok("db", "systemctl", "is-enabled", "slurmdbd").strip() == "enabled"
    assert run_on("db", "test", "-e", HOLD).returncode != 0
    every = [*restored["before"], restored["running"], *restored["outage"]]
    recorded = ended(every)
    assert sorted(recorded) == sorted(every), recorded
    # The job the backup held as running got its real end, after the backup.
    assert recorded[restored["running"]] not in ("", "Unknown"), recorded
    wait_for("slurmctld's queue empty", lambda: queued() == 0, 60)


def test_nothing_reached_the_new_slurmdbd_before_the_restore(restored: dict[str, Any]) -> None:
    log = ok("db", "cat", DBD_LOG)
    assert "couldn't add job" not in log and "_job_table' doesn't exist" not in log, log[-3000:]
