"""``pyhpc admin upgrade run``: the plan carried out, where the cluster is deployed from, in
SchedMD's order. Each step is one of the parts that exist on their own (the queue's save
and restore, the backups, a host's move, the database's conversion, the deploy), run on
its hosts as the deploy reaches them. Each of those parts goes on where it stopped when it
runs again, so the run keeps only which steps ended well: a second run starts again at
the first step that did not, and a run after the last step changes nothing.

The record is ``/var/lib/pyhpc/upgrade-run/run.json`` on the machine the run runs on:
root's, 0700 and 0600, written atomically and never through a link. Each step's output
is kept beside it (``STEP.log``).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyhpc import files, paths
from pyhpc.admin import upgrade as upgrade_plan
from pyhpc.admin import upgrade_facts as facts_mod
from pyhpc.admin.queue_store import check_root
from pyhpc.admin.upgrade_facts import Host
from pyhpc.admin.upgrade_queue import deadline_seconds
from pyhpc.admin.upgrade_releases import UpgradeError
from pyhpc.cluster import Cluster

RUN_DIR = Path("/var/lib/pyhpc/upgrade-run")
RECORD = "run.json"
LIMIT = 64 * 1024
#: A command on a host, or a playbook, may take this long (a host's move with its reboot
#: is the longest: minutes; a drain's deadline is the admin's and counts on top).
STEP_TIMEOUT_S = 6 * 3600
#: pyhpc on a cluster host: the shared environment's, as the backup role's schedule runs it
#: (controller and accounting hosts have no pyhpc command in PATH).
PYHPC = (str(paths.SHARED_VENV / "bin" / "python"), "-P", "-m", "pyhpc")


@dataclass(frozen=True)
class Step:
    name: str
    what: str


#: SchedMD's order (docs/admin/upgrades.md, Phases). The queue is saved twice: first to
#: stop new jobs and drain by the deadline, then again right before slurmctld stops, for
#: jobs submitted since.
STEPS = (
    Step("plan", "the plan; whatever blocks it stops the run before any change"),
    Step("queue-save", "the controller: no job starts (reservation pyhpc-upgrade); pending "
         "jobs recorded and held; running jobs drained by the deadline"),
    Step("backup", "the accounting, directory and controller hosts: pyhpc admin backup now, "
         "the controller's with Slurm's state directory"),
    Step("move-dbd", "the accounting host moved to the next Debian release"),
    Step("accounting", "its database converted for the new slurmdbd, which starts"),
    Step("queue-save-last", "the controller: jobs submitted since, recorded and held, "
         "before slurmctld stops"),
    Step("move-controller", "the controller moved"),
    Step("move-compute", "the compute hosts moved, all at once"),
    Step("move-login", "the login hosts moved"),
    Step("release-finish", "the old slurmctld state set aside (it is in the backup); the "
         "daemons the moves held unmasked"),
    Step("deploy", "the deploy, onto the new release"),
    Step("queue-restore", "the controller: every recorded job submitted again, the "
         "reservation removed"),
)
NAMES = tuple(s.name for s in STEPS)
#: The line ``pyhpc admin backup now`` ends with (pyhpc.cli.admin.cmd_backup_now).
BACKUP_MADE = re.compile(r"backup ([\w.-]+): \d+ bytes ")
#: The role whose hosts each move takes (the plan's roles: the accounting host is the
#: controller where the inventory has no dbd group). A host in two roles moves with the
#: first; a move with no host left does nothing.
MOVES = {"move-dbd": "dbd", "move-controller": "controller", "move-compute": "compute",
         "move-login": "login"}


@dataclass(frozen=True)
class Context:
    """What every step needs: the inventory, the cluster, its hosts, the deadline."""
    inventory: Path
    cluster_file: Path
    cluster: Cluster
    hosts: tuple[Host, ...]
    deadline: str
    logs: Path
    #: The run's record: a step that learns what a later one needs keeps it there (the
    #: backup step, each host's backup's name, for a rollback).
    record: dict[str, Any] = field(default_factory=dict)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class StepFailed(UpgradeError):
    """A step ended badly: the run stops there (exit 1); a second run goes on from it."""


def read(top: Path) -> dict[str, Any] | None:
    if not os.path.lexists(top / RECORD):
        return None
    try:
        data = json.loads(files.read_owned(top / RECORD, LIMIT, "upgrade run record"))
    except files.FileError as exc:
        raise UpgradeError(f"{top / RECORD}: {exc}") from None
    except ValueError:
        raise UpgradeError(f"{top / RECORD}: not JSON (a hand edit?); move it aside to start "
                           "the upgrade's record anew") from None
    if not isinstance(data, dict) or not isinstance(data.get("done"), dict):
        raise UpgradeError(f"{top / RECORD}: not an upgrade run record")
    return data


def _make(top: Path) -> None:
    try:
        files.make_dir(top, "upgrade run record", mode=0o700)
    except files.FileError as exc:
        raise UpgradeError(str(exc)) from None


def write(top: Path, data: dict[str, Any]) -> None:
    files.write_text(top / RECORD, json.dumps(data, indent=1, sort_keys=True) + "\n",
                     "upgrade run record", 0o600)


def _stream(argv: list[str], log: Path, stdin: str | None = None,
            env: dict[str, str] | None = None, seen: list[str] | None = None) -> int:
    """Run argv, its output both printed and kept in ``log`` (0600, never through a link),
    and its lines added to ``seen``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"=== {now()} $ {shlex.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else
                                subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            out.write(line)
            if seen is not None:
                seen.append(line)
        rc = proc.wait(timeout=STEP_TIMEOUT_S)
        out.write(f"=== exit {rc}\n")
    return rc


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name  # the checkout's venv, as the plan's
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise UpgradeError(f"--inventory: {name} is not installed here (run where you "
                           "deploy from: make venv installs Ansible)")
    return found


def playbook(ctx: Context, name: str, *extra: str, log: str) -> int:
    """One of the checkout's playbooks on the inventory, as its make target runs it."""
    argv = [_tool("ansible-playbook"), "-i", str(ctx.inventory),
            "-e", f"pyhpc_cluster_file={ctx.cluster_file}", *extra,
            str(paths.ROOT / "ansible" / name)]
    env = {**os.environ, "ANSIBLE_CONFIG": str(paths.ROOT / "ansible" / "ansible.cfg")}
    return _stream(argv, ctx.logs / log, env=env)


def on_host(ctx: Context, host: Host, argv: list[str], log: str,
            seen: list[str] | None = None) -> int:
    """``argv`` as root on ``host``, reached as the plan reaches it."""
    return _stream(facts_mod.shell_argv(host), ctx.logs / log,
                   stdin=f"exec {shlex.join(argv)}\n", seen=seen)


def controller_of(hosts: tuple[Host, ...]) -> Host:
    return next(h for h in hosts if "controller" in h.roles)


def _backed_up(ctx: Context) -> list[Host]:
    """The hosts that hold what the upgrade backs up: accounting, directory, controller."""
    return [h for h in ctx.hosts if {"dbd", "directory", "controller"} & set(h.roles)]


def do_plan(ctx: Context) -> int:
    found = facts_mod.gather(list(ctx.hosts), ctx.cluster.name, *plan_args(ctx.cluster))
    p = upgrade_plan.build(ctx.cluster, found)
    print(upgrade_plan.text(p))
    return 0


def plan_args(cluster: Cluster) -> tuple[str, str]:
    d = cluster.directory
    return (d.base_dn if d is not None and d.managed else "",
            cluster.backup.path if cluster.backup is not None else "")


def do_queue_save(ctx: Context, first: bool) -> int:
    argv = [*PYHPC, "admin", "upgrade", "queue", "save"]
    return on_host(ctx, controller_of(ctx.hosts), argv + (["--deadline", ctx.deadline] if first else []),
                   "queue-save.log" if first else "queue-save-last.log")


def do_backup(ctx: Context) -> int:
    """Each host's backup; their names kept in the record (``backups``: host -> name), the
    ones a rollback restores."""
    names: dict[str, str] = {}
    for host in _backed_up(ctx):
        seen: list[str] = []
        rc = on_host(ctx, host, [*PYHPC, "admin", "backup", "now", "--state"], "backup.log",
                     seen)
        if rc != 0:
            return rc
        made = [m.group(1) for line in seen if (m := BACKUP_MADE.match(line))]
        if len(made) != 1:
            raise UpgradeError(f"host {host.name}: pyhpc admin backup now named no backup "
                               f"(its output: {ctx.logs / 'backup.log'})")
        names[host.name] = made[0]
    ctx.record["backups"] = names
    return 0


def moved_by(hosts: tuple[Host, ...]) -> dict[str, list[str]]:
    """The hosts each move step takes, in SchedMD's order, each host once."""
    taken: set[str] = set()
    steps: dict[str, list[str]] = {}
    for step, role in MOVES.items():
        steps[step] = [h.name for h in hosts if role in h.roles and h.name not in taken]
        taken.update(steps[step])
    return steps


def runners(ctx: Context) -> dict[str, Callable[[], int]]:
    """Each step's action; its exit status 0 when it ended well."""
    def move(step: str) -> Callable[[], int]:
        names = moved_by(ctx.hosts)[step]

        def go() -> int:
            if not names:
                print(f"no host left to move: the {MOVES[step]} hosts moved earlier")
                return 0
            return playbook(ctx, "release.yml", "-e",
                            f"debian_release_hosts={':'.join(names)}", log=f"{step}.log")
        return go
    acts: dict[str, Callable[[], int]] = {
        "plan": lambda: do_plan(ctx),
        "queue-save": lambda: do_queue_save(ctx, first=True),
        "backup": lambda: do_backup(ctx),
        "accounting": lambda: playbook(ctx, "accounting.yml", log="accounting.log"),
        "queue-save-last": lambda: do_queue_save(ctx, first=False),
        "release-finish": lambda: playbook(ctx, "release_finish.yml", log="release-finish.log"),
        "deploy": lambda: playbook(ctx, "site.yml", log="deploy.log"),
        "queue-restore": lambda: on_host(ctx, controller_of(ctx.hosts), [*PYHPC, "admin", "upgrade",
                                         "queue", "restore"], "queue-restore.log"),
    }
    acts.update({name: move(name) for name in MOVES})
    return acts


def check_stop_after(name: str | None) -> None:
    if name is not None and name not in NAMES:
        raise UpgradeError(f"--stop-after: {name!r} is not a step; one of {', '.join(NAMES)}")


def carry_out(record: dict[str, Any], top: Path, acts: dict[str, Callable[[], int]],
              stop_after: str | None = None) -> dict[str, Any]:
    """Run each step not yet done, in order, recording each that ends well; stop at the
    first that fails (:class:`UpgradeError` naming it and its log), or after
    ``stop_after``. Returns the record."""
    for step in STEPS:
        if step.name in record["done"]:
            if step.name == stop_after:
                break
            continue
        print(f"--- upgrade run: {step.name}: {step.what}", flush=True)
        if step.name != "plan":  # the plan changes nothing, not even here
            _make(top)
        started = time.monotonic()
        try:
            rc = acts[step.name]()
        except UpgradeError as exc:
            if step.name == "plan":
                raise
            raise StepFailed(f"step {step.name}: {exc}; fix it and run again: the run goes "
                             f"on from {step.name}") from None
        if rc != 0:
            raise StepFailed(f"step {step.name} failed (exit {rc}; its output: "
                             f"{top / (step.name + '.log')}); fix the cause and run again: "
                             f"the run goes on from {step.name}")
        record["done"][step.name] = {"at": now(),
                                     "seconds": round(time.monotonic() - started, 1)}
        _make(top)
        write(top, record)
        if step.name == stop_after:
            break
    if all(name in record["done"] for name in NAMES) and "finished" not in record:
        record["finished"] = now()
        write(top, record)
    return record


def same_run(record: dict[str, Any], inventory: Path, cluster: Cluster, top: Path) -> None:
    """Refused where the record under way is another cluster's or another inventory's."""
    if record.get("inventory") != str(inventory) or record.get("cluster") != cluster.name:
        raise UpgradeError(f"{top / RECORD}: an upgrade of cluster {record.get('cluster')} "
                           f"from {record.get('inventory')} is under way; run it with that "
                           "inventory, or move the record aside once it is over")


def start(inventory: Path, cluster_file: Path, cluster: Cluster, deadline: str | None,
          top: Path) -> dict[str, Any]:
    """The record of a run under way, or a new one (which needs the deadline)."""
    record = read(top)
    if record is not None:
        same_run(record, inventory, cluster, top)
        if deadline is not None and deadline != record.get("deadline"):
            deadline_seconds(deadline)
            record["deadline"] = deadline
        return record
    if deadline is None:
        raise UpgradeError("--deadline: required on the first run: how long running jobs may "
                           "go on (seconds, or a number and s, m, h or d, up to 7d; 0: at once)")
    deadline_seconds(deadline)
    return {"cluster": cluster.name, "inventory": str(inventory), "deadline": deadline,
            "started": now(), "done": {}}


def run(cluster: Cluster, inventory: str | None, deadline: str | None,
        stop_after: str | None = None, top: Path = RUN_DIR) -> dict[str, Any]:
    """``pyhpc admin upgrade run``: carry the plan out, or go on with the run under way."""
    check_root()
    check_stop_after(stop_after)
    if inventory is None:
        raise UpgradeError("--inventory: required: the Ansible inventory the cluster was "
                           "deployed from (the lab's one machine moves by Debian's release "
                           "notes, not by this run)")
    path = Path(inventory).resolve()
    record = start(path, paths.cluster_file().resolve(), cluster, deadline, top)
    if "finished" in record:
        return {**record, "changed": False}
    hosts = tuple(facts_mod.hosts(path))
    ctx = Context(path, paths.cluster_file().resolve(), cluster, hosts,
                  str(record["deadline"]), top, record)
    before = set(record["done"])
    done = carry_out(record, top, runners(ctx), stop_after)
    return {**done, "changed": set(done["done"]) != before}


def text(done: dict[str, Any]) -> str:
    lines = [f"upgrade of cluster {done['cluster']} (from {done['inventory']}), started "
             f"{done['started']}:"]
    for step in STEPS:
        d = done["done"].get(step.name)
        lines.append(f"  {step.name}: " + (f"done {d['at']} ({d['seconds']} s)" if d
                                            else "to do") + f": {step.what}")
    lines.append(f"finished {done['finished']}" if "finished" in done
                 else "not finished: run it again to go on")
    if not done.get("changed", True):
        lines.append("nothing changed")
    return "\n".join(lines)
