"""Shared test fixtures: golden-file comparison and the lab cluster's tools."""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from pyhpc import cluster, paths

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).resolve().parent.parent


class Golden:
    """Compare rendered text with tests/golden/<name>; UPDATE_GOLDEN=1 rewrites it."""

    def check(self, name: str, actual: str) -> None:
        path = GOLDEN / name
        if os.environ.get("UPDATE_GOLDEN") == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual)
            return
        if not path.exists():
            pytest.fail(f"golden file {path} is missing; create it with UPDATE_GOLDEN=1 make test")
        expected = path.read_text()
        if actual != expected:
            diff = "".join(difflib.unified_diff(
                expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                fromfile=f"golden/{name}", tofile="rendered"))
            pytest.fail(f"{name} differs from its golden file:\n{diff}\n"
                        "If the change is intended, accept it with: UPDATE_GOLDEN=1 make test")


@pytest.fixture
def golden() -> Golden:
    return Golden()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def lab() -> cluster.Cluster:
    """The lab's cluster definition, as every command on the lab loads it."""
    return cluster.load(paths.LAB_CLUSTER)
