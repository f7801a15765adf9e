"""Monitoring's cost on the lab (issue 25): `make bench-monitoring`.

overhead   a training job's samples/s with the monitoring running (Prometheus scraping
           node_exporter and pyhpc's exporters every scrape interval) against without it
           (their services stopped), alternated ABBA, one lab job per sample: ratio of
           medians, target >= 0.99
scrape     each exporter scraped directly (Prometheus stopped meanwhile, so only these
           scrapes run): wall time and the exporter process's CPU time per scrape
           (/proc/PID/stat), at 4 nodes (the lab) and 68 (ansible/inventories/lab/ddl256.yml),
           every node running one job
commands   Slurm commands the Slurm exporter runs per scrape (its own metric,
           pyhpc_exporter_scrape_slurm_commands) with 0 and 1,000 jobs queued: 1 of each

Writes benchmarks/results/monitoring.json. Takes the lab for about 20 minutes: deploys
ddl256 and redeploys the stock lab at the end (also when a step fails). Stops and starts
the monitoring's services through their pid-file init scripts (this lab has no systemd),
and starts them all again whatever happens. Slurm is asked through pyhpc's Slurm module
(benchmarks.lab); the jobs it sizes the cluster with are plain sbatch.

    python -m benchmarks.monitoring                         # everything
    python -m benchmarks.monitoring --parts overhead        # some parts
"""
from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks import lab, record
from benchmarks.deploy import timed
from pyhpc import cluster, paths
from pyhpc.slurm import slurm

ROOT = record.ROOT
LARGE = ROOT / "ansible" / "inventories" / "lab" / "ddl256.yml"
JOB_PYTHON = "/opt/pyhpc/venv/bin/python"
PARTS = ("overhead", "scrape", "commands")
DEPLOY_TIMEOUT_S = 1800.0
#: The monitoring's services on the lab: stopped for the "without" samples.
SERVICES = ("prometheus", "pyhpc-job-exporter", "pyhpc-slurm-exporter", "prometheus-node-exporter")
#: Each exporter's pid file (Debian's init scripts' and pyhpc's).
PID_FILES = {"node": "/run/prometheus/prometheus-node-exporter.pid",
             "slurm": "/run/pyhpc-slurm-exporter.pid", "jobs": "/run/pyhpc-job-exporter.pid"}
COMMANDS = ("squeue", "scontrol", "sdiag", "sacct")
SCRAPES = 20


# ---------------------------------------------------------------- pure parts (unit-tested)

def abba(reps: int) -> list[bool]:
    """The order of samples, True with the monitoring running: A B, B A, A B, ..."""
    return [on for i in range(reps) for on in ((True, False) if i % 2 == 0 else (False, True))]


def cpu_seconds(stat: str, ticks: int) -> float:
    """utime + stime of a /proc/PID/stat line and cutime + cstime, its waited-for children's
    (the Slurm exporter's squeue, scontrol, sdiag, sacct), in seconds (the comm may hold
    spaces)."""
    fields = stat.rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / ticks


def commands_per_scrape(metrics: str) -> dict[str, float]:
    """The Slurm exporter's own count of the commands its scrape ran."""
    return {m[1]: float(m[2]) for m in re.finditer(
        r'^pyhpc_exporter_scrape_slurm_commands\{command="(\w+)"\} (\S+)$', metrics, re.M)}


def ratio(on: list[float], off: list[float]) -> float:
    return statistics.median(on) / statistics.median(off)


# ---------------------------------------------------------------- lab steps

def sh(argv: list[str], check: bool = True) -> str:
    """A command that is not a Slurm query (service, make)."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"benchmarks.monitoring: {' '.join(argv)} exited {proc.returncode}: "
                         f"{proc.stderr.strip()[-500:]}")
    return proc.stdout


def services(action: str, names: tuple[str, ...] = SERVICES) -> None:
    for name in names:
        sh(["service", name, action])


def ports() -> dict[str, int]:
    mon = cluster.load(paths.LAB_CLUSTER).monitoring
    return {"node": mon.node_exporter_port, "slurm": mon.slurm_exporter_port,
            "jobs": mon.job_exporter_port}


#: The exporters answer over TLS to Prometheus' client certificate only (root reads its key).
TLS = Path("/etc/pyhpc/monitoring")


def scrape(port: int) -> tuple[float, str]:
    context = ssl.create_default_context(cafile=str(TLS / "ca.crt"))
    context.load_cert_chain(str(TLS / "monitoring.crt"), str(TLS / "prometheus.key"))
    start = time.perf_counter()
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=60,
                                context=context) as answer:
        body = answer.read().decode()
    return time.perf_counter() - start, body


def train_in_job(epochs: int) -> dict[str, Any]:
    """Inside the lab job: samples/s of a synthetic WideCNN over ``epochs`` timed epochs
    (after one warm-up epoch), as pyhpc.train.train_epoch runs them."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from pyhpc import dist
    from pyhpc.train import loop as train
    from pyhpc.train.config import TrainConfig

    warmup, batch = 5, 32
    cfg = TrainConfig(out=tempfile.mkdtemp(), mode="synthetic", synthetic_samples=2048,
                      batch_size=batch)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.setup()
    train_set, _, model = train.datasets(cfg)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    loader = DataLoader(train_set, batch_size=batch, shuffle=True, drop_last=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    train.train_epoch(ddp, loader, opt, loss_fn, None)  # warm the process up
    rates = []
    for _ in range(epochs):
        result = train.train_epoch(ddp, loader, opt, loss_fn, None, skip=warmup)
        rates.append((result.steps - warmup) * batch / result.plain_s)
    dist.teardown()
    return {"samples_per_s": statistics.median(rates), "epochs": rates}


def sample(work: Path, epochs: int) -> float:
    """One training job on a lab node: its median samples/s."""
    proc = slurm.srun(["-N1", "-n1", "-J", "bench-monitoring", "-t", "10", f"--chdir={work}",
                       f"--export=ALL,PYTHONPATH={ROOT}", JOB_PYTHON, "-m",
                       "benchmarks.monitoring", "--train-job", str(epochs)], timeout_s=580)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.monitoring: training job failed:\n{proc.stderr[-2000:]}")
    rate: float = json.loads(proc.stdout.strip().splitlines()[-1])["samples_per_s"]
    return rate


def bench_overhead(work: Path, reps: int, epochs: int, settle_s: float = 15.0) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"with": [], "without": []}
    try:
        for on in abba(reps):
            services("start" if on else "stop")
            time.sleep(settle_s)  # a few scrapes (or none) before the job starts
            rates["with" if on else "without"].append(sample(work, epochs))
    finally:
        services("start")
    value = ratio(rates["with"], rates["without"])
    return {"reps": reps, "samples_per_s": rates, "median_with": statistics.median(rates["with"]),
            "median_without": statistics.median(rates["without"]), "ratio": value,
            "method": "one 1-task lab job per sample, monitoring on and off alternated ABBA; "
                      "ratio of medians", "target": ">= 0.99", "met": value >= 0.99}


def fill(definition: cluster.Cluster) -> str:
    """One exclusive sleeping job on each node of every partition (the job exporter's work)."""
    nodes = len(definition.nodes)
    partitions = ",".join(p.name for p in definition.partitions)
    out = lab.output(["sbatch", "--parsable", f"--array=0-{nodes - 1}", "--exclusive", "-N1",
                      "-p", partitions, "-J", "bench-monitoring-fill", "-t", "15",
                      "-o", "/dev/null", "--wrap", "sleep 900"])
    job = out.strip().split(";")[0]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        running = lab.output(["squeue", "-h", "-j", job, "-t", "RUNNING", "-o", "%i"]).split()
        if len(running) >= nodes:
            return job
        time.sleep(2)
    raise SystemExit(f"benchmarks.monitoring: {nodes} fill jobs not running after 300 s")


def scrape_costs(definition: cluster.Cluster) -> dict[str, Any]:
    """Each exporter scraped :data:`SCRAPES` times, a job on every node, Prometheus stopped
    meanwhile."""
    ticks = os.sysconf("SC_CLK_TCK")
    fill(definition)
    out: dict[str, Any] = {"nodes": len(definition.nodes), "jobs": len(definition.nodes)}
    services("stop", ("prometheus",))
    try:
        for name, port in ports().items():
            pid = Path(PID_FILES[name]).read_text().strip()
            stat = Path(f"/proc/{pid}/stat")
            before = cpu_seconds(stat.read_text(), ticks)
            walls, size = [], 0
            for _ in range(SCRAPES):
                wall, body = scrape(port)
                walls.append(wall)
                size = len(body)
                time.sleep(0.5)
            cpu = (cpu_seconds(stat.read_text(), ticks) - before) / SCRAPES
            out[name] = {"scrapes": SCRAPES, "median_wall_s": statistics.median(walls),
                         "max_wall_s": max(walls), "cpu_s_per_scrape": cpu, "bytes": size}
    finally:
        services("start", ("prometheus",))
        lab.cancel("bench-monitoring-fill")
    return out


def bench_scrape(no_restore: bool) -> dict[str, Any]:
    small = scrape_costs(cluster.load(paths.LAB_CLUSTER))
    try:
        wall, _ = timed(["make", "--no-print-directory", "deploy", f"CLUSTER={LARGE}"],
                        timeout=DEPLOY_TIMEOUT_S)
        definition = cluster.load(LARGE)
        lab.wait_for_idle_nodes("gpu", len(definition.partition("gpu").nodes))
        large = scrape_costs(definition)
    finally:
        if not no_restore:
            timed(["make", "--no-print-directory", "deploy"], timeout=DEPLOY_TIMEOUT_S)
    return {"small": small, "large": large, "large_deploy_s": wall,
            "note": "ddl256 runs tuning: high_throughput (jobacct_gather/none): its jobs have no "
                    "cpuacct cgroup, so the job exporter reads memory only there"}


def bench_commands(queued: tuple[int, ...] = (0, 1000)) -> dict[str, Any]:
    port = ports()["slurm"]
    out: dict[str, Any] = {}
    for jobs in queued:
        held = []
        if jobs:
            held.append(lab.output(["sbatch", "--parsable", "--hold", f"--array=0-{jobs - 1}",
                                    "-J", "bench-monitoring-held", "-t", "1", "-o", "/dev/null",
                                    "--wrap", "true"]).strip().split(";")[0])
        try:
            counts = [commands_per_scrape(scrape(port)[1]) for _ in range(5)]
        finally:
            if held:
                lab.cancel("bench-monitoring-held")
        out[str(jobs)] = counts
    met = all(c == dict.fromkeys(COMMANDS, 1.0) for counts in out.values() for c in counts)
    return {"queued": out, "target": "1 of each command a scrape, whatever the queue",
            "met": met}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"from {','.join(PARTS)}")
    parser.add_argument("--reps", type=int, default=6, help="ABBA pairs for the overhead")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per training job")
    parser.add_argument("--no-restore", action="store_true", help="leave ddl256 deployed")
    parser.add_argument("--train-job", type=int, metavar="EPOCHS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train_job:
        print(json.dumps(train_in_job(args.train_job)))
        return 0
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        sys.exit(f"benchmarks.monitoring: error: --parts: {', '.join(unknown)} not allowed; "
                 f"allowed: {', '.join(PARTS)}")
    work = Path(tempfile.mkdtemp(prefix="pyhpc-bench-monitoring-"))
    work.chmod(0o755)
    result: dict[str, Any] = {"cluster": "lab (emulated nodes on one machine)"}
    if "commands" in parts:
        result["commands"] = bench_commands()
    if "overhead" in parts:
        result["overhead"] = bench_overhead(work, args.reps, args.epochs)
    if "scrape" in parts:
        result["scrape"] = bench_scrape(args.no_restore)
    result = record.carried(result, record.read("monitoring"))
    result["pass"] = {k: result[k]["met"] for k in ("overhead", "commands") if k in result}
    print(f"wrote {record.write('monitoring', result).relative_to(ROOT)}")
    print(json.dumps(result["pass"]))
    return 0 if all(result["pass"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
