"""Benchmark `make deploy`: fresh deploy vs. installing its Debian packages alone.

In one run: purge the cluster (`make undeploy PURGE=1`), time `apt-get install`
of exactly the roles' package lists, purge again, time a fresh `make deploy`,
then time an idempotent re-run. Prints the figures and writes
benchmarks/results/deploy.json. Targets (issue 2): fresh deploy <= 1.5x the package
install, re-run <= 60 s. This purges the lab: it is down for a few minutes and
comes back up at the end (also when a step fails).

    python -m benchmarks.deploy            # the benchmark (purges and redeploys)
    python -m benchmarks.deploy --dry-run  # print the plan and package list only
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import yaml

from benchmarks import record

ROOT = record.ROOT
ROLES = ROOT / "ansible" / "roles"
FRESH_RATIO_TARGET = 1.5
RERUN_TARGET_S = 60.0
RECAP = re.compile(r"^\S+\s+: ok=\d+\s+changed=(\d+)", re.M)
ROLE_TIME = re.compile(r"^(\S+) -+ (\d+\.\d+)s$", re.M)
#: profile_tasks' summary: "role : task name ---- 1.23s" (the slowest TASK_LIMIT tasks);
#: a name with a space in it (a role's line in profile_roles' summary has none).
TASK_TIME = re.compile(r"^(\S[^\n]*? [^\n]*?) -{3,} (\d+\.\d+)s$", re.M)
TASK_LIMIT = 25
COUNTS = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=\d+\s+unreachable=\d+\s+failed=\d+\s+"
                    r"skipped=(\d+)", re.M)
#: Both profiles: seconds per role and the slowest tasks, in the deploy's output.
PROFILE_ENV = {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_roles,ansible.posix.profile_tasks",
               "PROFILE_TASKS_TASK_OUTPUT_LIMIT": str(TASK_LIMIT)}
TASK = re.compile(r"^TASK \[(.+?)\] \**$", re.M)


def changed_tasks(output: str) -> list[str]:
    """Names of the tasks that reported a change (e.g. the repo copy after an edit)."""
    names = []
    parts = TASK.split(output)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if re.search(r"^changed: ", body, re.M):
            names.append(name)
    return names


def packages() -> list[str]:
    """The Debian packages the roles install (vars/Debian.yml of each role), in order."""
    names: list[str] = []
    for role in ("munge", "slurm", "pyhpc_login"):
        data = yaml.safe_load((ROLES / role / "vars" / "Debian.yml").read_text())
        for key, value in data.items():
            if not key.endswith("packages"):
                continue
            groups = value.values() if isinstance(value, dict) else [value]
            names += [p for group in groups for p in group if p not in names]
    return names


def timed(argv: list[str], env: dict[str, str] | None = None,
          timeout: float | None = None) -> tuple[float, str]:
    """Run a command (output to our stdout and captured), return wall seconds and output."""
    print(f"$ {' '.join(argv)}", flush=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench: {' '.join(argv)} took over {timeout} s") from None
    wall = time.monotonic() - start
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.stdout.write(out[-4000:])
        raise SystemExit(f"bench: {' '.join(argv)} exited {proc.returncode}")
    print(f"  {wall:.1f} s", flush=True)
    return wall, out


def make(*args: str, env: dict[str, str] | None = None) -> tuple[float, str]:
    return timed(["make", "--no-print-directory", *args], env)


def profile(output: str) -> dict[str, Any]:
    """A profiled deploy's seconds per role, its slowest tasks, and per host the tasks run
    (ok) and skipped (PLAY RECAP)."""
    return {"roles_s": {r: float(t) for r, t in ROLE_TIME.findall(output)},
            "slowest_tasks_s": [[name.strip(), float(t)] for name, t in TASK_TIME.findall(output)],
            "tasks": {host: {"ok": int(ok), "skipped": int(skipped)}
                      for host, ok, skipped in COUNTS.findall(output)}}


def rerun_profile() -> dict[str, Any]:
    """The lab as it is: one deploy to converge it, then the idempotent re-run, profiled."""
    make("deploy")
    env = dict(os.environ, **PROFILE_ENV)
    wall, out = make("deploy", env=env)
    return {"rerun_s": round(wall, 1), "rerun_changed": [int(c) for c in RECAP.findall(out)],
            **profile(out)}


def run_benchmark(pkgs: list[str]) -> dict[str, Any]:
    apt_env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    make("undeploy", "PURGE=1")
    install_s, _ = timed(["apt-get", "install", "-y", "-q", *pkgs], apt_env)
    make("undeploy", "PURGE=1")
    profile_env = dict(os.environ, **PROFILE_ENV)
    fresh_s, fresh_out = make("deploy", env=profile_env)
    rerun_s, rerun_out = make("deploy", env=profile_env)
    changed = [int(c) for c in RECAP.findall(rerun_out)]
    fresh = profile(fresh_out)
    ratio = fresh_s / install_s
    return {
        "packages": pkgs,
        "package_install_s": round(install_s, 1),
        "fresh_deploy_s": round(fresh_s, 1),
        "fresh_deploy_roles_s": fresh["roles_s"],
        "fresh_profile": fresh,
        "rerun_profile": profile(rerun_out),
        "rerun_s": round(rerun_s, 1),
        "rerun_changed": changed,
        "rerun_changed_tasks": changed_tasks(rerun_out),
        "fresh_over_packages": round(ratio, 2),
        "targets": {"fresh_over_packages_max": FRESH_RATIO_TARGET, "rerun_max_s": RERUN_TARGET_S},
        "met": {"fresh": ratio <= FRESH_RATIO_TARGET, "rerun": rerun_s <= RERUN_TARGET_S},
        "notes": "apt cache pre-populated (no downloads); the fresh deploy includes building "
                 "/opt/pyhpc/venv (torch CPU wheel from /opt/wheels) after PURGE=1 removed it",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--rerun-only", action="store_true",
                        help="profile the idempotent re-run of the lab as it is (no purge): "
                             "deploy-rerun.json")
    args = parser.parse_args()
    if args.rerun_only:
        figures = rerun_profile()
        written = record.write("deploy-rerun", figures)
        print(json.dumps({k: v for k, v in figures.items() if k != "slowest_tasks_s"}, indent=1))
        for name, took in figures["slowest_tasks_s"]:
            print(f"{took:6.2f} s  {name}")
        print(f"wrote {written.relative_to(ROOT)}")
        return 0
    pkgs = packages()
    if args.dry_run:
        print("packages:", " ".join(pkgs))
        print("plan: make undeploy PURGE=1; time apt-get install -y <packages>; "
              "make undeploy PURGE=1; time make deploy; time make deploy")
        print(f"writes {record.path('deploy').relative_to(ROOT)}")
        return 0
    try:
        result = run_benchmark(pkgs)
    finally:
        if subprocess.run(["make", "--no-print-directory", "-s", "lab-up"], cwd=ROOT,
                          check=False).returncode != 0:
            print("bench: the lab did not come back up; run make deploy", file=sys.stderr)
    written = record.write("deploy", result)
    print(f"package install  {result['package_install_s']:7.1f} s")
    print(f"fresh deploy     {result['fresh_deploy_s']:7.1f} s  "
          f"({result['fresh_over_packages']}x packages; target <= {FRESH_RATIO_TARGET}x)")
    print(f"re-run           {result['rerun_s']:7.1f} s  "
          f"(changed={result['rerun_changed']}; target <= {RERUN_TARGET_S:.0f} s)")
    print(f"wrote {written.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
