"""Fixtures shared by the integration tests."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def work(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A job directory every node can enter (Slurm runs the job from it)."""
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit("_", 1)[-1])
    path.chmod(0o755)
    return path
