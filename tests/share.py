"""How the integration suite's two workers share the machine (tests/integration/conftest.py).

Every test holds the machine shared while it runs; a test marked ``alone`` holds it alone.
Two flock'd files: the share itself, and a gate every test passes on its way to it. An
``alone`` test holds the gate while it waits, so that the other worker's next test cannot
take the share before it (a reader arriving on a reader would starve it otherwise). A lock
goes with the process that held it, however that process ends.

And what a module's fixture raises when the machine cannot give it what its tests need
(hostlab's hosts did not come up): `Unavailable`, one line, which the suite reports once.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

LOCKS = Path("/run" if os.geteuid() == 0 else tempfile.gettempdir())
GATE, SHARE = (LOCKS / f"pyhpc-integration-{os.geteuid()}.{name}" for name in ("gate", "share"))


@contextlib.contextmanager
def machine(alone: bool, gate_path: Path = GATE, share_path: Path = SHARE) -> Iterator[None]:
    """Hold the machine shared, or alone, until the block ends."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    gate = os.open(gate_path, flags, 0o600)
    try:
        share = os.open(share_path, flags, 0o600)
        try:
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(share, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
            yield
        finally:
            os.close(share)
    finally:
        os.close(gate)


class Unavailable(Exception):
    """A module's fixture could not set up what its tests need, in one line (hostlab's own
    error). The first test it fails errors with the line; every later one skips on it."""


#: Prometheus' own checker, for the tests that run rules and configurations through it. It
#: comes with Debian's prometheus package, which the lab's deploy installs: `make test`
#: deploys before its unit tests, so there they run; a bare `make unit` skips them.
PROMTOOL_SKIP = ("promtool is not installed: it comes with Debian's prometheus package, "
                 "which the lab's deploy installs (make test deploys first)")
