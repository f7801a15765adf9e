"""pyhpc doctor's verdicts from faked command output (the real run is in tests/integration)."""
from __future__ import annotations

import subprocess

import pytest

from pyhpc.admin.doctor import Doctor, table

HEALTHY = {
    "munge": (0, "MUNGE:cred:\n"),
    "unmunge": (0, "STATUS:          Success (0)\n"),
    "scontrol": (0, "Slurmctld(primary) at vm is UP\n"),
    "sacctmgr": (0, "lab\n"),
    "sinfo": (0, "cpu1 idle\ncpu2 idle\ngpu1 idle\ngpu1 idle\n"),
    "srun": (0, "7 cpu1\n7 cpu2\n"),
    "sacct": (0, "7|COMPLETED|None\n"),
}


SELFTEST = "node: cpu1\nimage: pyhpc-cpu\npython: 3.11.2\ntorch: 2.13.0+cpu\n"


def srun_answers(container: tuple[int, str] = (0, SELFTEST), job: tuple[int, str] = (0, "7 cpu1\n7 cpu2\n")):
    """srun's answer per step: the 2-node job, or the container check (pyhpc.container_run)."""
    return lambda argv: container if "pyhpc.container_run" in argv else job


@pytest.fixture
def image(tmp_path):
    (tmp_path / "pyhpc-cpu" / "rootfs").mkdir(parents=True)
    return tmp_path / "pyhpc-cpu"


@pytest.fixture
def checks(fake_slurm, image):
    def run(**overrides):
        fake_slurm.answers.update({**HEALTHY, "srun": srun_answers(), **overrides})
        return Doctor(sacct_wait=0, runtime="podman", images={"podman": image}).checks()
    return run


def verdicts(checks, **overrides) -> dict[str, bool]:
    return {c.name: c.ok for c in checks(**overrides)}


def test_healthy_cluster_passes_every_check(checks, fake_slurm) -> None:
    assert all(verdicts(checks).values())
    assert not [c for c in fake_slurm.calls if "--list-reasons" in c]  # asked only when needed


def test_busy_node_fails_the_idle_check_and_skips_the_job(checks) -> None:
    result = verdicts(checks, sinfo=(0, "cpu1 idle\ncpu2 alloc\n"))
    assert result["nodes idle"] is False
    assert result["srun -N2"] is False


def test_a_drained_node_is_named_with_the_reason_slurm_holds(checks, fake_slurm) -> None:
    def sinfo(argv):
        if "--list-reasons" in argv:
            return 0, "cpu2|Duplicate jobid | by slurmctld\n"
        return 0, "cpu1 idle\ncpu2 drain\ngpu1 alloc\n"
    result = {c.name: c for c in checks(sinfo=sinfo)}
    assert result["nodes idle"].detail == ("not idle: cpu2 (drain: Duplicate jobid | by slurmctld), "
                                           "gpu1 (alloc)")
    assert result["srun -N2"].ok is False
    assert len([c for c in fake_slurm.calls if "--list-reasons" in c]) == 1


def test_job_on_one_node_fails(checks) -> None:
    assert verdicts(checks, srun=srun_answers(job=(0, "7 cpu1\n7 cpu1\n")))["srun -N2"] is False


def test_container_check_starts_the_image_from_root_with_a_safe_import_path(checks, fake_slurm,
                                                                             image) -> None:
    result = {c.name: c for c in checks()}
    assert result["container"].ok
    assert result["container"].detail == "pyhpc-cpu started on cpu1: torch 2.13.0+cpu, python 3.11.2"
    step = next(c for c in fake_slurm.calls if "pyhpc.container_run" in c)
    assert "--chdir=/" in step and step[step.index("-m") - 1] == "-P"
    assert step[step.index("--image") + 1] == str(image)
    assert step[step.index("--workdir") + 1] == "/"


def test_container_that_cannot_start_fails_with_the_runtimes_one_line(checks) -> None:
    line = ("pyhpc: the container runtime cannot start the image on cpu1: OCI runtime error: crun: "
            "cgroups in hybrid mode not supported, drop all controllers from cgroupv2")
    result = {c.name: c for c in checks(srun=srun_answers(container=(3, line + "\n")))}
    assert result["container"].ok is False
    assert result["container"].detail == line.removeprefix("pyhpc: ")
    assert result["srun -N2"].ok


def test_container_check_without_an_image_starts_nothing(fake_slurm, tmp_path) -> None:
    fake_slurm.answers.update({**HEALTHY, "srun": srun_answers()})
    result = {c.name: c for c in Doctor(sacct_wait=0, runtime="podman",
                                        images={"podman": tmp_path / "none"}).checks()}
    assert result["container"].ok
    assert "no image at" in result["container"].detail
    assert not any("pyhpc.container_run" in c for c in fake_slurm.calls)


def test_unrecorded_job_fails_sacct(checks) -> None:
    assert verdicts(checks, sacct=(0, ""))["sacct"] is False


def test_sacct_reads_the_newest_job_of_the_id(checks) -> None:
    """After a controller crash the doctor's own job may get a lost job's id: sacct -D
    lists the lost job's open record first (seen on the lab: 'job 199: PENDING')."""
    rows = "7|PENDING|None|2026-11-25T17:50:38\n7|COMPLETED|None|2026-11-25T17:51:02\n"
    result = {c.name: c for c in checks(sacct=(0, rows))}
    assert result["sacct"].ok and result["sacct"].detail == "job 7: COMPLETED"


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


def test_the_two_node_job_asks_a_partition_that_has_two_nodes(fake_slurm, image) -> None:
    """hostlab's default partition has one node: a 2-node job there would pend for ever."""
    from pyhpc import cluster, paths

    fake_slurm.answers.update({**HEALTHY, "srun": srun_answers()})
    hostlab = cluster.load(paths.ROOT / "ansible" / "inventories" / "hostlab" / "cluster.yml")
    for definition, partition in ((hostlab, "gpu"), (cluster.load(paths.LAB_CLUSTER), "cpu")):
        fake_slurm.calls.clear()
        Doctor(sacct_wait=0, runtime="podman", images={"podman": image}, the_cluster=definition).checks()
        job = next(c for c in fake_slurm.calls if c[0] == "srun" and "--nodes=2" in c)
        assert f"--partition={partition}" in job, job


def test_a_step_that_never_answers_fails_its_check_and_the_report_goes_on(checks) -> None:
    def hang(argv):
        raise subprocess.TimeoutExpired(argv, 90)

    result = {c.name: c for c in checks(srun=hang)}
    assert result["srun -N2"].ok is False and "no answer within" in result["srun -N2"].detail
    assert result["container"].ok is False and "no answer within" in result["container"].detail
    assert "runaway" in " ".join(result)  # the checks after it still ran
