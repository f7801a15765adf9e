"""Job benchmarks on the lab cluster; prints figures, writes benchmarks/results/jobs.json.

(a) submit latency: ``pyhpc submit`` to RUNNING vs plain ``sbatch`` of the same
    rendered script (ratio of medians, target <= 1.2);
(b) harness overhead: samples/s the metrics harness reports vs a stopwatch around
    the same training loop (pyhpc.train.train_epoch) without per-step timing; epochs
    alternate between the two in one lab job (ratio of medians, >= 0.99);
(c) Slurm queries per poll while watching 100 jobs (every process spawned is
    counted; target 1).

Run with ``make bench`` (needs the lab: ``make deploy``).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import lab, record
from pyhpc.slurm import slurm

ROOT = record.ROOT
PYHPC = "/opt/pyhpc/venv/bin/pyhpc"
JOB_PYTHON = "/opt/pyhpc/venv/bin/python"


def _squeue_state(job_id: str) -> str:
    return lab.output(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).strip() or "GONE"


def _until_running(start: float, job_id: str, timeout: float = 60.0) -> float:
    """Seconds from ``start`` until squeue shows the job RUNNING (polled every 20 ms)."""
    while True:
        state = _squeue_state(job_id)
        if state in ("RUNNING", "COMPLETING", "GONE"):
            return time.perf_counter() - start
        if time.perf_counter() - start > timeout:
            raise RuntimeError(f"job {job_id} not running after {timeout}s ({state})")
        time.sleep(0.02)


def _wait_idle(timeout: float = 60.0) -> None:
    """Wait until no job of ours is queued, so each sample starts from the same state."""
    lab.wait_for(lab.queued("bench-submit"), timeout)


def bench_submit(work: Path, reps: int) -> dict[str, Any]:
    sets = ["--set", "command=sleep 30", "--set", "job_name=bench-submit"]
    script = work / "bench-submit.sbatch"
    script.write_text(subprocess.run([PYHPC, "render", "single", *sets], cwd=work,
                                     capture_output=True, text=True, check=True).stdout)
    samples: dict[str, list[float]] = {"pyhpc_submit_s": [], "sbatch_s": []}
    for _ in range(reps):
        for key in ("sbatch_s", "pyhpc_submit_s"):  # alternate, so drift hits both alike
            _wait_idle()
            time.sleep(2)  # let the freed node settle (epilog) before the next sample
            start = time.perf_counter()
            if key == "sbatch_s":  # baseline: raw sbatch is what pyhpc submit is measured against
                cmd = ["sbatch", "--parsable", str(script)]
            else:
                cmd = [PYHPC, "submit", "single", *sets]
            job_id = subprocess.run(cmd, cwd=work, capture_output=True, text=True,
                                    check=True).stdout.strip().split(";")[0]
            samples[key].append(_until_running(start, job_id))
            slurm.cancel([job_id])
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {"reps": reps, "samples": samples, **{f"median_{k}": v for k, v in med.items()},
            "ratio": med["pyhpc_submit_s"] / med["sbatch_s"], "target": "<= 1.2"}


def overhead_in_job(reps: int, out: Path) -> dict[str, Any]:
    """Inside the lab job: alternate epochs of pyhpc.train.train_epoch with the harness's
    step timer and without it (a stopwatch only), on one model, in ABBA order."""
    import socket

    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from pyhpc import dist
    from pyhpc.train import loop as train
    from pyhpc.train import metrics
    from pyhpc.train.config import TrainConfig

    warmup, batch = 5, 32
    cfg = TrainConfig(out=str(out), mode="synthetic", synthetic_samples=4096, batch_size=batch)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    info = dist.setup()
    train_set, _, model = train.datasets(cfg)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    loader = DataLoader(train_set, batch_size=batch, shuffle=True, drop_last=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    env = metrics.Environment(torch.__version__, info.backend, "bench", [socket.gethostname()],
                              batch, mode="synthetic", model="WideCNN")
    rates: dict[str, list[float]] = {"harness": [], "plain": []}
    train.train_epoch(ddp, loader, opt, loss_fn, None)  # warm the process up
    for i in range(reps):
        for timed in ((True, False) if i % 2 else (False, True)):
            timer = metrics.StepTimer() if timed else None
            result = train.train_epoch(ddp, loader, opt, loss_fn, timer, skip=warmup)
            if timer is not None:
                ranks = [metrics.RankTimes(0, env.nodes[0], timer.times)]
                rates["harness"].append(metrics.summarize(ranks, warmup, env).samples_per_s)
            else:
                rates["plain"].append((result.steps - warmup) * batch / result.plain_s)
    dist.teardown()
    med = {k: statistics.median(v) for k, v in rates.items()}
    paired = [h / p for h, p in zip(rates["harness"], rates["plain"], strict=True)]
    return {"reps": reps, "samples_per_s": rates, "median_harness": med["harness"],
            "median_plain": med["plain"], "ratio": med["harness"] / med["plain"],
            "median_paired_ratio": statistics.median(paired),
            "best_ratio": max(rates["harness"]) / max(rates["plain"]),
            "method": "ratio of medians over epochs alternated ABBA in one process",
            "target": ">= 0.99",
            "workload": f"synthetic WideCNN, epochs of {len(loader)} steps ({warmup} warm-up), "
                        f"batch {batch}, 1 thread"}


def bench_overhead(work: Path, reps: int) -> dict[str, Any]:
    """Run :func:`overhead_in_job` as a one-task job on a lab compute node."""
    out = work / "overhead"
    # The job imports pyhpc (and this module) from this checkout: the figure is for the code
    # under test.
    proc = slurm.srun(["-N1", "-n1", "-J", "bench-overhead", "-t", "10", f"--chdir={work}",
                       f"--export=ALL,PYTHONPATH={ROOT}", JOB_PYTHON, "-m", "benchmarks.jobs",
                       "--overhead-job", str(out), "--reps", str(reps)], timeout_s=580)
    if proc.returncode != 0:
        raise RuntimeError(f"overhead job failed:\n{proc.stdout}\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _sbatch_tiny() -> str:
    """A job that runs ``true`` (slurm.run retries while slurmctld is busy)."""
    out = lab.output(["sbatch", "--parsable", "-J", "bench-watch", "-o", "/dev/null", "--wrap", "true"])
    return out.strip().split(";")[0]


def bench_watch(jobs: int, interval_s: float = 1.0, timeout_s: float = 240.0) -> dict[str, Any]:
    """Submit ``jobs`` tiny jobs and watch them to the end with pyhpc.watch.watch,
    counting every process spawned while watching and, separately, the polls."""
    from pyhpc.slurm import watch

    ids = [_sbatch_tiny() for _ in range(jobs)]
    spawned: list[list[str]] = []
    real_popen = subprocess.Popen

    class CountingPopen(real_popen):  # type: ignore[misc, valid-type]  # a subclass of Popen
        def __init__(self, args: Any, *a: Any, **kw: Any) -> None:
            spawned.append(list(args))
            super().__init__(args, *a, **kw)

    polls, start = 0, time.monotonic()
    seen: set[str] = set()
    real_query = watch.query

    def counted_query(*args: Any, **kwargs: Any) -> dict[str, str]:
        nonlocal polls
        polls += 1
        result = real_query(*args, **kwargs)
        seen.update(result.values())
        return result

    subprocess.Popen = CountingPopen  # type: ignore[misc]  # counting, put back below
    watch.query = counted_query
    try:
        states = watch.watch(ids, interval_s=interval_s, timeout_s=timeout_s, quiet=True)
    finally:
        subprocess.Popen = real_popen  # type: ignore[misc]  # put back
        watch.query = real_query
        lab.cancel("bench-watch")
    return {"jobs": len(ids), "polls": polls, "processes_spawned": len(spawned),
            "queries_per_poll": len(spawned) / polls, "commands": sorted({c[0] for c in spawned}),
            "states_seen": sorted(seen), "final_states": dict(sorted(Counter(states.values()).items())),
            "watch_s": round(time.monotonic() - start, 1), "target": "1"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=15, help="epochs of each kind for (b)")
    parser.add_argument("--overhead-job", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.overhead_job:
        print(json.dumps(overhead_in_job(args.reps, Path(args.overhead_job))))
        return 0
    for tool in ("sbatch", "srun", "squeue", "sacct"):
        if not shutil.which(tool):
            sys.exit(f"benchmarks.jobs: {tool} not found: deploy the lab first (make deploy)")
    work = Path(tempfile.mkdtemp(prefix="pyhpc-bench-"))
    work.chmod(0o755)
    submit = bench_submit(work, 7)
    print(f"(a) submit -> RUNNING: pyhpc submit {submit['median_pyhpc_submit_s']:.3f} s, "
          f"sbatch {submit['median_sbatch_s']:.3f} s, ratio {submit['ratio']:.2f} (target <= 1.2)")
    overhead = bench_overhead(work, args.reps)
    print(f"(b) samples/s (median of {overhead['reps']} epochs each): harness "
          f"{overhead['median_harness']:.1f}, uninstrumented {overhead['median_plain']:.1f}, "
          f"ratio {overhead['ratio']:.3f} (target >= 0.99; median paired ratio "
          f"{overhead['median_paired_ratio']:.3f})")
    watched = bench_watch(100)
    print(f"(c) watching {watched['jobs']} jobs: {watched['queries_per_poll']:.0f} Slurm "
          f"query per poll ({watched['processes_spawned']} processes in {watched['polls']} polls)")
    passed = {"submit_ratio": submit["ratio"] <= 1.2, "harness_ratio": overhead["ratio"] >= 0.99,
              "queries_per_poll": watched["queries_per_poll"] == 1}
    result = {
        "cluster": "lab (4 emulated nodes on one 2-core machine)",
        "submit_to_running": submit, "harness_overhead": overhead, "watch_queries": watched,
        "pass": passed,
    }
    print(f"wrote {record.write('jobs', result).relative_to(ROOT)}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(passed.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
