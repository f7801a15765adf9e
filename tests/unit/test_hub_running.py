"""Which code the running hub runs (pyhpc.hub.running): the digest the hub records as it
starts, and the deploy's check against the modules on disk, on a package of its own in
tmp_path. The deployed check itself (the role's argv) is in test_hub_role.py; the hub
writing its record, in test_hub_loads.py; a deploy restarting the lab's hub, in
tests/integration/test_hub.py."""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from pyhpc.hub import running


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    (root / "hub").mkdir(parents=True)
    (root / "__init__.py").write_text('"""pkg"""\n')
    (root / "hub" / "spawner.py").write_text("SUBMIT = 1\n")
    return root


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return path


def test_the_digest_follows_every_module_and_nothing_else(package: Path) -> None:
    first = running.digest(package)
    assert first == running.digest(package)
    (package / "hub" / "__pycache__").mkdir()
    (package / "hub" / "__pycache__" / "spawner.cpython-311.pyc").write_bytes(b"\0")
    (package / "hub" / "form.html").write_text("<form>")
    assert running.digest(package) == first
    (package / "hub" / "spawner.py").write_text("SUBMIT = 2\n")
    edited = running.digest(package)
    assert edited != first
    (package / "hub" / "spawner.py").rename(package / "hub" / "spawner2.py")
    assert running.digest(package) not in (first, edited)
    (package / "hub" / "spawner2.py").rename(package / "hub" / "spawner.py")
    assert running.digest(package) == edited
    (package / "hub" / "new.py").write_text("")
    assert running.digest(package) != edited


def test_a_module_split_in_two_is_not_the_same_code(package: Path) -> None:
    """Path and length go in with each content: 'a.py' = 'xy' is not 'a.py' = 'x' plus a
    module whose name and content make up the rest."""
    (package / "hub" / "spawner.py").unlink()
    (package / "a.py").write_text("xy")
    whole = running.digest(package)
    (package / "a.py").write_text("x")
    (package / "b.py").write_text("y")
    assert running.digest(package) != whole


def test_the_hubs_record_is_private_and_matches_until_the_code_changes(package: Path,
                                                                     state: Path) -> None:
    assert running.stale(state, package)  # no record: a hub from before this, or none
    running.record(state, package)
    info = (state / running.RECORD).stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    assert not running.stale(state, package)
    (package / "hub" / "spawner.py").write_text("SUBMIT = 2\n")
    assert running.stale(state, package)
    running.record(state, package)  # the restarted hub
    assert not running.stale(state, package)


def test_a_planted_link_is_replaced_not_followed_and_never_read(package: Path, state: Path,
                                                                tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text(running.digest(package) + "\n")
    (state / running.RECORD).symlink_to(target)
    assert running.stale(state, package)  # a link is no record, even with the right digest
    running.record(state, package)
    assert not (state / running.RECORD).is_symlink()
    assert target.read_text() == running.digest(package) + "\n"
    assert not running.stale(state, package)


def test_a_fifo_or_an_oversized_record_is_stale_without_hanging(package: Path, state: Path) -> None:
    os.mkfifo(state / running.RECORD)
    answer: list[bool] = []
    reader = threading.Thread(target=lambda: answer.append(running.stale(state, package)), daemon=True)
    reader.start()
    reader.join(10)
    assert answer == [True]
    (state / running.RECORD).unlink()
    (state / running.RECORD).write_text(running.digest(package) + " " * running.LIMIT + "x\n")
    assert running.stale(state, package)
