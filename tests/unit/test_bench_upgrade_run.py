"""benchmarks/upgrade_run.py's pure parts: the phases and the time no job can start from the
run's record, and the plan's estimate read from its text. Runs no hostlab command."""
from __future__ import annotations

from benchmarks import upgrade_run as bench
from pyhpc.admin.upgrade_run import NAMES


def done(seconds: dict[str, float]) -> dict[str, dict[str, object]]:
    return {name: {"at": "t", "seconds": seconds.get(name, 1.0)} for name in NAMES}


def test_every_step_but_the_restore_is_in_one_phase() -> None:
    steps = [s for phase in bench.PHASES.values() for s in phase]
    assert sorted(steps) == sorted(n for n in NAMES if n != "queue-restore")
    assert len(steps) == len(set(steps))


def test_phases_add_their_steps_and_the_window_runs_from_the_save_to_the_deploy() -> None:
    record = done({"plan": 0.5, "move-dbd": 70.0, "accounting": 5.0, "deploy": 58.0})
    figures = bench.phases(record)
    assert figures["dbd"] == 75.0 and figures["backup"] == 2.5 and figures["restart"] == 59.0
    # every step from queue-save to deploy: not the plan, not the restore
    assert bench.window_s(record) == 70.0 + 5.0 + 58.0 + 7 * 1.0


def test_the_plans_estimate_is_read_from_its_line() -> None:
    text = "Phases, in order:\n\nNo job can start for about 11.3 min (dbd, controller)."
    assert bench.estimate_min(text) == 11.3
    assert bench.estimate_min("no plan here") is None
