"""No command of ``pyhpc --help`` ends in a traceback, whatever its arguments
(Hypothesis, derandomized, fixed budget; Slurm faked, nothing real submitted)."""
from __future__ import annotations

import argparse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyhpc.cli import main as cli

#: `containers build` runs podman and `train --local` trains, `admin backup now` and
#: `admin restore` change this machine: all run for real elsewhere.
SKIP = {"--local"}


def _commands() -> dict[str, list[str]]:
    """Each command (``cluster validate`` as one) with its option strings."""
    found: dict[str, list[str]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[" ".join(prefix)] = [o for a in parser._actions for o in a.option_strings
                                       if o not in ("-h", "--help") and o not in SKIP]
            return
        for name, sub in subs[0].choices.items():
            walk(sub, [*prefix, name])

    walk(cli.build_parser(), [])
    found.pop("containers build")
    # Back up and restore this machine's real database and directory as root: the lab's
    # tests run them (tests/integration/test_backup.py).
    found.pop("admin backup now")
    found.pop("admin restore")
    # Hold, requeue, cancel and resubmit every user's jobs, and write root's queue record:
    # the lab's test runs them (tests/integration/test_upgrade_queue.py), their bad input
    # is tests/unit/test_upgrade_queue.py's.
    found.pop("admin upgrade queue save")
    found.pop("admin upgrade queue restore")
    return found


COMMANDS = _commands()
VALUES = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "99", "1e9", "inf", "nan", "", "-", "--", "a\\",
                     "it's", "$(touch x)", "a\nb", "cpu", "gpu", "digits", "1,2", "x=y",
                     "single", "array", "os:getcwd", "99-00:00:00", "00:01:00", "/", "..", "0-9%2", "5-2"]),
    st.text(max_size=12))


@settings(max_examples=150, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(command=st.sampled_from(sorted(COMMANDS)), data=st.data())
def test_no_input_ends_in_a_traceback(command: str, data, slurm, capsys) -> None:
    options = COMMANDS[command]
    tokens = data.draw(st.lists(st.one_of(st.sampled_from(options), VALUES) if options else VALUES,
                                max_size=6))
    try:
        code = cli.main([*command.split(), *tokens])
    except SystemExit as exc:  # argparse: --help/--version (0) or a usage error (2)
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected" not in err, (command, tokens, err)
    assert code in (0, 1, 2), (command, tokens, code, err)
    if code == 2:
        assert err.startswith("pyhpc: error: ") and err.count("\n") == 1, (command, tokens, err)


def test_every_command_is_fuzzed() -> None:
    assert {"submit", "train", "scale", "report", "status", "cluster validate",
            "containers render"} <= set(COMMANDS)


@pytest.fixture(autouse=True)
def _no_torch_threads(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
