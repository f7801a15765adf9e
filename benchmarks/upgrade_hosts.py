"""Hosts moved in place from Debian 12 to Debian 13 (issue 46 items 3, 7 and 8), on
hostlab's Debian 12 hosts as a deploy leaves them (``HOSTLAB_RELEASE=bookworm make
hostlab``); writes benchmarks/results/upgrade-hosts.json.

Each move is one ``make debian-release HOSTS=HOST`` (ansible/release.yml, the
debian_release role: sources, apt's two steps, a reboot, checks), timed from the outside. Three compute hosts
with the same packages compare the package cache (item 7): cpu1 from the mirror itself,
gpu1 through an apt-cacher-ng on ctl with the cache empty, gpu2 through it warm.
Then db, ctl and login move through the cache, in SchedMD's order. Per host: the seconds
of the move, apt's own count of what it had to fetch ("Need to get", both steps), and what
crossed the mirror's link (the cache's growth on ctl; all of it without the cache).

Only the hosts move: the database's conversion and the queue are other steps. Slurm's
daemons stay masked, so the hosts are no cluster afterwards: the benchmark ends with
``hostlab down`` (the image and the shared directories stay). A failed move leaves the
hosts up to look at; ``make hostlab-down`` then.

    HOSTLAB_RELEASE=bookworm make hostlab && python -m benchmarks.upgrade_hosts
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from typing import Any

from benchmarks import record

HOSTLAB = ["python3", "hostlab/hostlab.py"]
INVENTORY = "ansible/inventories/hostlab"
STATE_DIR = "/var/lib/pyhpc/release"
CACHE_DIR = "/var/cache/apt-cacher-ng"
#: The cache the benchmark runs on ctl (Debian's apt-cacher-ng, installed here, not by
#: the role: a site brings its own cache or proxy, debian_release_apt_proxy).
PROXY = "http://ctl:3142"
#: (host, through the cache): the three compute hosts first, for the cache's comparison.
MOVES = (("cpu1", False), ("gpu1", True), ("gpu2", True),
         ("db", True), ("ctl", True), ("login", True))
STEP_TIMEOUT_S = 3600
NEED = re.compile(r"^Need to get ([\d.,]+) ([kMG]?B)(?:/([\d.,]+) ([kMG]?B))? of archives",
                  re.MULTILINE)
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def fetched_bytes(log: str) -> int:
    """What apt had to fetch, summed over the log's steps: the first figure of each
    "Need to get A/B of archives" line (A: still to fetch; B: all, some found already)."""
    return int(sum(float(n.replace(",", "")) * UNITS[u] for n, u, _, _ in NEED.findall(log)))


def on(host: str, command: str) -> str:
    proc = subprocess.run([*HOSTLAB, "run", host, "--", "bash", "-c", command],
                          cwd=record.ROOT, capture_output=True, text=True, timeout=300,
                          check=True)
    return proc.stdout


def release(host: str) -> str:
    return on(host, ". /etc/os-release; echo $VERSION_CODENAME").strip()


def cache_bytes() -> int:
    out = on("ctl", f"du -sb {CACHE_DIR} 2>/dev/null | cut -f1 || true").strip()
    return int(out or 0)


def move(host: str, cached: bool) -> dict[str, Any]:
    argv = ["make", "--no-print-directory", "debian-release", f"INVENTORY={INVENTORY}",
            f"HOSTS={host}", f"PROXY={PROXY if cached else ''}"]
    env = dict(os.environ)
    before = cache_bytes() if cached else 0
    print(f"$ {' '.join(argv)}", flush=True)
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=record.ROOT, env=env, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S, check=False)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.upgrade_hosts: the move of {host} failed:\n"
                         f"{proc.stdout[-4000:]}{proc.stderr[-2000:]}")
    log = on(host, f"cat {STATE_DIR}/trixie.log")
    need = fetched_bytes(log)
    row = {"host": host, "through_cache": cached, "move_s": round(seconds, 1),
           "apt_fetched_bytes": need,
           "from_mirror_bytes": (cache_bytes() - before) if cached else need,
           "release_after": release(host)}
    print(f"  {row}", flush=True)
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = {r["host"]: r for r in rows}
    through = [r for r in rows if r["through_cache"]]
    return {
        "hosts": len(rows),
        "all_moves_s": round(sum(r["move_s"] for r in rows), 1),
        "apt_fetched_bytes": sum(r["apt_fetched_bytes"] for r in rows),
        "from_mirror_bytes": sum(r["from_mirror_bytes"] for r in rows),
        # item 7: the same compute host's move, from the mirror against through a warm cache
        "warm_cache_move_ratio": round(by["gpu2"]["move_s"] / by["cpu1"]["move_s"], 3),
        "cold_cache_move_ratio": round(by["gpu1"]["move_s"] / by["cpu1"]["move_s"], 3),
        "mirror_bytes_through_cache_vs_without": round(
            sum(r["from_mirror_bytes"] for r in through)
            / max(1, sum(r["apt_fetched_bytes"] for r in through)), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true",
                        help="leave the moved hosts up (no hostlab down) to look at them; a "
                             "failed move leaves them up too")
    args = parser.parse_args()
    found = {host: release(host) for host, _ in MOVES}
    if set(found.values()) != {"bookworm"}:
        raise SystemExit(f"benchmarks.upgrade_hosts: needs hostlab's Debian 12 hosts as a "
                         f"deploy leaves them (HOSTLAB_RELEASE=bookworm make hostlab); "
                         f"found {found}")
    on("ctl", "DEBIAN_FRONTEND=noninteractive apt-get install -y -q apt-cacher-ng >/dev/null"
              " && systemctl is-active apt-cacher-ng")
    rows = [move(host, cached) for host, cached in MOVES]
    if not args.keep:
        subprocess.run([*HOSTLAB, "down"], cwd=record.ROOT, check=True)
    figures = {"moves": rows, "summary": summary(rows),
               "route": "in place: sources to trixie, apt-get upgrade --without-new-pkgs, "
                        "apt-get full-upgrade, reboot (ansible/release.yml)"}
    print(f"wrote {record.write('upgrade-hosts', figures)}")
    print(figures["summary"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
