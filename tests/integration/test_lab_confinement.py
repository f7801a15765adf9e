"""The lab confines jobs as real hosts do: proctrack/cgroup and task/cgroup (cgroup v1).

Each `slurmd -N <node>` keeps its jobs under /sys/fs/cgroup/<controller>/slurm_<node>.
These are the checks test_hostlab.py makes on hostlab's hosts, through srun and sbatch
as a user runs them. The GPU stand-ins carry NVIDIA's major device number, which no
driver answers here, and minor numbers of their own across nodes: a job's open of a
stand-in it holds fails with ENXIO, of any other, on any node, with EPERM (the device
cgroup).
"""
from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from pyhpc import cluster, paths

pytestmark = pytest.mark.integration

LAB = cluster.load(paths.ROOT / "ansible" / "inventories" / "lab" / "cluster.yml")
DEFAULTS = paths.ROOT / "ansible" / "roles" / "slurm" / "defaults" / "main.yml"
GPU_DIR = yaml.safe_load(DEFAULTS.read_text())["slurm_lab_gpu_dir"]
GRAB = "import sys; b = b'x' * (int(sys.argv[1]) << 20); print(len(b))"
#: Prints the node, then how each of its stand-ins opens (ENXIO: the device cgroup let
#: the open through to the missing driver; EPERM: denied), then CUDA_VISIBLE_DEVICES.
OPEN_GPUS = ("import errno, glob, os, sys; node = os.environ['SLURMD_NODENAME']; seen = []\n"
             "for path in sorted(glob.glob(f'{sys.argv[1]}/{node}/nvidia[0-9]*')):\n"
             "    try:\n        os.close(os.open(path, os.O_RDONLY)); seen.append('open')\n"
             "    except OSError as exc:\n        seen.append(errno.errorcode[exc.errno])\n"
             "print(node, ','.join(seen), os.environ.get('CUDA_VISIBLE_DEVICES', '-'))")


def srun(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["srun", "--time=1", *argv], capture_output=True, text=True, timeout=120,
                          check=False)


def open_gpus(*options: str) -> tuple[str, list[str], str]:
    proc = srun("--partition=gpu", *options, "python3", "-c", OPEN_GPUS, GPU_DIR)
    assert proc.returncode == 0, proc.stderr
    node, seen, visible = proc.stdout.split()
    assert len(seen.split(",")) == LAB.node(node).gpus, seen
    return node, seen.split(","), visible


def test_a_step_is_killed_past_its_memory_and_runs_within_it() -> None:
    ok = srun("--mem=100M", "python3", "-c", GRAB, "30")
    assert ok.returncode == 0 and ok.stdout.strip() == str(30 << 20), ok.stderr
    big = srun("--mem=100M", "python3", "-c", GRAB, "300")
    assert big.returncode != 0
    assert "out of memory" in big.stderr.lower(), big.stderr


def test_one_cpu_job_gets_a_cpuset_of_one_cpu() -> None:
    proc = srun("--cpus-per-task=1", "grep", "Cpus_allowed_list", "/proc/self/status")
    assert proc.returncode == 0, proc.stderr
    allowed = proc.stdout.split()[-1]
    assert allowed.isdigit(), allowed


def test_a_job_without_gres_is_denied_every_gpu_standin() -> None:
    _, seen, visible = open_gpus()
    assert set(seen) == {"EPERM"} and visible == "-"


def test_a_one_gpu_job_reaches_exactly_one_standin_and_sees_one() -> None:
    _, seen, visible = open_gpus("--gres=gpu:1")
    assert sorted(seen) == ["ENXIO"] + ["EPERM"] * (len(seen) - 1), seen
    assert visible.isdigit(), visible


#: Prints how every node's stand-ins open from this job: path=errno name, one per line.
OPEN_ALL = ("import errno, glob, os, sys\n"
            "for path in sorted(glob.glob(f'{sys.argv[1]}/*/nvidia[0-9]*')):\n"
            "    try:\n        os.close(os.open(path, os.O_RDONLY)); print(path, 'open')\n"
            "    except OSError as exc:\n        print(path, errno.errorcode[exc.errno])")


def test_every_standin_has_a_device_number_of_its_own() -> None:
    numbers = [(p.stat().st_rdev, str(p)) for p in sorted(Path(GPU_DIR).glob("*/nvidia*"))]
    assert len(numbers) == sum(n.gpus for n in LAB.nodes)
    assert len({rdev for rdev, _ in numbers}) == len(numbers), numbers


def test_a_one_gpu_job_cannot_open_another_nodes_standins() -> None:
    """All emulated nodes share this host's /dev: a job given one GPU of one node may open
    that stand-in only; every other node's stand-ins stay denied (EPERM), not reachable."""
    proc = srun("--partition=gpu", "--gres=gpu:1", "bash", "-c",
                f'echo "$SLURMD_NODENAME"; python3 -c "$0" {GPU_DIR}', OPEN_ALL)
    assert proc.returncode == 0, proc.stderr
    node, *lines = proc.stdout.split("\n")
    seen = dict(line.split() for line in lines if line)
    assert len(seen) == sum(n.gpus for n in LAB.nodes), seen
    own = {p: e for p, e in seen.items() if f"/{node}/" in p}
    others = {p: e for p, e in seen.items() if f"/{node}/" not in p}
    assert sorted(own.values()) == ["ENXIO"] + ["EPERM"] * (len(own) - 1), own
    assert others and set(others.values()) == {"EPERM"}, others


def test_scancel_kills_a_process_that_left_the_job_script(tmp_path: Path) -> None:
    """A double-forked, setsid process has no parent in the job (proctrack/linuxproc
    lost it); its cgroup still holds it, so scancel kills it."""
    mark = f"pyhpc-escapee-{uuid.uuid4().hex[:12]}"
    script = tmp_path / "escape.sh"
    script.write_text(f"#!/bin/bash\n(setsid bash -c 'exec -a {mark} sleep 300' &)\nsleep 300\n")
    job = subprocess.run(["sbatch", "--parsable", "--time=2", "--output=/dev/null", str(script)],
                         capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip().split(";")[0]
    try:
        pids: list[str] = []
        deadline = time.monotonic() + 60
        while not pids and time.monotonic() < deadline:
            time.sleep(1)
            pids = subprocess.run(["pgrep", "-f", mark], capture_output=True,
                                  text=True).stdout.split()
        assert len(pids) == 1, f"job {job}: no escaped process"
        node = subprocess.run(["squeue", "--noheader", f"--jobs={job}", "--format=%N"],
                              capture_output=True, text=True, check=True).stdout.strip()
        memory = next(line for line in Path(f"/proc/{pids[0]}/cgroup").read_text().splitlines()
                      if line.split(":")[1] == "memory")
        assert f"/slurm_{node}/" in memory and f"/job_{job}/" in memory, memory
    finally:
        subprocess.run(["scancel", job], check=True, timeout=60)
    deadline = time.monotonic() + 60
    while subprocess.run(["pgrep", "-f", mark], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, f"{mark} outlived scancel of job {job}"
        time.sleep(1)
