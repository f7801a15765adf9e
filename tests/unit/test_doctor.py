"""pyhpc doctor's verdicts from faked command output (the real run is in tests/integration)."""
from __future__ import annotations

import subprocess
from collections.abc import Sequence

from pyhpc.doctor import Doctor, table

HEALTHY = {
    "munge": (0, "MUNGE:cred:\n"),
    "unmunge": (0, "STATUS:          Success (0)\n"),
    "scontrol": (0, "Slurmctld(primary) at vm is UP\n"),
    "sacctmgr": (0, "lab\n"),
    "sinfo": (0, "cpu1 idle\ncpu2 idle\ngpu1 idle\ngpu1 idle\n"),
    "srun": (0, "7 cpu1\n7 cpu2\n"),
    "sacct": (0, "7|COMPLETED\n"),
}


def fake(overrides: dict[str, tuple[int, str]]):
    outputs = {**HEALTHY, **overrides}

    def runner(argv: Sequence[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
        code, out = outputs[argv[0]]
        return subprocess.CompletedProcess(argv, code, out, "boom" if code else "")
    return runner


def verdicts(**overrides: tuple[int, str]) -> dict[str, bool]:
    return {c.name: c.ok for c in Doctor(fake(overrides), sacct_wait=0).checks()}


def test_healthy_cluster_passes_every_check() -> None:
    assert all(verdicts().values())


def test_busy_node_fails_the_idle_check_and_skips_the_job() -> None:
    result = verdicts(sinfo=(0, "cpu1 idle\ncpu2 alloc\n"))
    assert result["nodes idle"] is False
    assert result["srun -N2"] is False and result["sacct"] is False


def test_job_on_one_node_fails() -> None:
    assert verdicts(srun=(0, "7 cpu1\n7 cpu1\n"))["srun -N2"] is False


def test_unrecorded_job_fails_sacct() -> None:
    assert verdicts(sacct=(0, ""))["sacct"] is False


def test_munge_failure_is_reported() -> None:
    checks = Doctor(fake({"unmunge": (1, "")}), sacct_wait=0).checks()
    assert checks[0].ok is False
    assert "FAIL" in table(checks).splitlines()[1]
