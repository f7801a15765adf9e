"""LOST: a job slurmctld lost in a crash while accounting holds it open, told apart from a
record that lags, a requeue and a new job that reuses the id (pyhpc.slurm.lost, watch)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pyhpc import paths
from pyhpc.slurm import lost, slurm, watch
from pyhpc.slurm.rows import JobRow, epoch, sacct_rows, squeue_rows, text_rows

#: slurmctld came back at BOOT; BEFORE was accepted 4 s before and not saved; AFTER and
#: LATER were submitted after the restart.
BOOT, BEFORE = "2026-11-25T16:18:54", "2026-11-25T16:18:50"
AFTER, LATER = "2026-11-25T16:19:30", "2026-11-25T16:25:00"
CONFIG = ("Configuration data as of 2026-11-25T16:30:00\n"
          "AccountingStorageType   = accounting_storage/slurmdbd\n"
          f"BOOT_TIME               = {BOOT}\nCLUSTER_NAME            = lab\n")


def sdiag(dbd_queue: int) -> str:
    """sdiag's head; the controller's own agent queue is not the DBD agent's."""
    return ("*******************************************************\n"
            "sdiag output at 2026-11-25T16:30:00 (1764084600)\n"
            "Server thread count:  3\nAgent queue size:     7\nAgent count:          0\n"
            f"DBD Agent queue size: {dbd_queue}\n\nJobs submitted: 12\n")


@pytest.fixture
def ctld(fake_slurm):
    """A controller that restarted at BOOT and has sent every accounting message."""
    fake_slurm.answers["scontrol"] = lambda argv: (0, CONFIG if argv[1:] == ["show", "config"]
                                                   else "")
    fake_slurm.answers["sdiag"] = (0, sdiag(0))
    return fake_slurm


def in_turn(fake, tool: str, outputs: list[list[str]]) -> None:
    """``tool`` answers these rows, one list per call (a call more is an error)."""
    answers = iter(outputs)
    fake.answers[tool] = lambda argv: (0, "\n".join(next(answers)) + "\n")


def tools(fake) -> list[str]:
    return [c[0] for c in fake.calls]


# -- the rule, through the watch (squeue first, sacct for jobs gone from it) ----------------

def test_a_job_the_controller_lost_while_accounting_holds_it_open_is_lost(ctld) -> None:
    in_turn(ctld, "squeue", [[f"42|RUNNING|None|{BEFORE}"], []])
    in_turn(ctld, "sacct", [[f"42|RUNNING|None|{BEFORE}", f"42.batch|RUNNING||{BEFORE}"]])
    with pytest.raises(lost.LostError) as exc:
        watch.watch(["42"], interval_s=0, quiet=True)
    message = str(exc.value)
    assert message == (f"job: 42 was lost: slurmctld restarted at {BOOT} before it saved the job, "
                       f"submitted {BEFORE} (accounting still says RUNNING, but it will never run "
                       "or end); submit it again with: pyhpc resubmit 42")
    assert exc.value.states == {"42": "LOST"} and "\n" not in message
    assert tools(ctld) == ["squeue", "squeue", "sacct", "scontrol", "sdiag"]


def test_lost_is_a_terminal_state_and_a_failure() -> None:
    assert "LOST" in watch.TERMINAL
    assert watch._merge(["COMPLETED", "LOST", "COMPLETED"]) == "LOST"


def test_a_lagging_record_is_not_lost_and_the_watch_goes_on(ctld) -> None:
    """The DBD agent still holds messages: the end record may be on its way."""
    queues = iter([sdiag(3)])
    ctld.answers["sdiag"] = lambda argv: (0, next(queues))
    in_turn(ctld, "squeue", [[f"42|RUNNING|None|{BEFORE}"], [], []])
    in_turn(ctld, "sacct", [[f"42|RUNNING|None|{BEFORE}"], [f"42|COMPLETED|None|{BEFORE}"]])
    assert watch.watch(["42"], interval_s=0, quiet=True) == {"42": "COMPLETED"}
    assert tools(ctld) == ["squeue", "squeue", "sacct", "scontrol", "sdiag", "squeue", "sacct"]


def test_a_record_submitted_after_the_boot_is_not_lost(ctld) -> None:
    in_turn(ctld, "squeue", [[f"42|PENDING|None|{AFTER}"], [], [], []])
    ctld.answers["sacct"] = (0, f"42|PENDING|None|{AFTER}\n")
    tracker = watch.Tracker(["42"], "squeue")
    for _ in range(4):
        tracker.poll()
    assert tracker.states() == {"42": "PENDING"} and not tracker.lost
    assert "sdiag" not in tools(ctld)  # (d) is asked only when (c) holds


def test_a_new_job_that_reuses_the_id_is_not_followed(ctld) -> None:
    """After the crash slurmctld gives the lost job's id to the next submission."""
    in_turn(ctld, "squeue", [[f"42|RUNNING|None|{BEFORE}"], [f"42|PENDING|Priority|{AFTER}"]])
    in_turn(ctld, "sacct", [[f"42|RUNNING|None|{BEFORE}", f"42|PENDING|Priority|{AFTER}"]])
    with pytest.raises(lost.LostError, match=r"^job: 42 was lost: .* submitted 2026-11-25T16:18:50 "):
        watch.watch(["42"], interval_s=0, quiet=True)
    assert ctld.calls[2][:3] == ["sacct", "-n", "-P"] and "-D" in ctld.calls[2]


def test_a_requeued_job_is_followed_into_its_next_run(ctld) -> None:
    """A requeue gives the job a new submit time too; accounting closed the first run."""
    in_turn(ctld, "squeue", [[f"42|RUNNING|None|{BEFORE}"], [f"42|PENDING|BeginTime|{LATER}"],
                             [f"42|RUNNING|None|{LATER}"], [f"42|COMPLETED|None|{LATER}"]])
    in_turn(ctld, "sacct", [[f"42|REQUEUED|None|{BEFORE}", f"42|PENDING|None|{LATER}"]])
    assert watch.watch(["42"], interval_s=0, quiet=True) == {"42": "COMPLETED"}
    assert tools(ctld) == ["squeue", "squeue", "sacct", "squeue", "squeue"]


def test_a_requeue_accounting_has_not_recorded_yet_is_followed_too(ctld) -> None:
    in_turn(ctld, "squeue", [[f"42|RUNNING|None|{BEFORE}"], [f"42|PENDING|BeginTime|{LATER}"]])
    in_turn(ctld, "sacct", [[f"42|REQUEUED|None|{BEFORE}"]])
    tracker = watch.Tracker(["42"], "squeue")
    tracker.poll()
    tracker.poll()
    assert tracker.states() == {"42": "PENDING"} and not tracker.lost


def test_a_job_neither_slurmctld_nor_accounting_knows_after_the_restart_is_lost(ctld) -> None:
    """slurmctld sends accounting a job's first record from memory too: SIGKILL 1.3 s after
    a burst left the lab no record at all of the lost jobs (it said UNKNOWN, then FINISHED)."""
    in_turn(ctld, "squeue", [[f"42|PENDING|Resources|{BEFORE}"], []])
    ctld.answers["sacct"] = (0, "")
    with pytest.raises(lost.LostError) as exc:
        watch.watch(["42"], interval_s=0, quiet=True)
    assert str(exc.value) == (f"job: 42 was lost: slurmctld restarted at {BOOT} before it saved "
                              f"the job, submitted {BEFORE} (accounting has no record of it "
                              "either); submit it again with: pyhpc resubmit 42")
    assert exc.value.states == {"42": "LOST"}


def test_a_job_pyhpc_submitted_that_the_watch_never_saw_is_lost_too(ctld) -> None:
    """The crash came between sbatch and the watch's first look: pyhpc's note of when it
    submitted the job stands in for the run it never saw."""
    ctld.answers["squeue"] = (0, "")
    ctld.answers["sacct"] = (0, "")
    with pytest.raises(lost.LostError, match="accounting has no record of it either"):
        watch.watch(["42"], interval_s=0, quiet=True, submitted={"42": epoch(BEFORE)})


def test_a_job_gone_from_both_without_a_restart_since_it_was_seen_is_finished(ctld) -> None:
    """No restart after it was submitted: the old rule (FINISHED after ABSENT_POLLS) holds."""
    in_turn(ctld, "squeue", [[f"42|RUNNING|None|{AFTER}"], [], []])
    ctld.answers["sacct"] = (0, "")
    assert watch.watch(["42"], interval_s=0, quiet=True) == {"42": "FINISHED"}
    assert "sdiag" not in tools(ctld)


def test_status_of_a_noted_job_no_one_knows_is_lost_and_of_an_unnoted_one_not_found(ctld) -> None:
    ctld.answers["squeue"] = (0, "")
    ctld.answers["sacct"] = (0, "")
    states, failure = watch.inspect(["42", "43"], submitted={"42": epoch(BEFORE)})
    assert states == {"42": "LOST", "43": "NOT_FOUND"}
    assert failure is not None and str(failure).startswith("job: 42 was lost")
    assert [c[0] for c in ctld.calls].count("squeue") == 1  # one call for both
    assert ctld.calls[[c[0] for c in ctld.calls].index("squeue")][-1] == "42,43"


def test_a_job_lost_after_its_requeue_and_before_its_next_run_is_lost(ctld) -> None:
    """Its newest record is the requeued run: no later run follows it (make bench-crash)."""
    ctld.answers["squeue"] = (0, "")
    ctld.answers["sacct"] = (0, f"42|REQUEUED|None|{BEFORE}\n")
    states, failure = watch.inspect(["42"])
    assert states == {"42": "LOST"} and failure is not None


def test_a_requeued_job_slurmctld_still_knows_is_not_lost(ctld) -> None:
    """Its next run's record has not reached accounting yet; slurmctld has it pending."""
    ctld.answers["squeue"] = (0, f"42|PENDING|BeginTime|{AFTER}\n")
    ctld.answers["sacct"] = (0, f"42|REQUEUED|None|{BEFORE}\n")
    states, failure = watch.inspect(["42"])
    assert states == {"42": "REQUEUED"} and failure is None


def test_a_job_slurm_held_after_the_restart_ends_the_watch_in_one_line(ctld) -> None:
    """Saved pending, started by its node before the crash: requeued and held at the restart."""
    ctld.answers["squeue"] = (0, f"42|PENDING|launch failed requeued held|{BEFORE}\n")
    with pytest.raises(watch.WatchError) as exc:
        watch.watch(["42"], interval_s=0, quiet=True)
    assert str(exc.value) == ("job: 42 is held by Slurm (launch failed requeued held): slurmctld "
                              "restarted while it started, and holds it until someone releases "
                              "it; an admin runs scontrol release 42, or pyhpc cancel 42")


def test_sacct_unreachable_is_never_lost_and_the_watch_still_ends(ctld) -> None:
    in_turn(ctld, "squeue", [[f"42|RUNNING|None|{BEFORE}"], [], []])
    ctld.answers["sacct"] = (1, "", "sacct: error: Problem talking to the database")
    assert watch.watch(["42"], interval_s=0, quiet=True) == {"42": "FINISHED"}
    assert "scontrol" not in tools(ctld) and "sdiag" not in tools(ctld)


def test_sdiag_that_does_not_answer_is_never_lost(ctld) -> None:
    ctld.answers["sdiag"] = (1, "", "sdiag: error: slurm_get_statistics: Access denied")
    in_turn(ctld, "squeue", [[f"42|RUNNING|None|{BEFORE}"], []])
    ctld.answers["sacct"] = (0, f"42|RUNNING|None|{BEFORE}\n")
    tracker = watch.Tracker(["42"], "squeue")
    tracker.poll()
    tracker.poll()
    assert tracker.states() == {"42": "RUNNING"} and not tracker.lost


def test_json_output_carries_submit_times_too(ctld, monkeypatch) -> None:
    """Slurm 23.02+ writes times as {"set", "number"}; 22.05 as plain numbers."""
    monkeypatch.setattr(slurm, "_json_ok", {})
    submit = epoch(BEFORE)
    queued = {"job_id": 42, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
              "job_state": ["RUNNING"], "state_reason": "None",
              "submit_time": {"set": True, "infinite": False, "number": submit}}
    polls = iter([[queued], []])
    ctld.answers["squeue"] = lambda argv: (0, json.dumps({"jobs": next(polls)}))
    ctld.answers["sacct"] = (0, json.dumps({"jobs": [{"job_id": 42, "array": {}, "time": {
        "submission": submit}, "state": {"current": ["RUNNING"], "reason": "None"}}]}))
    with pytest.raises(lost.LostError) as exc:
        watch.watch(["42"], interval_s=0, quiet=True)
    assert exc.value.states == {"42": "LOST"}
    assert ctld.calls[2] == ["sacct", "-D", "-j", "42", "--json"]


def test_other_jobs_are_watched_to_their_end_before_the_lost_one_is_reported(ctld) -> None:
    in_turn(ctld, "squeue", [[f"42|RUNNING|None|{BEFORE}", f"43|RUNNING|None|{AFTER}"],
                             [f"43|RUNNING|None|{AFTER}"], [f"43|COMPLETED|None|{AFTER}"]])
    in_turn(ctld, "sacct", [[f"42|RUNNING|None|{BEFORE}"]])
    with pytest.raises(lost.LostError) as exc:
        watch.watch(["42", "43"], interval_s=0, quiet=True)
    assert exc.value.states == {"42": "LOST", "43": "COMPLETED"}


# -- one look (pyhpc status): sacct first, squeue for the jobs it holds open -----------------

def test_one_look_asks_squeue_once_about_the_open_records_only(ctld) -> None:
    ctld.answers["sacct"] = (0, f"41|COMPLETED|None|{BEFORE}\n42|RUNNING|None|{BEFORE}\n"
                                f"43|PENDING|None|{BEFORE}\n")
    ctld.answers["squeue"] = (0, f"43|PENDING|Priority|{BEFORE}\n")
    states, error = watch.inspect(["41", "42", "43"])
    assert states == {"41": "COMPLETED", "42": "LOST", "43": "PENDING"}
    assert error is not None and str(error).startswith("job: 42 was lost: ")
    assert tools(ctld) == ["sacct", "squeue", "scontrol", "sdiag"]
    assert ctld.calls[1][-2:] == ["-j", "42,43"]


def test_one_look_at_a_job_the_controller_knows_asks_nothing_more(ctld) -> None:
    ctld.answers["sacct"] = (0, f"42|RUNNING|None|{BEFORE}\n")
    ctld.answers["squeue"] = (0, f"42|RUNNING|None|{BEFORE}\n")
    assert watch.inspect(["42"]) == ({"42": "RUNNING"}, None)
    assert tools(ctld) == ["sacct", "squeue"]


def test_one_look_picks_the_run_pyhpc_submitted_among_records_of_a_reused_id(ctld) -> None:
    """The job record's clock says when pyhpc submitted it; accounting has a newer job too."""
    ctld.answers["sacct"] = (0, f"42|RUNNING|None|{BEFORE}\n42|PENDING|None|{AFTER}\n")
    ctld.answers["squeue"] = (0, f"42|PENDING|Priority|{AFTER}\n")
    assert watch.inspect(["42"])[0] == {"42": "PENDING"}  # the newest job of the id
    states, error = watch.inspect(["42"], submitted={"42": epoch(BEFORE) - 1})
    assert states == {"42": "LOST"} and error is not None


# -- the doctor's ledger: a record closed by --fix-runaway reads COMPLETED, and is LOST ------

def ledger(tmp_path: Path, monkeypatch, *entries: dict, mode: int = 0o600) -> Path:
    """This user's ledger, holding ``entries``."""
    monkeypatch.setattr(paths, "RUNAWAY_LEDGERS", tmp_path / "runaway-jobs")
    paths.RUNAWAY_LEDGERS.mkdir(mode=0o711, exist_ok=True)
    path = paths.RUNAWAY_LEDGERS / f"{os.geteuid()}.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    path.chmod(mode)
    return path


def test_a_record_the_admin_closed_is_still_lost(ctld, tmp_path, monkeypatch) -> None:
    ledger(tmp_path, monkeypatch, {"job": "42", "user": "alice", "submit": epoch(BEFORE),
                                   "boot": epoch(BOOT), "fixed_at": epoch(LATER)})
    ctld.answers["sacct"] = (0, f"42|COMPLETED|None|{BEFORE}\n43|COMPLETED|None|{AFTER}\n")
    states, error = watch.inspect(["42", "43"])
    assert states == {"42": "LOST", "43": "COMPLETED"}
    assert str(error) == (f"job: 42 was lost: slurmctld restarted at {BOOT} before it saved the "
                          f"job, submitted {BEFORE} (an admin closed its accounting record at "
                          f"{LATER}); submit it again with: pyhpc resubmit 42")


def test_the_ledger_matches_the_submit_time_not_only_the_id(ctld, tmp_path, monkeypatch) -> None:
    """A new job that reused the id and completed is not the one the admin closed."""
    ledger(tmp_path, monkeypatch, {"job": "42", "submit": epoch(BEFORE), "boot": epoch(BOOT),
                                   "fixed_at": epoch(LATER)})
    ctld.answers["sacct"] = (0, f"42|COMPLETED|None|{AFTER}\n")
    assert watch.inspect(["42"]) == ({"42": "COMPLETED"}, None)


def test_a_ledger_entry_without_times_still_reads_as_one_line(ctld, tmp_path, monkeypatch) -> None:
    ledger(tmp_path, monkeypatch, {"job": "42", "submit": epoch(BEFORE)})
    ctld.answers["sacct"] = (0, f"42|COMPLETED|None|{BEFORE}\n")
    assert str(watch.inspect(["42"])[1]) == (
        f"job: 42 was lost: slurmctld restarted before it saved the job, submitted {BEFORE} (an "
        "admin closed its accounting record); submit it again with: pyhpc resubmit 42")


def test_a_controller_that_does_not_tell_its_boot_time_now_is_asked_again(ctld) -> None:
    configs = iter([(1, "", "slurm_load_ctl_conf error: Zero Bytes were transmitted or received"),
                    (0, CONFIG)])
    ctld.answers["scontrol"] = lambda argv: next(configs)
    in_turn(ctld, "squeue", [[f"42|RUNNING|None|{BEFORE}"], [], []])
    ctld.answers["sacct"] = (0, f"42|RUNNING|None|{BEFORE}\n")
    tracker = watch.Tracker(["42"], "squeue")
    for state in ("RUNNING", "RUNNING", "LOST"):
        tracker.poll()
        assert tracker.states() == {"42": state}


def test_a_ledger_others_can_write_is_ignored(ctld, tmp_path, monkeypatch) -> None:
    ledger(tmp_path, monkeypatch, {"job": "42", "submit": epoch(BEFORE)}, mode=0o666)
    ctld.answers["sacct"] = (0, f"42|COMPLETED|None|{BEFORE}\n")
    assert watch.inspect(["42"]) == ({"42": "COMPLETED"}, None)


def test_each_user_reads_their_own_ledger_alone_and_root_every_users(tmp_path,
                                                                     monkeypatch) -> None:
    ledger(tmp_path, monkeypatch)
    for uid, job in ((1001, "42"), (1002, "43")):
        path = lost.ledger_path(uid)
        path.write_text(json.dumps({"job": job, "submit": epoch(BEFORE)}) + "\n")
        path.chmod(0o600)
    assert lost.ledger_files(1001) == [paths.RUNAWAY_LEDGERS / "1001.jsonl"]
    assert list(lost.ledger(1001)) == [("42", epoch(BEFORE))]
    assert list(lost.ledger(1002)) == [("43", epoch(BEFORE))]
    assert list(lost.ledger(1003)) == []
    assert sorted(lost.ledger(0)) == [("42", epoch(BEFORE)), ("43", epoch(BEFORE))]


def test_a_fifo_in_place_of_the_ledger_never_hangs_status(ctld, tmp_path, monkeypatch) -> None:
    path = ledger(tmp_path, monkeypatch)
    path.unlink()
    os.mkfifo(path)  # a reader that opened it blocking would hang
    ctld.answers["sacct"] = (0, f"42|COMPLETED|None|{BEFORE}\n")
    assert watch.inspect(["42"]) == ({"42": "COMPLETED"}, None)


# -- pieces ----------------------------------------------------------------------------------

def test_text_rows_read_the_submit_time_from_the_last_field() -> None:
    rows = text_rows(f"42|RUNNING|None|{BEFORE}\n43|PENDING|a|b|{AFTER}\n44|PENDING|Unknown\n"
                     "45|PENDING|None|Unknown\n")
    assert rows == [JobRow("42", None, "RUNNING", "None", epoch(BEFORE)),
                    JobRow("43", None, "PENDING", "a|b", epoch(AFTER)),
                    JobRow("44", None, "PENDING", "Unknown", 0),
                    JobRow("45", None, "PENDING", "None", 0)]
    assert epoch(AFTER) - epoch(BEFORE) == 40


def test_json_rows_read_plain_and_set_number_submit_times() -> None:
    assert squeue_rows({"jobs": [{"job_id": 5, "job_state": "PENDING", "submit_time": 1700}]}) == [
        JobRow("5", None, "PENDING", "", 1700)]
    assert sacct_rows({"jobs": [{"job_id": 5, "state": {"current": "FAILED"},
                                 "time": {"submit": {"set": True, "number": 1800}}}]}) == [
        JobRow("5", None, "FAILED", "", 1800)]
    assert squeue_rows({"jobs": [{"job_id": 6, "job_state": "PENDING"}]})[0].submit == 0


def test_boot_time_and_agent_queue_are_read_from_scontrol_and_sdiag(ctld) -> None:
    assert slurm.boot_time() == epoch(BOOT)
    assert slurm.agent_queue() == 0
    ctld.answers["sdiag"] = (0, "sdiag output without accounting\n")
    assert slurm.agent_queue() is None
    ctld.answers["scontrol"] = (0, "CLUSTER_NAME = lab\n")
    assert slurm.boot_time() == 0


def test_the_run_followed_is_the_one_first_seen_then_its_requeues() -> None:
    runs = [JobRow("42", None, "REQUEUED", "", 100), JobRow("42", None, "PREEMPTED", "", 200),
            JobRow("42", None, "RUNNING", "", 300), JobRow("42", None, "PENDING", "", 900)]
    assert lost.incarnation(runs[:3], 100) == runs[2]  # through both requeues
    assert lost.incarnation(runs, 300) == runs[2]  # not the newer job of the same id
    assert lost.incarnation(runs, None) == runs[3]  # nothing seen yet: the newest
    assert lost.incarnation(runs, 5000) is None  # accounting has no record of that run
    assert lost.incarnation([JobRow("42", None, "RUNNING")], 300) == JobRow("42", None, "RUNNING")


def test_a_record_without_a_submit_time_is_never_judged(ctld) -> None:
    assert lost.judge({("42", None): JobRow("42", None, "RUNNING")}) == {}
    assert ctld.calls == []


# -- pyhpc status ------------------------------------------------------------------------------

def test_status_of_a_lost_job_prints_it_then_one_line_and_exits_1(ctld, capsys) -> None:
    from pyhpc.cli import main as cli

    ctld.answers["sacct"] = (0, f"42|RUNNING|None|{BEFORE}\n43|COMPLETED|None|{BEFORE}\n")
    assert cli.main(["status", "42", "43", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"42": "LOST", "43": "COMPLETED"}
    assert err.startswith("pyhpc: error: job: 42 was lost: ") and err.count("\n") == 1


def test_status_with_accounting_down_is_one_line_and_never_lost(ctld, capsys) -> None:
    from pyhpc.cli import main as cli

    ctld.answers["sacct"] = (1, "", "sacct: error: Problem talking to the database: Connection refused")
    assert cli.main(["status", "42"]) == 2
    assert capsys.readouterr().err == ("pyhpc: error: sacct: sacct: error: Problem talking to the "
                                       "database: Connection refused\n")
    assert tools(ctld) == ["sacct"]
