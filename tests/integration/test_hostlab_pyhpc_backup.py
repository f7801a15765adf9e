"""Backups on hostlab's Debian 12 hosts (issue 47 item 1): systemd's pyhpc-backup.timer on
the hosts that hold the state (ctl: directory, keys, configuration; db: accounting), each
host's backup on the share (/var/backups/pyhpc, hostlab's NFS stand-in) where the other
hosts see it, and db's dump restored into a scratch database holds the job this test ran.

After test_hostlab_pyhpc.py, whose converged Debian 12 hosts it reuses (no deploy of its
own); the pyhpc environment, which runs the backups, exists only on Debian 12 hosts.
"""
from __future__ import annotations

import json
import time
from typing import Any

import pytest

# pytest puts this directory on sys.path (rootdir-relative, no package).
from test_hostlab import SKIP, run_on
from test_hostlab_life import converge

from pyhpc import cluster, paths

pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

DEFINITION = cluster.load(paths.ROOT / "ansible" / "inventories" / "hostlab" / "cluster.yml")
assert DEFINITION.backup is not None, "hostlab's definition backs up"
SHARE = DEFINITION.backup.path
#: Each backed-up host and the part only it holds.
HOLDS = {"db": "accounting.sql.gz", "ctl": "directory.ldif.gz"}
PYHPC = str(paths.SHARED_VENV / "bin" / "pyhpc")


def ok(host: str, *cmd: str, timeout: int = 300) -> str:
    proc = run_on(host, *cmd, timeout=timeout)
    assert proc.returncode == 0, f"[{host}] {' '.join(cmd)}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def hosts() -> dict[str, Any]:
    """Debian 12 hosts converged, a job of user1 recorded, then each host's backup taken
    by its own timer's service (started by hand: the timer's next tick is minutes away)."""
    converge("bookworm")
    job = ok("login", "su", "-", "user1", "-c", "sbatch --parsable --wait --time=1 "
             "--output=/dev/null --wrap true").strip()
    deadline = time.monotonic() + 120
    while "COMPLETED" not in ok("login", "sacct", "-n", "-X", "-j", job, "-o", "State"):
        assert time.monotonic() < deadline, f"job {job} is not recorded as COMPLETED"
        time.sleep(2)
    for host in HOLDS:
        # The timer's first tick may have taken one already: then this one is not due.
        ok(host, PYHPC, "admin", "backup", "now")
        ok(host, "systemctl", "start", "pyhpc-backup.service")
    return {"job": int(job)}


def test_the_timer_runs_on_the_hosts_that_hold_state(hosts: dict[str, Any]) -> None:
    for host in HOLDS:
        assert ok(host, "systemctl", "is-enabled", "pyhpc-backup.timer").strip() == "enabled"
        assert ok(host, "systemctl", "is-active", "pyhpc-backup.timer").strip() == "active"
        # The service ran (oneshot, exited 0): the --if-due run after the one by hand.
        shown = ok(host, "systemctl", "show", "pyhpc-backup.service",
                   "--property=Result,ExecMainStatus")
        assert "Result=success" in shown and "ExecMainStatus=0" in shown, shown
    for host in ("login", "cpu1"):
        assert run_on(host, "systemctl", "cat", "pyhpc-backup.timer").returncode != 0


def test_each_hosts_backup_lands_on_the_share_where_another_host_lists_it(
        hosts: dict[str, Any]) -> None:
    rows = json.loads(ok("login", PYHPC, "admin", "backup", "list", "--json"))
    for host, part in HOLDS.items():
        mine = [r for r in rows if r["host"] == host]
        assert mine and all(r["ok"] for r in mine), rows
        listing = ok("login", "ls", f"{SHARE}/{mine[-1]['name']}").split()
        assert part in listing and "files.tar.gz" in listing, listing
    assert ok("login", "stat", "-c", "%U %a", SHARE).strip() == "root 700"


def test_dbs_dump_holds_the_job_this_test_ran(hosts: dict[str, Any]) -> None:
    found = json.loads(ok("db", PYHPC, "admin", "backup", "verify", "--json",
                          f"--job={hosts['job']}"))
    assert found["name"].startswith("db-") and found["found_jobs"] == [hosts["job"]]
    found = json.loads(ok("ctl", PYHPC, "admin", "backup", "verify", "--json"))
    assert found["name"].startswith("ctl-") and found["directory_check"] == "slapadd -u"
