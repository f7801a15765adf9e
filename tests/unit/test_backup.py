"""Backups: the definition's ``backup`` section, and the backup directory's manifest,
listing and pruning (pyhpc.cluster.backup, pyhpc.admin.backup_store and the metric)."""
from __future__ import annotations

import copy
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

# pytest puts tests/unit on sys.path (no package).
from test_alert_rules import render

from pyhpc import cluster, paths
from pyhpc.admin import backup, backup_store
from pyhpc.cluster import ConfigError
from tests.share import PROMTOOL_SKIP

LAB = yaml.safe_load(paths.LAB_CLUSTER.read_text())
HOSTS = yaml.safe_load((paths.ROOT / "ansible/inventories/hostlab/cluster.yml").read_text())
HOSTS["monitoring"] = {"listen": "10.0.0.0/16"}  # this test's subject is backup alone
T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


def with_backup(base: dict[str, Any], section: Any) -> dict[str, Any]:
    data = copy.deepcopy(base)
    data["backup"] = section
    return data


def test_the_section_normalises_with_its_defaults() -> None:
    spec = cluster.parse(with_backup(LAB, {"path": "/var/backups/pyhpc/"}), ram_mb=1 << 20)
    assert spec.backup == cluster.Backup(path="/var/backups/pyhpc", kind="local",
                                         interval="1d", interval_s=86400, keep=7)
    hosts = cluster.parse(with_backup(HOSTS, {"path": "/srv/backup", "interval": "6h",
                                              "keep": 30}))
    assert hosts.backup == cluster.Backup("/srv/backup", "share", "6h", 6 * 3600, 30)
    assert cluster.parse(LAB, ram_mb=1 << 20).backup == cluster.Backup("/var/backups/pyhpc")
    assert cluster.parse(with_backup(LAB, None), ram_mb=1 << 20).backup is None


@pytest.mark.parametrize(("base", "section", "message"), [
    (LAB, {"interval": "1d"}, "backup.path: required key is missing (absolute directory"),
    (LAB, {"path": "/var/backups/pyhpc", "host": "db"},
     "backup.host: unknown key; allowed: interval, keep, kind, path"),
    (LAB, {"path": "var/backups"}, "backup.path: "),
    (LAB, {"path": "/tmp/backups"}, "backup.path: /tmp/backups is not allowed; a directory "
     "of its own, outside the system's directories and the trees users write"),
    (LAB, {"path": "/home/user1/b"}, "backup.path: /home/user1/b is not allowed"),
    (LAB, {"path": "/var"}, "backup.path: /var is not allowed"),
    (LAB, {"path": "/var/backups/../tmp"}, "backup.path: '/var/backups/../tmp' is not "
     "allowed; name the directory without . or .. parts"),
    (LAB, {"path": "/var/b", "interval": "5m"}, "backup.interval: '5m' is not allowed; use "
     "a number and one unit of m, h or d, from 15m to 7d"),
    (LAB, {"path": "/var/b", "interval": "8d"}, "backup.interval: '8d' is not allowed"),
    (LAB, {"path": "/var/b", "interval": 3600}, "backup.interval: 3600 is not allowed"),
    (LAB, {"path": "/var/b", "keep": 0}, "backup.keep: must be an integer from 1 to 365, "
     "got 0"),
    (LAB, {"path": "/var/b", "keep": 366}, "backup.keep: must be an integer from 1 to 365"),
    (LAB, {"path": "/var/b", "kind": "share"}, "backup.kind: mode lab has one host, so a "
     "local directory is the only choice; allowed: local"),
    (HOSTS, {"path": "/var/b", "kind": "local"}, "backup.kind: a local directory would be on "
     "the host backed up, and lost with it; mode hosts allows only share"),
    (HOSTS, {"path": "/var/b", "kind": "nfs"}, "backup.kind: 'nfs' is not allowed; allowed: "
     "local, share (mode hosts: share only)"),
    (LAB, "/var/b", "backup: expected a mapping, got str"),
])
def test_a_bad_section_is_one_error_naming_the_key(base: dict[str, Any], section: Any,
                                                    message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        cluster.parse(with_backup(base, section), ram_mb=1 << 20)
    assert str(caught.value).startswith(message)


def test_the_cli_refuses_a_bad_section_in_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yml"
    bad.write_text(yaml.safe_dump(with_backup(HOSTS, {"path": "/srv/b", "kind": "local"})))
    before = bad.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "pyhpc", "cluster", "validate", "--json",
                           str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyhpc: error: backup.kind: "), lines
    assert bad.read_bytes() == before


def make(root: Path, host: str, when: datetime, parts: dict[str, bytes] | None = None,
         made_by: str = "pyhpc") -> Path:
    """A backup as pyhpc.admin.backup.now writes one (parts, marker, manifest)."""
    name = backup_store.backup_name(host, when)
    folder = root / name
    folder.mkdir(mode=0o700)
    parts = {"files.tar.gz": b"x" * 10} if parts is None else parts
    for part, data in parts.items():
        (folder / part).write_bytes(data)
    (folder / backup_store.MARKER).write_text(json.dumps({"made_by": made_by, "host": host}))
    (folder / backup_store.MANIFEST).write_text(
        backup_store.manifest_text(folder, [*parts, backup_store.MARKER]))
    return folder


def test_the_manifest_is_what_sha256sum_checks(tmp_path: Path) -> None:
    folder = make(tmp_path, "db", T0, {"accounting.sql.gz": b"dump"})
    want = hashlib.sha256(b"dump").hexdigest()
    assert f"{want}  accounting.sql.gz\n" in (folder / backup_store.MANIFEST).read_text()
    proc = subprocess.run(["sha256sum", "--check", "--strict", backup_store.MANIFEST],
                          cwd=folder, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert backup_store.check(folder) == ""


@pytest.mark.parametrize(("spoil", "problem"), [
    (lambda f: (f / "files.tar.gz").write_bytes(b"x" * 9), "files.tar.gz does not match its "
     "checksum (corrupt or truncated)"),
    (lambda f: (f / "extra").write_bytes(b""), "files differ from the manifest (missing: [], "
     "not listed: ['extra'])"),
    (lambda f: (f / "files.tar.gz").unlink(), "files differ from the manifest (missing: "
     "['files.tar.gz']"),
    (lambda f: (f / backup_store.MANIFEST).write_text("nonsense\n"), "the manifest has a line"),
    (lambda f: (f / backup_store.MANIFEST).unlink(), "no readable manifest"),
])
def test_a_spoilt_backup_is_not_ok_and_says_why(tmp_path: Path, spoil: Any, problem: str) -> None:
    folder = make(tmp_path, "db", T0)
    spoil(folder)
    assert backup_store.check(folder).startswith(problem)
    [entry] = backup_store.entries(tmp_path)
    assert not entry.ok and entry.problem.startswith(problem)


def test_a_part_replaced_by_a_link_is_not_ok(tmp_path: Path) -> None:
    folder = make(tmp_path, "db", T0)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x" * 10)  # same bytes: only the link gives it away
    (folder / "files.tar.gz").unlink()
    (folder / "files.tar.gz").symlink_to(target)
    assert backup_store.check(folder) == "files.tar.gz is not a regular file"


def test_pruning_keeps_the_newest_good_ones_and_only_what_pyhpc_made(tmp_path: Path) -> None:
    made = [make(tmp_path, "db", T0 + timedelta(hours=h)) for h in range(5)]
    (made[3] / "files.tar.gz").write_bytes(b"corrupt")  # a bad one among the newest
    other_host = make(tmp_path, "ctl", T0)
    not_ours = make(tmp_path, "db", T0 - timedelta(days=1), made_by="someone")
    lookalike = tmp_path / "db-20200101T000000Z.tar"
    lookalike.write_bytes(b"")
    link = tmp_path / backup_store.backup_name("db", T0 - timedelta(days=2))
    link.symlink_to(made[0])
    partial = tmp_path / f"{backup_store.PARTIAL}{backup_store.backup_name('db', T0)}.abcd"
    partial.mkdir()
    removed = backup_store.prune(tmp_path, "db", keep=2)
    # Good: 0, 1, 2, 4; the newest two good are 2 and 4; 3 (bad, newer) stays to look at.
    assert removed == [made[0].name, made[1].name, partial.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [made[2].name, made[3].name, made[4].name, other_host.name, not_ours.name,
         lookalike.name, link.name])
    assert link.is_symlink()


def test_with_fewer_good_backups_than_keep_nothing_goes(tmp_path: Path) -> None:
    made = [make(tmp_path, "db", T0 + timedelta(hours=h)) for h in range(3)]
    for folder in made[1:]:
        (folder / "files.tar.gz").write_bytes(b"bad")
    assert backup_store.prune(tmp_path, "db", keep=2) == []


def test_the_listing_is_oldest_first_with_size_and_state(tmp_path: Path) -> None:
    make(tmp_path, "db", T0 + timedelta(hours=1))
    make(tmp_path, "ctl", T0)
    rows = [e.row() for e in backup_store.entries(tmp_path)]
    assert [(r["host"], r["time"], r["ok"]) for r in rows] == [
        ("ctl", "2026-12-01T03:00:00+00:00", True), ("db", "2026-12-01T04:00:00+00:00", True)]
    assert all(isinstance(r["size"], int) and r["size"] > 10 for r in rows)
    assert backup_store.newest_good(tmp_path, "ctl").name == "ctl-20261201T030000Z"  # type: ignore[union-attr]


def test_the_metric_file_names_the_newest_good_backup(tmp_path: Path) -> None:
    make(tmp_path, "db", T0)
    entry = backup_store.newest_good(tmp_path)
    assert entry is not None
    backup.write_metrics(entry, tmp_path)
    text = (tmp_path / backup.METRICS_FILE).read_text()
    assert f"pyhpc_backup_last_success_timestamp_seconds {int(T0.timestamp())}\n" in text
    assert f"pyhpc_backup_last_size_bytes {entry.size}\n" in text
    assert oct(os.stat(tmp_path / backup.METRICS_FILE).st_mode & 0o777) == "0o644"


def test_a_backup_is_due_once_the_interval_has_passed_less_the_ticks_slack() -> None:
    entry = backup_store.Entry("db-20261201T030000Z", "db", T0, 1, True)
    start = T0.timestamp()
    assert backup_store.due(None, 900, start)
    assert not backup_store.due(entry, 900, start + 900 - backup_store.SLACK_S - 1)
    assert backup_store.due(entry, 900, start + 880)  # the next 15-minute tick, a bit early
    assert not backup_store.due(entry, 86400, start + 86400 - backup_store.SLACK_S - 1)
    assert backup_store.due(entry, 86400, start + 86400)


PROMTOOL_TEST = """\
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # db: its last good backup at time 0, hourly backups: too old after 2 h.
      - {series: 'pyhpc_backup_last_success_timestamp_seconds{instance="db",job="node"}',
         values: '0x300'}
      - {series: 'pyhpc_backup_interval_seconds{instance="db",job="node"}', values: '3600x300'}
      - {series: 'pyhpc_backup_deployed_timestamp_seconds{instance="db",job="node"}',
         values: '0x300'}
      # fresh: deployed long ago, but a backup every minute: never.
      - {series: 'pyhpc_backup_last_success_timestamp_seconds{instance="fresh",job="node"}',
         values: '0+60x300'}
      - {series: 'pyhpc_backup_interval_seconds{instance="fresh",job="node"}',
         values: '3600x300'}
      - {series: 'pyhpc_backup_deployed_timestamp_seconds{instance="fresh",job="node"}',
         values: '0x300'}
      # new: no backup yet, deployed at 0, daily: counted from the deploy, not yet.
      - {series: 'pyhpc_backup_interval_seconds{instance="new",job="node"}', values: '86400x300'}
      - {series: 'pyhpc_backup_deployed_timestamp_seconds{instance="new",job="node"}',
         values: '0x300'}
      # never: deployed at 0, hourly, no backup ever: fires like db.
      - {series: 'pyhpc_backup_interval_seconds{instance="never",job="node"}', values: '3600x300'}
      - {series: 'pyhpc_backup_deployed_timestamp_seconds{instance="never",job="node"}',
         values: '0x300'}
    alert_rule_test:
      - {eval_time: 110m, alertname: BackupTooOld, exp_alerts: []}
      - eval_time: 130m
        alertname: BackupTooOld
        exp_alerts:
          - exp_labels: {severity: critical, instance: db}
            exp_annotations:
              summary: >-
                db has no good backup for over twice its backup.interval
                (pyhpc admin backup list)
          - exp_labels: {severity: critical, instance: never}
            exp_annotations:
              summary: >-
                never has no good backup for over twice its backup.interval
                (pyhpc admin backup list)
"""


def test_the_alert_fires_past_twice_the_interval_counting_from_the_deploy_until_a_first(
        tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(PROMTOOL_SKIP)
    (tmp_path / "rules.yml").write_text(render(["/"]))
    (tmp_path / "test.yml").write_text(PROMTOOL_TEST)
    proc = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """backup.now on this machine without MariaDB or slapd: one part, the lock and the
    textfile directory under tmp_path, the host named db; returns the backup root."""
    if os.geteuid() != 0:
        pytest.skip("backups are root's (backup.now refuses other users): run as root")
    tmp_path.chmod(0o700)
    (tmp_path / "textfile").mkdir()
    monkeypatch.setattr(backup, "LOCK", tmp_path / "lock")
    monkeypatch.setattr(backup, "TEXTFILE_DIR", tmp_path / "textfile")
    monkeypatch.setattr(backup, "_host", lambda: "db")
    monkeypatch.setattr(backup, "_parts", lambda cluster, state=False: {
        "files.tar.gz": lambda out: out.write(b"state")})
    return tmp_path / "backups"


def lab_with(root: Path, keep: int = 7) -> cluster.Cluster:
    """The lab with backups under ``root`` (a tmp_path the validator would refuse: these
    tests are of backup.now, the validator's are above)."""
    return dataclasses.replace(cluster.parse(LAB, ram_mb=1 << 20),
                               backup=cluster.Backup(path=str(root), keep=keep))


def test_now_writes_private_parts_a_manifest_and_the_metric(here: Path) -> None:
    done = backup.now(lab_with(here))
    folder = here / done["name"]
    assert done["parts"] == {"files.tar.gz": 5} and done["pruned"] == []
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["files.tar.gz", backup_store.MARKER, backup_store.MANIFEST])
    for path in [here, folder, *folder.iterdir()]:
        assert oct(os.lstat(path).st_mode & 0o777) == ("0o700" if path.is_dir() else "0o600")
    assert backup_store.check(folder) == ""
    assert "pyhpc_backup_last_size_bytes" in (here.parent / "textfile" /
                                              backup.METRICS_FILE).read_text()
    skipped = backup.now(lab_with(here), if_due=True)
    assert skipped["name"] == done["name"] and skipped["skipped"].startswith("not due")


def test_now_prunes_beyond_keep(here: Path) -> None:
    here.mkdir(mode=0o700)
    old = [make(here, "db", T0 + timedelta(hours=h)) for h in range(3)]
    done = backup.now(lab_with(here, keep=2))
    assert done["pruned"] == [old[0].name, old[1].name]
    assert sorted(p.name for p in here.iterdir()) == [old[2].name, done["name"]]


def test_a_full_disk_is_one_line_and_keeps_nothing(here: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def full(out: Any) -> None:
        out.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(backup, "_parts", lambda cluster, state=False: {"files.tar.gz": full})
    with pytest.raises(backup_store.BackupError) as caught:
        backup.now(lab_with(here))
    assert str(caught.value).startswith("backup: cannot write ")
    assert str(caught.value).endswith("(No space left on device); nothing was kept")
    assert list(here.iterdir()) == []
    assert not (here.parent / "textfile" / backup.METRICS_FILE).exists()


def test_a_link_at_the_path_is_refused(here: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    here.symlink_to(target)
    with pytest.raises(backup_store.BackupError, match="is a symbolic link; name the "
                       "directory itself"):
        backup.now(lab_with(here))
    assert list(target.iterdir()) == []
