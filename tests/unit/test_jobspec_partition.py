"""A job without a partition: SBATCH_PARTITION (sbatch's own default, which a hub server
sets for the jobs its notebooks submit), else the cluster's default; a bad value is one line."""
from __future__ import annotations

import pytest

from pyhpc.cluster import load
from pyhpc.paths import LAB_CLUSTER
from pyhpc.slurm.jobspec import JobSpec, JobSpecError, check


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
