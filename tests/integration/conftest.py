"""Fixtures shared by the integration tests, and how two workers share the machine.

`make integration` runs two pytest-xdist workers (``--dist loadgroup``): hostlab's modules
in one, in their order, and the lab's in the other, in theirs, except that the lab's
modules with `alone` tests come first, those tests first in them (:func:`alone_first`).
Each test holds the machine shared for its whole protocol (fixtures included); a test
marked ``alone`` (it measures CPU rates, or restarts the lab's daemons under the other
worker's jobs) holds it alone: the other worker finishes its current test and waits
(alone tests one after another hold it once). Run without workers, nothing waits.

A fixture that raises `Unavailable` (hostlab's hosts did not come up) errors the first test
with its one line; each later test that meets the same line skips on it, so an unrepairable
hostlab is one error, not one per test.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from pyhpc import paths
from tests.share import Unavailable, machine

#: The code jobs run, from the deployed copy (pyhpc is installed editable from it): every
#: module of the package (a job imports it or the CLI runs it to submit one), and every job
#: template.
JOB_CODE = [str(p.relative_to(paths.ROOT)) for p in sorted((paths.ROOT / "pyhpc").rglob("*.py"))] + [
    str(p.relative_to(paths.ROOT)) for p in sorted(paths.SLURM_JOBS.glob("*.j2"))]


@pytest.fixture(scope="module")
def deployed_copy_is_current() -> None:
    """Jobs import pyhpc from /opt/pyhpc/src: it must be this checkout's code
    (``pytest.mark.usefixtures("deployed_copy_is_current")`` in the modules that submit)."""
    src = paths.SHARED_SRC
    stale = [rel for rel in JOB_CODE if not (src / rel).exists()
             or (src / rel).read_bytes() != (paths.ROOT / rel).read_bytes()]
    assert not stale, f"/opt/pyhpc/src is older than this checkout ({stale}); run make deploy"


@pytest.fixture
def work(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A job directory every node can enter (Slurm runs the job from it)."""
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit("_", 1)[-1])
    path.chmod(0o755)
    return path


def group(item: pytest.Item) -> str:
    """The worker an integration test runs on: hostlab's modules share one, the lab's the
    other (each module's tests in order, as a serial run has them)."""
    return "hostlab" if item.get_closest_marker("hostlab") else "lab"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    alone_first(items)


def alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


def alone_first(items: list[pytest.Item]) -> None:
    """The lab's modules that hold `alone` tests run first, each with its alone tests
    first, so that they make one run at the start: there the other worker waits for
    hostlab's first, short test, not for a converge of up to 10 min (a clean clone's CI
    lost about 1,200 s to such waits). Each module's tests stay together; hostlab's order
    is kept."""
    lab = [item for item in items if group(item) == "lab"]
    holds = {item.path for item in lab if alone(item)}
    first = {}
    for n, item in enumerate(lab):
        first.setdefault(item.path, n)
    ordered = iter(sorted(lab, key=lambda item: (  # stable: the rest keeps its order
        item.path not in holds, first[item.path], not alone(item))))
    items[:] = [next(ordered) if group(item) == "lab" else item for item in items]


#: The machine as this worker holds it across tests (at most one hold): a run of `alone`
#: tests holds it once, so the other worker finishes its current test (a hostlab converge:
#: minutes) once before the run, not once before each of its tests.
HELD: list[ExitStack] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not HELD:  # else held alone by the test before, in the same run
        hold = ExitStack()
        hold.enter_context(machine(alone=alone(item)))
        HELD.append(hold)
    try:
        return (yield)
    finally:
        if not (alone(item) and alone(nextitem)):
            HELD.pop().close()


#: The lines of `Unavailable` already reported in this run (hostlab's modules share a worker).
REPORTED: set[str] = set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if call.when == "setup" and call.excinfo is not None and call.excinfo.errisinstance(Unavailable):
        line = str(call.excinfo.value)
        if line in REPORTED:
            report.outcome = "skipped"
            report.longrepr = (item.location[0], item.location[1] or 0,
                               f"Skipped: {line} (the error above)")
        else:
            REPORTED.add(line)
            report.longrepr = line
    return report
