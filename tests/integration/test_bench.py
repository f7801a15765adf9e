"""``pyhpc bench`` on the lab through the user-facing CLI (/opt/pyhpc/venv/bin/pyhpc): a
real 2-node job on the cpu partition (gloo, host memory copies), results read back."""
from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from pyhpc import paths
from pyhpc.bench import config as bench
from pyhpc.bench import results

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]


def pyhpc(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(paths.SHARED_VENV / "bin" / "pyhpc"), *args], cwd=work,
                          capture_output=True, text=True, timeout=300)


def test_bench_on_two_cpu_nodes_writes_json_table_and_png(work: Path) -> None:
    out = work / "bench"
    proc = pyhpc(work, "bench", "--nodes", "2", "--partition", "cpu", "--out", str(out),
                 "--wait", "--timeout", "240", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["state"] == "COMPLETED"
    assert result["json"] == str(out / "bench.json") and result["png"] == str(out / "bench.png")
    doc = results.read_results(out / "bench.json")
    assert doc["job_id"] == result["job_id"] and doc["world_size"] == 2
    assert doc["nodes"] == ["cpu1", "cpu2"] and (doc["device"], doc["backend"]) == ("cpu", "gloo")
    # No GPU: host memory copies, said so; sizes 4 KiB .. 64 MiB (the CPU default).
    assert "no GPU" in doc["copy"]["what"] and doc["copy"]["max_bytes"] == 64 << 20
    for rank in doc["copy"]["ranks"]:
        assert [r["bytes"] for r in rank["rows"]] == bench.sizes(64 << 20)
        assert all(r["GBps"] > 0 for r in rank["rows"])
    # Across the two nodes: one group of both ranks, busbw = algbw x 2(n-1)/n = algbw.
    (group,) = doc["allreduce"]["groups"]
    assert (group["scope"], group["ranks"], group["nodes"]) == ("inter-node", 2, ["cpu1", "cpu2"])
    for row in group["rows"]:
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"]) and row["busbw_GBps"] > 0
    assert {r["dtype"] for m in doc["matmul"]["ranks"] for r in m["rows"]} == {"fp32", "bf16"}
    assert all(not r["known"] for r in doc["link"]["ranks"])
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "bench.txt").read_text() == results.table(doc)
    assert stat.S_IMODE((out / "bench.json").stat().st_mode) == 0o600


def test_bench_gpus_on_a_partition_without_gpus_is_one_line_and_submits_nothing(
        work: Path) -> None:
    proc = pyhpc(work, "bench", "--gpus", "--partition", "cpu", "--out", str(work / "refused"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("pyhpc: error: gpus_per_node: partition 'cpu' has 0 GPUs per node, "
                           "1 requested; partitions with GPUs: gpu\n")
    assert list(work.iterdir()) == []
