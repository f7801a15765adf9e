#!/usr/bin/env python3
"""Container overhead on the lab: the reference job in the image vs the same job bare.

One run measures everything: a rebuild of the CPU image (`pyhpc containers build
--force`: build time, image and rootfs size), then the 2-node data-parallel reference
job (pyhpc.train, synthetic mode) alternately bare (ddp-srun) and in the image
(container), REPEATS times each. Overhead = median over the (bare, container) pairs of
container throughput / bare throughput (target >= 0.97). Writes bench/results/containers.json.

Usage: /opt/pyhpc/venv/bin/python bench/containers.py [--repeats N] [--no-rebuild|--from-scratch]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYHPC = "/opt/pyhpc/venv/bin/pyhpc"
IMAGE_DIR = Path("/opt/pyhpc/images/pyhpc-cpu")
RESULT = ROOT / "bench" / "results" / "containers.json"
TARGET = 0.97


def pyhpc(cwd: Path, *args: str, timeout: int = 1800, cli: tuple[str, ...] = (PYHPC,)) -> str:
    proc = subprocess.run([*cli, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"bench/containers.py: pyhpc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def forget_build() -> None:
    """Remove the base image, the image and the wheel cache: the next build starts cold (as in CI)."""
    podman = ["podman", "--storage-driver", "vfs", "--runtime", "runc", "--cgroup-manager", "cgroupfs",
              "--events-backend", "file"]
    for ref in ("localhost/pyhpc-cpu:latest", "localhost/pyhpc-base:bookworm"):
        subprocess.run([*podman, "rmi", "-f", ref], capture_output=True)
    subprocess.run([*podman, "image", "prune", "-f"], capture_output=True)
    subprocess.run(["rm", "-rf", "/var/cache/pyhpc/containers"], check=True)


def build(rebuild: bool) -> dict:
    start = time.monotonic()
    # This checkout's builder, as `make containers` runs it; jobs go through the deployed CLI.
    pyhpc(ROOT, "containers", "build", "--variant", "cpu", *(["--force"] if rebuild else []),
          cli=(sys.executable, "-m", "pyhpc"))
    wall = time.monotonic() - start
    record = json.loads((IMAGE_DIR / "image.json").read_text())
    return {
        "rebuilt_in_this_run": rebuild,
        "build_wall_seconds": round(wall, 1) if rebuild else None,
        "build_seconds_recorded": record["total_seconds"],
        "podman_build_seconds": record["build_seconds"],
        "base_bootstrap_seconds": record["base_seconds"],
        "image_size_bytes": record["image_size_bytes"],
        "image_size_mb": round(record["image_size_bytes"] / 1e6),
        "rootfs_bytes": record["rootfs_bytes"],
        "image_ref": record["ref"],
    }


def job(work: Path, template: str, tag: str, args: str) -> dict:
    run = work / tag
    out = pyhpc(work, "submit", template, "--nodes", "2", "--set", "module=pyhpc.train",
                "--set", f"args=--out {run} {args}", "--wait", "--json")
    result = json.loads(out)
    if result["state"] != "COMPLETED":
        sys.exit(f"bench/containers.py: {template} job {result['job_id']} ended {result['state']}")
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    return {"template": template, "job_id": result["job_id"], "samples_per_s": row["samples_per_s"],
            "loadavg_after": os.getloadavg()[0],
            "step_time_p50": row["step_time_p50"], "workers": row["workers"], "nodes": row["nodes"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="jobs per kind (alternating)")
    parser.add_argument("--no-rebuild", action="store_true", help="reuse the image; build time from its record")
    parser.add_argument("--from-scratch", action="store_true",
                        help="build cold: no base image, no wheel cache (what a fresh CI machine does)")
    parser.add_argument("--train-args", default="--mode synthetic --synthetic-samples 2048 --epochs 2")
    args = parser.parse_args()

    if args.from_scratch:
        forget_build()
    image = build(rebuild=not args.no_rebuild)
    image["from_scratch"] = args.from_scratch
    print(f"image: {image['image_size_mb']} MB, build {image['build_seconds_recorded']} s "
          f"(podman build {image['podman_build_seconds']} s)")
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-containers-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        for i in range(args.repeats):
            for template in ("ddp-srun", "container"):
                row = job(work, template, f"{template}-{i}", args.train_args)
                print(f"  {template:9s} job {row['job_id']}: {row['samples_per_s']:.0f} samples/s")
                runs.append(row)
    bares = [r["samples_per_s"] for r in runs if r["template"] == "ddp-srun"]
    boxes = [r["samples_per_s"] for r in runs if r["template"] == "container"]
    bare, boxed = statistics.median(bares), statistics.median(boxes)
    # Each container job runs right after its bare twin: the median of the pair ratios is
    # the figure least disturbed by other load on this shared 2-core machine.
    pairs = [c / b for b, c in zip(bares, boxes)]
    ratio = statistics.median(pairs)
    result = {
        "benchmark": "containers",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": f"{platform.node()}, {platform.machine()}, lab cluster (2 emulated CPU nodes)",
        "workload": f"pyhpc.train {args.train_args}, 2 nodes x 1 task, gloo",
        "image": image,
        "throughput": {"bare_median_samples_per_s": round(bare, 1),
                       "container_median_samples_per_s": round(boxed, 1),
                       "container_over_bare": round(ratio, 4), "target": TARGET,
                       "pair_ratios": [round(x, 4) for x in pairs],
                       "ratio_of_medians": round(boxed / bare, 4),
                       "ratio_of_best": round(max(boxes) / max(bares), 4),
                       "meets_target": ratio >= TARGET, "repeats": args.repeats},
        "runs": runs,
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"container/bare throughput: {ratio:.3f} (target >= {TARGET}); bare {bare:.0f}, "
          f"container {boxed:.0f} samples/s -> {RESULT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
