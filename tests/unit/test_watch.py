"""Watching jobs: one Slurm query per poll, whatever the number of jobs."""
from __future__ import annotations

import io
import subprocess

from pyhpc import watch


class FakeSlurm:
    """Answers sacct like Slurm would and counts the calls."""

    def __init__(self, rows: list[str]) -> None:
        self.rows, self.calls = rows, []

    def __call__(self, cmd, **kwargs) -> subprocess.CompletedProcess:
        self.calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "\n".join(self.rows) + "\n", "")


def test_one_query_for_a_hundred_jobs() -> None:
    ids = [str(i) for i in range(1000, 1100)]
    fake = FakeSlurm([f"{i}|COMPLETED" for i in ids])
    states = watch.query(ids, runner=fake)
    assert len(fake.calls) == 1
    assert fake.calls[0][0] == "sacct" and fake.calls[0][-1] == ",".join(ids)
    assert set(states.values()) == {"COMPLETED"} and len(states) == 100


def test_watch_polls_once_per_interval_until_all_finish() -> None:
    ids = [str(i) for i in range(100)]
    answers = iter([[f"{i}|PENDING" for i in ids], [f"{i}|RUNNING" for i in ids],
                    [f"{i}|COMPLETED" for i in ids]])
    calls = []

    def runner(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "\n".join(next(answers)), "")

    out = io.StringIO()
    states = watch.watch(ids, interval_s=0, runner=runner, stream=out)
    assert len(calls) == 3
    assert set(states.values()) == {"COMPLETED"}
    assert "100/100 finished | COMPLETED 100" in out.getvalue()


def test_array_tasks_merge_into_their_array_job_and_unknown_ids_wait() -> None:
    fake = FakeSlurm(["7_0|COMPLETED", "7_0.batch|COMPLETED", "7_1|RUNNING", "7_1.0|FAILED",
                      "7_[2-3]|PENDING", "8|CANCELLED by 0"])
    assert watch.query(["7", "8", "9"], runner=fake) == {
        "7": "RUNNING", "8": "CANCELLED", "9": watch.UNKNOWN}
    fake = FakeSlurm(["7_0|COMPLETED", "7_1|FAILED"])
    assert watch.query(["7"], runner=fake) == {"7": "FAILED"}


def test_squeue_source_reports_jobs_that_left_the_queue_as_finished() -> None:
    fake = FakeSlurm(["5|RUNNING"])
    assert watch.query(["5", "6"], source="squeue", runner=fake) == {"5": "RUNNING", "6": "FINISHED"}
    assert fake.calls[0][0] == "squeue"


def test_progress_line_counts_states() -> None:
    line = watch.progress_line({"1": "COMPLETED", "2": "RUNNING", "3": "RUNNING"}, 5)
    assert line == "[   5s] 1/3 finished | COMPLETED 1 | RUNNING 2"


def test_a_job_that_leaves_squeue_keeps_its_last_state() -> None:
    answers = iter([["1|RUNNING", "2|RUNNING"], ["1|COMPLETED", "2|FAILED"], ["2|FAILED"]])

    def runner(cmd, **kwargs):
        assert cmd[:6] == ["squeue", "-h", "-r", "-t", "all", "-o"]
        return subprocess.CompletedProcess(cmd, 0, "\n".join(next(answers)), "")

    # Poll 2 finishes both; had job 1 vanished first, it would keep COMPLETED.
    assert watch.watch(["1", "2"], interval_s=0, runner=runner, quiet=True) == {
        "1": "COMPLETED", "2": "FAILED"}
    answers = iter([["1|RUNNING", "2|RUNNING"], ["1|COMPLETED", "2|RUNNING"], ["2|COMPLETED"]])
    assert watch.watch(["1", "2"], interval_s=0, runner=runner, quiet=True) == {
        "1": "COMPLETED", "2": "COMPLETED"}
