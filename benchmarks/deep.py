"""The deep model on the lab: pipeline stages against the same depth unsplit, side by side in
one run; prints figures, writes benchmarks/results/deep.json.

(a) split vs unsplit: samples/s of a depth that fits one task, unsplit on 1 task and on 2
    (data parallel, the same 2 CPUs the split gets) against 2 pipeline stages (1F1B);
(b) time to first step (rank 0's, from ``startup.json``) of each of those runs;
(c) the bubble: each stage's measured share of a step spent waiting, 1F1B and GPipe at
    2, 4 and 8 micro-batches, against the equal-stage bound (P-1)/(M+P-1);
(d) samples/s of 2 stages on 1 node and on 2 nodes (data parallel across them);
(e) the largest depth that trains per stage count (1, 2, 4 stages; one task a stage, the
    lab's 1 GiB a task): depths tried in rising order until Slurm's cgroup kills a task.

Pairs alternate (ABBA) so drift hits both alike; medians of ``--reps``. Every run is
``pyhpc train --model deep … --wait --json`` on the lab as root, in a fresh run directory.
Run with ``make bench-deep`` (needs the lab: ``make deploy``; about 25 minutes).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import lab, record
from pyhpc.train.pipeline import bubble_theory

PYHPC = "/opt/pyhpc/venv/bin/pyhpc"
#: One batch of 32 images, 3x62x62 (the seeds' workload), 4 steps an epoch after warm-up.
BASE = ["--model", "deep", "--batch-size", "32", "--synthetic-samples", "200",
        "--warmup-steps", "1", "--epochs", "1"]
#: A depth that one lab task (1 GiB) holds unsplit, for the split/unsplit comparison (100
#: did not: OUT_OF_MEMORY).
FITS = 50
#: The deeper model for the bubble and node figures (test_deep's: 1 task cannot hold it).
DEEP = 200
DEPTHS = (50, 100, 150, 200, 300, 400, 600, 800, 1200, 1600)
STAGES = (1, 2, 4)


def train(work: Path, name: str, layers: int, *flags: str) -> dict[str, Any]:
    """One ``pyhpc train`` run; its summary row, start-up marks and final state."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([PYHPC, "train", *BASE, "--layers", str(layers), *flags, "--out",
                           str(out), "--wait", "--json"], cwd=work, capture_output=True,
                          text=True, check=False)
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"benchmarks.deep: {name}: {proc.stderr.strip()[-400:]}") from None
    metrics = out / "metrics.jsonl"
    row = json.loads(metrics.read_text().splitlines()[-1]) if metrics.is_file() else {}
    first = None
    if (out / "startup.json").is_file():
        ranks = json.loads((out / "startup.json").read_text())["ranks"]
        marks = next(r["marks"] for r in ranks if r["rank"] == 0)
        first = round(marks["first_step"] - marks["process_start"], 3)
    return {"state": result.get("state"), "job_id": result.get("job_id"),
            "why": result.get("why"), "row": row, "first_step_s": first}


def _rate(run: dict[str, Any]) -> float:
    if run["state"] != "COMPLETED":
        raise SystemExit(f"benchmarks.deep: job {run['job_id']} {run['state']}: {run['why']}")
    return float(run["row"]["samples_per_s"])


def paired(work: Path, runs: dict[str, tuple[int, list[str]]], reps: int) -> dict[str, Any]:
    """Each named run ``reps`` times in ABBA order; medians of samples/s and first step."""
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    names = list(runs)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            layers, flags = runs[name]
            got[name].append(train(work, f"{name}-{rep}", layers, *flags))
    out: dict[str, Any] = {}
    for name, results in got.items():
        rates = [_rate(r) for r in results]
        firsts = [r["first_step_s"] for r in results if r["first_step_s"] is not None]
        out[name] = {"samples_per_s": rates, "median_samples_per_s": round(statistics.median(rates), 2),
                     "median_first_step_s": round(statistics.median(firsts), 2) if firsts else None,
                     "row": results[-1]["row"]}
    return out


def bench_split(work: Path, reps: int) -> dict[str, Any]:
    runs = {"unsplit-1task": (FITS, ["--pipeline", "1", "--tasks-per-node", "1"]),
            "unsplit-2tasks-ddp": (FITS, ["--pipeline", "1", "--tasks-per-node", "2"]),
            "split-2stages": (FITS, ["--pipeline", "2", "--microbatches", "4"])}
    got = paired(work, runs, reps)
    base = got["unsplit-1task"]["median_samples_per_s"]
    for name in got:
        got[name]["ratio_to_unsplit_1task"] = round(got[name]["median_samples_per_s"] / base, 3)
        got[name]["peak_memory_bytes"] = got[name]["row"].get("extra_stage_peak_memory_bytes")
        del got[name]["row"]
    return {"layers": FITS, "runs": got}


def bench_bubble(work: Path, reps: int) -> dict[str, Any]:
    """Once per point (the bubble is a share, steady across runs; ``reps`` is unused)."""
    rows = []
    for schedule in ("1f1b", "gpipe"):
        for micro in (2, 4, 8):
            run = train(work, f"bubble-{schedule}-{micro}", DEEP, "--pipeline", "2",
                        "--microbatches", str(micro), "--schedule", schedule)
            _rate(run)
            rows.append({"schedule": schedule, "microbatches": micro,
                         "stage_bubble": run["row"]["extra_stage_bubble"],
                         "bound": round(bubble_theory(2, micro), 4),
                         "stage_peak_memory_bytes": run["row"]["extra_stage_peak_memory_bytes"],
                         "samples_per_s": run["row"]["samples_per_s"]})
    return {"layers": DEEP, "stages": 2, "rows": rows}


def bench_nodes(work: Path, reps: int) -> dict[str, Any]:
    runs = {"1node": (DEEP, ["--pipeline", "2", "--nodes", "1", "--microbatches", "4"]),
            "2nodes": (DEEP, ["--pipeline", "2", "--nodes", "2", "--microbatches", "4"])}
    got = paired(work, runs, reps)
    one, two = got["1node"]["median_samples_per_s"], got["2nodes"]["median_samples_per_s"]
    for name in got:
        del got[name]["row"]
    return {"layers": DEEP, "stages": 2, "runs": got, "speedup": round(two / one, 3),
            "efficiency": round(two / (2 * one), 3)}


def bench_largest(work: Path, reps: int) -> dict[str, Any]:
    """Per stage count, depths in rising order until a task is killed for memory (once
    each: the kill is a fact, not a rate; ``reps`` is unused)."""
    rows = []
    for stages in STAGES:
        trained: list[int] = []
        killed = None
        for layers in DEPTHS:
            nodes = "2" if stages == 4 else "1"  # the lab's nodes have 2 CPUs: 2 tasks each
            run = train(work, f"largest-{stages}-{layers}", layers, "--pipeline", str(stages),
                        "--nodes", nodes, "--tasks-per-node", str(min(stages, 2)),
                        "--microbatches", str(max(4, stages)))
            if run["state"] != "COMPLETED":
                killed = {"layers": layers, "state": run["state"], "why": run["why"]}
                break
            trained.append(layers)
        rows.append({"stages": stages, "largest_trained": max(trained) if trained else None,
                     "first_killed": killed, "tried": list(DEPTHS)})
    return {"rows": rows, "memory_per_task": "1 GiB (the lab's DefMemPerCPU, one CPU a task)"}


PARTS = {"split": bench_split, "bubble": bench_bubble, "nodes": bench_nodes,
         "largest": bench_largest}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated: " + ",".join(PARTS))
    args = parser.parse_args()
    lab.wait_for_idle_queue()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pyhpc-bench-deep-") as tmp:
        work = Path(tmp)
        for part in args.only.split(","):
            fn = PARTS[part]
            figures[part] = fn(work, args.reps)
            print(json.dumps({part: figures[part]}, indent=1), flush=True)
    print(record.write("deep", record.carried(figures, record.read("deep"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
