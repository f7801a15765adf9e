"""The admin commands of the ``pyhpc`` CLI: ``directory sync``, ``workshop create|delete|
list``, ``admin backup now|list|verify``, ``admin upgrade plan|run`` and ``admin upgrade
queue save|restore``. Each parses its arguments
and makes one call into :mod:`pyhpc.admin.directory`, :mod:`pyhpc.admin.workshop`,
:mod:`pyhpc.admin.backup`, :mod:`pyhpc.admin.upgrade`, :mod:`pyhpc.admin.upgrade_run` or
:mod:`pyhpc.admin.upgrade_queue`;
run as root (workshops and the directory on the login host, backups where the state is).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pyhpc import cluster, paths
from pyhpc.admin import (
    backup,
    directory_sync,
    restore,
    upgrade_queue,
    upgrade_rollback,
    upgrade_run,
    workshop,
)
from pyhpc.admin import upgrade as upgrade_plan


def _emit(data: Any, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if as_json else text)


def _cluster() -> cluster.Cluster:
    return cluster.load(paths.cluster_file())


def cmd_directory_sync(args: argparse.Namespace) -> int:
    the_cluster = _cluster()
    d = workshop.directory_of(the_cluster)
    plan = directory_sync.sync(d, the_cluster.accounts)
    data = {**asdict(plan), "changed": plan.changed}
    _emit(data, args.json, "\n".join(f"{k}: {' '.join(v) if isinstance(v, tuple) else v}"
                                     for k, v in data.items()))
    return 0


def cmd_workshop_create(args: argparse.Namespace) -> int:
    the_cluster = _cluster()
    limits = {k: getattr(args, k) for k in ("jobs_per_user", "submitted_per_user",
                                             "nodes_per_user", "gpus_per_user")}
    plan = workshop.plan(args.name, args.participants, args.start, args.hours, args.nodes,
                         the_cluster, args.partition, limits=limits,
                         outside=args.outside_reservation)
    done = workshop.create(plan, the_cluster, Path(args.out or f"pyhpc-workshops/{args.name}"))
    text = (f"workshop {plan.name}: {len(plan.participants)} participants, reservation on "
            f"{plan.nodes} {plan.partition} nodes from {plan.start} for {plan.minutes} min"
            + (f"; sheet: {', '.join(done['sheet'])}" if "sheet" in done else "")
            + (f"; notebooks: {done['hub_url']}" if "hub_url" in done else "")
            + ("" if done["changed"] else " (unchanged)"))
    _emit(done, args.json, text)
    return 0


def cmd_workshop_delete(args: argparse.Namespace) -> int:
    done = workshop.delete(args.name, _cluster(), args.homes)
    left = done["left_alone"]
    _emit(done, args.json, f"workshop {args.name}: "
          + ("deleted" if done["changed"] else "nothing to delete")
          + (f"; left alone, not this workshop's: {', '.join(left)}" if left else "")
          + (f"; the hub did not forget its participants ({done['hub_unreachable']}): it "
             "does at its next start" if "hub_unreachable" in done else ""))
    return 0


def cmd_workshop_list(args: argparse.Namespace) -> int:
    rows = workshop.listing(_cluster())
    _emit(rows, args.json, "\n".join(f"{r['name']}\t{r['participants']} participants\t"
                                     f"{r['start']} - {r['end']}\t{r['nodes']}" for r in rows))
    return 0


def cmd_backup_now(args: argparse.Namespace) -> int:
    done = backup.now(_cluster(), args.if_due, args.state)
    if "skipped" in done:
        _emit(done, args.json, f"backup: {done['skipped']} (newest: {done['name']})")
        return 0
    _emit(done, args.json, f"backup {done['name']}: {done['size']} bytes "
          f"({', '.join(sorted(done['parts']))}) in {done['seconds']} s"
          + (f"; pruned {', '.join(done['pruned'])}" if done["pruned"] else ""))
    return 0


def cmd_backup_list(args: argparse.Namespace) -> int:
    rows = backup.listing(_cluster())
    _emit(rows, args.json, "\n".join(
        f"{r['name']}\t{r['time']}\t{r['size']} bytes\t"
        + ("checksums ok" if r["ok"] else f"BAD: {r['problem']}") for r in rows)
        or "no backups")
    return 0 if all(r["ok"] for r in rows) else 1


def _job_id(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 1 << 32:
        raise argparse.ArgumentTypeError(f"not a job id: {text[:20]!r} (1 to 4294967295)")
    return int(text)


def cmd_backup_verify(args: argparse.Namespace) -> int:
    done = backup.verify(_cluster(), args.name, tuple(args.job))
    _emit(done, args.json, f"backup {done['name']}: checksums ok"
          + (f"; {done['jobs']} jobs restored into a scratch database (newest job "
             f"{done['newest_job_id']})" if "jobs" in done else "")
          + (f"; {done['directory_entries']} directory entries"
             + (" (slapadd -u accepts them)" if "directory_check" in done else "")
             if "directory_entries" in done else "")
          + f"; {len(done['files'])} files"
          + (f"; of jobs {', '.join(map(str, args.job))} it holds "
             f"{', '.join(map(str, done['found_jobs'])) or 'none'}" if args.job else ""))
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    done = restore.restore(_cluster(), args.name, args.only)
    lines = [f"restored from {done['name']}:"]
    if "accounting" in done:
        a = done["accounting"]
        lines.append(f"accounting: {a['database']}, {a['jobs']} jobs; slurmdbd stopped for "
                     f"{a['seconds']} s")
        if a.get("released"):
            lines.append("accounting: slurmdbd was held for this restore: now started and "
                         "enabled at boot; slurmctld sends it the records of the jobs that "
                         "ended meanwhile (sdiag: DBD Agent queue size)")
    if "directory" in done:
        d = done["directory"]
        lines.append(f"directory: {d['base_dn']}, {d['entries']} entries; slapd stopped for "
                     f"{d['seconds']} s"
                     + (f"; not in the backup (the next deploy's directory sync adds the "
                        f"definition's back): {', '.join(d['not_in_backup'])}"
                        if d["not_in_backup"] else ""))
    _emit(done, args.json, "\n  ".join(lines))
    return 0


def cmd_upgrade_plan(args: argparse.Namespace) -> int:
    done = upgrade_plan.plan(_cluster(), Path(args.inventory) if args.inventory else None)
    _emit(done, args.json, upgrade_plan.text(done))
    return 0


def _steps(carry_out: Callable[[], dict[str, Any]], text: Callable[[dict[str, Any]], str],
           as_json: bool) -> int:
    """A command of steps (upgrade run, rollback): a step that failed exits 1 in one line."""
    try:
        done = carry_out()
    except upgrade_run.StepFailed as exc:
        print(f"pyhpc: error: {exc}", file=sys.stderr)
        return 1
    _emit(done, as_json, text(done))
    return 0


def cmd_upgrade_run(args: argparse.Namespace) -> int:
    return _steps(lambda: upgrade_run.run(_cluster(), args.inventory, args.deadline,
                                          args.stop_after), upgrade_run.text, args.json)


def cmd_upgrade_rollback(args: argparse.Namespace) -> int:
    return _steps(lambda: upgrade_rollback.rollback(_cluster(), args.inventory),
                  upgrade_rollback.text, args.json)


def cmd_queue_save(args: argparse.Namespace) -> int:
    done = upgrade_queue.save(args.deadline)
    _emit(done, args.json, upgrade_queue.text(done))
    return 0


def cmd_queue_restore(args: argparse.Namespace) -> int:
    done = upgrade_queue.restore()
    _emit(done, args.json, upgrade_queue.text(done, restoring=True))
    return 0


def add_commands(sub: Any) -> None:
    """Register the admin commands on the CLI's subparsers."""
    p = sub.add_parser("directory", help="admin: the user directory (LDAP)")
    dsub = p.add_subparsers(dest="directory_command", required=True, metavar="SUBCOMMAND")
    s = dsub.add_parser("sync", help="make the directory hold the definition's users and "
                        "one group per account (the deploy runs it)")
    s.add_argument("--json", action="store_true", help="print what changed as JSON")
    s.set_defaults(func=cmd_directory_sync)

    p = sub.add_parser("workshop", help="admin: workshop accounts, limits and reservation")
    wsub = p.add_subparsers(dest="workshop_command", required=True, metavar="SUBCOMMAND")
    s = wsub.add_parser("create", help="participants NAME-01.., a Slurm account with a QOS "
                        "(per-job and per-user limits), a reservation, and the instructor's "
                        "sheet (0600); refuses names that objects pyhpc did not create have; "
                        "an existing workshop keeps its limits")
    s.add_argument("name", help="workshop name (the Slurm account, QOS and reservation)")
    s.add_argument("--participants", required=True, help=f"1 to {workshop.MAX_PARTICIPANTS}")
    s.add_argument("--start", required=True, help="now, or an ISO time (2026-03-02T09:00)")
    s.add_argument("--hours", required=True, help="length of the reservation")
    s.add_argument("--nodes", default="1", help="nodes reserved, also each job's limit")
    s.add_argument("--partition", help="partition of the nodes (default: the default one)")
    s.add_argument("--out", help="directory of the sheet (default pyhpc-workshops/NAME)")
    s.add_argument("--jobs-per-user", help="jobs a participant runs at once "
                   f"(default {workshop.JOBS_PER_USER})")
    s.add_argument("--submitted-per-user", help="jobs a participant has queued and running "
                   f"(default {workshop.SUBMITTED_PER_USER})")
    s.add_argument("--nodes-per-user", help="distinct nodes a participant's running jobs hold "
                   "(default: --nodes)")
    s.add_argument("--gpus-per-user", help="GPUs a participant's jobs hold together "
                   "(default: all of the reserved nodes')")
    s.add_argument("--outside-reservation", action="store_true",
                   help="participants may also run outside the reservation, in its partition "
                   "only (default: only in the reservation)")
    s.add_argument("--json", action="store_true", help="print what changed as JSON")
    s.set_defaults(func=cmd_workshop_create)
    s = wsub.add_parser("delete", help="cancel the jobs of the workshop's account and remove "
                        "everything the workshop created (only what carries its marker)")
    s.add_argument("name")
    s.add_argument("--homes", action="store_true", help="also remove the participants' homes")
    s.add_argument("--json", action="store_true", help="print what changed as JSON")
    s.set_defaults(func=cmd_workshop_delete)
    s = wsub.add_parser("list", help="workshops, their windows and participants")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_workshop_list)

    p = sub.add_parser("admin", help="admin: the cluster's backups and upgrades")
    asub = p.add_subparsers(dest="admin_command", required=True, metavar="SUBCOMMAND")
    b = asub.add_parser("backup", help="backups of accounting, the directory, munge's key, "
                        "the secrets and Slurm's configuration (the definition's backup "
                        "section; docs/admin/backups.md)")
    bsub = b.add_subparsers(dest="backup_command", required=True, metavar="SUBCOMMAND")
    s = bsub.add_parser("now", help="take this host's backup, prune beyond backup.keep (the "
                        "backup role's timer runs it)")
    s.add_argument("--if-due", action="store_true", help="only where this host's newest "
                   "good backup is older than backup.interval (the schedulers' every tick)")
    s.add_argument("--state", action="store_true", help="also slurmctld's state directory, "
                   "where this host runs slurmctld (the upgrade's backup)")
    s.add_argument("--json", action="store_true", help="print what was done as JSON")
    s.set_defaults(func=cmd_backup_now)
    s = bsub.add_parser("list", help="every backup: time, size, whether its checksums hold "
                        "(exit 1 if one does not)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_backup_list)
    s = bsub.add_parser("verify", help="restore a backup's dump into a scratch database "
                        "(dropped afterwards) and count its jobs; check its directory "
                        "entries with slapadd -u")
    s.add_argument("name", nargs="?", help="the backup (default: this host's newest good one)")
    s.add_argument("--job", action="append", default=[], type=_job_id, metavar="ID",
                   help="a job id to look for in the restored accounting (repeatable)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_backup_verify)
    s = asub.add_parser("restore", help="on a new host: what it holds (the accounting "
                        "database, pyhpc's directory) back from its newest good backup "
                        "(refused where it holds jobs or directory entries a deploy does "
                        "not make)")
    s.add_argument("name", nargs="?", help="the backup (default: this host's newest good one)")
    s.add_argument("--only", choices=restore.PARTS, help="restore this part alone (default: "
                   "every part this host holds)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_restore)
    u = asub.add_parser("upgrade", help="move the cluster to Debian 13 and Slurm 24.11 "
                        "(docs/admin/upgrades.md)")
    usub = u.add_subparsers(dest="upgrade_command", required=True, metavar="SUBCOMMAND")
    s = usub.add_parser("plan", help="read-only: every host's versions now and after, "
                        "whether SchedMD supports the Slurm jump, what is drained, the "
                        "backups and their size, the phases, the time no job can start")
    s.add_argument("--inventory", metavar="HOSTS_YML", help="the Ansible inventory the "
                   "cluster was deployed from (required in mode hosts; mode lab: this "
                   "machine)")
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    s.set_defaults(func=cmd_upgrade_plan)
    s = usub.add_parser("run", help="carry the plan out from where you deploy, as root: "
                        "the queue saved, the backups, each host moved in SchedMD's order, "
                        "the database converted, the deploy, the queue restored; run again, "
                        "it goes on from the step that did not end well")
    s.add_argument("--inventory", metavar="HOSTS_YML", help="the Ansible inventory the "
                   "cluster was deployed from (required)")
    s.add_argument("--deadline", metavar="DURATION", help="how long running jobs may go on "
                   "(as queue save's; required on the first run)")
    s.add_argument("--stop-after", metavar="STEP", help="stop after this step (one of "
                   f"{', '.join(upgrade_run.NAMES)}); the next run goes on from there")
    s.add_argument("--json", action="store_true", help="print the run's record as JSON")
    s.set_defaults(func=cmd_upgrade_run)
    s = usub.add_parser("rollback", help="a run stopped before the controller's move, "
                        "undone from where you deploy, as root, once you have reinstalled "
                        "the moved hosts with the controller's release: the deploy, each "
                        "moved accounting host's database from the run's backup, the queue "
                        "given back; run again, it goes on from the step that did not end "
                        "well")
    s.add_argument("--inventory", metavar="HOSTS_YML", help="the Ansible inventory the "
                   "upgrade runs on (required)")
    s.add_argument("--json", action="store_true", help="print what was done as JSON")
    s.set_defaults(func=cmd_upgrade_rollback)
    q = usub.add_parser("queue", help="the job queue across Slurm's unsupported jump: save "
                        "it before slurmctld loses its state, restore it after (as root on "
                        "the controller)")
    qsub = q.add_subparsers(dest="queue_command", required=True, metavar="SUBCOMMAND")
    s = qsub.add_parser("save", help="stop jobs from starting (reservation pyhpc-upgrade), "
                        "record and hold every pending job, wait for running ones until the "
                        "deadline, then requeue pyhpc train jobs and cancel the others, "
                        "recorded; run again, it records nothing twice")
    s.add_argument("--deadline", metavar="DURATION", help="how long running jobs may go "
                   "on, from now: seconds, or a number and s, m, h or d, up to 7d; 0: at "
                   "once (required on the first run; a later run without it keeps the first "
                   "run's)")
    s.add_argument("--json", action="store_true", help="print the record as JSON")
    s.set_defaults(func=cmd_queue_save)
    s = qsub.add_parser("restore", help="submit every recorded job again as its user "
                        "(dependencies remapped, user holds kept), remove the reservation, "
                        "list old -> new job ids; run again, it submits nothing twice")
    s.add_argument("--json", action="store_true", help="print old -> new ids as JSON")
    s.set_defaults(func=cmd_queue_restore)
