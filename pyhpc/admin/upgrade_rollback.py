"""``pyhpc admin upgrade rollback``: an upgrade run given up before the controller moved,
the cluster back as it was before the run, from the run's own backups.

pyhpc does not install hosts (docs/admin/upgrades.md, How a host moves), so the admin
first reinstalls each host that moved with the release the controller still runs (or
returns it to a snapshot). The rollback then checks that every host runs that release,
deploys (a reinstalled accounting host's deploy holds slurmdbd until its restore),
restores the accounting database from the backup the run took before any host moved (a
backup taken since may hold the converted database, which the old slurmdbd cannot read),
and gives the queue back on the controller, which kept its state. The run's record and
the controller's queue record are then set aside: the next run starts a new upgrade.

Past the controller's move the controller's state moved with it: no rollback is built
from there, and the rollback says so in one line. Each of its steps that ended well is
kept in the run's record (``rollback``): a second rollback goes on from the first that did
not.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyhpc import paths
from pyhpc.admin import upgrade_facts as facts_mod
from pyhpc.admin import upgrade_run as run
from pyhpc.admin.backup_store import STAMP
from pyhpc.admin.queue_store import check_root
from pyhpc.admin.upgrade_facts import Host
from pyhpc.admin.upgrade_releases import UpgradeError
from pyhpc.cluster import Cluster

STEPS = (
    run.Step("deploy", "the deploy, onto every host (the reinstalled ones as they were; a "
             "reinstalled accounting host holds slurmdbd until its restore)"),
    run.Step("restore", "each moved accounting host: its database from the run's backup, "
             "taken before it moved"),
    run.Step("queue-restore", "the controller: every recorded job released, the "
             "reservation removed, the queue's record set aside"),
)
NAMES = tuple(s.name for s in STEPS)


def moved(record: dict[str, Any], hosts: tuple[Host, ...]) -> list[str]:
    """The hosts the run's move steps that ended well took, in order."""
    return [name for step, names in run.moved_by(hosts).items() if step in record["done"]
            for name in names]


def check_window(record: dict[str, Any], hosts: tuple[Host, ...], top: Path) -> list[str]:
    """The hosts that moved; refused where the run is over or the controller moved."""
    if "finished" in record:
        raise UpgradeError(f"{top / run.RECORD}: the upgrade finished at {record['finished']}: "
                           "there is no run to roll back (nothing changed)")
    gone = moved(record, hosts)
    controller = run.controller_of(hosts)
    if controller.name in gone:
        raise UpgradeError(f"host {controller.name}: the controller moved, and its state with "
                           "it; a rollback goes back only from a run stopped before the "
                           "controller's move (docs/admin/upgrades.md, Rolling back; nothing "
                           "changed)")
    return gone


def check_backups(record: dict[str, Any], gone: list[str], hosts: tuple[Host, ...]) -> dict[str, str]:
    """The run's backup of each moved accounting host (host -> name)."""
    names: dict[str, str] = record.get("backups") or {}
    restored = {h.name: names.get(h.name, "") for h in hosts
                if h.name in gone and "dbd" in h.roles}
    if missing := sorted(h for h, name in restored.items() if not name):
        raise UpgradeError(f"host {missing[0]}: the run's record names no backup of it (a "
                           "run before pyhpc kept their names); restore it by hand: pyhpc "
                           "admin restore NAME there (nothing changed)")
    return restored


def check_releases(found: list[facts_mod.Facts], controller: str) -> None:
    """Every host on the controller's release again: the moved ones reinstalled."""
    release = next(f.codename for f in found if f.host.name == controller)
    other = [f for f in found if f.codename != release]
    if other:
        names = ", ".join(f"{f.host.name} ({f.codename})" for f in other)
        raise UpgradeError(f"host {names}: not on the controller's release, {release}; "
                           f"reinstall {'them' if len(other) > 1 else 'it'} with {release} "
                           "(or return to a snapshot taken before the move), then roll back "
                           "again (nothing changed)")


def runners(ctx: run.Context, gone: list[str],
            backups: dict[str, str]) -> dict[str, Callable[[], int]]:
    """Each rollback step's action; its exit status 0 when it ended well."""
    by_name = {h.name: h for h in ctx.hosts}
    controller = run.controller_of(ctx.hosts)
    stamp = datetime.now(UTC).strftime(STAMP)

    def deploy() -> int:
        # Every time: a host moved by hand (make debian-release), outside the run's
        # record, and reinstalled since is deployed too.
        return run.playbook(ctx, "site.yml", log="rollback-deploy.log")

    def restore() -> int:
        for host, name in backups.items():
            rc = run.on_host(ctx, by_name[host], [*run.PYHPC, "admin", "restore", name,
                                                  "--only", "accounting"],
                             "rollback-restore.log")
            if rc != 0:
                return rc
        if not backups:
            print("no accounting host moved: nothing to restore")
        return 0

    def queue_restore() -> int:
        if "queue-save" not in ctx.record["done"]:
            print("the queue was not saved: nothing to give back")
            return 0
        queue = str(paths.UPGRADE_QUEUE)
        log = "rollback-queue-restore.log"
        if run.on_host(ctx, controller, ["test", "-e", queue], log) != 0:
            print(f"{controller.name}: no {queue}: given back and set aside by an earlier "
                  "rollback")
            return 0
        rc = run.on_host(ctx, controller, [*run.PYHPC, "admin", "upgrade", "queue", "restore"],
                         log)
        if rc != 0:
            return rc
        return run.on_host(ctx, controller, ["mv", "--no-target-directory", "--no-clobber",
                                             queue, f"{queue}.rolled-back-{stamp}"], log)

    return {"deploy": deploy, "restore": restore, "queue-restore": queue_restore}


def carry_out(record: dict[str, Any], top: Path, acts: dict[str, Callable[[], int]]) -> None:
    """Each rollback step not yet done, in order, kept in the record as it ends well; the
    first that fails stops it (:class:`run.StepFailed`, naming its log)."""
    done: dict[str, Any] = record.setdefault("rollback", {})
    for step in STEPS:
        if step.name in done:
            continue
        print(f"--- upgrade rollback: {step.name}: {step.what}", flush=True)
        started = time.monotonic()
        rc = acts[step.name]()
        if rc != 0:
            raise run.StepFailed(
                f"rollback step {step.name} failed (exit {rc}; its output: "
                f"{top / ('rollback-' + step.name + '.log')}); fix the cause and roll back "
                f"again: it goes on from {step.name}")
        done[step.name] = {"at": run.now(), "seconds": round(time.monotonic() - started, 1)}
        run.write(top, record)


def set_aside(top: Path) -> Path:
    """The run's record moved aside: the next run starts a new upgrade."""
    aside = top / f"rolled-back-{datetime.now(UTC).strftime(STAMP)}.json"
    os.rename(top / run.RECORD, aside)
    return aside


def rollback(cluster: Cluster, inventory: str | None, top: Path = run.RUN_DIR) -> dict[str, Any]:
    """``pyhpc admin upgrade rollback``: see the module's docstring."""
    check_root()
    if inventory is None:
        raise UpgradeError("--inventory: required: the Ansible inventory the upgrade runs on")
    path = Path(inventory).resolve()
    record = run.read(top)
    if record is None:
        raise UpgradeError(f"{top / run.RECORD}: no upgrade run under way: nothing to roll "
                           "back (nothing changed)")
    run.same_run(record, path, cluster, top)
    hosts = tuple(facts_mod.hosts(path))
    gone = check_window(record, hosts, top)
    backups = check_backups(record, gone, hosts)
    check_releases(facts_mod.gather(list(hosts), cluster.name, *run.plan_args(cluster)),
                   run.controller_of(hosts).name)
    ctx = run.Context(path, paths.cluster_file().resolve(), cluster, hosts,
                      str(record["deadline"]), top, record)
    carry_out(record, top, runners(ctx, gone, backups))
    aside = set_aside(top)
    return {**record, "moved": gone, "restored_from": backups, "record": str(aside)}


def text(done: dict[str, Any]) -> str:
    lines = [f"upgrade of cluster {done['cluster']} rolled back: "
             + (f"{', '.join(done['moved'])} deployed again" if done["moved"]
                else "no host had moved")]
    lines += [f"  {host}: accounting restored from {name}"
              for host, name in done["restored_from"].items()]
    lines += [f"  {step}: done {d['at']} ({d['seconds']} s)"
              for step, d in done["rollback"].items()]
    lines.append(f"the run's record: {done['record']}; the next run starts a new upgrade")
    return "\n".join(lines)
