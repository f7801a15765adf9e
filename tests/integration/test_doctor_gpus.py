"""GPU acceptance on the lab: ``pyhpc doctor --gpus`` and Slurm's HealthCheckProgram.

Through the commands an admin runs: the deployed ``pyhpc`` (/opt/pyhpc/venv), the
installed /usr/local/sbin/pyhpc-healthcheck, scontrol. A fault is simulated without
touching the lab: a fake ``nvidia-smi`` (or ``df``) first on PATH. A test that drains a
node resumes it, whatever happens.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from drains import node_fields, resume_ours

from pyhpc import cluster, paths

# The check step imports pyhpc from /opt/pyhpc/src: conftest checks it is this checkout's.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

LAB = cluster.load(paths.LAB_CLUSTER)
GPU_NODES = sorted(n.name for n in LAB.nodes if n.gpus)
HEALTHCHECK = Path("/usr/local/sbin/pyhpc-healthcheck")
PYHPC = str(paths.SHARED_VENV / "bin" / "pyhpc")


def sh(*argv: str, env: dict[str, str] | None = None, timeout: int = 600,
       ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)


def fake_tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def resume() -> Iterator[list[str]]:
    """Nodes a test may drain: resumed afterwards if pyhpc drained them."""
    nodes: list[str] = []
    yield nodes
    resume_ours(nodes)


def test_doctor_gpus_finds_every_gpu_node_ok(work: Path) -> None:
    proc = subprocess.run([PYHPC, "doctor", "--gpus", "--json"], cwd=work, capture_output=True,
                          text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    rows = {r["node"]: r for r in data["gpus"]}
    assert sorted(rows) == GPU_NODES
    for name, row in rows.items():
        assert row["ok"] is True, row
        assert row["gres"] == row["seen"] == LAB.node(name).gpus, row
        assert row["matmul"] == "pass" and row["dcgm"] == "absent", row
        assert "device files in /etc/slurm/gres.conf" in row["why"], row


def test_doctor_gpus_drain_drains_only_the_node_that_sees_too_few(
        work: Path, resume: list[str]) -> None:
    """gpu2's step finds a (fake) driver listing one GPU of its two: only gpu2 is drained."""
    fakes = work / "fake-bin"
    fakes.mkdir()
    fake_tool(fakes, "nvidia-smi", 'echo "GPU 0: Fake (UUID: GPU-0)"\n'
                                   '[ "$SLURMD_NODENAME" = gpu2 ] || echo "GPU 1: Fake (UUID: GPU-1)"')
    env = dict(os.environ, PATH=f"{fakes}:{os.environ['PATH']}")  # srun passes it to the step
    resume += GPU_NODES
    proc = subprocess.run([PYHPC, "doctor", "--gpus", "--drain", "--json"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {r["node"]: r for r in json.loads(proc.stdout)["gpus"]}
    assert (rows["gpu2"]["seen"], rows["gpu2"]["fault"], rows["gpu2"]["drained"]) == (1, True, True)
    assert (rows["gpu1"]["fault"], rows["gpu1"]["drained"]) == (False, False)
    gpu2 = node_fields("gpu2")
    assert "DRAIN" in gpu2["State"]
    assert gpu2["Reason"].startswith("pyhpc doctor: Slurm has 2 GPUs as GRES, the node sees 1")
    assert "DRAIN" not in node_fields("gpu1")["State"]


def test_healthcheck_is_installed_and_slurm_runs_it() -> None:
    info = HEALTHCHECK.stat()
    assert stat.S_IMODE(info.st_mode) == 0o755 and (info.st_uid, info.st_gid) == (0, 0)
    # The program is the package's module as it is; its settings are the lab's golden file.
    assert HEALTHCHECK.read_text() == (paths.ROOT / "pyhpc" / "admin" / "healthcheck.py").read_text()
    settings = Path("/etc/slurm/pyhpc-healthcheck.json")
    golden = paths.ROOT / "tests" / "golden" / "slurm" / "lab" / "pyhpc-healthcheck.json"
    assert settings.read_text() == golden.read_text()
    assert stat.S_IMODE(settings.stat().st_mode) == 0o644
    config = {k.strip(): v.strip() for k, _, v in (
        line.partition("=") for line in sh("scontrol", "show", "config").stdout.splitlines())}
    assert config["HealthCheckProgram"] == str(HEALTHCHECK)
    assert config["HealthCheckInterval"] == "300 sec"
    assert config["HealthCheckNodeState"] == "ANY"


@pytest.mark.parametrize("node", sorted(n.name for n in LAB.nodes))
def test_healthcheck_leaves_a_healthy_lab_node_undrained(node: str, resume: list[str]) -> None:
    """Run as slurmd runs it: no environment but SLURMD_NODENAME."""
    resume.append(node)  # should it drain the node after all, the lab still recovers
    proc = sh(str(HEALTHCHECK), env={"SLURMD_NODENAME": node}, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DRAIN" not in node_fields(node)["State"]


def test_healthcheck_drains_its_node_on_a_fault(tmp_path: Path, resume: list[str]) -> None:
    """A (fake) full spool on gpu2: gpu2 drains itself with the reason; gpu1 is untouched."""
    fake_tool(tmp_path, "df", 'echo "Filesystem 1024-blocks Used Available Capacity Mounted on"\n'
                              'echo "/dev/vda 1000000 999000 1000 100% /"')
    resume.append("gpu2")
    env = {"SLURMD_NODENAME": "gpu2", "PATH": f"{tmp_path}:/usr/sbin:/usr/bin:/sbin:/bin"}
    proc = sh(str(HEALTHCHECK), env=env, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    gpu2 = node_fields("gpu2")
    assert "DRAIN" in gpu2["State"]
    assert gpu2["Reason"].startswith("pyhpc-healthcheck: spool: /var/lib/slurm/slurmd/gpu2 has 0 MiB "
                                     "free, below 256 MiB")
    assert "DRAIN" not in node_fields("gpu1")["State"]
