"""Shared test fixtures: golden-file comparison and the lab cluster's tools."""
from __future__ import annotations

import difflib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pyhpc import cluster, paths

GOLDEN = Path(__file__).parent / "golden"


class Golden:
    """Compare rendered text with tests/golden/<name>; UPDATE_GOLDEN=1 rewrites it."""

    def check(self, name: str, actual: str) -> None:
        path = GOLDEN / name
        if os.environ.get("UPDATE_GOLDEN") == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual)
            return
        if not path.exists():
            pytest.fail(f"golden file {path} is missing; create it with UPDATE_GOLDEN=1 make unit")
        expected = path.read_text()
        if actual != expected:
            diff = "".join(difflib.unified_diff(
                expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                fromfile=f"golden/{name}", tofile="rendered"))
            pytest.fail(f"{name} differs from its golden file:\n{diff}\n"
                        "If the change is intended, accept it with: UPDATE_GOLDEN=1 make unit")


@pytest.fixture
def golden() -> Golden:
    return Golden()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return paths.ROOT


@pytest.fixture
def lab() -> cluster.Cluster:
    """The lab's cluster definition, as every command on the lab loads it."""
    return cluster.load(paths.LAB_CLUSTER)


class FakeSlurm:
    """Stands in for every command pyhpc.slurm runs (its one RUNNER) and records them.

    ``answers[tool]`` is ``(exit code, stdout[, stderr])`` or a function of argv giving that.
    Without ``json=True`` this Slurm has no ``--json`` (pyhpc parses its text).
    """

    DEFAULTS: dict[str, Any] = {"sbatch": (0, "4242\n")}

    def __init__(self, json: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.stdins: list[str | None] = []  # what each call got on stdin (a script to sbatch)
        self.answers: dict[str, Any] = dict(self.DEFAULTS)
        self.json = json

    def __call__(self, argv, stdin, timeout_s) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        self.stdins.append(stdin)
        answer = self.answers.get(argv[0], (0, ""))
        code, out, *err = answer(argv) if callable(answer) else answer
        return subprocess.CompletedProcess(argv, code, out, err[0] if err else
                                           ("boom" if code else ""))


@pytest.fixture
def fake_slurm(monkeypatch) -> FakeSlurm:
    """pyhpc.slurm runs nothing real: every command goes to a FakeSlurm (text output)."""
    from pyhpc.slurm import slurm

    fake = FakeSlurm()
    monkeypatch.setattr(slurm, "RUNNER", fake)
    monkeypatch.setattr(slurm, "_json_ok", {t: False for t in ("squeue", "sacct")})
    monkeypatch.setattr(slurm, "BACKOFF_S", 0.0)
    return fake
