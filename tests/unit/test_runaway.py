"""pyhpc doctor's runaway check and --fix-runaway: jobs accounting holds open that
slurmctld lost, listed for every user, closed only by root, and kept LOST by the ledger."""
from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from pyhpc import files, paths
from pyhpc.admin import runaway
from pyhpc.admin.doctor import Doctor
from pyhpc.cli import main as cli
from pyhpc.slurm import lost
from pyhpc.slurm.rows import epoch, stamp

BOOT, EARLY, BEFORE = "2026-11-25T16:18:54", "2026-11-25T16:10:00", "2026-11-25T16:18:50"
AFTER, ENDED = "2026-11-25T16:19:30", "2026-11-25T16:12:00"
NOW = epoch("2026-11-25T17:00:00")
OPEN = [f"42|alice|lab|{BEFORE}|RUNNING|Unknown",
        f"42.batch|alice|lab|{BEFORE}|RUNNING|Unknown",
        f"43|bob|lab|{EARLY}|PENDING|Unknown",
        f"44|alice|lab|{AFTER}|PENDING|Unknown",       # after the boot: may still be saved
        f"45|carol|lab|{BEFORE}|RUNNING|Unknown",      # slurmctld knows it
        f"46|dave|lab|{EARLY}|COMPLETED|{ENDED}",      # was running in the window, ended
        f"47|erin|lab|{EARLY}|REQUEUED|{ENDED}",       # a requeue closed this run
        f"48|alice|lab|{BEFORE}|RUNNING|Unknown"]      # its id now belongs to a new job
QUEUE = f"45|RUNNING|None|{BEFORE}\n48|PENDING|Priority|{AFTER}\n"
CONFIG = f"AccountingStorageType = accounting_storage/slurmdbd\nBOOT_TIME = {BOOT}\n"
#: The directory's users (erin is not one: sacct names a user this host cannot resolve).
ALICE, BOB = 20000, 20001
USERS = {"alice": SimpleNamespace(pw_uid=ALICE), "bob": SimpleNamespace(pw_uid=BOB)}


def rows(uid: int | None) -> list[dict]:
    """The ledger of ``uid``'s jobs."""
    return [json.loads(line) for line in lost.ledger_path(uid).read_text().splitlines()]


@pytest.fixture
def ctld(fake_slurm, tmp_path, monkeypatch):
    fake_slurm.answers.update({
        "sacct": (0, "\n".join(OPEN) + "\n"), "squeue": (0, QUEUE),
        "scontrol": (0, CONFIG), "sdiag": (0, "DBD Agent queue size: 0\n"),
        "sacctmgr": (0, "NOTE: Runaway jobs are jobs that don't exist in the controller\n")})
    monkeypatch.setattr(paths, "RUNAWAY_LEDGERS", tmp_path / "lib" / "pyhpc" / "runaway-jobs")
    monkeypatch.setattr(paths, "RUNAWAY_LEDGER_SHARED", tmp_path / "lib" / "pyhpc" / "runaway-jobs.jsonl")
    monkeypatch.setattr(runaway, "is_root", lambda: True)
    monkeypatch.setattr(runaway.pwd, "getpwnam", lambda name: USERS[name])
    return fake_slurm


def test_runaway_jobs_are_open_unknown_to_slurmctld_and_older_than_its_boot(ctld) -> None:
    found = runaway.find(NOW)
    assert [r.job for r in found.records] == ["42", "43", "48"]
    assert found.boot == epoch(BOOT) and found.agent_queue == 0
    assert ctld.calls[0] == ["sacct", "-a", "-D", "-n", "-P", "-s", "pending,running,requeued,suspended",
                             "-S", stamp(NOW - 30 * 86400), "-E", "now", "-o",
                             "JobID,User,Account,Submit,State,End"]
    assert ctld.calls[1] == ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%r|%V"]
    assert [c[0] for c in ctld.calls] == ["sacct", "squeue", "scontrol", "sdiag"]


def test_the_doctor_says_how_many_whose_and_since_when(ctld) -> None:
    check = Doctor().runaway()
    assert check.name == "runaway jobs" and check.ok is False
    assert check.detail == (f"3 open in accounting, lost by slurmctld (restarted {BOOT}): alice 2, "
                            f"bob 1; submitted since {EARLY}; pyhpc doctor --fix-runaway closes them")


def test_no_open_record_is_one_sacct_call(ctld) -> None:
    ctld.answers["sacct"] = (0, f"46|dave|lab|{EARLY}|COMPLETED|{ENDED}\n")
    check = Doctor().runaway()
    assert check.ok and check.detail.startswith("none")
    assert [c[0] for c in ctld.calls] == ["sacct"]


def test_records_still_on_their_way_are_said_and_not_fixed(ctld, capsys) -> None:
    ctld.answers["sdiag"] = (0, "DBD Agent queue size: 12\n")
    check = Doctor().runaway()
    assert not check.ok and "12 accounting messages not yet sent to slurmdbd" in check.detail
    assert cli.main(["doctor", "--fix-runaway"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyhpc: error: --fix-runaway: 3 open in accounting") and err.count("\n") == 1
    assert "nothing closed" in err
    assert not paths.RUNAWAY_LEDGERS.exists() and "sacctmgr" not in [c[0] for c in ctld.calls]


def test_fix_records_each_job_in_the_ledger_before_sacctmgr_closes_them(ctld, capsys) -> None:
    seen_by_sacctmgr: list[str] = []

    def sacctmgr(argv):
        seen_by_sacctmgr.append("".join(p.read_text() for p in
                                        sorted(paths.RUNAWAY_LEDGERS.glob("*.jsonl"))))
        return 0, "fixed\n"

    ctld.answers["sacctmgr"] = sacctmgr
    assert cli.main(["doctor", "--fix-runaway"]) == 0
    assert ctld.calls[-1] == ["sacctmgr", "-i", "show", "runawayjobs"]
    entries = [json.loads(line) for line in seen_by_sacctmgr[0].splitlines()]
    assert [(e["job"], e["user"], e["submit"], e["boot"]) for e in entries] == [
        ("42", "alice", epoch(BEFORE), epoch(BOOT)), ("48", "alice", epoch(BEFORE), epoch(BOOT)),
        ("43", "bob", epoch(EARLY), epoch(BOOT))]
    assert all(isinstance(e["fixed_at"], int) and e["fixed_at"] > 0 for e in entries)
    # One ledger per owner, root's and private; nobody lists whose ledgers there are.
    assert sorted(p.name for p in paths.RUNAWAY_LEDGERS.iterdir()) == [f"{ALICE}.jsonl",
                                                                      f"{BOB}.jsonl"]
    assert [r["job"] for r in rows(ALICE)] == ["42", "48"] and [r["job"] for r in rows(BOB)] == ["43"]
    assert stat.S_IMODE(paths.RUNAWAY_LEDGERS.stat().st_mode) == 0o711
    for uid in (ALICE, BOB):
        info = lost.ledger_path(uid).stat()
        assert info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o077 in (0, 0o040)
        readers(lost.ledger_path(uid), uid)
    out = capsys.readouterr().out
    assert out.startswith("closed 3 open in accounting") and f"48   alice  lab      RUNNING  {BEFORE}" in out
    # The admin learns that sreport loses usage until slurmdbd's next rollup, and how to hasten it.
    assert out.splitlines()[-1].startswith("sreport may show no usage until slurmdbd's next rollup")


def test_a_second_fix_appends(ctld) -> None:
    assert cli.main(["doctor", "--fix-runaway"]) == 0
    ctld.answers["sacct"] = (0, f"43|bob|lab|{EARLY}|PENDING|Unknown\n")
    assert cli.main(["doctor", "--fix-runaway"]) == 0
    assert [r["job"] for r in rows(ALICE)] == ["42", "48"]
    assert [r["job"] for r in rows(BOB)] == ["43", "43"]


def test_after_the_fix_status_still_says_lost(ctld, capsys) -> None:
    assert cli.main(["doctor", "--fix-runaway"]) == 0
    capsys.readouterr()
    # sacctmgr closed them: COMPLETED, end = start. The new job 48 of a reused id completed too.
    ctld.answers["sacct"] = (0, f"42|COMPLETED|None|{BEFORE}\n44|COMPLETED|None|{AFTER}\n")
    assert cli.main(["status", "42", "44"]) == 1
    out, err = capsys.readouterr()
    assert out == "42\tLOST\n44\tCOMPLETED\n"
    assert err.startswith("pyhpc: error: job: 42 was lost: slurmctld restarted at ")
    assert "an admin closed its accounting record at" in err and err.count("\n") == 1
    assert err.rstrip().endswith("pyhpc resubmit 42")


def test_only_root_fixes(ctld, monkeypatch, capsys) -> None:
    monkeypatch.setattr(runaway, "is_root", lambda: False)
    assert cli.main(["doctor", "--fix-runaway"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyhpc: error: --fix-runaway: only root closes accounting records")
    assert err.count("\n") == 1 and ctld.calls == [] and not paths.RUNAWAY_LEDGERS.exists()


def test_the_ledger_is_never_written_through_a_link(ctld, tmp_path: Path, capsys) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    paths.RUNAWAY_LEDGERS.mkdir(parents=True, mode=0o711)
    lost.ledger_path(ALICE).symlink_to(target)
    assert cli.main(["doctor", "--fix-runaway"]) == 2
    err = capsys.readouterr().err
    assert "--fix-runaway: cannot append to" in err and "symlink is never followed" in err
    assert target.read_text() == "" and "sacctmgr" not in [c[0] for c in ctld.calls]


def readers(path: Path, uid: int) -> None:
    """Root and user ``uid`` alone may read ``path``: its ACL names ``uid`` (where the
    filesystem has ACLs; without them only root reads it)."""
    try:
        acl = os.getxattr(path, files.ACL_XATTR)
    except OSError as exc:
        assert exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP)  # ENODATA: no ACL written
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    else:
        assert acl == files.acl_reader(0o600, uid)


def test_a_user_this_host_does_not_know_gets_a_ledger_only_root_reads(ctld) -> None:
    ctld.answers["sacct"] = (0, f"43|erin|lab|{EARLY}|PENDING|Unknown\n")
    assert cli.main(["doctor", "--fix-runaway"]) == 0
    path = lost.ledger_path(None)
    assert [r["user"] for r in rows(None)] == ["erin"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(OSError):
        os.getxattr(path, files.ACL_XATTR)


def test_the_shared_ledger_from_before_moves_into_its_owners_ledgers(ctld, capsys) -> None:
    shared = paths.RUNAWAY_LEDGER_SHARED
    shared.parent.mkdir(parents=True)
    old = [{"job": "40", "user": "alice", "submit": epoch(EARLY), "boot": 1, "fixed_at": 2},
           {"job": "41", "user": "bob", "submit": epoch(EARLY), "boot": 1, "fixed_at": 2}]
    shared.write_text("".join(json.dumps(e) + "\n" for e in old) + "not json\n")
    shared.chmod(0o644)
    check = Doctor().runaway()
    assert not check.ok and f"{shared} holds every user's closed runaway jobs" in check.detail
    ctld.answers["sacct"] = (0, "")  # nothing to close: the move happens all the same
    assert cli.main(["doctor", "--fix-runaway"]) == 0
    assert not shared.exists()
    assert rows(ALICE) == old[:1] and rows(BOB) == old[1:]
    readers(lost.ledger_path(BOB), BOB)
    after = Doctor().runaway()
    assert after.ok and str(shared) not in after.detail


def test_fix_runaway_is_not_for_the_gpu_check(ctld, capsys) -> None:
    assert cli.main(["doctor", "--gpus", "--fix-runaway"]) == 2
    assert "--fix-runaway: not with --gpus" in capsys.readouterr().err and ctld.calls == []
