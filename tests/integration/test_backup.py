"""Backups on the lab (issue 47 item 1): ``pyhpc admin backup now`` dumps the real MariaDB
and slapd, ``verify`` restores the dump into a scratch database and finds the jobs this
test ran, the files are root's and private, ``list`` shows the backup, a corrupt one is
named so, and a planted link at the destination is refused with nothing written.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_directory import LAB, PYHPC, as_user, sh
from test_monitoring import query, until

from pyhpc import paths
from pyhpc.admin import backup_store

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

assert LAB.backup is not None, "the lab definition backs up (ansible/inventories/lab/cluster.yml)"
SECTION = LAB.backup
ROOT = Path(SECTION.path)
CRON = Path("/etc/cron.d/pyhpc-backup")


def cli(*args: str, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """`pyhpc ARGS` as root here, with `env` added; fails the test where it fails and `check`."""
    proc = subprocess.run([PYHPC, *args], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        pytest.fail(f"pyhpc {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n"
                    f"{proc.stderr}")
    return proc


def backup(*args: str, env: dict[str, str] | None = None,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    return cli("admin", "backup", *args, env=env, check=check)


def refusal(proc: subprocess.CompletedProcess[str], start: str = "pyhpc: error: ") -> str:
    """The one line of a refusal (exit 2, nothing on stdout), which begins with `start`."""
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), proc.stderr
    return lines[0]


def one_line_refusal(proc: subprocess.CompletedProcess[str]) -> str:
    return refusal(proc, "pyhpc: error: backup: ")


def recorded(job: str, wait_s: float = 120) -> None:
    """Wait until slurmdbd has the job's end (slurmctld sends it a little after)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        state = sh("sacct", "-n", "-X", "-P", "-j", job, "-o", "State,End").stdout.strip()
        if state.startswith("COMPLETED|") and not state.endswith("|Unknown"):
            return
        time.sleep(1)
    pytest.fail(f"job {job} has no end in accounting after {wait_s} s: {state!r}")


@pytest.fixture(scope="module")
def taken() -> dict[str, Any]:
    """Two jobs of user1, recorded; then a backup of this host."""
    jobs = [as_user("user1", "sbatch --parsable --wait --time=1 --output=/dev/null "
                    "--wrap true").stdout.strip() for _ in range(2)]
    for job in jobs:
        recorded(job)
    done = json.loads(backup("now", "--json").stdout)
    return {"jobs": [int(j) for j in jobs], **done}


def test_verify_restores_the_jobs_this_test_ran_into_a_scratch_database(
        taken: dict[str, Any]) -> None:
    ids = [str(j) for j in taken["jobs"]]
    found = json.loads(backup("verify", taken["name"], "--json", *(f"--job={j}" for j in ids))
                       .stdout)
    assert found["found_jobs"] == taken["jobs"]
    assert found["jobs"] >= 2 and found["newest_job_id"] >= max(taken["jobs"])
    assert found["directory_check"] == "slapadd -u"
    # The directory's base, its groups and the definition's users (user1, user2) at least.
    assert found["directory_entries"] >= 3
    assert {"etc/munge/munge.key", "etc/pyhpc/secrets/slurmdbd_db_password",
            "etc/slurm/slurm.conf"} <= set(found["files"])
    scratch = sh("mysql", "--batch", "--skip-column-names", "-e",
                 "SHOW DATABASES LIKE 'pyhpc\\_verify\\_%'").stdout
    assert scratch == "", f"verify left its scratch database: {scratch}"


def test_the_backup_is_roots_alone_with_a_manifest_sha256sum_accepts(
        taken: dict[str, Any]) -> None:
    folder = ROOT / taken["name"]
    assert set(taken["parts"]) == {"accounting.sql.gz", "directory.ldif.gz", "files.tar.gz"}
    for path, mode in [(ROOT, 0o700), (folder, 0o700),
                       *((p, 0o600) for p in folder.iterdir())]:
        info = os.lstat(path)
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, mode), path
    proc = subprocess.run(["sha256sum", "--check", "--strict", backup_store.MANIFEST],
                          cwd=folder, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(p.name.startswith(backup_store.PARTIAL) for p in ROOT.iterdir())


def test_list_shows_the_backup_with_its_time_size_and_good_checksums(
        taken: dict[str, Any]) -> None:
    rows = {r["name"]: r for r in json.loads(backup("list", "--json").stdout)}
    row = rows[taken["name"]]
    assert row["ok"] and row["size"] > taken["size"]  # the parts, the marker, the manifest
    assert datetime.fromisoformat(row["time"]) > datetime.now(UTC) - timedelta(hours=1)
    text = backup("list").stdout
    assert f"{taken['name']}\t" in text and "checksums ok" in text


def test_a_corrupt_copy_is_listed_bad_and_verify_refuses_it(taken: dict[str, Any]) -> None:
    parsed = backup_store.parse_name(taken["name"])
    assert parsed is not None
    host, when = parsed
    copy = ROOT / backup_store.backup_name(host, when - timedelta(days=400))
    shutil.copytree(ROOT / taken["name"], copy)
    try:
        dump = copy / "accounting.sql.gz"
        dump.write_bytes(dump.read_bytes()[:-100])  # truncated
        listed = backup("list", check=False)
        assert listed.returncode == 1
        assert (f"{copy.name}\t" in listed.stdout and "BAD: accounting.sql.gz does not match "
                "its checksum (corrupt or truncated)" in listed.stdout), listed.stdout
        line = one_line_refusal(backup("verify", copy.name, check=False))
        assert line == (f"pyhpc: error: backup: {copy.name}: accounting.sql.gz does not match "
                        "its checksum (corrupt or truncated)")
    finally:
        shutil.rmtree(copy)


def definition_with_path(tmp_path: Path, path: Path) -> dict[str, str]:
    data = yaml.safe_load(paths.LAB_CLUSTER.read_text())
    data["backup"]["path"] = str(path)
    spec = tmp_path / "cluster.yml"
    spec.write_text(yaml.safe_dump(data))
    return {"PYHPC_CLUSTER": str(spec)}


@pytest.fixture
def elsewhere(tmp_path: Path) -> Iterator[Path]:
    """Where a planted link points: a directory anyone could read (0755)."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    yield target
    assert list(target.iterdir()) == [], "a backup was written through the link"


def test_a_link_planted_at_the_destination_is_refused(tmp_path: Path, elsewhere: Path) -> None:
    link = ROOT.parent / "pyhpc-it-planted"
    link.symlink_to(elsewhere)
    try:
        line = one_line_refusal(backup("now", env=definition_with_path(tmp_path, link),
                                       check=False))
        assert line == (f"pyhpc: error: backup: {link} is a symbolic link; name the directory "
                        "itself")
    finally:
        link.unlink()


def test_links_planted_at_the_backups_next_names_are_refused(tmp_path: Path,
                                                            elsewhere: Path) -> None:
    root = ROOT.parent / "pyhpc-it-names"
    root.mkdir(mode=0o700)
    try:
        host = sh("hostname", "-s").stdout.strip().lower()
        start = datetime.now(UTC)
        for s in range(120):  # every name the next two minutes could give
            (root / backup_store.backup_name(host, start + timedelta(seconds=s))) \
                .symlink_to(elsewhere)
        line = one_line_refusal(backup("now", env=definition_with_path(tmp_path, root),
                                       check=False))
        assert "something is there already; nothing is written through a link" in line, line
        assert all(p.is_symlink() for p in root.iterdir()), "a partial backup was left"
    finally:
        shutil.rmtree(root)


def test_the_schedule_runs_the_same_command_and_skips_until_due(
        taken: dict[str, Any]) -> None:
    assert f"root umask 077; cd / && {paths.SHARED_VENV}/bin/python -P -m pyhpc admin backup " \
           "now --if-due " in CRON.read_text()
    assert sh("pgrep", "-x", "cron", check=False).returncode == 0, "cron is not running"
    proc = backup("now", "--if-due")
    assert proc.stdout.startswith("backup: not due: the newest good backup is younger than "
                                  f"backup.interval ({SECTION.interval})"), proc.stdout


def test_prometheus_scrapes_the_newest_good_backups_time_and_the_interval(
        taken: dict[str, Any]) -> None:
    """What the BackupTooOld alert reads, as Prometheus has it from node_exporter."""
    newest = max(datetime.fromisoformat(str(r["time"])) for r in
                 json.loads(backup("list", "--json").stdout) if r["ok"])
    until("Prometheus has the newest backup's time", lambda: [
        v for _, v in query("pyhpc_backup_last_success_timestamp_seconds")
        if v == newest.timestamp()])
    assert [v for _, v in query("pyhpc_backup_interval_seconds")] == [SECTION.interval_s]
    assert [v > 0 for _, v in query("pyhpc_backup_deployed_timestamp_seconds")] == [True]


def test_restore_onto_a_database_that_holds_jobs_is_refused(taken: dict[str, Any]) -> None:
    before = sh("sacct", "-n", "-X", "-a", "-P", "-S", "2020-01-01", "-o", "JobID").stdout
    proc = subprocess.run([PYHPC, "admin", "restore"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("pyhpc: error: restore: the accounting database "
                                  "slurm_acct_db already holds "), proc.stderr
    # The lab's one host holds the directory too: the other part is named.
    assert proc.stderr.rstrip().endswith("jobs; restore only onto a new, empty host, or --only "
                                         "directory (nothing was changed)") \
        and len(proc.stderr.splitlines()) == 1
    assert sh("sacct", "-n", "-X", "-a", "-P", "-S", "2020-01-01", "-o", "JobID").stdout == before
