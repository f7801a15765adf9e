"""Benchmark `make deploy`: a fresh deploy from a clean clone vs. a plain install.

In one run: purge the cluster (`make undeploy PURGE=1`), then the floor: `apt-get install`
of every role's Debian packages for the lab's functions and a plain `pip install -r` of each
requirements file the deploy installs (the control node's deploy.txt; the job runtime's
runtime.txt and singleuser.txt; the hub's hub.txt), each into a new virtualenv. Then purge
the packages that plain install added, with the database of its slapd (pyhpc's purge leaves
a slapd pyhpc did not install, and the deploy refuses it). Then, on a clean `git clone` of
this checkout, time `make venv-deploy` and `make deploy` (profiled), and the idempotent
re-run there. Prints the figures and writes benchmarks/results/deploy.json. Targets (issue
28): the fresh deploy, `.venv` included, <= 180 s and <= 1.3x the plain install. This purges
the lab: it is down for several minutes and comes back up at the end from this checkout
(also when a step fails).

    python -m benchmarks.deploy              # the benchmark (purges and redeploys)
    python -m benchmarks.deploy --dry-run    # print the plan and package list only
    python -m benchmarks.deploy --rerun-only # profile the lab's re-run as it is
    python -m benchmarks.deploy --rerun-only --hostlab  # the same for hostlab's hosts
    python -m benchmarks.deploy --rerun-only --against REF  # and this checkout's re-run
                                             # against REF's, alternated A B B A
    python -m benchmarks.deploy --venv-only --against REF   # the control node's `make
                                             # venv-deploy` from clean clones of REF and
                                             # HEAD, alternated A B B A (deploy-venv.json)
    python -m benchmarks.deploy --cold [--against REF]  # as on a new machine: before the
                                             # plain install and each fresh deploy, podman's
                                             # packages, apt's downloaded packages and pip's
                                             # cache are removed and apt's lists dated two
                                             # hours back; with REF, REF's fresh deploy
                                             # first, then HEAD's (deploy-cold.json)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks import record

ROOT = record.ROOT
ROLES = ROOT / "ansible" / "roles"
FRESH_RATIO_TARGET = 1.3
FRESH_TARGET_S = 180.0
RERUN_TARGET_S = 20.0
#: What the deploy pip-installs, as (virtualenv, requirements files, extra arguments): the
#: control node's .venv, the job runtime (/opt/pyhpc/venv; singleuser.txt goes into it
#: constrained by runtime.txt, as the hub role does) and the hub's own virtualenv.
#: The lab's group_vars give every pip --find-links /opt/wheels (the CPU torch wheel).
PIP_SETS = (("control", ("deploy.txt",), ()),
            ("runtime", ("runtime.txt",), ("--find-links", "/opt/wheels")),
            ("runtime", ("singleuser.txt",), ("-c", "runtime.txt", "--find-links", "/opt/wheels")),
            ("hub", ("hub.txt",), ("--find-links", "/opt/wheels")))
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
    """The Debian packages the roles install on the lab's one host (every function's), in
    order: each role's ``*_packages`` lists, purge lists left out."""
    names: list[str] = []
    for role in ("munge", "slurm", "pyhpc_login", "directory", "monitoring", "jupyterhub",
                 "containers"):
        data: dict[str, Any] = {}
        for name in ("defaults/main.yml", "vars/main.yml", "vars/Debian.yml"):
            path = ROLES / role / name
            if path.is_file():
                data.update(yaml.safe_load(path.read_text()) or {})
        for key, value in data.items():
            if not key.endswith("_packages") or "purge" in key or key == "containers_runtime_packages":
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


def make(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[float, str]:
    return timed(["make", "--no-print-directory", "-C", str(cwd), *args], env)


APT_ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
#: What slapd's purge keeps (Debian asks before removing a database; unattended, it does not).
SLAPD_DATA = (Path("/var/lib/ldap"), Path("/etc/ldap/slapd.d"))


def installed_debs() -> set[str]:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n"],
                         capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.endswith(" installed")}


def remove_plain_debs(added: list[str]) -> None:
    """Purge the packages the plain install added (dependencies included), and the database
    of the slapd it installed: they are the benchmark's, and pyhpc's purge leaves them."""
    if added:
        timed(["apt-get", "purge", "-y", "-q", *added], APT_ENV)
    if "slapd" in added:
        for path in SLAPD_DATA:
            shutil.rmtree(path, ignore_errors=True)


#: pip's cache, which a new machine lacks (root's: every pip of the deploy runs as root).
PIP_CACHE = Path.home() / ".cache" / "pip"
#: What says how old apt's lists are (the apt module reads the stamp first, where it exists).
APT_LISTS = (Path("/var/lib/apt/lists"), Path("/var/lib/apt/periodic/update-success-stamp"))


def podman_packages() -> list[str]:
    """The containers role's podman set (what a new machine lacks and this one keeps)."""
    data = yaml.safe_load((ROLES / "containers" / "defaults" / "main.yml").read_text())
    return list(data["containers_podman_packages"])


def cold_caches() -> None:
    """This machine as a new one finds it: no podman (the containers role's packages, which
    `make undeploy PURGE=1` leaves; refused while a container runs, hostlab's hosts), no
    cached package or wheel, and apt's lists two hours old. The lists themselves stay (a
    new machine has some)."""
    if shutil.which("podman"):
        # stdout alone: podman warns on stderr (about the cgroup layout after a purge).
        running = subprocess.run(["podman", "ps", "-q"], capture_output=True, text=True,
                                 check=False).stdout.strip()
        if running:
            raise SystemExit("bench: --cold removes podman, and containers run "
                             "(make hostlab-down first)")
    here = installed_debs()
    if gone := [p for p in podman_packages() if p in here]:
        timed(["apt-get", "purge", "-y", "-q", "--autoremove", *gone], APT_ENV)
    timed(["apt-get", "clean"])
    shutil.rmtree(PIP_CACHE, ignore_errors=True)
    old = time.time() - 7200
    for path in APT_LISTS:
        if path.exists():
            os.utime(path, (old, old))


def plain_install(pkgs: list[str], work: Path,
                  cold: bool = False) -> tuple[dict[str, float], list[str]]:
    """The floor: apt-get install of the packages (after apt-get update where ``cold``, as
    an admin does on a new machine), then pip install -r of each set into a new virtualenv
    under ``work`` (pip's cache as it is, as the deploy finds it). Also the packages apt
    added."""
    before = installed_debs()
    update_s = timed(["apt-get", "update", "-q"], APT_ENV)[0] if cold else 0.0
    took = {"apt": update_s + timed(["apt-get", "install", "-y", "-q", *pkgs], APT_ENV)[0]}
    added = sorted(installed_debs() - before)
    reqs = ROOT / "requirements"
    for venv, files, extra in PIP_SETS:
        path = work / venv
        argv = [str(path / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
        argv += [str(reqs / a) if a.endswith(".txt") else a for a in extra]
        start = time.monotonic()
        if not path.exists():
            timed([sys.executable if venv == "control" else "/usr/bin/python3", "-m", "venv",
                   str(path)])
        for name in files:
            timed([*argv, "-r", str(reqs / name)])
        key = f"pip_{venv}"
        took[key] = took.get(key, 0.0) + time.monotonic() - start
    took["total"] = sum(took.values())
    return {k: round(v, 1) for k, v in took.items()}, added


def profile(output: str) -> dict[str, Any]:
    """A profiled deploy's seconds per role, its slowest tasks, and per host the tasks run
    (ok) and skipped (PLAY RECAP)."""
    return {"roles_s": {r: float(t) for r, t in ROLE_TIME.findall(output)},
            "slowest_tasks_s": [[name.strip(), float(t)] for name, t in TASK_TIME.findall(output)],
            "tasks": {host: {"ok": int(ok), "skipped": int(skipped)}
                      for host, ok, skipped in COUNTS.findall(output)}}


def floor(tasks: int, inventory: Path) -> dict[str, Any]:
    """Ansible's own cost of a task here: a playbook of ``tasks`` tasks that each run one
    module doing almost nothing (``stat`` of one file) on every host of ``inventory``, with
    pyhpc's ansible.cfg, against the same playbook with no task (start-up)."""
    with tempfile.TemporaryDirectory(prefix="pyhpc-bench-floor-") as tmp:
        took = {}
        for n in (0, tasks):
            book = Path(tmp) / f"floor-{n}.yml"
            plays = [{"name": "Ansible's floor", "hosts": "all", "gather_facts": False,
                      "tasks": [{"name": f"stat {i}", "ansible.builtin.stat": {"path": "/etc/hostname"}}
                                for i in range(n)]}]
            book.write_text(yaml.safe_dump(plays))
            took[n], _ = timed([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i",
                                str(inventory / "hosts.yml"), str(book)],
                               dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible" / "ansible.cfg")))
    per_task = (took[tasks] - took[0]) / tasks
    return {"tasks": tasks, "startup_s": round(took[0], 1), "playbook_s": round(took[tasks], 1),
            "per_task_s": round(per_task, 3)}


def rerun_profile(hostlab: bool = False) -> dict[str, Any]:
    """The lab (or hostlab's hosts) as it is: one deploy to converge it, then the idempotent
    re-run, profiled, then Ansible's floor side by side: as many tasks as the re-run ran
    on a host (the mean over hosts), on every host at once."""
    target = "hostlab-deploy" if hostlab else "deploy"
    make(target)
    env = dict(os.environ, **PROFILE_ENV)
    wall, out = make(target, env=env)
    got = profile(out)
    ran = round(sum(host["ok"] for host in got["tasks"].values()) / len(got["tasks"]))
    inventory = ROOT / "ansible" / "inventories" / ("hostlab" if hostlab else "lab")
    return {"rerun_s": round(wall, 1), "rerun_changed": [int(c) for c in RECAP.findall(out)],
            **got, "floor": floor(ran, inventory)}


def side_by_side(ref: str, hostlab: bool = False) -> dict[str, Any]:
    """This checkout's idempotent re-run (new) against the commit `ref`'s (old), on the same
    hosts, alternated old, new, new, old; each variant's first run converges it (the copy of
    the repository differs) and is not counted."""
    target = "hostlab-deploy" if hostlab else "deploy"
    runs: dict[str, list[float]] = {"old": [], "new": []}
    changed: list[int] = []
    with tempfile.TemporaryDirectory(prefix="pyhpc-bench-rerun-") as tmp:
        old = Path(tmp) / "old"
        timed(["git", "clone", "--quiet", str(ROOT), str(old)])
        timed(["git", "-C", str(old), "checkout", "--quiet", ref])
        last = ""
        for kind in ("old", "new", "new", "old"):
            cwd = old if kind == "old" else ROOT
            if kind != last:
                make(target, cwd=cwd)
            wall, out = make(target, cwd=cwd)
            runs[kind].append(round(wall, 1))
            changed += [int(c) for c in RECAP.findall(out)]
            last = kind
        commit = timed(["git", "-C", str(old), "rev-parse", "HEAD"])[1].strip()
    mean = {kind: sum(walls) / len(walls) for kind, walls in runs.items()}
    return {"against": commit, "old_s": runs["old"], "new_s": runs["new"], "changed": changed,
            "new_over_old": round(mean["new"] / mean["old"], 2)}


def venv_side_by_side(ref: str) -> dict[str, Any]:
    """`make venv-deploy` (the control node's virtualenv: the README's first command's first
    step) on a clean clone of `ref` (old) and of HEAD (new), each from no .venv, alternated
    old, new, new, old; with the files each virtualenv holds."""
    runs: dict[str, list[float]] = {"old": [], "new": []}
    files: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="pyhpc-bench-venv-") as tmp:
        clones = {kind: Path(tmp) / kind for kind in runs}
        for clone in clones.values():
            timed(["git", "clone", "--quiet", str(ROOT), str(clone)])
        timed(["git", "-C", str(clones["old"]), "checkout", "--quiet", ref])
        for kind in ("old", "new", "new", "old"):
            shutil.rmtree(clones[kind] / ".venv", ignore_errors=True)
            wall, _ = make("venv-deploy", cwd=clones[kind])
            runs[kind].append(round(wall, 1))
            files[kind] = sum(1 for p in (clones[kind] / ".venv").rglob("*") if p.is_file())
        commits = {kind: timed(["git", "-C", str(clone), "rev-parse", "HEAD"])[1].strip()
                   for kind, clone in clones.items()}
    mean = {kind: sum(walls) / len(walls) for kind, walls in runs.items()}
    return {"against": commits["old"], "head": commits["new"], "old_s": runs["old"],
            "new_s": runs["new"], "old_files": files["old"], "new_files": files["new"],
            "new_over_old": round(mean["new"] / mean["old"], 2)}


def fresh_deploy(clone: Path, cold: bool) -> tuple[float, float, str]:
    """`make venv-deploy` and `make deploy` (profiled) on the clean clone ``clone``, from
    nothing of pyhpc's (and, where ``cold``, no cached download): the seconds of each and
    the deploy's output."""
    if cold:
        cold_caches()
    venv_s, _ = make("venv-deploy", cwd=clone)
    ansible_s, out = make("deploy", env=dict(os.environ, **PROFILE_ENV), cwd=clone)
    return venv_s, ansible_s, out


def run_benchmark(pkgs: list[str], cold: bool = False,
                  against: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pyhpc-bench-deploy-") as tmp:
        work = Path(tmp)
        make("undeploy", "PURGE=1")
        if cold:
            cold_caches()
        plain, added = plain_install(pkgs, work / "plain", cold)
        shutil.rmtree(work / "plain")
        remove_plain_debs(added)
        old: dict[str, Any] | None = None
        if against:
            before = work / "old"
            timed(["git", "clone", "--quiet", str(ROOT), str(before)])
            timed(["git", "-C", str(before), "checkout", "--quiet", against])
            old_venv_s, old_ansible_s, _ = fresh_deploy(before, cold)
            old = {"commit": timed(["git", "-C", str(before), "rev-parse", "HEAD"])[1].strip(),
                   "fresh_deploy_s": round(old_venv_s + old_ansible_s, 1),
                   "fresh_venv_s": round(old_venv_s, 1),
                   "fresh_ansible_s": round(old_ansible_s, 1)}
            make("undeploy", "PURGE=1", cwd=before)
        clone = work / "clone"
        timed(["git", "clone", "--quiet", str(ROOT), str(clone)])
        venv_s, ansible_s, fresh_out = fresh_deploy(clone, cold)
        rerun_s, rerun_out = make("deploy", env=dict(os.environ, **PROFILE_ENV), cwd=clone)
    fresh_s = venv_s + ansible_s
    changed = [int(c) for c in RECAP.findall(rerun_out)]
    fresh = profile(fresh_out)
    ratio = fresh_s / plain["total"]
    result = {
        "cold": cold,
        "packages": pkgs,
        "plain_install_s": plain,
        "fresh_deploy_s": round(fresh_s, 1),
        "fresh_venv_s": round(venv_s, 1),
        "fresh_ansible_s": round(ansible_s, 1),
        "fresh_deploy_roles_s": fresh["roles_s"],
        "fresh_profile": fresh,
        "rerun_profile": profile(rerun_out),
        "rerun_s": round(rerun_s, 1),
        "rerun_changed": changed,
        "rerun_changed_tasks": changed_tasks(rerun_out),
        "fresh_over_plain": round(ratio, 2),
        "targets": {"fresh_over_plain_max": FRESH_RATIO_TARGET, "fresh_max_s": FRESH_TARGET_S,
                    "rerun_max_s": RERUN_TARGET_S},
        "met": {"fresh_ratio": ratio <= FRESH_RATIO_TARGET, "fresh_s": fresh_s <= FRESH_TARGET_S,
                "rerun": rerun_s <= RERUN_TARGET_S},
        "notes": ("cold: before the plain install and each fresh deploy, the containers role's "
                  "podman packages purged with what they alone needed, apt-get clean, pip's "
                  "cache removed and apt's lists dated two hours back (the plain install runs "
                  "apt-get update first)" if cold
                  else "apt's and pip's caches warm (no downloads here)")
                 + "; the torch CPU wheel from /opt/wheels; the fresh deploy runs on a clean "
                   "clone after PURGE=1 removed the roles' packages, state and virtualenvs; the "
                   "machine's Python and build tools stay (CI's machine has them), and where "
                   "not cold its podman",
    }
    if old is not None:
        result["against"] = {**old, "new_over_old": round(fresh_s / old["fresh_deploy_s"], 2),
                             "order": "old's fresh deploy, then this checkout's (one each)"}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--rerun-only", action="store_true",
                        help="profile the idempotent re-run of the lab as it is (no purge): "
                             "deploy-rerun.json")
    parser.add_argument("--against", metavar="REF",
                        help="with --rerun-only: also this checkout's re-run against REF's, "
                             "alternated (old, new, new, old)")
    parser.add_argument("--venv-only", action="store_true",
                        help="with --against: time make venv-deploy on clean clones of REF and "
                             "HEAD, alternated: deploy-venv.json")
    parser.add_argument("--cold", action="store_true",
                        help="as on a new machine: no cached package or wheel before the plain "
                             "install and each fresh deploy (deploy-cold.json)")
    parser.add_argument("--hostlab", action="store_true",
                        help="with --rerun-only: hostlab's hosts as they are (make hostlab-deploy): "
                             "deploy-rerun-hostlab.json")
    args = parser.parse_args()
    if args.against and not (args.rerun_only or args.venv_only or args.cold):
        parser.error("--against needs --rerun-only, --venv-only or --cold")
    if args.venv_only:
        if not args.against:
            parser.error("--venv-only needs --against REF")
        figures = venv_side_by_side(args.against)
        written = record.write("deploy-venv", figures)
        print(json.dumps(figures, indent=1))
        print(f"wrote {written.relative_to(ROOT)}")
        return 0
    if args.rerun_only:
        figures = rerun_profile(args.hostlab)
        if args.against:
            figures["side_by_side"] = side_by_side(args.against, args.hostlab)
        written = record.write("deploy-rerun-hostlab" if args.hostlab else "deploy-rerun", figures)
        print(json.dumps({k: v for k, v in figures.items() if k != "slowest_tasks_s"}, indent=1))
        for name, took in figures["slowest_tasks_s"]:
            print(f"{took:6.2f} s  {name}")
        print(f"wrote {written.relative_to(ROOT)}")
        return 0
    pkgs = packages()
    if args.dry_run:
        print("packages:", " ".join(pkgs))
        print("plan: make undeploy PURGE=1; time apt-get install -y <packages> and pip install -r "
              "of " + ", ".join(f for _, files, _ in PIP_SETS for f in files) + " into new "
              "virtualenvs; apt-get purge what it added; git clone; time make venv-deploy and make "
              "deploy there; time make deploy again"
              + ("; --cold: before the plain install and each fresh deploy, purge podman's "
                 "packages, apt-get clean, remove pip's cache, date apt's lists back; the plain "
                 "install runs apt-get update first" if args.cold else ""))
        print(f"writes {record.path('deploy-cold' if args.cold else 'deploy').relative_to(ROOT)}")
        return 0
    try:
        result = run_benchmark(pkgs, args.cold, args.against)
    finally:
        if subprocess.run(["make", "--no-print-directory", "-s", "lab-up"], cwd=ROOT,
                          check=False).returncode != 0:
            print("bench: the lab did not come back up; run make deploy", file=sys.stderr)
    written = record.write("deploy-cold" if args.cold else "deploy", result)
    print(f"plain install    {result['plain_install_s']['total']:7.1f} s  {result['plain_install_s']}")
    print(f"fresh deploy     {result['fresh_deploy_s']:7.1f} s  (.venv {result['fresh_venv_s']} s; "
          f"{result['fresh_over_plain']}x plain; targets <= {FRESH_RATIO_TARGET}x, "
          f"<= {FRESH_TARGET_S:.0f} s)")
    if "against" in result:
        print(f"against {result['against']['commit'][:10]} {result['against']['fresh_deploy_s']:7.1f} s  "
              f"(new/old {result['against']['new_over_old']})")
    print(f"re-run           {result['rerun_s']:7.1f} s  "
          f"(changed={result['rerun_changed']}; target <= {RERUN_TARGET_S:.0f} s)")
    print(f"wrote {written.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
