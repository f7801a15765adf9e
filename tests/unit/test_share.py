"""The integration suite's share of the machine (tests/share.py): real flock, two threads
standing in for the two workers (a lock is per open file, so threads contend as processes do)."""
from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from tests.share import machine


def held(path: Path) -> bool:
    """Whether someone holds path's lock (a non-blocking try of our own)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def until(what: str, condition, limit_s: float = 30) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_an_alone_test_waits_for_the_running_one_and_the_next_waits_for_it(tmp_path: Path) -> None:
    gate, share = tmp_path / "gate", tmp_path / "share"
    order: list[str] = []
    finish_alone = threading.Event()

    def alone() -> None:
        with machine(True, gate, share):
            order.append("alone")
            finish_alone.wait(30)

    def shared() -> None:
        with machine(False, gate, share):
            order.append("next")

    running = machine(False, gate, share)
    running.__enter__()
    waiting = threading.Thread(target=alone)
    waiting.start()
    # The alone test waits at the share, holding the gate: the other worker's next test,
    # arriving now, waits behind it rather than joining the running one.
    until("the alone test at the gate", lambda: held(gate))
    nxt = threading.Thread(target=shared)
    nxt.start()
    assert order == []
    running.__exit__(None, None, None)
    until("the alone test running", lambda: order == ["alone"])
    assert held(share) and order == ["alone"]
    finish_alone.set()
    waiting.join(30)
    nxt.join(30)
    assert order == ["alone", "next"]
    assert not held(gate) and not held(share)


def test_two_shared_tests_run_together(tmp_path: Path) -> None:
    gate, share = tmp_path / "gate", tmp_path / "share"
    with machine(False, gate, share), machine(False, gate, share):
        assert held(share) and not held(gate)


def test_a_planted_link_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "gate").symlink_to(target)
    with pytest.raises(OSError), machine(False, tmp_path / "gate", tmp_path / "share"):
        pass
    assert not target.exists()
