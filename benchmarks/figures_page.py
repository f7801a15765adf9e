"""docs/benchmarks.md, rendered from benchmarks/results/*.json: one table per result file.

``python -m benchmarks.figures_page`` (``make bench-page``) writes the page; ``--check``
exits 1 when the committed page is not what the JSON gives. Each table says what the
benchmark measures, how to run it, and per figure its value, its target and when it was
measured (a part carried from an earlier run keeps that run's date). The history of the
figures is in docs/benchmarks-journal.md and in git, not here.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import record

PAGE = record.ROOT / "docs" / "benchmarks.md"
Figures = dict[str, Any]


def at(figures: Figures, dotted: str) -> Any:
    """The value at ``a.b.c`` in ``figures`` (list items by index)."""
    value: Any = figures
    for key in dotted.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def num(value: float, unit: str = "", digits: int = 1) -> str:
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}".strip() if unit not in ("×", "%") else f"{text}{unit}"


def met(ok: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "—"}[ok]


@dataclass(frozen=True)
class Row:
    """One figure: its label, its value from the figures, the target (or ``—``), whether
    the target was met (None: no target), and the part whose ``measured`` date applies."""
    label: str
    value: Callable[[Figures], str]
    target: str = "—"
    ok: Callable[[Figures], bool | None] = lambda f: None
    part: str | None = None


@dataclass(frozen=True)
class Table:
    name: str                # the result file's stem
    title: str
    what: str
    run: str
    rows: list[Row] = field(default_factory=list)
    pictures: tuple[str, ...] = ()


def deploy_rows() -> list[Row]:
    return [
        Row("plain install (apt + pip), s", lambda f: num(f["plain_install_s"]["total"])),
        Row("fresh deploy (`.venv` + Ansible), s", lambda f: num(f["fresh_deploy_s"]),
            "≤ 180 s", lambda f: f["met"]["fresh_s"]),
        Row("fresh deploy / plain install", lambda f: num(f["fresh_over_plain"], "×", 2),
            "≤ 1.3×", lambda f: f["met"]["fresh_ratio"]),
        Row("re-run, s", lambda f: num(f["rerun_s"]), "≤ 20 s", lambda f: f["met"]["rerun"]),
        Row("re-run, tasks changed", lambda f: str(sum(f["rerun_changed"])), "0",
            lambda f: sum(f["rerun_changed"]) == 0),
    ]


def rerun_rows(target_s: float) -> list[Row]:
    return [
        Row("re-run, s", lambda f: num(f["rerun_s"]), f"≤ {target_s:g} s",
            lambda f: f["rerun_s"] <= target_s),
        Row("re-run, tasks changed", lambda f: str(sum(f["rerun_changed"])), "0",
            lambda f: sum(f["rerun_changed"]) == 0),
        Row("Ansible's floor per task, s", lambda f: num(f["floor"]["per_task_s"], digits=3)),
        Row("re-run against the commit before (side by side)",
            lambda f: f"{num(f['side_by_side']['new_over_old'], '×', 2)} of "
                      f"`{f['side_by_side']['against'][:7]}`"),
    ]


def crash_rows(version: str) -> list[Row]:
    def lost_at(delay: float) -> Callable[[Figures], str]:
        def value(f: Figures) -> str:
            rows = [r for r in f[version]["rows"] if r["delay_s"] == delay]
            return f"{rows[0]['lost']} of {rows[0]['jobs']}" if rows else "not measured"
        return value

    def none_lost(delay: float) -> Callable[[Figures], bool | None]:
        def ok(f: Figures) -> bool | None:
            rows = [r for r in f[version]["rows"] if r["delay_s"] == delay]
            return None if delay <= 5 or not rows else rows[0]["lost"] == 0
        return ok
    return [Row(f"{version}: jobs lost, killed {d:g} s after the burst", lost_at(d),
                "0 past the 5 s window" if d > 5 else "—", none_lost(d))
            for d in (0.0, 3.0, 6.0, 10.0)]


def scale_ddp(nodes: int) -> Callable[[Figures], str]:
    def value(f: Figures) -> str:
        row = next(r for r in f["ddp"]["rows"] if r["nodes"] == nodes)
        return num(row["pyhpc_minus_bare_s"], "s", 2)
    return value


def srun(nodes: int) -> Callable[[Figures], str]:
    return lambda f: num(next(r for r in f["srun"]["rows"] if r["nodes"] == nodes)["median_s"],
                         "s", 2)


def hostlab_run(hosts: int, key: str) -> Callable[[Figures], str]:
    return lambda f: num(next(r for r in f["runs"] if r["compute_hosts"] == hosts)[key], "s")


def hub_rss(way: str) -> Callable[[Figures], str]:
    def value(f: Figures) -> str:
        run = f[way]
        grown = sum(run["hub_rss_kib_after"].values()) - sum(run["hub_rss_kib_before"].values())
        return num(grown / 1024, "MiB")
    return value


def hub_running(way: str) -> Callable[[Figures], str]:
    """Servers that answered at their own origin, of the participants, on nodes declared
    ``way``; the failed ones and the hub's start timeout when some failed."""
    def value(f: Figures) -> str:
        run = f[way]
        text = (f"{run['serving']} of {run['participants']} ({run['cpus_per_node']} CPUs "
                f"declared a node, {run['nodes']} nodes)")
        if run["failed"]:
            text += (f"; {run['failed']} waited in Slurm's queue until the hub's "
                     f"{run['start_timeout_s']} s start timeout failed them")
        return text
    return value


def hub_last(way: str) -> Callable[[Figures], str]:
    return lambda f: num(f[way]["last_serving_s"], "s") if f[way]["last_serving_s"] else "none ran"


def backup_per_10k(key: str, unit: str, digits: int) -> Callable[[Figures], str]:
    """``key`` per 10,000 jobs at each job count, side by side (each count's total after)."""
    def value(f: Figures) -> str:
        runs = f["runs"]
        counts = " / ".join(f"{r['jobs']:,}" for r in runs)
        return " / ".join(num(r["per_10k"][key], unit, digits) for r in runs) + \
            f" (at {counts} jobs)"
    return value


def upgrade_versions(f: Figures) -> str:
    def side(v: dict[str, str]) -> str:
        return (f"Debian {v['debian']}: slurmdbd {v['slurmdbd']}, "
                f"MariaDB {v['mariadb-server'].split(':')[-1]}")
    return f"{side(f['old']['versions'])} → {side(f['new']['versions'])}"


def bubble(schedule: str, microbatches: int) -> Callable[[Figures], str]:
    def value(f: Figures) -> str:
        row = next(r for r in f["bubble"]["rows"]
                   if r["schedule"] == schedule and r["microbatches"] == microbatches)
        return f"{max(row['stage_bubble']):.2f} (bound {row['bound']:.2f})"
    return value


def largest(stages: int) -> Callable[[Figures], str]:
    def value(f: Figures) -> str:
        row = next(r for r in f["largest"]["rows"] if r["stages"] == stages)
        return f"{row['largest_trained']} blocks ({row['first_killed']['layers']} killed)"
    return value


TABLES = [
    Table("deploy-cold", "Fresh deploy on a new machine",
          "A clean clone's `make venv-deploy` + `make deploy` after a purge, against a plain "
          "apt + pip install of the same packages; then the re-run. Cold: no cached package "
          "or wheel.",
          "`make bench-deploy BENCH_DEPLOY_FLAGS=--cold` (purges the lab; ~12 min)",
          deploy_rows()),
    Table("deploy", "Fresh deploy, warm caches",
          "The same comparison with apt's and pip's caches warm.",
          "`make bench-deploy` (purges the lab; ~12 min)", deploy_rows()),
    Table("deploy-rerun", "The lab's idempotent re-run",
          "`make deploy` on a lab that is up, against the commit before, side by side.",
          "`python -m benchmarks.deploy --rerun-only --against REF`", rerun_rows(20)),
    Table("deploy-rerun-hostlab", "hostlab's idempotent re-run",
          "`make hostlab-deploy` on six hosts that are up, over SSH.",
          "`python -m benchmarks.deploy --rerun-only --hostlab --against REF`", rerun_rows(60)),
    Table("deploy-venv", "The control node's virtualenv",
          "`make venv-deploy` from nothing: three collections against the whole `ansible` bundle.",
          "`python -m benchmarks.deploy --venv-only --against REF`",
          [Row("new, s (each run)", lambda f: " / ".join(num(s) for s in f["new_s"])),
           Row("new / old", lambda f: num(f["new_over_old"], "×", 2)),
           Row("files in `.venv`, new / old", lambda f: f"{f['new_files']:,} / {f['old_files']:,}")]),
    Table("hostlab", "hostlab: deploys against 1–8 compute hosts",
          "hostlab's image, hosts up, a fresh deploy and its re-run for each host count.",
          "`make bench-hostlab` (~30 min; restores hostlab)",
          [Row("image, first build / cached, s",
               lambda f: f"{num(f['image']['first_s'])} / {num(f['image']['cached_s'])}"),
           Row("fresh deploy, 1 compute host", hostlab_run(1, "fresh_deploy_s")),
           Row("re-run, 1 compute host", hostlab_run(1, "rerun_s")),
           Row("re-run, 8 compute hosts", hostlab_run(8, "rerun_s")),
           Row("re-run, 8 hosts / 1 host", lambda f: num(f["rerun_8_over_1"], "×", 2),
               "≤ 1.5×", lambda f: f["met"]["rerun_8_over_1"]),
           Row("every re-run changed nothing", lambda f: "yes" if f["met"]["idempotent"] else "no",
               "yes", lambda f: f["met"]["idempotent"])],
          pictures=("hostlab-deploy.png",)),
    Table("jobs", "Jobs: submission and the training harness",
          "`pyhpc submit` against `sbatch`, the harness's samples/s against a plain loop, "
          "and Slurm queries per poll of `pyhpc status --watch`.",
          "`python -m benchmarks.jobs` (in `make bench`)",
          [Row("submit to RUNNING, pyhpc / sbatch",
               lambda f: num(f["submit_to_running"]["ratio"], "×", 2), "≤ 1.2×",
               lambda f: f["pass"]["submit_ratio"]),
           Row("harness samples/s / plain loop",
               lambda f: num(f["harness_overhead"]["ratio"], "×", 3), "≥ 0.99",
               lambda f: f["pass"]["harness_ratio"]),
           Row("Slurm queries per poll, 100 jobs",
               lambda f: num(f["watch_queries"]["queries_per_poll"]), "1",
               lambda f: f["pass"]["queries_per_poll"])]),
    Table("scale", "Scale: 4 to 64 emulated nodes",
          "Deploy, `srun` launch, 1,000 submissions, status polls and DDP start-up on the "
          "lab grown to 68 nodes (`ddl256.yml`).",
          "`make bench-scale` (~30 min; redeploys the lab)",
          [Row("re-run on 64 nodes / on 4",
               lambda f: num(next(r for r in f["deploy"]["runs"] if r["nodes"] == 64)["rerun_ratio"],
                             "×", 2),
               "≤ 2×", lambda f: f["deploy"]["met"], part="deploy"),
           Row("`srun hostname`, 1 node", srun(1)),
           Row("`srun hostname`, 64 nodes", srun(64)),
           Row("1,000 jobs, `pyhpc submit --array`, s",
               lambda f: num(f["submit"]["ways"]["pyhpc_submit_array_cli"]["seconds"], digits=2)),
           Row("1,000 jobs, a loop of `pyhpc submit`, jobs/s",
               lambda f: num(f["submit"]["ways"]["pyhpc_submit_loop"]["jobs_per_s"])),
           Row("Slurm queries per status poll, 1,000 jobs",
               lambda f: num(f["status"]["rows"][-1]["calls_per_poll"]), "1",
               lambda f: f["status"]["met"]),
           Row("DDP start-up, pyhpc − bare, 2 nodes", scale_ddp(2), "< 1 s",
               lambda f: next(r for r in f["ddp"]["rows"] if r["nodes"] == 2)["pyhpc_minus_bare_s"] < 1),
           Row("DDP start-up, pyhpc − bare, 8 nodes", scale_ddp(8), "< 1 s",
               lambda f: next(r for r in f["ddp"]["rows"] if r["nodes"] == 8)["pyhpc_minus_bare_s"] < 1),
           Row("1,000 array tasks to COMPLETED, s",
               lambda f: num(f["complete"]["runs"]["default"]["seconds"]))],
          pictures=tuple(f"scale-{part}.png" for part in
                         ("deploy", "srun", "submit", "status", "ddp", "complete"))),
    Table("crash", "Controller crash, lab",
          "20 jobs submitted in a burst, slurmctld killed 0–30 s later: how many accepted jobs "
          "are gone after the restart (Slurm saves state at most 5 s apart).",
          "`make bench-crash` (~15 min)", crash_rows("slurm-wlm 22.05.8")),
    Table("crash-hostlab", "Controller crash, hostlab",
          "The same on hostlab's `ctl` host, killed with `podman kill`, on both Slurm releases.",
          "`make bench-crash TARGET=hostlab`",
          crash_rows("slurm-wlm 22.05.8") + crash_rows("slurm-wlm 24.11.5")[:3]),
    Table("backup", "Backups: per 10,000 job records",
          "The backup's accounting part (mysqldump, gzip, sha256), the restore's load of it "
          "into an empty database and verify's check (a scratch database, the load, the job "
          "table counted), with pyhpc's own functions, on scratch copies of the lab's "
          "accounting schema filled with copies of its real jobs and their steps (the lab's "
          "rows: a real cluster's may be longer).",
          "`make bench-backup` (~1 min)",
          [Row("compressed dump, per 10,000 jobs", backup_per_10k("compressed_mib", "MiB", 2)),
           Row("backup (dump, gzip, sha256), per 10,000 jobs",
               backup_per_10k("backup_s", "s", 2)),
           Row("restore's load, per 10,000 jobs", backup_per_10k("restore_load_s", "s", 2)),
           Row("verify's check, per 10,000 jobs", backup_per_10k("verify_s", "s", 2)),
           Row("every job back (the load and verify's count)",
               lambda f: "yes" if f["every_row_back"] else "no", "yes",
               lambda f: bool(f["every_row_back"]))]),
    Table("restore-hostlab", "Losing the db host, hostlab",
          "Jobs before a backup, jobs between it and the loss of the db host (removed with "
          "its volumes), the host deployed anew and `pyhpc admin restore`.",
          "`python -m benchmarks.restore` (hostlab's Debian 12 hosts, ~10 min)",
          [Row("jobs recorded before the backup, kept",
               lambda f: f"{f['kept']['before_backup']} of {f['jobs']['before_backup']}",
               "all", lambda f: f["kept"]["before_backup"] == f["jobs"]["before_backup"]),
           Row("recovery point: jobs lost (ended after the backup)",
               lambda f: f"{f['recovery_point']['jobs_lost']} of "
               f"{f['jobs']['between_backup_and_loss']}"),
           Row("seconds between the backup and the loss",
               lambda f: num(f["recovery_point"]["seconds_between_backup_and_loss"], "s", 0)),
           Row("slurmdbd stopped for the restore",
               lambda f: num(f["restore"]["seconds_slurmdbd_stopped"], "s", 3)),
           Row("logins after the restore (user1 on login)",
               lambda f: "yes" if f["logins"]["user1_su_login"] else "no", "yes",
               lambda f: bool(f["logins"]["user1_su_login"]))]),
    Table("takeover-hostlab", "A backup controller's takeover, hostlab",
          "Controllers ctl and db sharing /srv/slurmctld; a burst of jobs, then ctl killed "
          "with `podman kill`, several times: when db schedules again, what the burst kept, "
          "when ctl is back in charge.",
          "`make bench-takeover` (after test_hostlab_takeover.py, ~10 min)",
          [Row("time until a new job runs (median)",
               lambda f: num(f["median_schedules_again_s"], "s") + f" with SlurmctldTimeout="
               f"{f['slurmctld_timeout']}"),
           Row("time until sbatch accepts a job again (median)",
               lambda f: num(f["median_submit_again_s"], "s")),
           Row("burst jobs accepted just before the kill, lost",
               lambda f: f"{f['burst_lost']} of {f['burst_jobs']}"),
           Row("time until ctl is in charge again, its boot included (median)",
               lambda f: num(f["median_takeback_s"], "s"))]),
    Table("upgrade-dbd", "Debian 13's slurmdbd on Debian 12's accounting database",
          "A copy of hostlab db's accounting database (Slurm 22.05, MariaDB 10.11), loaded "
          "into Debian 13's MariaDB in a container and given to Debian 13's slurmdbd; then the "
          "same with 23.02's one conversion step from it replayed by SQL first (SchedMD does "
          "not support this), and with the job table grown.",
          "`python -m benchmarks.upgrade_dbd` (hostlab's db host up; ~3 min)",
          [Row("versions, Debian 12 → 13", upgrade_versions),
           Row("slurmdbd 24.11 on the 22.05 database",
               lambda f: f"{f['outcome']}: `{f['refusal'].split(': ', 1)[-1]}`"
               if f["refusal"] else f["outcome"]),
           Row("schema version of the 22.05 database",
               lambda f: str(f["old"]["rows"]["schema_version"])),
           Row("database after the refusal: rows and schema unchanged",
               lambda f: "yes" if f["rows_kept"] and all(
                   r["after"] == r["before"] for r in f["runs"]) else "no", "yes",
               lambda f: f["rows_kept"]),
           Row("with 23.02's step replayed: outcome, schema after",
               lambda f: f"{f['replayed_outcome']}, "
               f"{f['replayed'][0]['after']['schema_version']}"),
           Row("every job's and step's fields equal after, sacct equal to db's",
               lambda f: "yes" if all(r.get("fields_equal") for r in f["replayed"])
               and f["replayed"][0]["sacct"]["equal_to_db"] else "no", "yes",
               lambda f: all(r.get("fields_equal") for r in f["replayed"])
               and f["replayed"][0]["sacct"]["equal_to_db"]),
           Row("slurmdbd's start with the conversion, by job records",
               lambda f: ", ".join(f"{int(n):,}: {num(s, 's', 2)}"
                                   for n, s in f["replayed_seconds"].items())),
           Row("seconds each 1,000 more job records add",
               lambda f: num(f["replayed_seconds_per_1000_more_jobs"], "s", 3))]),
    Table("upgrade-hosts", "Hosts moved in place to Debian 13, hostlab",
          "hostlab's six Debian 12 hosts as a deploy leaves them, each moved by `make "
          "debian-release` (sources, apt's two steps, a reboot), one after another: cpu1 "
          "from the mirror, gpu1 through an apt-cacher-ng on ctl, empty, gpu2 "
          "through it warm, then db, ctl and login through it. Only the hosts: no "
          "database conversion, no queue.",
          "`make bench-upgrade-hosts` (after `HOSTLAB_RELEASE=bookworm make hostlab`; "
          "~15 min)",
          [Row("each host's move", lambda f: ", ".join(
               f"{r['host']} {num(r['move_s'], 's', 0)}" for r in f["moves"])),
           Row("apt's downloads, each host", lambda f: ", ".join(
               f"{r['host']} {num(r['apt_fetched_bytes'] / 1e6, 'MB', 0)}"
               for r in f["moves"])),
           Row("a compute host's move through the warm cache / from the mirror",
               lambda f: num(f["summary"]["warm_cache_move_ratio"], digits=2)),
           Row("through the empty cache / from the mirror",
               lambda f: num(f["summary"]["cold_cache_move_ratio"], digits=2)),
           Row("bytes from the mirror through the cache / apt's downloads",
               lambda f: num(f["summary"]["mirror_bytes_through_cache_vs_without"],
                             digits=2)),
           Row("all six moves, one after another",
               lambda f: num(f["summary"]["all_moves_s"] / 60, "min"))]),
    Table("upgrade-run", "The whole cluster moved to Debian 13 by the run, hostlab",
          "hostlab's six Debian 12 hosts as a deploy leaves them, with history (an array "
          "that ran, a held job, one that begins later), moved by one `pyhpc admin upgrade "
          "run --deadline 0 --stop-after deploy`: the plan, the queue saved, the backups, "
          "db moved and its database converted, the controller, compute and login hosts "
          "moved, the old state set aside, the deploy onto Debian 13. Not the queue's "
          "restore: Debian 13 hosts have no pyhpc environment yet.",
          "`make bench-upgrade-run` (after `HOSTLAB_RELEASE=bookworm make hostlab`; "
          "~15 min)",
          [Row("each step", lambda f: ", ".join(
               f"{step} {num(s, 's', 0)}" for step, s in f["steps_s"].items())),
           Row("each phase", lambda f: ", ".join(
               f"{phase} {num(s, 's', 0)}" for phase, s in f["phases_s"].items())),
           Row("time no job can start (the queue's save to the deploy's end)",
               lambda f: num(f["no_job_can_start_s"] / 60, "min")),
           Row("the plan's estimate of it",
               lambda f: num(f["plan_estimate_min"], "min")
               if f["plan_estimate_min"] is not None else "—"),
           Row("after: Slurm, node states", lambda f: f"{f['after']['slurm']}, "
               + ", ".join(f["after"]["node_states"]))]),
    Table("monitoring", "Monitoring's cost",
          "A training job's samples/s with monitoring on and off (ABBA); each exporter's "
          "scrape at 4 and 68 nodes; Slurm commands per scrape with 1,000 jobs queued.",
          "`make bench-monitoring` (~20 min; redeploys the lab)",
          [Row("samples/s, on / off", lambda f: num(f["overhead"]["ratio"], digits=3), "≥ 0.99",
               lambda f: f["overhead"]["met"], part="overhead"),
           Row("each Slurm command per scrape, 1,000 jobs queued", lambda f: "1",
               "1", lambda f: f["commands"]["met"], part="commands"),
           Row("Slurm exporter scrape, 68 nodes",
               lambda f: num(f["scrape"]["large"]["slurm"]["median_wall_s"], "s", 3)),
           Row("job exporter scrape, 68 nodes",
               lambda f: num(f["scrape"]["large"]["jobs"]["median_wall_s"], "s", 3))]),
    Table("hub", "Hub: twenty participants at once",
          "Twenty participants press **Start** at the same moment, each server a one-CPU job on "
          "the workshop's two reserved CPU nodes, declared two ways: with the CPUs this machine "
          "has, and with 16 each (declared, not real). A server runs once JupyterLab answers at "
          "its own origin.",
          "`make bench-hub` (~10 min; redeploys the lab)",
          [Row("servers running, the machine's CPUs declared", hub_running("real")),
           Row("time until the last one ran, the machine's CPUs declared", hub_last("real")),
           Row("the hub's growth (hub + proxy rss), the machine's CPUs declared", hub_rss("real")),
           Row("servers running, 16 CPUs declared a node", hub_running("declared"), "all",
               lambda f: f["declared"]["serving"] == f["declared"]["participants"]),
           Row("time until all run, 16 CPUs declared a node", hub_last("declared")),
           Row("the hub's growth (hub + proxy rss), 16 CPUs declared a node",
               hub_rss("declared"))]),
    Table("workshop", "Workshops: 200 participants",
          "`pyhpc workshop create` and `delete --homes` of 200 participants, the directory and "
          "accounting real; a second create changes nothing.",
          "`make bench-workshop` (~1 min)",
          [Row("create, s", lambda f: num(f["create_s"], digits=2)),
           Row("create again (nothing changed), s", lambda f: num(f["create_again_s"], digits=2),
               "nothing changed", lambda f: not f["create_again_changed"]),
           Row("delete --homes, s", lambda f: num(f["delete_s"], digits=2)),
           Row("each participant resolves, has an association and is in the reservation",
               lambda f: f"{min(f['associations'], f['reservation_users'])} of "
                         f"{f['participants']}", "all",
               lambda f: f["last_participant_resolves"] and f["associations"]
               == f["reservation_users"] == f["participants"]),
           Row("left after delete (associations, reservation users)",
               lambda f: f"{f['left_after_delete']['associations']}, "
                         f"{f['left_after_delete']['reservation_users']}", "0, 0",
               lambda f: f["left_after_delete"]["associations"]
               == f["left_after_delete"]["reservation_users"] == 0)]),
    Table("deep", "Deep model: pipeline stages",
          "The residual CNN unsplit, over 2 and 4 stages, on 1 and 2 nodes: throughput, "
          "bubble, largest depth per stage count (1 GiB a task).",
          "`make bench-deep` (~25 min)",
          [Row("2 stages / unsplit 1 task, 50 blocks",
               lambda f: num(f["split"]["runs"]["split-2stages"]["ratio_to_unsplit_1task"], "×", 2)),
           Row("bubble, 1F1B, 4 micro-batches, 200 blocks", bubble("1f1b", 4), part="bubble"),
           Row("largest depth, unsplit", largest(1), part="largest"),
           Row("largest depth, 2 stages", largest(2), part="largest"),
           Row("largest depth, 4 stages on 2 nodes", largest(4), part="largest"),
           Row("2 nodes / 1 node, 200 blocks", lambda f: num(f["nodes"]["speedup"], "×", 2))]),
    Table("containers", "Containers: the framework image",
          "The same 2-node DDP job bare (`ddp-srun`) and in the image (`container`).",
          "`python -m benchmarks.containers` (in `make bench`)",
          [Row("samples/s, container / bare (best of 6)",
               lambda f: num(f["throughput"]["container_over_bare"], "×", 3), "≥ 0.97",
               lambda f: f["throughput"]["meets_target"]),
           Row("image size", lambda f: num(f["image"]["image_size_mb"], "MB", 0)),
           Row("image build, s", lambda f: num(f["image"]["build_seconds_recorded"]))]),
    Table("gpu", "One GPU",
          "`pyhpc bench`, training fp32 against bf16 and against the CPU, the health "
          "check and NVML on one real GPU.",
          "`make bench-gpu` (on a machine whose torch sees a GPU; ~3 min)",
          [Row("GPU", lambda f: f["bench"]["measured"]["gpu"], part="bench"),
           Row("pinned host→device copy, GB/s", lambda f: num(f["bench"]["copy_GBps"]["h2d pinned"]),
               part="bench"),
           Row("pinned copy / PCIe peak", lambda f: num(100 * f["bench"]["link"]["copy_fraction"], "%", 0),
               part="bench"),
           Row("matmul fp32 / bf16, TFLOP/s",
               lambda f: f"{num(f['bench']['matmul']['fp32']['tflops'])} / "
                         f"{num(f['bench']['matmul']['bf16']['tflops'])}", part="bench"),
           Row("wide CNN, bf16 / fp32",
               lambda f: num(f["train"]["wide"]["cuda bf16"]["vs_first"], "×", 2), part="train"),
           Row("deterministic / default kernels (H100)",
               lambda f: num(f["kernels"]["deterministic_vs_default_samples_per_s"], "×", 2)),
           Row("health check", lambda f: f["gpucheck"]["verdict"], "pass",
               lambda f: f["gpucheck"]["verdict"] == "pass", part="gpucheck")]),
]

#: `pyhpc bench`'s own output (schema pyhpc.bench/1), kept as a sample of the lab.
SAMPLES = {"pyhpc-bench-lab.json"}


def date(doc: dict[str, Any], part: str | None) -> str:
    measured = doc["figures"].get(part, {}).get("measured") if part else None
    return str((measured or doc)["date"])[:10]


def render_table(table: Table, doc: dict[str, Any]) -> str:
    figures = doc["figures"]
    lines = [f"## {table.title}", "", table.what, "", f"Run: {table.run}. "
             f"Result: `benchmarks/results/{table.name}.json` (commit `{(doc['commit'] or '?')[:7]}`).",
             "", "| figure | value | target | measured |", "|---|---|---|---|"]
    for row in table.rows:
        target = row.target if row.ok(figures) is None else f"{row.target} ({met(row.ok(figures))})"
        lines.append(f"| {row.label} | {row.value(figures)} | {target} | {date(doc, row.part)} |")
    for picture in table.pictures:
        lines += ["", f"![{table.title}: {Path(picture).stem}]({picture})"]
    return "\n".join(lines)


def render(results: Path = record.RESULTS) -> str:
    """The page, from the result files in ``results``. A result file without a table here
    is an error, so a new benchmark gets one."""
    names = sorted(p.stem for p in results.glob("*.json") if p.name not in SAMPLES)
    missing = sorted(set(names) - {t.name for t in TABLES})
    if missing:
        raise ValueError(f"benchmarks/figures_page.py: no table for {', '.join(missing)}")
    parts = ["# Benchmarks: current figures", "",
             "Generated by `make bench-page` from `benchmarks/results/*.json`; do not edit by hand.",
             "Measured on the lab unless a table says otherwise: one 2-core, 24 GiB Debian 12 "
             "machine emulating its nodes. How each figure came to be is in the "
             "[journal](benchmarks-journal.md) and in git.", ""]
    for table in TABLES:
        path = results / f"{table.name}.json"
        if path.exists():
            parts += [render_table(table, record.check(json.loads(path.read_text()), path.name)), ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if PAGE.read_text() != text:
            print(f"{PAGE.relative_to(record.ROOT)} is not what the JSON gives: make bench-page",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(record.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
