"""pyhpc doctor's verdicts from faked command output (the real run is in tests/integration)."""
from __future__ import annotations

import pytest

from pyhpc.doctor import Doctor, table

HEALTHY = {
    "munge": (0, "MUNGE:cred:\n"),
    "unmunge": (0, "STATUS:          Success (0)\n"),
    "scontrol": (0, "Slurmctld(primary) at vm is UP\n"),
    "sacctmgr": (0, "lab\n"),
    "sinfo": (0, "cpu1 idle\ncpu2 idle\ngpu1 idle\ngpu1 idle\n"),
    "srun": (0, "7 cpu1\n7 cpu2\n"),
    "sacct": (0, "7|COMPLETED|None\n"),
}


@pytest.fixture
def checks(fake_slurm):
    def run(**overrides: tuple[int, str]):
        fake_slurm.answers.update({**HEALTHY, **overrides})
        return Doctor(sacct_wait=0).checks()
    return run


def verdicts(checks, **overrides) -> dict[str, bool]:
    return {c.name: c.ok for c in checks(**overrides)}


def test_healthy_cluster_passes_every_check(checks) -> None:
    assert all(verdicts(checks).values())


def test_busy_node_fails_the_idle_check_and_skips_the_job(checks) -> None:
    result = verdicts(checks, sinfo=(0, "cpu1 idle\ncpu2 alloc\n"))
    assert result["nodes idle"] is False
    assert result["srun -N2"] is False


def test_job_on_one_node_fails(checks) -> None:
    assert verdicts(checks, srun=(0, "7 cpu1\n7 cpu1\n"))["srun -N2"] is False


def test_unrecorded_job_fails_sacct(checks) -> None:
    assert verdicts(checks, sacct=(0, ""))["sacct"] is False


def test_munge_failure_is_reported(checks) -> None:
    result = checks(unmunge=(1, ""))
    assert result[0].ok is False
    assert "FAIL" in table(result).splitlines()[1]


def test_slurmdbd_down_blames_only_accounting(checks, fake_slurm) -> None:
    """Jobs run without slurmdbd: the 2-node job still runs; only sacct is skipped."""
    result = {c.name: c for c in checks(sacctmgr=(1, ""))}
    assert result["slurmdbd"].ok is False
    assert result["srun -N2"].ok is True
    assert result["sacct"].ok is False and "slurmdbd does not answer" in result["sacct"].detail
    assert "controller or nodes" not in table(list(result.values()))
    assert any(c[0] == "srun" for c in fake_slurm.calls)
