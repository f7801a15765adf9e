"""`pyhpc admin upgrade run`'s sequence: SchedMD's order, the record of the steps that
ended well, a second run going on from the one that did not, a run after the last one
changing nothing, and its bad input in one line. The steps' own actions run on hostlab
(tests/integration/test_hostlab_release.py); here they are counted.
"""
from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from pyhpc import cluster, paths
from pyhpc.admin import backup
from pyhpc.admin import upgrade_run as run
from pyhpc.admin.upgrade_releases import UpgradeError
from pyhpc.cli.main import main
from pyhpc.errors import PyhpcError

ORDER = ["plan", "queue-save", "backup", "move-dbd", "accounting", "queue-save-last",
         "move-controller", "move-compute", "move-login", "release-finish", "deploy",
         "queue-restore"]


def acts(calls: list[str], failing: str | None = None) -> dict[str, Callable[[], int]]:
    def act(name: str) -> Callable[[], int]:
        def go() -> int:
            calls.append(name)
            return 3 if name == failing else 0
        return go
    return {name: act(name) for name in run.NAMES}


def new_record() -> dict[str, object]:
    return {"cluster": "lab", "inventory": "/inv/hosts.yml", "deadline": "0",
            "started": "2026-12-07T00:00:00+00:00", "done": {}}


def test_the_steps_follow_schedmds_order_and_a_run_after_the_last_changes_nothing(
        tmp_path: Path) -> None:
    assert list(run.NAMES) == ORDER
    calls: list[str] = []
    done = run.carry_out(new_record(), tmp_path / "run", acts(calls))
    assert calls == ORDER
    assert list(done["done"]) == ORDER and "finished" in done
    on_disk = json.loads((tmp_path / "run" / run.RECORD).read_text())
    assert on_disk == done
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "run" / run.RECORD).stat().st_mode & 0o777 == 0o600

    again: list[str] = []
    assert run.carry_out(on_disk, tmp_path / "run", acts(again)) == on_disk
    assert again == []


def test_a_failed_step_stops_the_run_and_the_next_run_goes_on_from_it(tmp_path: Path) -> None:
    top = tmp_path / "run"
    calls: list[str] = []
    with pytest.raises(run.StepFailed) as caught:
        run.carry_out(new_record(), top, acts(calls, failing="accounting"))
    assert calls == ORDER[:5]
    line = str(caught.value)
    assert line.startswith("step accounting failed (exit 3; its output: ")
    assert str(top / "accounting.log") in line and "goes on from accounting" in line
    record = json.loads((top / run.RECORD).read_text())
    assert set(record["done"]) == set(ORDER[:4]) and "finished" not in record

    again: list[str] = []
    done = run.carry_out(record, top, acts(again))
    assert again == ORDER[4:]
    assert set(done["done"]) == set(ORDER)


def test_a_step_that_cannot_start_names_itself(tmp_path: Path) -> None:
    def refused() -> int:
        raise UpgradeError("--inventory: ansible-playbook is not installed here")
    steps = {**acts([]), "backup": refused}
    with pytest.raises(run.StepFailed, match="^step backup: --inventory: ansible-playbook is "
                       "not installed here; fix it and run again: the run goes on from backup"):
        run.carry_out(new_record(), tmp_path / "run", steps)


def test_a_blocked_plan_is_its_own_line_and_writes_nothing(tmp_path: Path) -> None:
    def blocked() -> int:
        raise UpgradeError("mixed cluster: db runs trixie, the others bookworm")
    with pytest.raises(UpgradeError) as caught:
        run.carry_out(new_record(), tmp_path / "run", {**acts([]), "plan": blocked})
    assert not isinstance(caught.value, run.StepFailed)
    assert str(caught.value).startswith("mixed cluster:")
    assert not (tmp_path / "run").exists()


def test_stop_after_ends_there_and_the_next_run_goes_on(tmp_path: Path) -> None:
    top = tmp_path / "run"
    calls: list[str] = []
    record = run.carry_out(new_record(), top, acts(calls), stop_after="accounting")
    assert calls == ORDER[:5] and "finished" not in record
    calls.clear()
    run.carry_out(record, top, acts(calls), stop_after="accounting")
    assert calls == []
    run.carry_out(record, top, acts(calls))
    assert calls == ORDER[5:]
    with pytest.raises(UpgradeError, match="^--stop-after: 'nosuch' is not a step; one of plan,"):
        run.check_stop_after("nosuch")


def lab() -> cluster.Cluster:
    return cluster.load(paths.LAB_CLUSTER)


def test_the_first_run_needs_a_deadline_in_bounds(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    with pytest.raises(UpgradeError, match="^--deadline: required on the first run"):
        run.start(inv, tmp_path / "cluster.yml", lab(), None, tmp_path / "run")
    with pytest.raises(PyhpcError, match="^--deadline: '8d' is not allowed"):
        run.start(inv, tmp_path / "cluster.yml", lab(), "8d", tmp_path / "run")
    record = run.start(inv, tmp_path / "cluster.yml", lab(), "2h", tmp_path / "run")
    assert record["deadline"] == "2h" and record["done"] == {}
    assert not (tmp_path / "run").exists()


def write(top: Path, data: object) -> None:
    top.mkdir(mode=0o700)
    (top / run.RECORD).write_text(json.dumps(data))
    (top / run.RECORD).chmod(0o600)


def test_a_run_under_way_keeps_its_inventory_and_a_finished_one_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    top = tmp_path / "run"
    inv = tmp_path / "hosts.yml"
    inv.write_text("all: {}\n")
    record = {**new_record(), "inventory": str(inv), "done": {n: {"at": "t", "seconds": 1.0}
                                                              for n in ORDER},
              "finished": "2026-12-07T01:00:00+00:00"}
    write(top, record)
    with pytest.raises(UpgradeError, match=f"an upgrade of cluster lab from {inv} is under way"):
        run.start(Path("/inv/other.yml"), inv, lab(), None, top)

    def no_hosts(_: Path) -> list[object]:
        raise AssertionError("a finished run reads no host")
    monkeypatch.setattr(run.facts_mod, "hosts", no_hosts)
    done = run.run(lab(), str(inv), None, top=top)
    assert done["changed"] is False and done["finished"] == record["finished"]
    assert "nothing changed" in run.text(done)


@pytest.mark.parametrize("content,line", [
    ("not json", "not JSON (a hand edit?)"),
    ('["a list"]', "not an upgrade run record"),
])
def test_a_broken_record_is_one_line(tmp_path: Path, content: str, line: str) -> None:
    top = tmp_path / "run"
    top.mkdir(mode=0o700)
    (top / run.RECORD).write_text(content)
    (top / run.RECORD).chmod(0o600)
    with pytest.raises(UpgradeError, match=re.escape(line)):
        run.start(tmp_path / "hosts.yml", tmp_path / "c.yml", lab(), "0", top)


def test_a_record_that_is_a_link_is_refused_and_not_followed(tmp_path: Path) -> None:
    top = tmp_path / "run"
    top.mkdir(mode=0o700)
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(json.dumps(new_record()))
    (top / run.RECORD).symlink_to(elsewhere)
    with pytest.raises(UpgradeError, match=str(top / run.RECORD)):
        run.start(tmp_path / "hosts.yml", tmp_path / "c.yml", lab(), "0", top)


def test_without_an_inventory_the_run_refuses_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UpgradeError, match="^--inventory: required"):
        run.run(lab(), None, "0", top=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_failed_step_exits_1_and_bad_input_2(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    def failed(*_: object, **__: object) -> dict[str, object]:
        raise run.StepFailed("step deploy failed (exit 2; its output: /x/deploy.log)")
    monkeypatch.setattr(run, "run", failed)
    assert main(["admin", "upgrade", "run", "--inventory", "x", "--deadline", "0"]) == 1
    assert capsys.readouterr().err == ("pyhpc: error: step deploy failed (exit 2; its output: "
                                       "/x/deploy.log)\n")

    def bad(*_: object, **__: object) -> dict[str, object]:
        raise UpgradeError("--deadline: required on the first run")
    monkeypatch.setattr(run, "run", bad)
    assert main(["admin", "upgrade", "run", "--inventory", "x"]) == 2


def test_the_upgrades_backup_takes_slurmctlds_state_where_it_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "spool" / "slurmctld"
    (state / "hash.3" / "job.13").mkdir(parents=True)
    (state / "job_state").write_bytes(b"jobs")
    (state / "hash.3" / "job.13" / "script").write_text("#!/bin/sh\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=lab\nStateSaveLocation={state}\n")
    daemon = tmp_path / "slurmctld"
    monkeypatch.setattr(backup, "SLURM_CONF", conf)
    monkeypatch.setattr(backup, "SLURMCTLD", daemon)
    assert backup.state_dir() is None  # no slurmctld here: not the controller
    daemon.write_text("")
    assert backup.state_dir() == state
    assert "slurmctld-state.tar.gz" not in backup._parts(lab())
    writer = backup._parts(lab(), state=True)["slurmctld-state.tar.gz"]

    # A state file renamed away between the listing and its turn is left out.
    walk = os.walk

    def listing_then_gone(top: str) -> object:
        for root, dirs, names in walk(top):
            yield root, dirs, [*names, "job_state.new"] if root == str(state) else names
    monkeypatch.setattr(backup.os, "walk", listing_then_gone)
    out = io.BytesIO()
    writer(out)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue()), mode="r:gz") as tar:
        names = sorted(tar.getnames())
    inside = str(state).lstrip("/")
    assert names == sorted([inside, f"{inside}/hash.3", f"{inside}/hash.3/job.13",
                            f"{inside}/hash.3/job.13/script", f"{inside}/job_state"])


def test_each_host_moves_once_in_schedmds_order_the_accounting_host_with_the_controller(
        ) -> None:
    listing = {"controller": {"hosts": ["ctl"]}, "compute": {"hosts": ["cn1", "cn2"]},
               "login": {"hosts": ["login", "cn2"]}, "_meta": {"hostvars": {}}}
    hosts = tuple(run.facts_mod.from_listing(listing))
    assert run.moved_by(hosts) == {"move-dbd": ["ctl"], "move-controller": [],
                                   "move-compute": ["cn1", "cn2"], "move-login": ["login"]}


def test_a_move_with_no_host_left_runs_no_playbook(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    listing = {"controller": {"hosts": ["ctl"]}, "compute": {"hosts": ["cn1"]},
               "_meta": {"hostvars": {}}}
    hosts = tuple(run.facts_mod.from_listing(listing))
    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(run, "playbook", lambda ctx, name, *extra, log: ran.append(
        (name, *extra)) or 0)
    ctx = run.Context(tmp_path / "hosts.yml", tmp_path / "cluster.yml", lab(), hosts, "0",
                      tmp_path)
    steps = run.runners(ctx)
    assert steps["move-controller"]() == 0 and steps["move-login"]() == 0 and ran == []
    assert steps["move-dbd"]() == 0
    assert ran == [("release.yml", "-e", "debian_release_hosts=ctl")]
