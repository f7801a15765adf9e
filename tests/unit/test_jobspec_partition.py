"""A job without a partition: SBATCH_PARTITION (sbatch's own default, which a hub server
sets for the jobs its notebooks submit), else the cluster's default; a bad value is one line."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyhpc.cluster import load
from pyhpc.paths import LAB_CLUSTER
from pyhpc.slurm import submit
from pyhpc.slurm.jobspec import JobSpec, JobSpecError, check
from pyhpc.slurm.reservations import ReservationError


def test_sbatch_partition_is_the_default_and_a_given_partition_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    lab = load(LAB_CLUSTER)
    names = [p.name for p in lab.partitions]
    other = next(n for n in names if n != lab.default_partition.name)
    assert check(JobSpec(), lab).partition == lab.default_partition.name
    monkeypatch.setenv("SBATCH_PARTITION", other)
    assert check(JobSpec(), lab).partition == other
    assert check(JobSpec(partition=lab.default_partition.name), lab).partition \
        == lab.default_partition.name


@pytest.mark.parametrize("value", ["cpu,gpu", "no such partition", "$(id)"])
def test_a_bad_sbatch_partition_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SBATCH_PARTITION", value)
    with pytest.raises(JobSpecError, match=r"^SBATCH_PARTITION: "):
        check(JobSpec(), load(LAB_CLUSTER))


#: scontrol's line of an active reservation in partition gpu that admits ws-01.
WORKSHOP = ("ReservationName=ws StartTime=2026-12-03T09:00:00 EndTime=2026-12-03T10:00:00 "
            "Nodes=gpu1 NodeCnt=1 PartitionName=gpu Users=ws-01 Accounts=ws State=ACTIVE")


def test_a_scripts_reservation_is_checked_in_the_partition_sbatch_will_use(
        fake_slurm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SBATCH_RESERVATION", "ws")  # in partition gpu
    fake_slurm.answers["scontrol"] = (0, WORKSHOP + "\n")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    lab = load(LAB_CLUSTER)
    assert lab.default_partition.name != "gpu"
    with pytest.raises(ReservationError, match=r"add --partition gpu$"):
        submit.script_choice(script, [], lab)
    monkeypatch.setenv("SBATCH_PARTITION", "gpu")
    assert submit.script_choice(script, [], lab).name == "ws"
