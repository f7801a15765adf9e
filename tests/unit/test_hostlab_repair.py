"""What `hostlab up` repairs of the podman state an interrupted run left, decided from what
podman 4.3 printed on this machine: `podman ps -a --format json` after a `podman run` was
SIGKILLed mid-way (the host "created", never started), and the errors podman gave."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from by_path import load

hostlab = load("hostlab_cli", "hostlab/hostlab.py")
HOSTS = ["ctl", "db", "login", "cpu1", "gpu1", "gpu2"]
IMAGE_ID = "be695088cc6d47fcf1a47615b125fe9071f8bc16fd59d05778e18b07f886c6ae"
CPU1_ID = "798761acab309673f9cece36e135ceb833cbe8a71e9403003e66bd337b898da4"


def row(name: str, state: str, status: str, pid: int, ident: str) -> dict[str, Any]:
    """A row of `podman ps -a --format json` (the fields hostlab reads, as podman gave them)."""
    return {"Names": [name], "State": state, "Status": status, "Id": ident, "ImageID": IMAGE_ID,
            "Pid": pid, "Exited": False}


#: `podman ps -a --format json` after `hostlab up` lost its `podman run` of cpu1 to SIGKILL
#: once cpu1's conmon had started (2026-12-03).
KILLED_RUN = {r["Names"][0]: r for r in [
    row("db", "running", "Up About a minute ago", 3037, "52414a07eeba"),
    row("ctl", "running", "Up About a minute ago", 3080, "3c29f3d6a644"),
    row("gpu1", "running", "Up About a minute ago", 3250, "3dcad6e68215"),
    row("gpu2", "running", "Up About a minute ago", 3125, "8830772b44e8"),
    row("login", "running", "Up About a minute ago", 3267, "33f3b6f707c7"),
    row("cpu1", "created", "Created", 0, CPU1_ID)]}
#: What podman 4.3.1 said, each word as printed.
START_DEADLOCK = ("Error: attempting to start container c065ab9e645fe942454e7cc383ec46d8a5ec0507da9983"
                  "94e03a30b7b9ef1d3d would cause a deadlock; please run 'podman system renumber' "
                  "to resolve")
SHARED_LOCK = ("Error: container 13fff305a827 and volume pyhpc-hostlab-cpu1-trixie-log share lock "
               "ID 0: deadlock due to lock mismatch")
ALREADY_EXISTS = ('Error: OCI runtime error: unable to start container "684a84521df8": runc: runc '
                  "create failed: container with given ID already exists")


def answering(host: str) -> bool:
    return True


def test_a_host_a_killed_run_left_created_is_recreated_and_the_running_ones_left_alone() -> None:
    assert hostlab.broken_hosts(KILLED_RUN, HOSTS, answering) == {"cpu1": "cpu1 created, never started"}


def test_a_running_host_that_does_not_answer_is_recreated() -> None:
    got = hostlab.broken_hosts(KILLED_RUN, HOSTS, lambda host: host != "db")
    assert got == {"db": "db listed as running but does not answer",
                   "cpu1": "cpu1 created, never started"}


@pytest.mark.parametrize("state", ["stopping", "removing", "configured", "paused", "unknown"])
def test_a_host_in_any_state_up_and_down_never_leave_is_recreated(state: str) -> None:
    rows = {**KILLED_RUN, "cpu1": {**KILLED_RUN["cpu1"], "State": state}}
    assert hostlab.broken_hosts(rows, HOSTS, answering) == {"cpu1": f"cpu1 {state}"}


def test_nothing_is_repaired_when_nothing_is_wrong_no_line() -> None:
    """Hosts running, one stopped cleanly (`podman stop`: up starts it), one absent (up makes it)."""
    rows = {**KILLED_RUN, "cpu1": {**KILLED_RUN["cpu1"], "State": "exited", "Status": "Exited (0)"}}
    del rows["gpu2"]
    assert hostlab.broken_hosts(rows, HOSTS, answering) == {}
    assert hostlab.Repair().line() is None


def test_the_repair_is_one_line_saying_what_was_found_and_done() -> None:
    repair = hostlab.Repair(found=["lock mismatch", "cpu1 created, never started"],
                            done=["ran podman system renumber",
                                  "removed cpu1 to recreate from the volumes"])
    assert repair.line() == ("podman state left by an interrupted run (lock mismatch; cpu1 created, "
                             "never started); ran podman system renumber, removed cpu1 to "
                             "recreate from the volumes")


@pytest.mark.parametrize(("stderr", "mismatch"), [(START_DEADLOCK, True), (SHARED_LOCK, True),
                                                  (ALREADY_EXISTS, False), ("", False)])
def test_podmans_lock_mismatch_is_told_from_its_other_errors(stderr: str, mismatch: bool) -> None:
    assert hostlab.is_lock_mismatch(stderr) is mismatch


def podman_saying(stderr: str) -> Any:
    """hostlab's Podman whose podman is a process that prints `stderr` and exits 126, as
    podman did."""
    podman = hostlab.Podman(hostlab.Inventory(("cpu1",), ("--root", "/nonexistent")))
    podman.argv = ["sh", "-c", 'printf "%s\\n" "$HOSTLAB_TEST_ERR" >&2; exit 126', "podman"]
    podman.env = dict(os.environ, HOSTLAB_TEST_ERR=stderr)
    return podman


def test_a_lock_mismatch_raises_the_error_up_repairs_and_others_do_not() -> None:
    with pytest.raises(hostlab.LockMismatch, match="podman system renumber"):
        podman_saying(START_DEADLOCK).run("start", "cpu1")
    with pytest.raises(hostlab.HostlabError) as other:
        podman_saying(ALREADY_EXISTS).run("start", "cpu1")
    assert not isinstance(other.value, hostlab.LockMismatch)


def test_a_mismatch_after_the_renumber_is_one_line_naming_what_to_do() -> None:
    repair = hostlab.Repair(found=["lock mismatch"], done=["ran podman system renumber"],
                            renumbered=True)
    with pytest.raises(hostlab.HostlabError) as err:
        hostlab.renumber(podman_saying(START_DEADLOCK), repair, hostlab.LockMismatch(START_DEADLOCK))
    assert "\n" not in str(err.value) and "make hostlab-down" in str(err.value)


def test_the_conmon_a_killed_run_left_and_its_runc_init_are_found_by_container_id(
        tmp_path: Path) -> None:
    """/proc as it was after `rm` of the created cpu1: its conmon (reparented to init) and
    its `runc init`, beside a running host's conmon and an unrelated process."""
    def proc(pid: int, ppid: int, *argv: str) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({Path(argv[0]).name}) S {ppid} {pid} 0\n")

    proc(6822, 1, "/usr/bin/conmon", "--api-version", "1", "-c", CPU1_ID, "-u", CPU1_ID)
    proc(6835, 6822, "/usr/bin/runc", "init")
    proc(9437, 1, "/usr/bin/conmon", "--api-version", "1", "-c", "637bddb4e3e8", "-u", "637bddb4e3e8")
    proc(9450, 9437, "/sbin/init")
    proc(7000, 1, "/usr/bin/python3", "-c", CPU1_ID)
    (tmp_path / "self").mkdir()
    assert hostlab.conmon_pids({CPU1_ID}, tmp_path) == [6822, 6835]
