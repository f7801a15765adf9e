"""``pyhpc admin upgrade plan``: what moving the cluster to Debian 13 will do, decided from
what each host runs now (:mod:`pyhpc.admin.upgrade_facts`) and SchedMD's rule
(:mod:`pyhpc.admin.upgrade_releases`). Read-only. Refuses, with one line, a cluster it
cannot plan: a host down, a mixed cluster, one already on Debian 13, an unknown version,
too little room for the backups.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyhpc import paths
from pyhpc.admin import upgrade_facts as facts_mod
from pyhpc.admin.upgrade_facts import Facts, Host
from pyhpc.admin.upgrade_releases import (
    COMPONENTS,
    DEBIAN,
    REPLAY,
    SCHEMA,
    SCHEMA_MIN,
    SHIPPED,
    TOO_OLD,
    UPGRADES,
    UPGRADES_FROM,
    UpgradeError,
    chain,
    slurm_major,
    supported,
    upstream,
)
from pyhpc.cluster import Cluster

#: SchedMD's order: accounting first (slurmdbd accepts older slurmctlds, not newer), then
#: the controller, then the nodes; login hosts last, as jobs start again without them.
PHASES = (("dbd", "the accounting host: MariaDB and slurmdbd, the database converted"),
          ("controller", "the controller: slurmctld (and slapd, Prometheus where they are)"),
          ("compute", "the compute hosts, all at once: slurmd"),
          ("login", "the login hosts: the Slurm clients, the hub"))
#: Phases inside the time no job can start: until slurmctld and the nodes are back. The
#: login hosts count: the deploy that starts Slurm again configures every host at once, so
#: it follows their move (pyhpc.admin.upgrade_run).
BLOCKING = ("backup", "dbd", "controller", "compute", "login")
#: The estimate's inputs, assumed. Each one a benchmark measured (RESULTS) replaces its
#: assumption; the plan says which are which.
ESTIMATE = {"host_upgrade_min": 20.0,        # apt full-upgrade to trixie and a reboot
            "backup_bytes_per_s": 50e6,      # mysqldump, slapcat, tar, gzip
            "conversion_s_per_1000_jobs": 5.0,  # slurmdbd's schema conversion, per step
            "restart_min": 5.0}              # daemons up, nodes resumed, jobs resubmitted
RESULTS = paths.ROOT / "benchmarks" / "results"


def _figures(name: str, results: Path) -> tuple[dict[str, Any], str] | None:
    """A result file's figures and its date, or None where it is missing or unreadable."""
    try:
        data = json.loads((results / name).read_text())
        return data["figures"], str(data["date"])[:10]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def estimate_inputs(results: Path = RESULTS) -> tuple[dict[str, float], str]:
    """The estimate's inputs, measured where benchmarks/results has them, and the line that
    says where each came from."""
    inputs, measured = dict(ESTIMATE), {}
    if found := _figures("upgrade-hosts.json", results):
        moves = [m["move_s"] for m in found[0]["moves"]]
        inputs["host_upgrade_min"] = max(moves) / 60
        measured["host_upgrade_min"] = (f"a host's move, the slowest of {len(moves)} "
                                        f"(upgrade-hosts.json, {found[1]})")
    if found := _figures("backup.json", results):
        largest = max(found[0]["runs"], key=lambda r: r["dump_bytes"])
        inputs["backup_bytes_per_s"] = largest["dump_bytes"] / largest["backup_s"]
        measured["backup_bytes_per_s"] = f"the backup rate (backup.json, {found[1]})"
    if found := _figures("upgrade-dbd.json", results):
        inputs["conversion_s_per_1000_jobs"] = found[0]["replayed_seconds_per_1000_more_jobs"]
        measured["conversion_s_per_1000_jobs"] = (f"the conversion per 1000 job records "
                                                  f"(upgrade-dbd.json, {found[1]})")
    assumed = [k for k in ESTIMATE if k not in measured]
    source = (f"measured on hostlab's container hosts ({'; '.join(measured.values())}): a "
              "real host's reboot adds its firmware's time; " if measured else "")
    source += f"assumed: {', '.join(assumed)} (pyhpc/admin/upgrade.py ESTIMATE)"
    return inputs, source


#: What the backups hold: part -> (the facts' size key, the command).
BACKUPS = {"accounting": ("accounting", "mysqldump --single-transaction"),
           "directory": ("directory", "slapcat"),
           "slurm state": ("state", "tar of StateSaveLocation"),
           "munge key": ("munge_key", f"tar of {facts_mod.PATHS['MUNGE_KEY']}"),
           "secrets": ("secrets", f"tar of {facts_mod.PATHS['SECRETS']}")}


def _version(f: Facts, component: str) -> str | None:
    for package in COMPONENTS[component]:
        if package in f.packages:
            return upstream(f.packages[package])
    return None


def _check_releases(found: list[Facts]) -> str:
    """The one Debian release all hosts share, which pyhpc knows how to move on."""
    by: dict[str, list[str]] = {}
    for f in found:
        by.setdefault(f.codename or "unknown", []).append(f.host.name)
    for release, names in by.items():
        if release not in DEBIAN:
            raise UpgradeError(f"host {names[0]}: Debian release {release!r} is not one "
                               f"pyhpc plans for (allowed: {', '.join(DEBIAN)})")
    if len(by) > 1:
        raise UpgradeError("mixed cluster: " + "; ".join(
            f"{c} on {', '.join(n)}" for c, n in sorted(by.items()))
            + " (one release on every host before a plan)")
    codename = next(iter(by))
    if codename not in UPGRADES:
        raise UpgradeError(f"nothing to upgrade: every host is on Debian "
                           f"{DEBIAN[codename].number} ({codename}) already")
    return codename


def _check_slurm(found: list[Facts]) -> tuple[str, str]:
    """The Slurm version all hosts share: (version, major release)."""
    by: dict[str, list[str]] = {}
    for f in found:
        version = _version(f, "slurm")
        if version is not None:
            slurm_major(version, f"host {f.host.name}")
            by.setdefault(version, []).append(f.host.name)
    if not by:
        raise UpgradeError("slurm: no host has a Slurm package installed (slurmctld, "
                           "slurmdbd, slurmd or slurm-client)")
    majors = {slurm_major(v, "") for v in by}
    if len(majors) > 1:
        raise UpgradeError("mixed cluster: " + "; ".join(
            f"Slurm {v} on {', '.join(n)}" for v, n in sorted(by.items()))
            + " (one Slurm release on every host before a plan)")
    version = sorted(by)[0]
    return version, slurm_major(version, "")


def _backups(found: list[Facts], path: str) -> tuple[list[dict[str, Any]], int]:
    rows: list[dict[str, Any]] = []
    for f in found:
        for what, (key, command) in BACKUPS.items():
            size = f.size(key)
            if size is not None:
                rows.append({"host": f.host.name, "what": what, "command": command,
                             "bytes": size})
    total = sum(r["bytes"] for r in rows)
    for f in found:
        free = f.number("backup_free")
        if free is not None and free < total and any(r["host"] == f.host.name for r in rows):
            raise UpgradeError(f"backup.path: {path} on host {f.host.name} has {free} bytes "
                               f"free; the upgrade's backups need {total} (measured now, "
                               "before compression)")
    return rows, total


def _slurm(old: str, new_version: str, pending: int, running: int) -> dict[str, Any]:
    new = slurm_major(new_version, "trixie")
    ok = supported(old, new)
    steps = chain(old, new)
    out: dict[str, Any] = {
        "now": old, "after": new, "supported": ok,
        "rule": f"SchedMD: {new} takes over the state and database of "
                f"{', '.join(UPGRADES_FROM[new])}",
        "pending_jobs": pending, "running_jobs": running}
    if ok:
        out["state"] = f"carried over: slurmctld {new} reads {old}'s StateSaveLocation"
        out["pending"] = "kept: they stay queued across the upgrade"
        out["accounting"] = f"slurmdbd {new} converts the database at its first start"
    else:
        out["state"] = (f"not carried over: slurmctld {new} does not read {old}'s "
                        "StateSaveLocation (it is backed up, then started empty)")
        out["pending"] = ("held (scontrol hold), recorded with their scripts and options, "
                          "resubmitted after the upgrade; old and new job ids are listed")
        out["accounting"], out["route"] = _accounting(old, new, steps)
        out["chain"] = list(steps)
    return out


def _accounting(old: str, new: str, steps: tuple[str, ...]) -> tuple[str, list[str]]:
    """How the accounting database gets from ``old``'s schema to ``new``'s, and the route:
    through releases Debian ships where there are; else by replaying the missing release's
    step by SQL, where pyhpc has it; else none."""
    between = [r for r in steps[1:-1] if r in SHIPPED.values()]
    if steps and len(between) == len(steps) - 2:
        return (f"converted through {' -> '.join(steps)}, on a copy from the backup first",
                list(steps))
    have, need = SCHEMA.get(old), SCHEMA_MIN.get(new)
    missing = ", ".join(r for r in steps[1:-1] if r not in between)
    if have is None or need is None or have not in REPLAY or need != have + 1:
        return (f"slurmdbd {new} may refuse {old}'s database ('{TOO_OLD}') and Debian ships "
                f"no release between ({missing}): no route pyhpc knows", [])
    through = next(r for r, v in SCHEMA.items() if v == need)
    bridges = ", ".join(sorted(r for r in UPGRADES_FROM[new] if supported(old, r)))
    return (f"slurmdbd {new} refuses {old}'s database (schema {have}; it converts {need} and "
            f"newer): '{TOO_OLD}' Debian and PyPI ship no release both accept ({bridges}). On "
            f"the moved accounting host (make upgrade-accounting), after a dump, {through}'s "
            f"one step from schema {have} is replayed by SQL (SchedMD does not support this), "
            f"slurmdbd {new} converts the database, and every job's and step's fields are "
            f"checked against the dump's; any failure loads the dump back",
            [f"{old} (schema {have})", f"{through}'s step by SQL (schema {need})",
             f"{new} (schema {SCHEMA.get(new, '?')})"])


def _drain(slurm: dict[str, Any]) -> list[dict[str, str]]:
    carried = slurm["supported"]
    return [
        {"what": "every compute node",
         "why": "slurmd and slurmstepd are replaced and the host reboots into Debian 13: a "
                "running job's steps would die with them"},
        {"what": "running jobs, by the deadline you give",
         "why": "the controller stops; " + ("they would survive in the state, but not "
                "their nodes' upgrade" if carried else "the new slurmctld does not take "
                "over the old state, so a job still running would be lost; pyhpc train "
                "checkpoints and is requeued")},
        {"what": "pending jobs",
         "why": ("they stay in the state slurmctld takes over" if carried else
                 f"slurmctld {slurm['after']} does not read {slurm['now']}'s queue: "
                 "they are held, recorded and resubmitted after, never dropped")},
    ]


def _phases(found: list[Facts], total: int, job_records: int, steps: int,
            estimate: dict[str, float]) -> list[dict[str, Any]]:
    done: set[str] = set()
    host_min = estimate["host_upgrade_min"]
    phases = [{"phase": "backup", "hosts": sorted({f.host.name for f in found}),
               "what": "every backup below, after the drain, before any change",
               "minutes": round(total / estimate["backup_bytes_per_s"] / 60, 1)}]
    for role, what in PHASES:
        names = [f.host.name for f in found if role in f.host.roles and f.host.name not in done]
        done.update(names)
        minutes = host_min if names else 0.0
        if role == "dbd" and names:
            minutes += steps * job_records / 1000 * estimate["conversion_s_per_1000_jobs"] / 60
        phases.append({"phase": role, "hosts": names,
                       "what": what if names else what + " (upgraded in an earlier phase)",
                       "minutes": round(minutes, 1)})
    return phases


def build(cluster: Cluster, found: list[Facts]) -> dict[str, Any]:
    """The plan from every host's facts; :class:`UpgradeError` where something blocks it."""
    if cluster.backup is None:
        raise UpgradeError("backup: the cluster definition has no backup section; the "
                           "upgrade backs up into backup.path first (docs/admin/backups.md)")
    codename = _check_releases(found)
    target = DEBIAN[UPGRADES[codename]]
    old_version, old = _check_slurm(found)
    rows, total = _backups(found, cluster.backup.path)
    pending = sum(f.number("jobs_pending") or 0 for f in found if "controller" in f.host.roles)
    running = sum(f.number("jobs_running") or 0 for f in found if "controller" in f.host.roles)
    slurm = _slurm(old, target.versions["slurm"], pending, running)
    job_records = sum(f.number("job_records") or 0 for f in found)
    # Conversions slurmdbd makes: one a release passed through (a replayed step is not one).
    steps = max(sum(1 for r in slurm.get("route", []) if "by SQL" not in r) - 1, 1)
    estimate, source = estimate_inputs()
    phases = _phases(found, total, job_records, steps, estimate)
    window = sum(p["minutes"] for p in phases if p["phase"] in BLOCKING) \
        + estimate["restart_min"]
    return {
        "cluster": cluster.name,
        "debian": {"now": f"{DEBIAN[codename].number} ({codename})",
                   "after": f"{target.number} ({target.codename})"},
        "hosts": [{"host": f.host.name, "roles": list(f.host.roles),
                   "debian": {"now": f.debian_version, "after": target.number},
                   "versions": {c: {"now": v, "after": target.versions[c]}
                                for c in COMPONENTS if (v := _version(f, c)) is not None}}
                  for f in found],
        "slurm": slurm,
        "drain": _drain(slurm),
        "backups": rows, "backup_bytes": total, "backup_path": cluster.backup.path,
        "job_records": job_records,
        "phases": phases,
        "no_job_can_start": {"minutes": round(window, 1),
                             "phases": [p["phase"] for p in phases
                                        if p["phase"] in BLOCKING and p["minutes"]],
                             "source": source},
    }


def lab_hosts() -> list[Host]:
    """mode lab: this machine is every host."""
    return [Host("localhost", facts_mod.ROLES, local=True)]


def plan(cluster: Cluster, inventory: Path | None = None) -> dict[str, Any]:
    """Read every host (the inventory's; in mode lab, without one, this machine) and plan."""
    if inventory is not None:
        found = facts_mod.hosts(inventory)
    elif cluster.mode == "lab":
        found = lab_hosts()
    else:
        raise UpgradeError("--inventory: required in mode hosts (the inventory the cluster "
                           "was deployed from names its hosts)")
    d = cluster.directory
    base_dn = d.base_dn if d is not None and d.managed else ""
    path = cluster.backup.path if cluster.backup is not None else ""
    return build(cluster, facts_mod.gather(found, cluster.name, base_dn, path))


def text(p: dict[str, Any]) -> str:
    """The plan as an admin reads it: a table of hosts, then the decisions."""
    cols = ["host", "roles", "debian", *COMPONENTS]
    rows = [[h["host"], ",".join(h["roles"]), f"{h['debian']['now']} -> {h['debian']['after']}",
             *(f"{h['versions'][c]['now']} -> {h['versions'][c]['after']}"
               if c in h["versions"] else "-" for c in COMPONENTS)] for h in p["hosts"]]
    widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
             for r in [cols, *rows]]
    s = p["slurm"]
    lines += ["", f"Debian {p['debian']['now']} -> {p['debian']['after']}; Slurm {s['now']} -> "
              f"{s['after']}: " + ("supported" if s["supported"] else "NOT supported")
              + f" ({s['rule']})",
              f"  state: {s['state']}", f"  pending jobs ({s['pending_jobs']}): {s['pending']}",
              f"  accounting ({p['job_records']} job records): {s['accounting']}", "",
              "Drained:"]
    lines += [f"  {d['what']}: {d['why']}" for d in p["drain"]]
    lines += ["", f"Backups into {p['backup_path']} ({p['backup_bytes']} bytes measured now, "
              "before compression):"]
    lines += [f"  {b['host']}: {b['what']} ({b['command']}): {b['bytes']} bytes"
              for b in p["backups"]]
    lines += ["", "Phases, in order:"]
    lines += [f"  {i}. {ph['phase']}: {', '.join(ph['hosts']) or '-'}: {ph['what']} "
              f"(~{ph['minutes']} min)" for i, ph in enumerate(p["phases"], 1)]
    n = p["no_job_can_start"]
    lines += ["", f"No job can start for about {n['minutes']} min "
              f"({', '.join(n['phases'])}, and the restart); {n['source']}."]
    return "\n".join(lines)
