"""Each alert of pyhpc's rules fires on the lab on its real cause and resolves once the
cause is undone, read from Prometheus' own alerts API (test_monitoring's helpers).

The lab scrapes every 5 s and every alert waits 30 s (its definition's monitoring
section), so each test takes about a minute. Every test puts the lab back whatever
happens: the stand-in GPU back (gpu2 resumed, should the health check have drained it),
slurmdbd started, the filesystem unmounted, the runaway record closed, the backup role's
interval file as the deploy wrote it.
SlurmNodeDrained is seen in test_monitoring.py; SlurmNodeDown and ExporterDown on hostlab
(test_hostlab_monitoring.py). JobGpusIdle needs NVML's utilization, which the lab's
stand-ins do not have (tests/unit/test_alert_rules.py runs it through promtool).
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from drains import resume_ours
from test_directory import sh
from test_monitoring import PYHPC, api, until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

#: Generous: 30 s of `for`, a scrape and an evaluation every 5 s.
FIRES, RESOLVES = 180, 120
#: The stand-in GPU the test takes away (gres.conf: File=/dev/pyhpc-lab/gpu2/nvidia[0-1]).
STAND_IN = Path("/dev/pyhpc-lab/gpu2/nvidia1")
#: ansible/inventories/lab/group_vars/all.yml: monitoring_alert_extra_mountpoints.
FULL = Path("/srv/pyhpc-lab-full")
#: The backup role's interval for node_exporter's textfile collector.
INTERVAL = Path("/var/lib/prometheus/node-exporter/pyhpc_backup_interval.prom")


def active(name: str, **labels: str) -> list[dict[str, Any]]:
    """The alert's pending or firing instances whose labels include ``labels``."""
    return [a for a in api("alerts")["alerts"] if a["labels"]["alertname"] == name
            and labels.items() <= a["labels"].items()]


def fires(name: str, **labels: str) -> dict[str, str]:
    """Wait for ``name`` to fire with ``labels``; its labels."""
    found = until(f"{name} fires with {labels}", lambda: [
        a for a in active(name, **labels) if a["state"] == "firing"], timeout=FIRES)
    labels_of: dict[str, str] = found[0]["labels"]
    return labels_of


def resolves(name: str, **labels: str) -> None:
    until(f"{name} {labels} resolved", lambda: not active(name, **labels), timeout=RESOLVES)


def test_a_missing_stand_in_gpu_fires_gpus_missing_for_its_node() -> None:
    away = STAND_IN.with_name(STAND_IN.name + ".away")
    assert STAND_IN.is_char_device()
    resolves("GpusMissing")
    os.rename(STAND_IN, away)  # as a GPU lost off the bus: its device file is gone
    try:
        alert = fires("GpusMissing", node="gpu2")
        assert alert["severity"] == "critical"
        assert [a["labels"]["node"] for a in active("GpusMissing")] == ["gpu2"]
        os.rename(away, STAND_IN)
        resolves("GpusMissing", node="gpu2")
    finally:
        if away.exists():
            os.rename(away, STAND_IN)
        # Slurm's HealthCheckProgram (every 300 s on the lab) drains gpu2 if it ran while
        # the GPU was away, as on a real host; an admin resumes it once the GPU is back.
        # A run still going may have read the device files before: let it end first.
        until("no health check running", lambda: subprocess.run(
            ["pgrep", "-f", "/usr/local/sbin/pyhpc-healthcheck"], capture_output=True, check=False,
        ).returncode == 1, timeout=60)
        resume_ours(["gpu2"])


def fill(folder: Path) -> None:
    """Write zeros into ``folder`` until its filesystem has no room left."""
    block = b"\0" * (1 << 20)
    with open(folder / "fill", "wb") as out:
        try:
            while True:
                out.write(block)
                out.flush()
        except OSError:
            pass


def test_a_filled_filesystem_fires_filesystem_almost_full_for_its_mount_point(
        tmp_path: Path) -> None:
    """A 16 MiB ext4 filesystem of its own (a loop device), at the lab's watched extra
    mount point; never the machine's real filesystems."""
    image = tmp_path / "full.img"
    sh("truncate", "-s", "16M", str(image))
    sh("mkfs.ext4", "-q", "-m", "0", str(image))
    FULL.mkdir(mode=0o755)
    try:
        sh("mount", "-o", "loop", str(image), str(FULL))
        until("node_exporter sees it", lambda: api("query", query=(
            f'node_filesystem_size_bytes{{mountpoint="{FULL}"}}'))["result"], timeout=60)
        fill(FULL)
        alert = fires("FilesystemAlmostFull", mountpoint=str(FULL))
        assert (alert["instance"], alert["fstype"], alert["severity"]) == (
            "localhost", "ext4", "warning")
        (FULL / "fill").unlink()
        resolves("FilesystemAlmostFull", mountpoint=str(FULL))
    finally:
        sh("umount", str(FULL), check=False)
        FULL.rmdir()


def sacct_answers() -> bool:
    return bool(sh("sacct", "-n", "-X", "-a", "-S", "now", check=False).returncode == 0)


def test_a_stopped_slurmdbd_fires_slurmdbd_unreachable() -> None:
    resolves("SlurmdbdUnreachable")
    sh("service", "pyhpc-slurmdbd", "stop")
    try:
        assert fires("SlurmdbdUnreachable")["severity"] == "critical"
        assert not active("ExporterDown")  # the Slurm exporter still answers its scrapes
        sh("service", "pyhpc-slurmdbd", "start")
        resolves("SlurmdbdUnreachable")
    finally:
        sh("service", "pyhpc-slurmdbd", "start", check=False)
        until("sacct answers", sacct_answers, timeout=60)


def runaway_record(job: int) -> None:
    """A job accounting holds as running that slurmctld never ran: the row a crash leaves
    (test_lost_jobs.py makes one by crashing slurmctld), written into slurmdbd's job table
    as root's in account lab, on partition cpu. From the association table, not from a job
    the lab ran: a new lab has run none when this test comes first (seen in a clean
    clone's CI: no row was written, and no runaway job was listed)."""
    started = int(time.time()) - 60
    sql = (
        "INSERT INTO lab_job_table (id_job, id_assoc, id_user, id_group, account, "
        "`partition`, job_name, state, time_submit, time_eligible, time_start, time_end, "
        "cpus_req, nodes_alloc, nodelist, id_resv, id_wckey, het_job_id, het_job_offset, "
        "state_reason_prev, priority, mod_time) "
        f"SELECT {job}, id_assoc, 0, 0, acct, 'cpu', "
        f"'pyhpc-alert-test', 1, {started}, {started}, {started}, 0, 1, 1, 'cpu1', 0, 0, 0, "
        f"4294967294, 0, 1, {started} FROM lab_assoc_table WHERE acct = 'lab' "
        "AND user = 'root' AND deleted = 0 LIMIT 1")
    sh("mysql", "slurm_acct_db", "-e", sql)
    written = sh("mysql", "-N", "slurm_acct_db", "-e",
                 f"SELECT COUNT(*) FROM lab_job_table WHERE id_job = {job}")
    assert written.stdout.strip() == "1", f"no runaway record written for job {job}: {written}"


def test_a_runaway_record_fires_slurm_runaway_jobs() -> None:
    job = 60_000_000 + os.getpid() % 1_000_000  # far above any id the lab has given
    sh("sacctmgr", "-i", "show", "runawayjobs", check=False)  # another test's, left over
    resolves("SlurmRunawayJobs")
    runaway_record(job)
    try:
        listed = subprocess.run(["sacctmgr", "-n", "-P", "show", "runawayjobs"], input="n\n",
                                capture_output=True, text=True, timeout=60, check=False)
        assert str(job) in listed.stdout, listed  # Slurm's own definition; not fixed ('n')
        assert fires("SlurmRunawayJobs")["severity"] == "warning"
        sh("sacctmgr", "-i", "show", "runawayjobs")  # Slurm's own tool closes it
        resolves("SlurmRunawayJobs")
    finally:
        sh("sacctmgr", "-i", "show", "runawayjobs", check=False)
        # Closing a record drops slurmdbd's rolled-up usage; a restart rolls it up again
        # (test_lost_jobs.py).
        sh("service", "pyhpc-slurmdbd", "restart", check=False)
        until("sacct answers", sacct_answers, timeout=60)


def test_no_backup_for_twice_the_interval_fires_backup_too_old() -> None:
    """The definition's interval is a day: the role's interval file says 30 s instead,
    so the newest backup is too old once it is a minute old (or, on a new lab where none was
    taken yet, the role's first deploy, as the rule counts). A new backup resolves it."""
    deployed = INTERVAL.read_text()
    resolves("BackupTooOld")
    INTERVAL.write_text(deployed.replace(deployed.split()[-1], "30"))
    try:
        until("the newest backup (or the first deploy) is a minute old", lambda: api("query", query=(
            "time() - max by (instance) (pyhpc_backup_last_success_timestamp_seconds"
            " or pyhpc_backup_deployed_timestamp_seconds) > 60"))["result"], timeout=FIRES)
        assert fires("BackupTooOld", instance="localhost")["severity"] == "critical"
        sh(PYHPC, "admin", "backup", "now")
        resolves("BackupTooOld", instance="localhost")
    finally:
        INTERVAL.write_text(deployed)
