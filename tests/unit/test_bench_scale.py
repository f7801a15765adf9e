"""benchmarks/scale.py's pure parts: the cut-down definitions, growth exponents, the DDP phase
breakdown, the plots. Runs no Slurm command."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import scale as bench
from pyhpc import cluster

PNG = b"\x89PNG\r\n\x1a\n"



@pytest.mark.parametrize("nodes", [4, 16, 64])
def test_definition_has_n_gpu_nodes_and_validates(nodes: int) -> None:
    doc = bench.definition(nodes)
    parsed = cluster.parse(doc, ram_mb=24 * 1024)
    gpu = [n for n in parsed.nodes if n.name.startswith("gpu")]
    assert len(gpu) == nodes and all(n.gpus == 4 for n in gpu)
    assert len(parsed.nodes) == nodes + 4
    (part,) = [p for p in parsed.partitions if p.name == "gpu"]
    assert len(part.nodes) == nodes
    assert doc["tuning"] == "high_throughput"


def test_untuned_definition_drops_only_the_tuning() -> None:
    tuned, untuned = bench.definition(64), bench.definition(64, tuning=False)
    assert "tuning" not in untuned
    assert {k: v for k, v in tuned.items() if k != "tuning"} == untuned


@pytest.mark.parametrize(("points", "slope"), [
    ({4: 10.0, 16: 10.0, 64: 10.0}, 0.0),
    ({4: 4.0, 16: 16.0, 64: 64.0}, 1.0),
    ({1: 1.0, 4: 16.0}, 2.0),
])
def test_growth_is_the_log_log_slope(points: dict[int, float], slope: float) -> None:
    assert bench.growth(points) == pytest.approx(slope)


def test_growth_needs_two_points() -> None:
    assert bench.growth({4: 1.0}) is None


def test_phases_split_the_time_to_first_step() -> None:
    marks = [
        {"rank": 0, "process_start": 102.0, "imported": 104.0, "rendezvous_done": 105.5,
         "first_step": 106.0},
        {"rank": 1, "process_start": 102.5, "imported": 104.5, "rendezvous_done": 105.5,
         "first_step": 106.2},
    ]
    got = bench.phases(marks, submit=100.0, start=101.0)
    assert got == {"queue_wait_s": 1.0, "launch_s": 1.5, "interpreter_and_imports_s": 2.0,
                   "rendezvous_s": 1.0, "first_step_s": 0.5, "from_start_s": 5.0,
                   "total_s": 6.0}
    parts = [v for k, v in got.items() if k not in ("total_s", "from_start_s")]
    assert sum(parts) == pytest.approx(got["total_s"])


def test_plot_writes_one_png_per_curve(tmp_path: Path) -> None:
    phase = {"queue_wait_s": 1.0, "launch_s": 0.5, "interpreter_and_imports_s": 2.0,
             "rendezvous_s": 0.3, "first_step_s": 0.2, "total_s": 4.0}
    result = {
        "deploy": {"runs": [{"nodes": n, "fresh_s": 60.0 + n, "rerun_s": 25.0 + n / 4}
                            for n in (4, 16, 64)]},
        "srun": {"rows": [{"nodes": k, "median_s": 0.2 + k / 100} for k in (1, 4, 16, 64)]},
        "submit": {"ways": {"sbatch_loop": {"jobs_per_s": 50.0},
                            "sbatch_array": {"jobs_per_s": 5000.0}}},
        "complete": {"runs": {"default": {"jobs_per_s": 10.0},
                              "high_throughput": {"jobs_per_s": 12.0}}},
        "status": {"rows": [{"jobs": 100, "poll_median_s": 0.01},
                            {"jobs": 1000, "poll_median_s": 0.05}]},
        "ddp": {"rows": [{"nodes": k, "bare": phase, "pyhpc": phase} for k in (1, 2)]},
    }
    made = bench.plot(result, tmp_path)
    assert sorted(p.name for p in made) == sorted(
        f"scale-{n}.png" for n in ("deploy", "srun", "submit", "complete", "status", "ddp"))
    assert all(p.read_bytes().startswith(PNG) for p in made)
