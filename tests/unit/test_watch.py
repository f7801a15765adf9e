"""Watching jobs: one Slurm query per poll, whatever the number of jobs."""
from __future__ import annotations

import io
import json

import pytest

from pyhpc.slurm import slurm, watch
from pyhpc.slurm.watch import WatchError


class Rows:
    """Configures the fake Slurm to answer with these ``JobID|State`` rows."""

    def __init__(self, fake, rows: list[str]) -> None:
        self.fake = fake
        self.calls = fake.calls
        fake.answers["sacct"] = fake.answers["squeue"] = (0, "\n".join(rows) + "\n")


@pytest.fixture
def FakeSlurm(fake_slurm):
    return lambda rows: Rows(fake_slurm, rows)


def test_one_query_for_a_hundred_jobs(FakeSlurm) -> None:
    ids = [str(i) for i in range(1000, 1100)]
    fake = FakeSlurm([f"{i}|COMPLETED" for i in ids])
    states = watch.query(ids)
    assert len(fake.calls) == 1
    assert fake.calls[0][0] == "sacct" and fake.calls[0][-1] == ",".join(ids)
    assert set(states.values()) == {"COMPLETED"} and len(states) == 100


def test_watch_polls_once_per_interval_until_all_finish(fake_slurm) -> None:
    ids = [str(i) for i in range(100)]
    answers = iter([[f"{i}|PENDING|None" for i in ids], [f"{i}|RUNNING|None" for i in ids],
                    [f"{i}|COMPLETED|None" for i in ids]])
    fake_slurm.answers["squeue"] = lambda argv: (0, "\n".join(next(answers)))
    out = io.StringIO()
    states = watch.watch(ids, interval_s=0, stream=out)
    assert len(fake_slurm.calls) == 3
    assert set(states.values()) == {"COMPLETED"}
    assert "100/100 jobs finished | COMPLETED 100" in out.getvalue()


def test_array_tasks_merge_into_their_array_job_and_ids_no_one_knows_are_not_found(FakeSlurm) -> None:
    fake = FakeSlurm(["7_0|COMPLETED", "7_0.batch|COMPLETED", "7_1|RUNNING", "7_1.0|FAILED",
                      "7_[2-3]|PENDING", "8|CANCELLED by 0"])
    assert watch.query(["7", "8", "9"]) == {
        "7": "RUNNING", "8": "CANCELLED", "9": "NOT_FOUND"}
    assert [c[0] for c in fake.calls] == ["sacct", "squeue"] and fake.calls[1][-1] == "9"
    FakeSlurm(["7_0|COMPLETED", "7_1|FAILED"])
    assert watch.query(["7"]) == {"7": "FAILED"}


def test_squeue_source_reports_jobs_that_left_the_queue_as_finished(FakeSlurm) -> None:
    fake = FakeSlurm(["5|RUNNING"])
    assert watch.query(["5", "6"], source="squeue") == {"5": "RUNNING", "6": watch.UNKNOWN}
    assert fake.calls[0][0] == "squeue"


def test_progress_line_counts_states() -> None:
    line = watch.progress_line(["COMPLETED", "RUNNING", "RUNNING"], 5, 3)
    assert line == "[    5s] 1/3 jobs finished | COMPLETED 1 | RUNNING 2"


def test_a_job_that_leaves_squeue_keeps_its_last_state(fake_slurm) -> None:
    answers = iter([["1|RUNNING", "2|RUNNING"], ["1|COMPLETED", "2|FAILED"], ["2|FAILED"]])

    def squeue(cmd):
        assert cmd[:6] == ["squeue", "-h", "-r", "-t", "all", "-o"]
        return 0, "\n".join(next(answers))

    fake_slurm.answers["squeue"] = squeue
    # Poll 2 finishes both; had job 1 vanished first, it would keep COMPLETED.
    assert watch.watch(["1", "2"], interval_s=0, quiet=True) == {
        "1": "COMPLETED", "2": "FAILED"}
    answers = iter([["1|RUNNING", "2|RUNNING"], ["1|COMPLETED", "2|RUNNING"], ["2|COMPLETED"]])
    assert watch.watch(["1", "2"], interval_s=0, quiet=True) == {
        "1": "COMPLETED", "2": "COMPLETED"}


def test_array_progress_counts_tasks_not_jobs(fake_slurm) -> None:
    """Item 15: 978 of 1000 tasks done must not read as 0/1 finished."""
    rows = ([f"9_{i}|COMPLETED|None" for i in range(978)] + ["9_978|RUNNING|None",
            "9_979|RUNNING|None"] + [f"9_{i}|PENDING|JobArrayTaskLimit" for i in range(980, 1000)])
    fake_slurm.answers["squeue"] = (0, "\n".join(rows))
    out = io.StringIO()
    assert watch.watch(["9"], interval_s=0, timeout_s=0, stream=out) == {"9": "RUNNING"}
    assert "978/1000 tasks finished | COMPLETED 978 | PENDING 20 | RUNNING 2" in out.getvalue()


def test_json_output_is_parsed_where_slurm_has_it(fake_slurm, monkeypatch) -> None:
    """22.05's squeue --json (openapi v0.0.38): a pending range is one record."""
    monkeypatch.setattr(slurm, "_json_ok", {})
    jobs = [{"job_id": 3, "array_job_id": 1, "array_task_id": 0, "array_task_string": "",
             "job_state": "COMPLETED", "state_reason": "None"},
            {"job_id": 1, "array_job_id": 1, "array_task_id": None, "array_task_string": "2-5%2",
             "job_state": "PENDING", "state_reason": "JobArrayTaskLimit"},
            {"job_id": 2, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
             "job_state": ["RUNNING"], "state_reason": "None"}]
    fake_slurm.answers["squeue"] = (0, json.dumps({"jobs": jobs}))
    tracker = watch.Tracker(["1", "2"], "squeue")
    tracker.poll()
    assert tracker.states() == {"1": "PENDING", "2": "RUNNING"}
    assert sorted(tracker.task_states()) == ["COMPLETED"] + ["PENDING"] * 4 + ["RUNNING"]
    assert fake_slurm.calls == [["squeue", "-t", "all", "-j", "1,2", "--json"]]


def test_a_job_that_can_never_start_stops_the_watch(fake_slurm) -> None:
    """Item 13: a time limit above the partition's pends forever; --wait says why."""
    fake_slurm.answers["squeue"] = (0, "5|PENDING|PartitionTimeLimit\n")
    with pytest.raises(WatchError, match=r"^job: 5 can never start \(PartitionTimeLimit\)"):
        watch.watch(["5"], interval_s=0, quiet=True)


def test_a_job_waiting_for_a_node_to_return_is_still_watched(fake_slurm) -> None:
    """ReqNodeNotAvail clears when the node is back (e.g. after a slurmd restart)."""
    answers = iter(["5|PENDING|ReqNodeNotAvail, UnavailableNodes:cpu1\n",
                    "5|PENDING|AssocMaxJobsLimit\n", "5|RUNNING|None\n", "5|COMPLETED|None\n"])
    fake_slurm.answers["squeue"] = lambda argv: (0, next(answers))
    assert watch.watch(["5"], interval_s=0, quiet=True) == {"5": "COMPLETED"}
    assert len(fake_slurm.calls) == 4


def test_wait_timeout_is_an_error_naming_the_jobs(fake_slurm) -> None:
    fake_slurm.answers["squeue"] = (0, "5|RUNNING|None\n")
    with pytest.raises(WatchError, match=r"^timeout: still not finished after 0 s: 5 RUNNING"):
        watch.watch(["5"], interval_s=0, timeout_s=0, quiet=True, fail_on_timeout=True)


def test_busy_controller_is_retried_then_answers(fake_slurm) -> None:
    answers = iter([(1, "", "Socket timed out on send/recv"), (0, "5|COMPLETED|None")])
    fake_slurm.answers["squeue"] = lambda argv: next(answers)
    assert watch.query(["5"], source="squeue") == {"5": "COMPLETED"}
    assert len(fake_slurm.calls) == 2


def test_missing_slurm_command_is_one_clear_error(monkeypatch) -> None:
    def missing(argv, stdin, timeout_s):
        raise FileNotFoundError(argv[0])
    monkeypatch.setattr(slurm, "RUNNER", missing)
    with pytest.raises(slurm.SlurmError, match=r"^squeue: command not found"):
        slurm.queue(["1"])


def answer_in_turn(fake, tool: str, outputs: list[list[str]]) -> None:
    """``tool`` answers with these rows, one list per call (a call more is an error)."""
    answers = iter(outputs)
    fake.answers[tool] = lambda argv: (0, "\n".join(next(answers)) + "\n")


def test_a_job_gone_from_squeue_unfinished_gets_its_final_state_from_sacct(fake_slurm) -> None:
    """MinJobAge (60 s under high_throughput) can be shorter than --interval."""
    answer_in_turn(fake_slurm, "squeue", [["1|RUNNING", "2|PENDING", "3|RUNNING"], ["3|COMPLETED"]])
    answer_in_turn(fake_slurm, "sacct", [["1|COMPLETED", "1.batch|COMPLETED", "2|FAILED"]])
    assert watch.watch(["1", "2", "3"], interval_s=0, quiet=True) == {
        "1": "COMPLETED", "2": "FAILED", "3": "COMPLETED"}
    assert [c[0] for c in fake_slurm.calls] == ["squeue", "squeue", "sacct"]
    assert fake_slurm.calls[-1][-2:] == ["-j", "1,2"]


def test_a_job_never_seen_in_squeue_gets_its_state_from_sacct(fake_slurm) -> None:
    answer_in_turn(fake_slurm, "squeue", [["5|RUNNING"]])
    answer_in_turn(fake_slurm, "sacct", [["6|FAILED"]])
    assert watch.query(["5", "6"], source="squeue") == {"5": "RUNNING", "6": "FAILED"}
    assert fake_slurm.calls[-1][-2:] == ["-j", "6"]


def test_a_poll_where_nothing_vanished_is_one_slurm_call(fake_slurm, monkeypatch) -> None:
    """Finished jobs leaving squeue, and a pending range splitting, need no sacct."""
    monkeypatch.setattr(slurm, "_json_ok", {"sacct": False})

    def job(task: int | None, state: str, pending: str = "") -> dict:
        return {"job_id": 70, "array_job_id": 7, "array_task_id": task,
                "array_task_string": pending, "job_state": state, "state_reason": "None"}

    plain = {"job_id": 8, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
             "job_state": "COMPLETED", "state_reason": "None"}
    polls = iter([[job(0, "RUNNING"), job(None, "PENDING", "1-3%2"), plain],
                  [job(0, "RUNNING"), job(1, "RUNNING"), job(None, "PENDING", "2-3%2")]])
    fake_slurm.answers["squeue"] = lambda argv: (0, json.dumps({"jobs": next(polls)}))
    tracker = watch.Tracker(["7", "8"], "squeue")
    tracker.poll()
    tracker.poll()
    assert [c[0] for c in fake_slurm.calls] == ["squeue", "squeue"]
    assert tracker.states() == {"7": "RUNNING", "8": "COMPLETED"}
    assert sorted(tracker.task_states()) == ["COMPLETED"] + ["PENDING"] * 2 + ["RUNNING"] * 2


def test_watching_the_tasks_of_a_pending_range_by_id_is_one_slurm_call(fake_slurm,
                                                                       monkeypatch) -> None:
    """``pyhpc status 9_0 … 9_999`` while squeue shows ``9_[0-999]``: no sacct call."""
    monkeypatch.setattr(slurm, "_json_ok", {"sacct": False})
    pending = {"job_id": 9, "array_job_id": 9, "array_task_id": None,
               "array_task_string": "0-998:2,999", "job_state": "PENDING", "state_reason": "None"}
    fake_slurm.answers["squeue"] = lambda argv: (0, json.dumps({"jobs": [pending]}))
    ids = [f"9_{i}" for i in range(0, 999, 2)] + ["9_999"]
    tracker = watch.Tracker(ids, "squeue")
    tracker.poll()
    tracker.poll()
    assert [c[0] for c in fake_slurm.calls] == ["squeue", "squeue"]
    assert set(tracker.states().values()) == {"PENDING"}
    assert tracker.task_states().count("PENDING") == 501


def test_a_job_in_neither_squeue_nor_sacct_is_finished_after_two_polls(fake_slurm) -> None:
    """Accounting lag or no accounting: the last state stands a poll, then the watch ends."""
    answer_in_turn(fake_slurm, "squeue", [["5|RUNNING"], [], []])
    fake_slurm.answers["sacct"] = (0, "")
    assert watch.watch(["5"], interval_s=0, quiet=True) == {"5": "FINISHED"}
    assert [c[0] for c in fake_slurm.calls] == ["squeue", "squeue", "sacct", "squeue", "sacct"]


def test_ids_unknown_to_squeue_and_sacct_are_asked_about_twice_at_most(fake_slurm) -> None:
    answer_in_turn(fake_slurm, "squeue", [["5|RUNNING"], [], [], []])
    fake_slurm.answers["sacct"] = (0, "")
    tracker = watch.Tracker(["5", "6"], "squeue")
    # 6 was never seen and accounting has no record of it: no job of that id exists.
    for states in ({"5": "RUNNING", "6": "UNKNOWN"}, {"5": "RUNNING", "6": "NOT_FOUND"},
                   {"5": "FINISHED", "6": "NOT_FOUND"}, {"5": "FINISHED", "6": "NOT_FOUND"}):
        tracker.poll()
        assert tracker.states() == states
    assert [c[-1] for c in fake_slurm.calls if c[0] == "sacct"] == ["6", "5,6", "5"]
    assert fake_slurm.calls[-1][0] == "squeue" and len(tracker.task_states()) == 2


def test_sacct_refusing_counts_as_not_knowing_the_job(fake_slurm) -> None:
    answer_in_turn(fake_slurm, "squeue", [["5|RUNNING"], [], []])
    fake_slurm.answers["sacct"] = (1, "", "Slurm accounting storage is disabled")
    tracker = watch.Tracker(["5"], "squeue")
    for state in ("RUNNING", "RUNNING", "FINISHED"):
        tracker.poll()
        assert tracker.states() == {"5": state}


def test_array_tasks_gone_from_squeue_merge_with_their_sacct_states(fake_slurm, monkeypatch) -> None:
    """Tasks 1 and 2 leave the pending range, run and leave squeue between two polls;
    sacct's staler rows for what squeue still shows (task 3, a range) are ignored."""
    monkeypatch.setattr(slurm, "_json_ok", {"sacct": False})

    def task(n: int | None, state: str, pending: str = "") -> dict:
        return {"job_id": 70 + (n or 0), "array_job_id": 7, "array_task_id": n,
                "array_task_string": pending, "job_state": state, "state_reason": "None"}

    polls = iter([[task(0, "RUNNING"), task(None, "PENDING", "1-3")], [task(3, "RUNNING")],
                  [task(3, "COMPLETED")]])
    fake_slurm.answers["squeue"] = lambda argv: (0, json.dumps({"jobs": next(polls)}))
    answer_in_turn(fake_slurm, "sacct", [["7_0|COMPLETED", "7_1|FAILED", "7_2|COMPLETED",
                                          "7_3|PENDING", "7_[4-5]|PENDING"]])
    tracker = watch.Tracker(["7"], "squeue")
    tracker.poll()
    tracker.poll()
    assert sorted(tracker.task_states()) == ["COMPLETED", "COMPLETED", "FAILED", "RUNNING"]
    tracker.poll()
    assert tracker.states() == {"7": "FAILED"}
    assert [c[0] for c in fake_slurm.calls] == ["squeue", "squeue", "sacct", "squeue"]


def test_a_submission_whose_answer_was_lost_is_not_sent_again(fake_slurm) -> None:
    """"Socket timed out": slurmctld may have taken the job; a second sbatch would be a second job."""
    answers = iter([(1, "", "sbatch: error: Socket timed out on send/recv operation"), (0, "6\n")])
    fake_slurm.answers["sbatch"] = lambda argv: next(answers)
    with pytest.raises(slurm.SlurmError, match=r"^sbatch: .*Socket timed out.*; slurmctld may have "
                                               r"accepted the job all the same: look for it with "
                                               r"squeue --me before submitting again$"):
        slurm.sbatch("/tmp/job.sh")
    assert [c[0] for c in fake_slurm.calls] == ["sbatch"]
    # Where slurmctld never got it, the submission is sent again.
    answers = iter([(1, "", "sbatch: error: Unable to contact slurm controller"), (0, "7\n")])
    assert slurm.sbatch("/tmp/job.sh") == "7"
    assert [c[0] for c in fake_slurm.calls] == ["sbatch"] * 3
