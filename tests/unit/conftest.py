"""Unit-test fixtures: fake Slurm tools on PATH (for submitit) plus pyhpc.slurm's fake runner."""
from __future__ import annotations

from pathlib import Path

import pytest

from pyhpc import paths

SLURM_TOOLS = ("sbatch", "srun", "squeue", "sacct", "scancel", "scontrol", "salloc")
FAKE_TOOL = """#!/bin/bash
echo "$(basename "$0") $*" >> "{log}"
[ "$(basename "$0")" = sbatch ] && echo "Submitted batch job 4243"
exit 0
"""


class Recorder:
    """pyhpc.slurm's commands (the fake RUNNER) and Slurm's tools on PATH (for submitit)."""

    def __init__(self, fake, log: Path) -> None:
        self.fake = fake
        self.log = log

    @property
    def calls(self) -> list[list[str]]:
        return self.fake.calls

    @property
    def tool_calls(self) -> list[str]:
        """Commands that reached a (fake) Slurm executable, e.g. through submitit's Popen."""
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def slurm(monkeypatch, tmp_path: Path, fake_slurm) -> Recorder:
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    rec = Recorder(fake_slurm, tmp_path / "slurm-calls.log")
    for tool in SLURM_TOOLS:
        (bin_dir / tool).write_text(FAKE_TOOL.format(log=rec.log))
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("PYHPC_CLUSTER", str(paths.LAB_CLUSTER))
    monkeypatch.chdir(tmp_path)
    return rec


