"""The lab at IBM DDL's scale (ansible/inventories/lab/ddl256.yml): 64 GPU nodes x 4
stand-in GPUs plus 4 CPU nodes, one `slurmd -N` each, on this one machine.

Deployed through `make deploy CLUSTER=...` as the README says; the stock lab is deployed
again afterwards (also when a test fails), so later tests find it as before. It runs in
`make test`: the two deploys and the jobs take about 2 minutes here.
"""
from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_deploy import make, sh

from pyhpc import cluster, paths

pytestmark = pytest.mark.integration

LARGE_FILE = paths.ROOT / "ansible" / "inventories" / "lab" / "ddl256.yml"
LARGE = cluster.load(LARGE_FILE)
GPU_DIR = Path("/dev/pyhpc-lab")
GPU_NODES = sorted((n for n in LARGE.nodes if n.gpus), key=lambda n: int(n.name[3:]))


def _tail(proc: object) -> str:
    return (getattr(proc, "stdout", "") + getattr(proc, "stderr", ""))[-3000:]


def _wait_idle(count: int, timeout: float = 300.0) -> list[str]:
    """sinfo rows ``node state gres`` once all ``count`` nodes are idle."""
    deadline = time.monotonic() + timeout
    rows: list[str] = []
    while time.monotonic() < deadline:
        rows = sh("sinfo", "-h", "-N", "-o", "%N %t %G", check=False).stdout.splitlines()
        if len(rows) == count and all(r.split()[1] == "idle" for r in rows):
            return rows
        time.sleep(2)
    pytest.fail(f"not all {count} nodes idle after {timeout:.0f} s: {rows}")


@pytest.fixture(scope="module")
def large_lab() -> Iterator[list[str]]:
    try:
        proc = make("deploy", f"CLUSTER={LARGE_FILE}")
        assert proc.returncode == 0, _tail(proc)
        yield _wait_idle(len(LARGE.nodes))
    finally:
        restore = make("deploy")
        assert restore.returncode == 0, _tail(restore)
        # Back to the stock lab's stand-ins only: the 64-node ones would be GPUs to a glob.
        stock = cluster.load(paths.LAB_CLUSTER)
        left = sorted(str(p.relative_to(GPU_DIR)) for p in GPU_DIR.glob("*/*"))
        assert left == sorted(f"{n.name}/nvidia{i}" for n in stock.nodes for i in range(n.gpus))


def test_the_large_lab_brings_up_256_gpus_on_68_nodes(large_lab: list[str]) -> None:
    gres = {row.split()[0]: row.split()[2] for row in large_lab}
    assert len(gres) == 68
    assert sorted(n for n, g in gres.items() if g == "gpu:lab:4") == sorted(
        n.name for n in GPU_NODES)
    assert sum(4 for g in gres.values() if g == "gpu:lab:4") == 256


def test_srun_spans_all_64_gpu_nodes_with_4_gpus_each(large_lab: list[str]) -> None:
    out = sh("srun", "-p", "gpu", "-N64", "--ntasks-per-node=1", "--gres=gpu:4", "-t", "5",
             "sh", "-c", "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES", timeout=300).stdout
    rows = dict(line.split() for line in out.splitlines())
    assert sorted(rows) == sorted(n.name for n in GPU_NODES)
    assert collections.Counter(rows.values()) == {"0,1,2,3": 64}


def test_the_68_slurmd_fit_in_a_small_share_of_memory(large_lab: list[str]) -> None:
    # By pid file: hostlab's slurmd in containers are processes of this machine too.
    pids = [Path(f"/run/slurmd-{n.name}.pid").read_text().strip() for n in LARGE.nodes]
    assert len(set(pids)) == 68
    pss_kib = sum(int(line.split()[1]) for pid in pids
                  for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                  if line.startswith("Pss:"))
    total_kib = int(Path("/proc/meminfo").read_text().split()[1])
    assert pss_kib < total_kib / 10, f"68 slurmd use {pss_kib // 1024} MiB"
