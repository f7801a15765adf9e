"""The hold of a new db host's slurmdbd (the slurm role's dbd.yml) as pyhpc reads it: the
restore releases it only on a loaded dump, and no backup is taken of the held, empty
database. On hosts: tests/integration/test_hostlab_pyhpc_restore.py."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from pyhpc import paths
from pyhpc.admin import backup, restore
from pyhpc.admin.backup_store import BackupError


def test_the_role_marks_the_hold_where_pyhpc_looks() -> None:
    role_vars = yaml.safe_load((paths.ROOT / "ansible" / "roles" / "slurm" / "vars"
                                / "main.yml").read_text())
    assert Path(role_vars["slurm_dbd_hold_file"]) == backup.HOLD


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """slurmdbd's start, stop and enable recorded, not run; the hold in tmp_path."""
    done: list[str] = []
    monkeypatch.setattr(backup, "HOLD", tmp_path / "slurmdbd-held")
    monkeypatch.setattr(restore, "service", lambda name, verb: done.append(f"{name} {verb}"))
    monkeypatch.setattr(restore, "_command", lambda argv: done.append(" ".join(argv)))
    monkeypatch.setattr(restore, "_manager", lambda: "systemd")
    monkeypatch.setattr(restore, "jobs_held", lambda cluster, database: 3)
    return done


def load(monkeypatch: pytest.MonkeyPatch, fails: bool = False) -> dict[str, Any]:
    def feed(*args: Any) -> bytes:
        if fails:
            raise BackupError("accounting.sql.gz is truncated or corrupt")
        return backup.DUMP_END
    monkeypatch.setattr(backup, "feed", feed)
    return restore._load_accounting(SimpleNamespace(name="c"), "slurm_acct_db",  # type: ignore[arg-type]  # a stand-in
                                    Path("/nonexistent"))


def test_a_held_slurmdbd_starts_and_is_enabled_once_the_dump_is_loaded(
        calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    backup.HOLD.write_text("held\n")
    done = load(monkeypatch)
    assert calls == ["slurmdbd stop", "slurmdbd start", "systemctl enable slurmdbd"]
    assert done["released"] is True and not backup.HOLD.exists()


def test_a_held_slurmdbd_stays_stopped_and_held_when_the_load_fails(
        calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    backup.HOLD.write_text("held\n")
    with pytest.raises(BackupError, match="truncated"):
        load(monkeypatch, fails=True)
    assert calls == ["slurmdbd stop"] and backup.HOLD.exists()


def test_without_a_hold_slurmdbd_starts_again_whatever_the_load_did(
        calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert load(monkeypatch)["released"] is False
    with pytest.raises(BackupError):
        load(monkeypatch, fails=True)
    assert calls == ["slurmdbd stop", "slurmdbd start"] * 2


def test_no_backup_is_taken_of_a_held_database(calls: list[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backup, "conf_value", lambda path, key: "slurm_acct_db")
    cluster = SimpleNamespace(accounting=True, directory=None)
    assert "accounting.sql.gz" in backup._parts(cluster)  # type: ignore[arg-type]  # a stand-in
    backup.HOLD.write_text("held\n")
    with pytest.raises(BackupError, match="held for a restore .* run pyhpc admin restore first"):
        backup._parts(cluster)  # type: ignore[arg-type]  # a stand-in
