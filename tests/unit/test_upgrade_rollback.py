"""`pyhpc admin upgrade rollback`'s checks and sequence, and the run's backup step keeping
each host's backup name for it. Its steps' actions are counted here; on hostlab
(tests/integration/test_hostlab_release.py) they run.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pyhpc import cluster, paths
from pyhpc.admin import upgrade_rollback as rollback
from pyhpc.admin import upgrade_run as run
from pyhpc.admin.upgrade_facts import Facts, Host, from_listing
from pyhpc.admin.upgrade_releases import UpgradeError
from pyhpc.cli.main import main

LISTING = {"controller": {"hosts": ["ctl"]}, "dbd": {"hosts": ["db"]},
           "compute": {"hosts": ["cpu1", "gpu2"]}, "login": {"hosts": ["login"]},
           "_meta": {"hostvars": {}}}
HOSTS = tuple(from_listing(LISTING))
INVENTORY = "/inv/hosts.yml"


def lab() -> cluster.Cluster:
    return cluster.load(paths.LAB_CLUSTER)


def record(*done: str, **more: Any) -> dict[str, Any]:
    return {"cluster": lab().name, "inventory": INVENTORY, "deadline": "0",
            "started": "2026-12-07T00:00:00+00:00",
            "done": {name: {"at": "2026-12-07T00:00:01+00:00", "seconds": 1.0}
                     for name in done}, **more}


def facts(**codename: str) -> list[Facts]:
    return [Facts(h, codename.get(h.name, "bookworm"), "12.8", {}) for h in HOSTS]


def test_a_run_stopped_before_the_controllers_move_rolls_back_its_moved_hosts() -> None:
    top = Path("/nonexistent")
    assert rollback.check_window(record("plan", "queue-save", "backup"), HOSTS, top) == []
    gone = rollback.check_window(record("plan", "queue-save", "backup", "move-dbd",
                                        "accounting"), HOSTS, top)
    assert gone == ["db"]
    with pytest.raises(UpgradeError, match=r"^host ctl: the controller moved, and its state "
                                           r"with it; .*\(.*nothing changed\)$"):
        rollback.check_window(record(*run.NAMES[:7]), HOSTS, top)
    with pytest.raises(UpgradeError, match=r"the upgrade finished at .*there is no run to "
                                           r"roll back \(nothing changed\)$"):
        rollback.check_window(record(*run.NAMES, finished="2026-12-08T00:00:00+00:00"),
                              HOSTS, top)


def test_where_the_controller_holds_accounting_its_move_is_the_controllers() -> None:
    hosts = tuple(from_listing({"controller": {"hosts": ["ctl"]},
                                "compute": {"hosts": ["cn1"]}, "_meta": {"hostvars": {}}}))
    assert rollback.check_window(record("plan", "queue-save", "backup"), hosts, Path("/x")) == []
    with pytest.raises(UpgradeError, match="^host ctl: the controller moved"):
        rollback.check_window(record("plan", "queue-save", "backup", "move-dbd"), hosts,
                              Path("/x"))


def test_each_moved_accounting_host_needs_the_runs_backup_of_it() -> None:
    named = record(backups={"db": "db-20261207T000000Z", "ctl": "ctl-20261207T000000Z"})
    assert rollback.check_backups(named, ["db"], HOSTS) == {"db": "db-20261207T000000Z"}
    assert rollback.check_backups(record(), [], HOSTS) == {}
    with pytest.raises(UpgradeError, match=r"^host db: the run's record names no backup of "
                                           r"it .*pyhpc admin restore NAME there \(nothing "
                                           r"changed\)$"):
        rollback.check_backups(record(), ["db"], HOSTS)


def test_every_host_must_run_the_controllers_release_again() -> None:
    rollback.check_releases(facts(), "ctl")
    with pytest.raises(UpgradeError) as caught:
        rollback.check_releases(facts(db="trixie", gpu2="trixie"), "ctl")
    assert str(caught.value) == (
        "host db (trixie), gpu2 (trixie): not on the controller's release, bookworm; "
        "reinstall them with bookworm (or return to a snapshot taken before the move), "
        "then roll back again (nothing changed)")


def test_the_steps_run_in_order_and_a_second_rollback_goes_on_from_the_failed_one(
        tmp_path: Path) -> None:
    top = tmp_path / "run"
    top.mkdir(mode=0o700)
    rec = record("plan", "queue-save", "backup", "move-dbd")
    calls: list[str] = []

    def acts(failing: str | None) -> dict[str, Any]:
        def act(name: str) -> Any:
            return lambda: calls.append(name) or (5 if name == failing else 0)
        return {name: act(name) for name in rollback.NAMES}

    with pytest.raises(run.StepFailed, match=(
            r"^rollback step restore failed \(exit 5; its output: .*/rollback-restore.log\); "
            r"fix the cause and roll back again: it goes on from restore$")):
        rollback.carry_out(rec, top, acts("restore"))
    assert calls == ["deploy", "restore"]
    assert list(json.loads((top / run.RECORD).read_text())["rollback"]) == ["deploy"]
    calls.clear()
    rollback.carry_out(rec, top, acts(None))
    assert calls == ["restore", "queue-restore"]
    assert list(rec["rollback"]) == ["deploy", "restore", "queue-restore"]


def test_the_steps_act_on_the_moved_hosts_only(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(run, "playbook", lambda ctx, name, *extra, log: ran.append(
        ("playbook", name)) or 0)
    queue_there = [0]

    def on_host(ctx: run.Context, host: Host, argv: list[str], log: str,
                seen: list[str] | None = None) -> int:
        pyhpc = tuple(argv[:len(run.PYHPC)]) == run.PYHPC
        ran.append((host.name, *(argv[len(run.PYHPC):] if pyhpc else argv[:1])))
        return queue_there[0] if argv[0] == "test" else 0
    monkeypatch.setattr(run, "on_host", on_host)
    ctx = run.Context(Path(INVENTORY), tmp_path / "cluster.yml", lab(), HOSTS, "0", tmp_path,
                      record("plan", "queue-save", "backup", "move-dbd"))
    steps = rollback.runners(ctx, ["db"], {"db": "db-20261207T000000Z"})
    for name in rollback.NAMES:
        assert steps[name]() == 0
    assert ran == [("playbook", "site.yml"),
                   ("db", "admin", "restore", "db-20261207T000000Z", "--only", "accounting"),
                   ("ctl", "test"), ("ctl", "admin", "upgrade", "queue", "restore"),
                   ("ctl", "mv")]

    ran.clear()  # again after the queue's record was set aside: nothing given back twice
    queue_there[0] = 1
    assert steps["queue-restore"]() == 0 and ran == [("ctl", "test")]

    ran.clear()  # called off before any host moved, before the queue was saved
    ctx = run.Context(Path(INVENTORY), tmp_path / "cluster.yml", lab(), HOSTS, "0", tmp_path,
                      record("plan"))
    steps = rollback.runners(ctx, [], {})
    assert [steps[name]() for name in rollback.NAMES] == [0, 0, 0]
    assert ran == [("playbook", "site.yml")]  # a host moved by hand may be reinstalled


def test_the_rollback_sets_the_runs_record_aside_and_refuses_bad_input_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    top = tmp_path / "run"
    with pytest.raises(UpgradeError, match="^--inventory: required"):
        rollback.rollback(lab(), None, top)
    with pytest.raises(UpgradeError, match=r"run.json: no upgrade run under way: nothing to "
                                           r"roll back \(nothing changed\)$"):
        rollback.rollback(lab(), INVENTORY, top)
    top.mkdir(mode=0o700)
    run.write(top, record("plan", "queue-save", "backup", "move-dbd",
                          backups={"db": "db-1", "ctl": "ctl-1"}))
    with pytest.raises(UpgradeError, match="an upgrade of cluster .* from /inv/hosts.yml is "
                                           "under way"):
        rollback.rollback(lab(), "/other/hosts.yml", top)
    monkeypatch.setattr(rollback.facts_mod, "hosts", lambda path: list(HOSTS))
    monkeypatch.setattr(rollback.facts_mod, "gather", lambda *a: facts(db="trixie"))
    before = (top / run.RECORD).read_bytes()
    with pytest.raises(UpgradeError, match=r"^host db \(trixie\): not on the controller's"):
        rollback.rollback(lab(), INVENTORY, top)
    assert (top / run.RECORD).read_bytes() == before

    monkeypatch.setattr(rollback.facts_mod, "gather", lambda *a: facts())
    monkeypatch.setattr(rollback, "runners", lambda ctx, gone, backups: {
        name: lambda: 0 for name in rollback.NAMES})
    done = rollback.rollback(lab(), INVENTORY, top)
    assert done["moved"] == ["db"] and done["restored_from"] == {"db": "db-1"}
    assert not (top / run.RECORD).exists()
    aside = Path(done["record"])
    assert aside.parent == top and aside.name.startswith("rolled-back-")
    assert sorted(json.loads(aside.read_text())["rollback"]) == sorted(rollback.NAMES)
    assert "the next run starts a new upgrade" in rollback.text(done)

    monkeypatch.setattr(rollback, "rollback", lambda *a: (_ for _ in ()).throw(
        UpgradeError("--inventory: required")))
    assert main(["admin", "upgrade", "rollback"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_runs_backup_step_keeps_each_hosts_backup_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said = {"db": "backup db-20261207T101500Z: 41234 bytes (accounting.sql.gz) in 1.2 s\n",
            "ctl": "backup ctl-20261207T101502Z: 99 bytes (slurmctld-state.tar.gz) in 0.4 s; "
                   "pruned ctl-20261101T000000Z\n"}

    def on_host(ctx: run.Context, host: Host, argv: list[str], log: str,
                seen: list[str] | None = None) -> int:
        assert seen is not None and argv[-3:] == ["backup", "now", "--state"]
        seen.append(said.get(host.name, "backup: not due (newest: x)\n"))
        return 0
    monkeypatch.setattr(run, "on_host", on_host)
    ctx = run.Context(Path(INVENTORY), tmp_path / "cluster.yml", lab(), HOSTS, "0", tmp_path,
                      record("plan", "queue-save"))
    assert run.do_backup(ctx) == 0
    assert ctx.record["backups"] == {"ctl": "ctl-20261207T101502Z",
                                     "db": "db-20261207T101500Z"}

    said["db"] = "pyhpc: error: backup: disk full\n"
    with pytest.raises(UpgradeError, match=r"^host db: pyhpc admin backup now named no backup"):
        run.do_backup(ctx)
