"""Benchmark hostlab: image build, hosts up, deploy and idempotent re-run against compute hosts.

For each N of --hosts (default 1,2,4,8): an inventory of ctl, db, login and N CPU hosts
cpu1..cpuN (a copy of ansible/inventories/hostlab with another hosts.yml and cluster.yml,
chosen with $HOSTLAB_INVENTORY). Remove every hostlab host, time `hostlab up`, a fresh
`make hostlab-deploy` and a second one (its PLAY RECAP should show changed=0), then read
each host's memory from `hostlab status --json`. Before that, time `hostlab image` with
the cache as it is (a build when the recipe changed) and once more, cached. Writes
benchmarks/results/hostlab.json and docs/hostlab-deploy.png. Target (issue 7): the re-run on
8 compute hosts takes at most 1.5x the re-run on 1. Needs hostlab to itself for about
30 min. At the end the stock hostlab comes back (down, make hostlab-up, make
hostlab-deploy), also when a step fails; --no-restore leaves it down.

    python -m benchmarks.hostlab              # the benchmark
    python -m benchmarks.hostlab --plan       # write the inventories to a temp dir, print the steps
    python -m benchmarks.hostlab --hosts 1,2  # a subset of the host counts
    python -m benchmarks.hostlab --plot       # redraw the plot from benchmarks/results/hostlab.json
"""
from __future__ import annotations

import argparse
import configparser
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from benchmarks import deploy, record
from benchmarks.deploy import ROLE_TIME, changed_tasks

ROOT = record.ROOT
STOCK = ROOT / "ansible" / "inventories" / "hostlab"
RESULT = record.path("hostlab")
PLOT = ROOT / "docs" / "hostlab-deploy.png"
HOST_COUNTS = (1, 2, 4, 8)
RERUN_RATIO_TARGET = 1.5
#: hostlab runs with the system python3 (as the Makefile's $(PYTHON)); `up` gets a long
#: boot timeout, as 11 hosts booting at once on 2 cores can pass the default 120 s.
HOSTLAB = ["python3", "hostlab/hostlab.py"]
UP_TIMEOUT_S = 600
STEP_TIMEOUT_S = 1800
#: Role times on every deploy (fresh and re-run alike, so the runs compare fairly).
PROFILE = {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_roles"}
RECAP_LINE = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
                        re.M)
IMAGE_LINE = re.compile(r"image (built|cached) in (\d+(?:\.\d+)?) s")
UP_LINE = re.compile(r"hosts up in (\d+(?:\.\d+)?) s \(containers (\d+(?:\.\d+)?) s, "
                     r"then systemd (\d+(?:\.\d+)?) s\)")


# --- inventories ----------------------------------------------------------------

def compute_names(n: int) -> list[str]:
    return [f"cpu{k}" for k in range(1, n + 1)]


def hosts_doc(stock: dict[str, Any], n: int) -> dict[str, Any]:
    """The stock hosts.yml with compute hosts cpu1..cpuN only (no GPU hosts)."""
    doc: dict[str, Any] = copy.deepcopy(stock)
    doc["all"]["children"]["compute"] = {"hosts": dict.fromkeys(compute_names(n))}
    return doc


def cluster_doc(stock: dict[str, Any], n: int) -> dict[str, Any]:
    """The stock cluster.yml with one node group `cpu` of N and one partition `cpu`."""
    cpu = next(group for group in stock["nodes"] if group["name"] == "cpu")
    part = next(p for p in stock["partitions"] if p["name"] == "cpu")
    doc = {k: v for k, v in stock.items() if k not in ("nodes", "partitions")}
    doc["nodes"] = [{**{k: v for k, v in cpu.items() if k != "count"}, "count": n}]
    doc["partitions"] = [{"name": "cpu", "nodes": compute_names(n), "default": True,
                          "max_time": part.get("max_time", "1-00:00:00")}]
    return doc


def write_inventory(n: int, parent: Path, stock: Path = STOCK) -> Path:
    """`parent/hosts-N`: the stock inventory's group_vars, with hosts.yml and cluster.yml for N."""
    where = parent / f"hosts-{n}"
    shutil.copytree(stock / "group_vars", where / "group_vars")
    for name, make_doc in (("hosts.yml", hosts_doc), ("cluster.yml", cluster_doc)):
        doc = make_doc(yaml.safe_load((stock / name).read_text()), n)
        (where / name).write_text(f"# benchmarks/hostlab.py: {n} compute host(s)\n"
                                  + yaml.safe_dump(doc, sort_keys=False))
    return where


# --- parsing ------------------------------------------------------------------------

def recap(output: str) -> dict[str, dict[str, int]]:
    """The last PLAY RECAP of an ansible-playbook output: host -> ok, changed, unreachable, failed."""
    tail = output.rsplit("PLAY RECAP", 1)
    if len(tail) < 2:
        return {}
    keys = ("ok", "changed", "unreachable", "failed")
    return {host: dict(zip(keys, map(int, counts), strict=True))
            for host, *counts in RECAP_LINE.findall(tail[1])}


def image_step(output: str) -> dict[str, Any]:
    """`hostlab image`'s own figure: whether it built, and in how long."""
    found = IMAGE_LINE.search(output)
    return {"built": found.group(1) == "built", "reported_s": float(found.group(2))} if found else {}


def up_step(output: str) -> dict[str, float]:
    """`hostlab up`'s split: containers created, then systemd booted."""
    found = UP_LINE.search(output)
    if not found:
        return {}
    return {"reported_s": float(found.group(1)), "containers_s": float(found.group(2)),
            "systemd_s": float(found.group(3))}


def memory(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per host memory in MiB from `hostlab status --json`, and the compute hosts' mean."""
    mib = {row["host"]: {"usage_mib": round(row["usage_bytes"] / 2**20, 1),
                         "rss_mib": round(row["rss_bytes"] / 2**20, 1)}
           for row in rows if "usage_bytes" in row and "rss_bytes" in row}
    compute = [v for host, v in mib.items() if re.fullmatch(r"cpu\d+", host)]

    def mean(key: str) -> float | None:
        return round(sum(v[key] for v in compute) / len(compute), 1) if compute else None

    return {"per_host": mib, "compute_usage_mib_mean": mean("usage_mib"),
            "compute_rss_mib_mean": mean("rss_mib")}


# --- figures ------------------------------------------------------------------------

def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Re-run and fresh deploy time over the smallest host count's, side by side."""
    base = min(runs, key=lambda r: r["compute_hosts"])
    return [{"compute_hosts": r["compute_hosts"], "over_compute_hosts": base["compute_hosts"],
             "rerun_ratio": round(r["rerun_s"] / base["rerun_s"], 2),
             "fresh_ratio": round(r["fresh_deploy_s"] / base["fresh_deploy_s"], 2)}
            for r in sorted(runs, key=lambda r: r["compute_hosts"])]


def target(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """rerun(8) / rerun(1) against the target; met is None unless both were measured."""
    by_n = {r["compute_hosts"]: r["rerun_s"] for r in runs}
    ratio = round(by_n[8] / by_n[1], 2) if 1 in by_n and 8 in by_n else None
    return {"rerun_8_over_1": ratio, "rerun_8_over_1_max": RERUN_RATIO_TARGET,
            "met": None if ratio is None else ratio <= RERUN_RATIO_TARGET}


def plot(result: dict[str, Any], path: Path = PLOT) -> Path:
    """Fresh deploy and re-run seconds against compute hosts, with the re-run target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(result["runs"], key=lambda r: r["compute_hosts"])
    hosts = [r["compute_hosts"] for r in runs]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(hosts, [r["fresh_deploy_s"] for r in runs], marker="o", label="fresh deploy")
    ax.plot(hosts, [r["rerun_s"] for r in runs], marker="o", label="idempotent re-run")
    if hosts[0] == 1:
        ax.axhline(RERUN_RATIO_TARGET * runs[0]["rerun_s"], linestyle="--", color="grey",
                   label=f"target: re-run on 8 <= {RERUN_RATIO_TARGET}x re-run on 1")
    ax.set_xticks(hosts)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("compute hosts (plus ctl, db, login)")
    ax.set_ylabel("seconds")
    ax.set_title("make hostlab-deploy")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


# --- running ------------------------------------------------------------------------

def env_for(inventory: Path | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with HOSTLAB_INVENTORY set (None: unset, the stock inventory)."""
    env = {k: v for k, v in os.environ.items() if k != "HOSTLAB_INVENTORY"}
    if inventory is not None:
        env["HOSTLAB_INVENTORY"] = str(inventory)
    return {**env, **(extra or {})}


def steps() -> list[tuple[str, list[str]]]:
    """The commands run for each host count, each with the key its time is recorded under."""
    deploy = ["make", "--no-print-directory", "hostlab-deploy"]
    return [("down_s", [*HOSTLAB, "down"]),
            ("up_s", [*HOSTLAB, "up", "--timeout", str(UP_TIMEOUT_S)]),
            ("fresh_deploy_s", deploy), ("rerun_s", deploy),
            ("status", [*HOSTLAB, "status", "--json"])]


RESTORE = [[*HOSTLAB, "down"], ["make", "--no-print-directory", "hostlab-up"],
           ["make", "--no-print-directory", "hostlab-deploy"]]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """benchmarks.deploy's timed(), with the inventory named and a limit per step."""
    inventory = env.get("HOSTLAB_INVENTORY")
    if inventory:
        print(f"  (HOSTLAB_INVENTORY={inventory})", flush=True)
    return deploy.timed(argv, env, timeout=STEP_TIMEOUT_S)


def bench_hosts(n: int, inventory: Path) -> dict[str, Any]:
    """One host count: down, up, fresh deploy, re-run, memory."""
    env = env_for(inventory, PROFILE)
    run: dict[str, Any] = {"compute_hosts": n, "hosts": n + 3}
    outputs = {}
    for key, argv in steps():
        wall, outputs[key] = timed(argv, env)
        if key != "status":
            run[key] = round(wall, 1)
    run["up"] = up_step(outputs["up_s"])
    run["fresh_deploy_roles_s"] = {r: float(s) for r, s in ROLE_TIME.findall(outputs["fresh_deploy_s"])}
    run["rerun_roles_s"] = {r: float(s) for r, s in ROLE_TIME.findall(outputs["rerun_s"])}
    counts = recap(outputs["rerun_s"])
    run["rerun_changed"] = {host: c["changed"] for host, c in counts.items()}
    run["rerun_changed_tasks"] = changed_tasks(outputs["rerun_s"])
    run["idempotent"] = bool(counts) and not any(run["rerun_changed"].values())
    # The JSON is all of stdout, which comes first in the output (stderr after it).
    run["memory"] = memory(json.JSONDecoder().raw_decode(outputs["status"].lstrip())[0])
    return run


def ansible_forks() -> int | None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible" / "ansible.cfg")
    return cfg.getint("defaults", "forks", fallback=None)


def run_benchmark(counts: tuple[int, ...], work: Path) -> dict[str, Any]:
    plain = env_for(None)
    first_s, first_out = timed([*HOSTLAB, "image"], plain)
    cached_s, _ = timed([*HOSTLAB, "image"], plain)
    runs = [bench_hosts(n, write_inventory(n, work)) for n in counts]
    goal = target(runs)
    return {
        "release": os.environ.get("HOSTLAB_RELEASE") or "trixie",
        "ansible_forks": ansible_forks(),
        "image": {"first_s": round(first_s, 1), **image_step(first_out),
                  "cached_s": round(cached_s, 1)},
        "runs": runs,
        "ratios": ratios(runs),
        "rerun_8_over_1": goal["rerun_8_over_1"],
        "targets": {"rerun_8_over_1_max": RERUN_RATIO_TARGET},
        "met": {"rerun_8_over_1": goal["met"], "idempotent": all(r["idempotent"] for r in runs)},
        "notes": "each host count starts from removed hosts (hostlab down), so every package is "
                 "installed anew; down keeps each host's /var/log volume and the shared /opt/pyhpc "
                 "and /home (hostlab's NFS stand-in). Memory: each host's cgroup after the re-run "
                 "(usage includes page cache). Deploys run with the profile_roles callback.",
    }


def restore() -> None:
    """The stock hostlab, as the tests expect it: down, then up and deploy its inventory."""
    for argv in RESTORE:
        if subprocess.run(argv, cwd=ROOT, env=env_for(None), check=False).returncode != 0:
            print("bench: hostlab did not come back; run make hostlab", file=sys.stderr)
            return


def host_counts(text: str) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4): positive, distinct, sorted."""
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4,8, got {text!r}") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"expected host counts of at least 1, got {text!r}")
    return tuple(counts)


def print_plan(counts: tuple[int, ...], work: Path, restore_after: bool) -> None:
    """Write the inventories under ``work``, validate their definitions, print every step."""
    from pyhpc import cluster

    print(f"$ {' '.join(HOSTLAB)} image    # as the cache is; then again, cached")
    for n in counts:
        where = write_inventory(n, work)
        nodes = [node.name for node in cluster.load(where / "cluster.yml").nodes]
        print(f"# {n} compute host(s): {where} (nodes {', '.join(nodes)})")
        for key, argv in steps():
            print(f"$ HOSTLAB_INVENTORY={where} {' '.join(argv)}    # {key}")
    for argv in RESTORE if restore_after else []:
        print(f"$ {' '.join(argv)}    # restore the stock hostlab")
    print(f"writes {RESULT.relative_to(ROOT)} and {PLOT.relative_to(ROOT)} "
          f"(the inventories above are removed after this plan)")


def summary(result: dict[str, Any]) -> None:
    image = result["image"]
    print(f"image            {image['first_s']:7.1f} s ({'built' if image.get('built') else 'cached'});"
          f" cached {image['cached_s']:.1f} s")
    for run, ratio in zip(result["runs"], result["ratios"], strict=True):
        print(f"{run['compute_hosts']} compute host(s): up {run['up_s']:.1f} s, fresh "
              f"{run['fresh_deploy_s']:.1f} s ({ratio['fresh_ratio']}x), re-run {run['rerun_s']:.1f} s "
              f"({ratio['rerun_ratio']}x; changed={sum(run['rerun_changed'].values())}), compute rss "
              f"{run['memory']['compute_rss_mib_mean']} MiB")
    print(f"re-run 8 / 1: {result['rerun_8_over_1']} (target <= {RERUN_RATIO_TARGET}; "
          f"met: {result['met']['rerun_8_over_1']})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=host_counts, default=HOST_COUNTS,
                        help="compute host counts to measure (default 1,2,4,8)")
    parser.add_argument("--plan", action="store_true", help="print the steps, change nothing")
    parser.add_argument("--no-restore", dest="restore", action="store_false",
                        help="leave hostlab down at the end (default: bring the stock one back)")
    parser.add_argument("--plot", action="store_true",
                        help=f"only redraw {PLOT.relative_to(ROOT)} from {RESULT.relative_to(ROOT)}")
    args = parser.parse_args()
    if args.plot:
        if not RESULT.exists():
            sys.exit(f"benchmarks: no {RESULT.relative_to(ROOT)} yet: run make bench-hostlab")
        print(f"wrote {plot(record.read('hostlab')['figures']).relative_to(ROOT)}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="pyhpc-bench-hostlab-"))
    try:
        if args.plan:
            print_plan(args.hosts, work, args.restore)
            return 0
        try:
            result = run_benchmark(args.hosts, work)
        finally:
            if args.restore:
                restore()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record.write("hostlab", result)
    plot(result)
    summary(result)
    print(f"wrote {RESULT.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
