"""The upgrade's queue record (issue 46): squeue --json's jobs as Slurm 22.05 prints them
(fields taken from the lab's squeue, trimmed) into sbatch options, dependencies remapped,
records read back or refused, and the commands' bad input. The lab's integration test
(tests/integration/test_upgrade_queue.py) saves and restores a real queue."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpc import paths
from pyhpc.admin import queue_store as store
from pyhpc.admin import upgrade_queue
from pyhpc.admin.queue_record import (
    QueueError,
    SavedJob,
    environment,
    from_json,
    held_by,
    options_of,
    remap,
    sbatch_args,
    to_json,
)
from pyhpc.slurm import queue_control, slurm

NOW = 1796607400
#: Three of the lab's jobs: held by its user with memory and output set; an array of four
#: tasks (two at once) after the first, exclusive; a job for later after both, niced.
HELD = {"job_id": 5, "name": "probe-a", "partition": "cpu", "account": "lab", "qos": "normal",
        "comment": "hi there", "standard_output": "/tmp/x-%j.out", "standard_error": "",
        "standard_input": "/dev/null", "flags": ["JOB_CPUS_SET", "JOB_MEM_SET"],
        "memory_per_node": 100, "memory_per_cpu": None, "time_limit": 3, "time_minimum": 0,
        "node_count": 1, "max_nodes": 0, "tasks": 1, "tasks_per_node": 0, "cpus_per_task": None,
        "nice": None, "shared": None, "requeue": True, "eligible_time": 0, "deadline": 0,
        "array_task_string": "", "array_max_tasks": 0, "dependency": "",
        "state_reason": "JobHeldUser", "tres_per_node": "", "resv_name": ""}
ARRAY = {**HELD, "job_id": 6, "name": "probe-b", "comment": "", "standard_output": "",
         "flags": [], "memory_per_node": None, "memory_per_cpu": 1024, "time_limit": 2,
         "shared": "none", "array_task_string": "1-4%2", "array_max_tasks": 2,
         "dependency": "afterok:5(unfulfilled)", "state_reason": "None"}
LATER = {**ARRAY, "job_id": 7, "name": "probe-c", "shared": None, "array_task_string": "",
         "array_max_tasks": 0, "tasks": 2, "tasks_per_node": 2, "max_nodes": 1, "nice": 10,
         "time_limit": 1440, "eligible_time": NOW + 3600, "state_reason": "Dependency",
         "dependency": "afterany:6_*(unfulfilled),afterok:5(unfulfilled)"}


def saved(job_id: str = "5", **values: object) -> SavedJob:
    fields = {"user": "user1", "uid": 20000, "cwd": "/home/user1", "submit": NOW,
              "fate": "held", "script": "#!/bin/sh\nsleep 1\n", "options": {"name": "a"},
              **values}
    return SavedJob(job_id, **fields)  # type: ignore[arg-type]  # test values


def test_a_held_job_keeps_what_it_asked_for_and_who_held_it() -> None:
    assert options_of(HELD, NOW) == {
        "account": "lab", "comment": "hi there", "mem": "100", "name": "probe-a",
        "ntasks": "1", "output": "/tmp/x-%j.out", "partition": "cpu", "qos": "normal",
        "requeue": "yes", "time": "3"}
    assert held_by(HELD) == "user" and held_by(ARRAY) == "" and \
        held_by({"state_reason": "JobHeldAdmin"}) == "admin"


def test_memory_the_job_did_not_set_is_left_to_the_partitions_default() -> None:
    assert "mem_per_cpu" not in options_of(ARRAY, NOW) and "mem" not in options_of(ARRAY, NOW)


def test_an_arrays_pending_tasks_and_throttle_come_back_once() -> None:
    options = options_of(ARRAY, NOW)
    assert options["array"] == "1-4%2" and options["exclusive"] == ""
    assert options_of({**ARRAY, "array_task_string": "3-4"}, NOW)["array"] == "3-4%2"


def test_a_later_begin_nice_and_tasks_per_node_are_kept() -> None:
    options = options_of(LATER, NOW)
    assert options["nice"] == "10" and options["ntasks_per_node"] == "2"
    assert options["begin"].startswith("2026-") and options["nodes"] == "1"
    assert "begin" not in options_of({**LATER, "eligible_time": NOW - 5}, NOW)


def test_slurms_no_value_numbers_are_no_option() -> None:
    job = {**HELD, "cpus_per_task": 65534, "time_limit": 4294967295, "nice": 2147483645,
           "tres_per_node": "gres:gpu:2", "tres_per_job": "gres:gpu:a100:1"}
    options = options_of(job, NOW)
    assert "cpus_per_task" not in options and "time" not in options and "nice" not in options
    assert options["gres"] == "gpu:2" and options["gpus"] == "a100:1"


def test_dependencies_are_remapped_to_the_new_ids_without_their_states() -> None:
    assert remap(LATER["dependency"], {"5": "105", "6": "106"}) == \
        ("afterany:106_*,afterok:105", [])
    assert remap("afterok:5+10(unfulfilled)?singleton", {"5": "9"}) == ("afterok:9+10?singleton", [])


def test_a_dependency_on_a_job_not_resubmitted_is_named() -> None:
    assert remap("afterok:5(unfulfilled),afterany:8(unfulfilled)", {"5": "105"}) == \
        ("afterok:105", ["8"])


def test_sbatch_gets_the_options_in_one_order_with_the_directory_first() -> None:
    job = saved(options=options_of(ARRAY, NOW))
    assert sbatch_args(job, "afterok:105", hold=True) == [
        "--chdir=/home/user1", "--job-name=probe-b", "--partition=cpu", "--account=lab",
        "--qos=normal", "--time=2", "--ntasks=1", "--array=1-4%2", "--exclusive",
        "--requeue", "--dependency=afterok:105", "--hold"]


def test_a_hostile_comment_stays_one_argument() -> None:
    job = saved(options={"comment": "x --uid=0\n; rm -rf /"})
    assert sbatch_args(job)[1:] == ["--comment=x --uid=0\n; rm -rf /"]


def test_a_record_round_trips_and_a_tampered_one_is_refused() -> None:
    job = saved(options=options_of(HELD, NOW), held="user")
    assert from_json(json.loads(json.dumps(to_json(job))), "x") == job
    for bad in ({**to_json(job), "fate": "lost"}, {**to_json(job), "uid": "0"},
                {**to_json(job), "options": {"uid": "0"}}, {**to_json(job), "job_id": "5;6"},
                {**to_json(job), "environment": ["NOEQUALS"]}, {**to_json(job), "umask": "777"},
                {k: v for k, v in to_json(job).items() if k != "script"}, []):
        with pytest.raises(QueueError, match="record: x"):
            from_json(bad, "x")


@pytest.mark.parametrize("text,seconds", [("0", 0), ("90", 90), ("90s", 90), ("10m", 600),
                                          ("2h", 7200), ("7d", 604800)])
def test_deadlines_in_bounds(text: str, seconds: int) -> None:
    assert upgrade_queue.deadline_seconds(text) == seconds


@pytest.mark.parametrize("text", ["8d", "-1", "1y", "10 m", "", "1e3", "9" * 30])
def test_deadlines_out_of_bounds_are_one_line(text: str) -> None:
    with pytest.raises(QueueError, match=r"^--deadline: .* from 0 to 7d$"):
        upgrade_queue.deadline_seconds(text)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pyhpc", "admin", "upgrade", "queue", *args]
    # No Slurm tool on its PATH: should a refusal come too late, nothing reaches the lab.
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60,
                          env={**os.environ, "PATH": "/nonexistent"})


def test_a_deadline_out_of_bounds_exits_2_and_records_nothing() -> None:
    before = os.path.lexists(store_path())
    proc = cli("save", "--deadline", "8d")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--deadline" in proc.stderr
    assert os.path.lexists(store_path()) == before


def store_path() -> Path:
    return paths.UPGRADE_QUEUE


def test_save_and_restore_refuse_anyone_but_root(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for call in (lambda: upgrade_queue.save("0", tmp_path / "q"),
                 lambda: upgrade_queue.restore(tmp_path / "q")):
        with pytest.raises(QueueError, match="^user: run as root on the controller"):
            call()
    assert not (tmp_path / "q").exists()


#: The record is root's (files.read_owned checks its owner): these tests need root.
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the record is root's: needs root")


@root_only
def test_no_record_and_a_corrupt_one_are_one_line_each(tmp_path: Path) -> None:
    top = tmp_path / "queue"
    with pytest.raises(QueueError, match="^record: no queue record in"):
        upgrade_queue.restore(top)
    store.make(top)
    store.write_save(top, {"reservation_made": True, "saved": True, "deadline_at": 1,
                           "started_at": 1})
    (top / store.JOBS / "5.json").write_text("{not json")
    (top / store.JOBS / "5.json").chmod(0o600)
    with pytest.raises(QueueError, match="is not JSON; not a pyhpc queue record"):
        upgrade_queue.restore(top)
    (top / store.JOBS / "5.json").chmod(0o644)
    with pytest.raises(QueueError, match="is not private"):
        upgrade_queue.restore(top)


@root_only
def test_the_record_is_private_and_a_planted_link_is_replaced_not_followed(tmp_path: Path) -> None:
    top = store.make(tmp_path / "queue")
    target = tmp_path / "elsewhere"
    target.write_text("kept")
    (top / store.JOBS / "5.json").symlink_to(target)
    store.write_job(top, saved())
    assert target.read_text() == "kept"
    assert oct((top / store.JOBS / "5.json").stat().st_mode & 0o777) == "0o600"
    assert oct(top.stat().st_mode & 0o777) == "0o700"
    assert store.read_jobs(top) == {"5": saved()}


@root_only
def test_a_first_save_without_a_deadline_is_one_line_and_makes_nothing(tmp_path: Path) -> None:
    with pytest.raises(QueueError, match="^--deadline: required on the first save"):
        upgrade_queue.save(None, tmp_path / "queue")
    assert not (tmp_path / "queue").exists()


def test_a_train_job_is_told_by_its_owners_pyhpc_record_and_by_nothing_else(
        tmp_path: Path) -> None:
    folder = tmp_path / "pyhpc-jobs" / "%j"
    (tmp_path / "pyhpc-jobs" / "records").mkdir(parents=True)
    record = tmp_path / "pyhpc-jobs" / "records" / "42.json"
    record.write_text(json.dumps({"job_id": "42", "kind": "train", "folder": str(folder)}))
    job = {"job_id": 42, "user_id": os.geteuid(), "standard_output": f"{folder}/%j_0_log.out"}
    assert upgrade_queue.pyhpc_kind(job) == ("train", str(folder))
    assert upgrade_queue.pyhpc_kind({**job, "user_id": os.geteuid() + 1}) == ("", "")
    assert upgrade_queue.pyhpc_kind({**job, "job_id": 43}) == ("", "")
    record.rename(tmp_path / "real.json")
    record.symlink_to(tmp_path / "real.json")
    assert upgrade_queue.pyhpc_kind(job) == ("", "")


def test_the_stored_environment_is_read_as_slurm_22_05_writes_it(tmp_path: Path) -> None:
    entries = [b"HOME=/home/user1", b"VAR=two words", b"RAW=\xff", b"SLURM_UMASK=0077",
               b"SLURM_SUBMIT_DIR=/home/user1"]
    where = tmp_path / "hash.5" / "job.45"
    where.mkdir(parents=True)
    (where / "environment").write_bytes(len(entries).to_bytes(4, sys.byteorder)
                                        + b"".join(e + b"\0" for e in entries))
    found = queue_control.environment("45", tmp_path)
    assert found is not None and found[2].encode(errors="surrogateescape") == b"RAW=\xff"
    assert environment(found) == (["HOME=/home/user1", "VAR=two words", found[2]], "0077")
    (where / "environment").write_bytes((9).to_bytes(4, sys.byteorder) + b"A=1\0")
    assert queue_control.environment("45", tmp_path) is None
    assert queue_control.environment("46", tmp_path) is None


@root_only
def test_a_save_over_a_restored_record_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    top = store.make(tmp_path / "queue")
    store.write_restored(top, {"5": "1"})
    before = sorted(p.name for p in top.rglob("*"))
    with pytest.raises(QueueError, match="^record: .* holds a queue restore brought back"):
        upgrade_queue.save("0", top)
    assert sorted(p.name for p in top.rglob("*")) == before


def test_the_admins_table_lists_each_job_and_old_to_new_ids() -> None:
    rows = [{"job_id": "5", "user": "user1", "name": "a", "fate": "held", "held": "user"},
            {"job_id": "6", "user": "user2", "name": "b", "fate": "cancelled", "held": ""}]
    saved_text = upgrade_queue.text({"record": "/r", "reservation": "pyhpc-upgrade",
                                     "seconds": 1.0, "jobs": rows, "first_job_id": 400})
    assert saved_text.splitlines()[0].endswith("the new slurmctld's FirstJobId: 400 (the "
                                               "deploy sets it)")
    assert saved_text.splitlines()[1:] == ["5\tuser1\ta\theld, held by its user",
                                           "6\tuser2\tb\tcancelled"]
    restored = [{**rows[0], "new_job_id": "1", "note": ""},
                {**rows[1], "new_job_id": None, "note": "cancelled at save's deadline"}]
    text = upgrade_queue.text({"record": "/r", "seconds": 1.0, "jobs": restored},
                              restoring=True)
    assert text.splitlines() == ["restored 1 of 2 recorded jobs in 1.0 s; record /r",
                                 "5 -> 1\tuser1\ta",
                                 "6 -> -\tuser2\tb\tcancelled at save's deadline"]


#: `scontrol show config` of the lab (22.05), trimmed; and its sacct over all time: an array
#: whose tasks ran (their own ids only on their steps' lines) and a job of an earlier
#: state loss, far above slurmctld's next id.
CONFIG = """Configuration data as of 2026-12-07T05:20:01
AccountingStorageType   = accounting_storage/slurmdbd
FirstJobId              = 1
NEXT_JOB_ID             = 392
StateSaveLocation       = /var/spool/slurmctld
"""
SACCT = "127\n127.batch\n128.batch\n129.batch\n391\n391.batch\n391.0\n60023339\n"


def answers(monkeypatch: pytest.MonkeyPatch, config: str = CONFIG,
            sacct: str | None = SACCT) -> list[list[str]]:
    """Slurm's canned answers to `scontrol show config` and to sacct (None: slurmdbd does
    not answer); any other command still fails the test. Returns the commands asked."""
    asked: list[list[str]] = []

    def runner(argv: list[str], stdin: object, timeout: object) -> subprocess.CompletedProcess[str]:
        asked.append(list(argv))
        if argv[:3] == ["scontrol", "show", "config"]:
            return subprocess.CompletedProcess(argv, 0, config, "")
        if argv[0] == "sacct":
            return subprocess.CompletedProcess(argv, 1 if sacct is None else 0, sacct or "",
                                               "sacct: error: Problem talking to the database")
        raise AssertionError(f"a unit test ran a Slurm command: {argv}")
    monkeypatch.setattr(slurm, "RUNNER", runner)
    return asked


def fresh(**values: int) -> dict[str, object]:
    return {"reservation_made": False, "saved": False, "deadline_at": 0, "started_at": 0,
            "first_job_id": 0, "next_job_id": 0, **values}


def test_scontrol_show_config_is_read_once_into_its_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = answers(monkeypatch)
    conf = queue_control.config()
    assert queue_control.config_number(conf, "NEXT_JOB_ID") == 392
    assert queue_control.state_dir(conf) == Path("/var/spool/slurmctld") and len(asked) == 1
    with pytest.raises(slurm.SlurmError, match="^scontrol: show config gives no number for MaxJobId"):
        queue_control.config_number(conf, "MaxJobId")


def test_the_first_job_id_is_above_slurmctlds_next_and_every_id_in_accounting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked = answers(monkeypatch)
    assert upgrade_queue.above_accounting(fresh()) == 60023340
    assert [a for a in asked if a[0] == "sacct"][0][:5] == ["sacct", "-a", "-n", "-P", "-o"]
    assert upgrade_queue.job_ids(fresh(first_job_id=60023340)) == {
        "first_job_id": 60023340, "next_job_id": 392}
    answers(monkeypatch, sacct="128.batch\n129.batch\n")  # array tasks: their steps' ids
    assert upgrade_queue.above_accounting(fresh()) == 130
    assert upgrade_queue.job_ids(fresh(first_job_id=130)) == {"first_job_id": 392,
                                                              "next_job_id": 392}


def test_a_later_save_raises_the_first_job_id_and_never_lowers_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    answers(monkeypatch, sacct="")
    assert upgrade_queue.above_accounting(fresh(first_job_id=500)) == 500
    assert upgrade_queue.job_ids(fresh(first_job_id=300, next_job_id=300)) == {
        "first_job_id": 392, "next_job_id": 392}
    assert upgrade_queue.job_ids(fresh(first_job_id=500, next_job_id=392))["first_job_id"] == 500


def test_job_ids_that_wrapped_at_max_job_id_stop_save_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    top = "67043328"
    wrapped = CONFIG + f"MaxJobId                = {top}\n"
    answers(monkeypatch, config=wrapped, sacct=f"{int(top) - 1}\n12.batch\n")
    with pytest.raises(QueueError, match=rf"^MaxJobId: accounting holds job ids up to "
                                         rf"{int(top) - 1}, slurmctld's MaxJobId \({top}\): its "
                                         "job ids have wrapped"):
        upgrade_queue.above_accounting(fresh())
    answers(monkeypatch, config=wrapped, sacct=f"{int(top) - 2}\n")  # one id left: saved
    assert upgrade_queue.above_accounting(fresh()) == int(top) - 1


def test_accounting_not_answering_stops_only_a_first_save(monkeypatch: pytest.MonkeyPatch) -> None:
    answers(monkeypatch, sacct=None)
    with pytest.raises(QueueError, match="^accounting: sacct: .*; save needs the highest job id "
                                         "in accounting once"):
        upgrade_queue.above_accounting(fresh())
    assert upgrade_queue.above_accounting(fresh(first_job_id=60023340)) == 60023340
    off = CONFIG.replace("accounting_storage/slurmdbd", "accounting_storage/none")
    asked = answers(monkeypatch, config=off, sacct=None)
    assert upgrade_queue.above_accounting(fresh()) == 0 and [a[0] for a in asked] == ["scontrol"]


@root_only
def test_a_first_save_without_accounting_is_one_line_and_makes_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    asked = answers(monkeypatch, sacct=None)
    with pytest.raises(QueueError, match="^accounting: "):
        upgrade_queue.save("0", tmp_path / "queue")
    assert not (tmp_path / "queue").exists() and [a[0] for a in asked] == ["scontrol", "sacct"]


def conf(next_id: int, first: int = 1) -> dict[str, str]:
    return {"NEXT_JOB_ID": str(next_id), "FirstJobId": str(first)}


def test_restore_refuses_a_slurmctld_started_empty_below_the_first_job_id() -> None:
    state = fresh(saved=True, first_job_id=60023340, next_job_id=400)
    for running in (conf(1), conf(5000, first=5000), conf(60023339, first=60023339)):
        with pytest.raises(QueueError, match=r"^FirstJobId: slurmctld's next job id is \d+, "
                                             r"below 60023340, .* set FirstJobId=60023340 in "):
            upgrade_queue.check_job_ids(state, running)
    upgrade_queue.check_job_ids(state, conf(60023340, first=60023340))  # the deploy's
    upgrade_queue.check_job_ids(state, conf(60023345, first=60023340))
    upgrade_queue.check_job_ids(state, conf(400))  # slurmctld kept its state: it counts on
    upgrade_queue.check_job_ids(state, conf(412))
    # kept, under the FirstJobId the deploy set from the record (a rollback's deploy)
    upgrade_queue.check_job_ids(state, conf(400, first=60023340))
    upgrade_queue.check_job_ids(fresh(saved=True), conf(1))  # a record from before the key


@root_only
def test_a_refused_restore_submits_nothing_and_changes_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    top = store.make(tmp_path / "queue")
    store.write_save(top, fresh(saved=True, reservation_made=True, first_job_id=60023340,
                                next_job_id=400))
    store.write_job(top, saved())
    before = sorted((p.name, p.read_bytes()) for p in top.rglob("*") if p.is_file())
    asked = answers(monkeypatch)
    with pytest.raises(QueueError, match="^FirstJobId: .* set FirstJobId=60023340 in slurm.conf"):
        upgrade_queue.restore(top)
    assert [a[:3] for a in asked] == [["scontrol", "show", "config"]]
    assert sorted((p.name, p.read_bytes()) for p in top.rglob("*") if p.is_file()) == before


@root_only
def test_a_record_written_before_the_job_ids_reads_as_none_recorded(tmp_path: Path) -> None:
    top = store.make(tmp_path / "queue")
    old = {k: v for k, v in fresh(saved=True).items() if k not in store.LATER_KEYS}
    (top / store.SAVE).write_text(json.dumps(old))
    (top / store.SAVE).chmod(0o600)
    assert store.read_save(top) == fresh(saved=True)
    (top / store.SAVE).write_text(json.dumps({**old, "first_job_id": "60023340"}))
    with pytest.raises(QueueError, match="is not a pyhpc queue record"):
        store.read_save(top)
