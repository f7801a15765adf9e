"""Benchmark how pyhpc's and Slurm's costs grow with the cluster (issue 12): `make bench-scale`.

On the single-host lab, in one run, each figure side by side with its baseline:

deploy      fresh deploy and idempotent re-run of definitions with 4, 16 and 64 emulated
            GPU nodes (4 stand-in GPUs each); memory per slurmd at each size
srun        `srun -N k true` for k = 1, 4, 16, 64 on the 64-node definition (median of 5)
submit      1,000 jobs five ways into a DOWN partition (accepted, never started, so only
            the client and slurmctld's intake are timed): `pyhpc submit` in a loop,
            `pyhpc submit --array 0-999`, pyhpc.submit_array (one batch), a raw
            `sbatch` loop, one `sbatch --array=0-999`
complete    1,000 trivial array tasks from submit to all COMPLETED in sacct, with
            `tuning: high_throughput` and without
status      `pyhpc status` on 100 and 1,000 queued jobs: Slurm calls per poll, latency
ddp         time to rank 0's first optimizer step of `pyhpc train` on 1, 2, 4, 8 nodes,
            broken into queue wait, launch, interpreter+imports, rendezvous and first
            step, next to a bare torch.distributed hello world (benchmarks/ddp_hello.py)

Writes benchmarks/results/scale.json and docs/scale-*.png. Takes the lab for about 30
minutes and redeploys the stock lab at the end (also when a step fails). Slurm is asked
through pyhpc's Slurm module (benchmarks.lab); the raw sbatch and srun it measures pyhpc
against are marked ``# baseline:``.

    python -m benchmarks.scale                   # everything
    python -m benchmarks.scale --parts srun,ddp  # some parts (those that need 64 nodes deploy it)
    python -m benchmarks.scale --plot            # redraw the plots from the JSON
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from benchmarks import lab, record
from benchmarks.deploy import RECAP, ROLE_TIME, changed_tasks, timed
from benchmarks.scale_plot import plot

ROOT = record.ROOT
LARGE = ROOT / "ansible" / "inventories" / "lab" / "ddl256.yml"
PYHPC = "/opt/pyhpc/venv/bin/pyhpc"
JOB_PYTHON = "/opt/pyhpc/venv/bin/python"
PARTS = ("deploy", "srun", "submit", "complete", "status", "ddp")
NODE_COUNTS = (4, 16, 64)
SRUN_NODES = (1, 4, 16, 64)
DDP_NODES = (1, 2, 4, 8)
JOBS = 1000
BENCH_PARTITION = "gpu"
DEPLOY_TIMEOUT_S = 1800.0


# ---------------------------------------------------------------- pure parts (unit-tested)

def definition(nodes: int, tuning: bool = True, large: Path = LARGE) -> dict[str, Any]:
    """The large definition cut to ``nodes`` GPU nodes (its 4 CPU nodes kept)."""
    doc = yaml.safe_load(large.read_text())
    out: dict[str, Any] = copy.deepcopy(doc)
    for group in out["nodes"]:
        if group["name"] == "gpu":
            group["count"] = nodes
    for part in out["partitions"]:
        if part["name"] == "gpu":
            part["nodes"] = [f"gpu{i}" for i in range(1, nodes + 1)]
    if not tuning:
        out.pop("tuning", None)
    return out


def ratio(value: float, base: float) -> float | None:
    return round(value / base, 3) if base else None


def growth(points: dict[int, float]) -> float | None:
    """Least-squares slope of log(cost) on log(size): 1 is linear, below 1 sublinear."""
    pts = [(float(k), v) for k, v in sorted(points.items()) if v > 0]
    if len(pts) < 2:
        return None
    import math

    xs = [math.log(k) for k, _ in pts]
    ys = [math.log(v) for _, v in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den, 3) if den else None


def phases(marks: list[dict[str, float]], submit: float, start: float) -> dict[str, float]:
    """Seconds of each phase to rank 0's first step, from Slurm's submit and start times
    and every rank's marks (the slowest rank bounds launch, imports and rendezvous)."""
    first = min(marks, key=lambda m: m.get("rank", 0))
    launched = max(m["process_start"] for m in marks)
    imported = max(m["imported"] for m in marks)
    met = max(m["rendezvous_done"] for m in marks)
    return {
        "queue_wait_s": round(start - submit, 3),
        "launch_s": round(launched - start, 3),
        "interpreter_and_imports_s": round(imported - launched, 3),
        "rendezvous_s": round(met - imported, 3),
        "first_step_s": round(first["first_step"] - met, 3),
        "from_start_s": round(first["first_step"] - start, 3),
        "total_s": round(first["first_step"] - submit, 3),
    }


def rate(jobs: int, seconds: float) -> float:
    return round(jobs / seconds, 2) if seconds > 0 else 0.0


# ---------------------------------------------------------------- lab steps

def sh(argv: list[str], check: bool = True, **kw: Any) -> str:
    """A command that is not a Slurm query (make, the pyhpc CLI, a measured baseline)."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if check and proc.returncode != 0:
        raise SystemExit(f"benchmarks.scale: {' '.join(argv[:6])} exited {proc.returncode}: "
                         f"{proc.stderr.strip()[-500:]}")
    out: str = proc.stdout
    return out


def deploy(cluster_file: Path) -> tuple[float, str]:
    """``make deploy CLUSTER=...``, with each role's time in the output (profile_roles)."""
    env = dict(os.environ, ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_roles")
    wall, out = timed(["make", "--no-print-directory", "deploy", f"CLUSTER={cluster_file}"],
                      env=env, timeout=DEPLOY_TIMEOUT_S)
    return wall, out


def write_definition(work: Path, nodes: int, tuning: bool = True) -> Path:
    path = work / f"scale-{nodes}{'' if tuning else '-untuned'}.yml"
    path.write_text(yaml.safe_dump(definition(nodes, tuning), sort_keys=False))
    return path


def slurmd_memory() -> dict[str, Any]:
    """Resident and proportional memory of the lab's slurmd daemons (by pid file: hostlab's
    slurmd in containers are processes of this machine too)."""
    nodes = Path("/etc/slurm/lab-nodes").read_text().split()
    pids = [Path(f"/run/slurmd-{n}.pid").read_text().strip() for n in nodes]
    rss, pss = [], []
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        fields = {line.split(":")[0]: int(line.split()[1]) for line in rollup.splitlines()[1:]}
        rss.append(fields["Rss"] / 1024)
        pss.append(fields["Pss"] / 1024)
    return {"slurmd": len(rss), "rss_mib_each": round(statistics.fmean(rss), 1) if rss else None,
            "pss_mib_each": round(statistics.fmean(pss), 1) if pss else None,
            "pss_mib_total": round(sum(pss), 1)}


def wait_idle(nodes: int) -> None:
    lab.wait_for_idle_nodes(BENCH_PARTITION, nodes)


def bench_deploy(work: Path) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for n in NODE_COUNTS:
        path = write_definition(work, n)
        sh(["make", "--no-print-directory", "-s", "undeploy"], cwd=ROOT)
        fresh_s, _ = deploy(path)
        rerun_s, out = deploy(path)
        wait_idle(n)
        runs.append({"nodes": n, "fresh_s": round(fresh_s, 1), "rerun_s": round(rerun_s, 1),
                     "rerun_changed": [int(c) for c in RECAP.findall(out)],
                     "rerun_changed_tasks": changed_tasks(out),
                     "rerun_roles_s": {r: float(t) for r, t in ROLE_TIME.findall(out)},
                     "memory": slurmd_memory()})
    base = runs[0]
    for r in runs:
        r["fresh_ratio"] = ratio(r["fresh_s"], base["fresh_s"])
        r["rerun_ratio"] = ratio(r["rerun_s"], base["rerun_s"])
    return {"runs": runs,
            "growth": {"fresh": growth({r["nodes"]: r["fresh_s"] for r in runs}),
                       "rerun": growth({r["nodes"]: r["rerun_s"] for r in runs})},
            "target": "re-run on 64 nodes <= 2x the re-run on 4",
            "met": runs[-1]["rerun_ratio"] is not None and runs[-1]["rerun_ratio"] <= 2.0,
            "method": "make undeploy (daemons stopped, packages and state kept), then a deploy "
                      "of the definition and a second one; nodes are GPU nodes plus 4 CPU nodes"}


def bench_srun(reps: int = 5) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for k in SRUN_NODES:
        samples: list[float] = []
        for _ in range(reps):
            start = time.perf_counter()
            # baseline: Slurm's own launch time is the figure
            sh(["srun", "-p", BENCH_PARTITION, "-N", str(k), "-n", str(k), "-t", "2", "true"])
            samples.append(time.perf_counter() - start)
        rows.append({"nodes": k, "samples_s": [round(s, 3) for s in samples],
                     "median_s": round(statistics.median(samples), 3)})
    for r in rows:
        r["ratio"] = ratio(r["median_s"], rows[0]["median_s"])
    return {"rows": rows, "growth": growth({r["nodes"]: r["median_s"] for r in rows})}


def _partition(state: str) -> None:
    lab.partition_state(BENCH_PARTITION, state)


def _cancel(name: str) -> None:
    lab.cancel(name)


def _noop(i: int) -> int:
    return i


def _submit_ways(work: Path, jobs: int) -> dict[str, tuple[float, int]]:
    """Seconds and jobs accepted for each way of submitting ``jobs`` jobs."""
    import pyhpc

    out: dict[str, tuple[float, int]] = {}
    base = ["-p", BENCH_PARTITION, "-o", "/dev/null", "-t", "1"]
    start = time.perf_counter()
    for _ in range(jobs):  # baseline: the raw sbatch loop pyhpc submit is measured against
        sh(["sbatch", "--parsable", "-J", "bs-sbatch", *base, "--wrap", "true"])
    out["sbatch_loop"] = (time.perf_counter() - start, jobs)
    _cancel("bs-sbatch")
    start = time.perf_counter()
    for _ in range(jobs):
        sh([PYHPC, "submit", "single", "--set", "command=true", "--partition", BENCH_PARTITION,
            "--job-name", "bs-pyhpc", "--time", "00:01:00"], cwd=work)
    out["pyhpc_submit_loop"] = (time.perf_counter() - start, jobs)
    _cancel("bs-pyhpc")
    start = time.perf_counter()
    sh([PYHPC, "submit", "single", "--set", "command=true", "--partition", BENCH_PARTITION,
        "--job-name", "bs-cliarr", "--time", "00:01:00", "--array", f"0-{jobs - 1}"], cwd=work)
    out["pyhpc_submit_array_cli"] = (time.perf_counter() - start, jobs)
    _cancel("bs-cliarr")
    start = time.perf_counter()
    handles = pyhpc.submit_array(_noop, list(range(jobs)), partition=BENCH_PARTITION,
                                 name="bs-api", time="00:01:00", folder=work / "api" / "%j")
    out["pyhpc_submit_array"] = (time.perf_counter() - start, len(handles))
    _cancel("bs-api")
    start = time.perf_counter()
    # baseline: one raw sbatch --array, measured against pyhpc's arrays
    sh(["sbatch", "--parsable", "-J", "bs-array", f"--array=0-{jobs - 1}", *base, "--wrap", "true"])
    out["sbatch_array"] = (time.perf_counter() - start, jobs)
    _cancel("bs-array")
    return out


def bench_submit(work: Path, jobs: int = JOBS) -> dict[str, Any]:
    _partition("DOWN")
    try:
        ways = _submit_ways(work, jobs)
    finally:
        _partition("UP")
    base = rate(ways["sbatch_loop"][1], ways["sbatch_loop"][0])
    rows = {k: {"jobs": n, "seconds": round(s, 2), "jobs_per_s": rate(n, s),
                "ratio_to_sbatch_loop": ratio(rate(n, s), base)} for k, (s, n) in ways.items()}
    return {"ways": rows, "target": "pyhpc client-side throughput >= 0.9x raw sbatch",
            "method": f"{jobs} jobs each into partition {BENCH_PARTITION} set DOWN (queued, "
                      "never started), cancelled between ways; pyhpc submit renders the single "
                      "template and runs one process per job"}


def completion(jobs: int, timeout: float = 900.0) -> float:
    """Seconds from sbatch to every task COMPLETED in sacct (polled every second)."""
    start = time.perf_counter()
    # baseline: Slurm's own throughput, tuned and not, is the figure
    job_id = sh(["sbatch", "--parsable", "-J", "bs-complete", f"--array=0-{jobs - 1}",
                 "-p", BENCH_PARTITION, "-o", "/dev/null", "-t", "1", "--wrap", "true"]).strip()
    while lab.completed(job_id)[0] < jobs:
        if time.perf_counter() - start > timeout:
            raise SystemExit(f"benchmarks.scale: {jobs} jobs not COMPLETED after {timeout:.0f} s")
        time.sleep(1)
    return time.perf_counter() - start


def bench_complete(work: Path, jobs: int = JOBS) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for tuned in (False, True):
        deploy(write_definition(work, NODE_COUNTS[-1], tuning=tuned))
        wait_idle(NODE_COUNTS[-1])
        seconds = completion(jobs)
        rows["high_throughput" if tuned else "default"] = {
            "seconds": round(seconds, 1), "jobs_per_s": rate(jobs, seconds)}
    rows["high_throughput"]["ratio_to_default"] = ratio(rows["high_throughput"]["jobs_per_s"],
                                                        rows["default"]["jobs_per_s"])
    return {"jobs": jobs, "runs": rows,
            "method": f"one --array=0-{jobs - 1} of `true`, from sbatch to all tasks COMPLETED "
                      "in sacct (polled every second), on 64 GPU + 4 CPU emulated nodes"}


def _poll_cost(ids: list[str], reps: int = 5) -> dict[str, Any]:
    """Slurm processes per poll and seconds per poll of pyhpc's watcher, and of the CLI."""
    from pyhpc.slurm import watch

    spawned: list[str] = []
    real = subprocess.Popen

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, args: Any, *a: Any, **kw: Any) -> None:
            spawned.append(str(args[0]))
            super().__init__(args, *a, **kw)

    samples = []
    subprocess.Popen = Counting  # type: ignore[misc]
    try:
        for _ in range(reps):
            tracker = watch.Tracker(ids, "squeue")
            start = time.perf_counter()
            tracker.poll()
            tracker.states()
            samples.append(time.perf_counter() - start)
    finally:
        subprocess.Popen = real  # type: ignore[misc]
    cli = []
    for _ in range(reps):
        start = time.perf_counter()
        sh([PYHPC, "status", "--json", *ids[:200]])
        cli.append(time.perf_counter() - start)
    return {"jobs": len(ids), "calls_per_poll": len(spawned) / reps, "commands": sorted(set(spawned)),
            "poll_median_s": round(statistics.median(samples), 4),
            "cli_status_200_ids_median_s": round(statistics.median(cli), 3)}


def bench_status(jobs: int = JOBS) -> dict[str, Any]:
    _partition("DOWN")
    rows = []
    try:
        for n in (jobs // 10, jobs):
            job_id = lab.output(["sbatch", "--parsable", "-J", "bs-status", f"--array=0-{n - 1}", "-p",
                                 BENCH_PARTITION, "-o", "/dev/null", "-t", "1", "--wrap", "true"]).strip()
            rows.append(_poll_cost([f"{job_id}_{i}" for i in range(n)]))
            _cancel("bs-status")
    finally:
        _partition("UP")
    return {"rows": rows, "target": "1 Slurm query per poll",
            "met": all(r["calls_per_poll"] == 1 for r in rows),
            "method": "array tasks queued in a DOWN partition, watched by id; the CLI row is "
                      "`pyhpc status --json` with 200 ids (a whole process each time)"}


def _marks(path: Path) -> list[dict[str, float]]:
    """Every rank's marks from a startup.json (pyhpc.train's or benchmarks/ddp_hello.py's)."""
    return [{**r["marks"], "rank": r["rank"]} for r in json.loads(path.read_text())["ranks"]]


def _ddp_pyhpc(work: Path, k: int, rep: int) -> dict[str, float]:
    out = work / f"train-{k}-{rep}"  # a fresh run directory: no checkpoint to resume
    res = json.loads(sh([PYHPC, "train", "--nodes", str(k), "--tasks-per-node", "1",
                         "--partition", BENCH_PARTITION, "--mode", "digits", "--epochs", "1",
                         "--out", str(out), "--wait", "--json"],
                        cwd=work))
    marks = _marks(out / "startup.json")
    submit, start = lab.submit_and_start(str(res["job_id"]))
    return phases(marks, submit, start)


def _ddp_bare(work: Path, k: int, rep: int) -> dict[str, float]:
    out = work / f"hello-{k}-{rep}.json"
    script = work / f"hello-{k}.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -N {k}\n#SBATCH --ntasks-per-node=1\n#SBATCH -p {BENCH_PARTITION}\n"
        f"#SBATCH -o {work}/hello-{k}.log\n#SBATCH -t 5\n"
        "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)\n"
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))\n"
        f"srun {JOB_PYTHON} {ROOT}/benchmarks/ddp_hello.py {out}\n")
    # baseline: bare torch.distributed under raw sbatch + srun, pyhpc train's floor
    job_id = sh(["sbatch", "--parsable", "--wait", str(script)], cwd=work).strip()
    marks = _marks(out)
    submit, start = lab.submit_and_start(job_id)
    return phases(marks, submit, start)


def bench_ddp(work: Path, reps: int = 3) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for k in DDP_NODES:
        runs: dict[str, list[dict[str, float]]] = {"pyhpc": [], "bare": []}
        for rep in range(reps):  # ABBA: whichever runs second may wait for the first's epilog
            for kind in (("bare", "pyhpc") if rep % 2 == 0 else ("pyhpc", "bare")):
                fn = _ddp_bare if kind == "bare" else _ddp_pyhpc
                runs[kind].append(fn(work, k, rep))
        med = {kind: {key: round(statistics.median(r[key] for r in rs), 3) for key in rs[0]}
               for kind, rs in runs.items()}
        # Queue wait is Slurm's (and whole seconds in sacct): the share is from job start.
        share = round(med["pyhpc"]["from_start_s"] - med["bare"]["from_start_s"], 3)
        rows.append({"nodes": k, "pyhpc": med["pyhpc"], "bare": med["bare"],
                     "pyhpc_minus_bare_s": share})
    return {"rows": rows, "reps": reps, "target": "pyhpc's share < 1 s above bare torch.distributed",
            "met": all(r["pyhpc_minus_bare_s"] < 1.0 for r in rows),
            "method": "median of reps, bare and pyhpc in ABBA order; pyhpc_minus_bare_s compares "
                      "from_start_s (job start to rank 0's first step); one task per node; pyhpc: "
                      "`pyhpc train --epochs 1` (digits); bare: benchmarks/ddp_hello.py "
                      "(torch only, gloo, one DDP step) under sbatch+srun; Submit/Start from "
                      "sacct (whole seconds), marks are each rank's wall clock"}


# ---------------------------------------------------------------- driver

def needs_large(parts: list[str]) -> bool:
    return any(p in parts for p in ("srun", "submit", "status", "ddp"))


def run(parts: list[str], work: Path, jobs: int = JOBS) -> dict[str, Any]:
    """The parts asked for, over the figures of the last run (the others are kept)."""
    result: dict[str, Any] = record.read("scale").get("figures", {})
    if "deploy" in parts:
        result["deploy"] = bench_deploy(work)
    if needs_large(parts):
        deploy(write_definition(work, NODE_COUNTS[-1]))
        wait_idle(NODE_COUNTS[-1])
    steps: tuple[tuple[str, Callable[[], dict[str, Any]]], ...] = (
        ("srun", bench_srun), ("submit", lambda: bench_submit(work, jobs)),
        ("status", lambda: bench_status(jobs)), ("ddp", lambda: bench_ddp(work)))
    for name, fn in steps:
        if name in parts:
            result[name] = fn()
            record.write("scale", result)  # each part kept as soon as it is measured
    if "complete" in parts:
        result["complete"] = bench_complete(work, jobs)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"from {','.join(PARTS)}")
    parser.add_argument("--plot", action="store_true", help="redraw the plots from the JSON")
    parser.add_argument("--no-restore", action="store_true", help="leave the large lab up")
    parser.add_argument("--jobs", type=int, default=JOBS, help="jobs per throughput run")
    args = parser.parse_args()
    if args.plot:
        for path in plot(record.read("scale")["figures"]):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        sys.exit(f"benchmarks.scale: error: --parts: {', '.join(unknown)} not allowed; "
                 f"allowed: {', '.join(PARTS)}")
    work = Path(tempfile.mkdtemp(prefix="pyhpc-scale-"))
    work.chmod(0o755)
    try:
        result = run(parts, work, args.jobs)
    finally:
        if not args.no_restore:
            timed(["make", "--no-print-directory", "deploy"], timeout=DEPLOY_TIMEOUT_S)
    record.write("scale", result)
    for path in plot(result):
        print(f"wrote {path.relative_to(ROOT)}")
    print(json.dumps({k: result[k].get("met") for k in PARTS if k in result
                      and isinstance(result[k], dict)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
