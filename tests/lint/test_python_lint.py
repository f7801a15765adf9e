"""ruff (pyflakes, pycodestyle, isort, bugbear, pyupgrade) and strict mypy, as configured
in pyproject.toml, from the pinned tools in the venv."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pyhpc import paths

BIN = Path(sys.executable).parent


def test_ruff_is_clean_on_the_package_benchmarks_hostlab_tests_and_ansibles_python() -> None:
    proc = subprocess.run([str(BIN / "ruff"), "check", "pyhpc", "benchmarks", "hostlab", "requirements",
                           "tests", "ansible/roles/containers/files", "ansible/collections", "setup.py"],
                          cwd=paths.ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_is_clean_on_the_package_and_the_benchmarks() -> None:
    proc = subprocess.run([str(BIN / "mypy")], cwd=paths.ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
