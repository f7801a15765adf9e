"""shellcheck on every rendered job template (the golden files are the rendered scripts)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

GOLDEN_JOBS = sorted((Path(__file__).resolve().parents[1] / "golden" / "jobs").glob("*.sbatch"))


@pytest.mark.parametrize("script", GOLDEN_JOBS, ids=lambda p: p.name)
def test_shellcheck_passes_on_rendered_job_script(script: Path, shellcheck: str) -> None:
    proc = subprocess.run([shellcheck, "--shell=bash", str(script)], capture_output=True, text=True)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout


def test_every_template_has_a_rendered_golden_file() -> None:
    assert len(GOLDEN_JOBS) >= 6
