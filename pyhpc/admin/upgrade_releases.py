"""The facts an upgrade plan rests on, as data: what each Debian release ships, and which
Slurm releases SchedMD supports upgrading to which.

Bookworm's versions are what ``apt-cache policy`` shows on Debian 12 (the lab). Trixie's
come from Debian 13's archive (packages.debian.org, trixie); they are not read from a
host, so check them against ``apt-cache policy`` on a Debian 13 host when trixie moves.
Bookworm-backports has no Slurm: 22.05 is Debian 12's only Slurm, and no suite or PyPI
has 23.02, 23.11 or 24.05 to pass through.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pyhpc.errors import PyhpcError


class UpgradeError(PyhpcError):
    """Something blocks the plan (a host down, a mixed cluster, an unknown version ...)."""


#: The components the plan follows, each by the Debian packages that carry it (the first
#: one installed on a host gives its version there).
COMPONENTS: dict[str, tuple[str, ...]] = {
    "slurm": ("slurmctld", "slurmdbd", "slurmd", "slurm-client"),
    "mariadb": ("mariadb-server",),
    "slapd": ("slapd",),
    "munge": ("munge",),
    "prometheus": ("prometheus",),
}
PACKAGES = tuple(p for names in COMPONENTS.values() for p in names)


@dataclass(frozen=True)
class Release:
    number: str  # /etc/debian_version's major
    codename: str
    versions: dict[str, str]  # component -> upstream version


DEBIAN: dict[str, Release] = {
    "bookworm": Release("12", "bookworm", {"slurm": "22.05.8", "mariadb": "10.11",
                                           "slapd": "2.5", "munge": "0.5.15",
                                           "prometheus": "2.42"}),
    "trixie": Release("13", "trixie", {"slurm": "24.11.5", "mariadb": "11.8",
                                       "slapd": "2.6.10", "munge": "0.5.16",
                                       "prometheus": "2.53"}),
}
#: The move pyhpc plans: from this release to the next.
UPGRADES = {"bookworm": "trixie"}

#: SchedMD's rule, release by release: the releases whose slurmdbd database and
#: slurmctld state (StateSaveLocation) a release takes over. Up to 24.05 a release accepts
#: the two before it; from 24.11 on, the three before it (slurm.schedmd.com/upgrades.html).
UPGRADES_FROM: dict[str, tuple[str, ...]] = {
    "21.08": ("20.11", "20.02"),
    "22.05": ("21.08", "20.11"),
    "23.02": ("22.05", "21.08"),
    "23.11": ("23.02", "22.05"),
    "24.05": ("23.11", "23.02"),
    "24.11": ("24.05", "23.11", "23.02"),
    "25.05": ("24.11", "24.05", "23.11"),
    "25.11": ("25.05", "24.11", "24.05"),
}
#: The Slurm releases Debian ships, suite by suite (and PyPI none): the only ones an
#: upgrade may pass through. Bookworm-backports has none.
SHIPPED = {"bookworm": "22.05", "trixie": "24.11"}

#: slurmdbd's accounting schema (``convert_version_table``) as each release leaves it, and
#: the oldest each converts (its ``MIN_CONVERT_VERSION``). 22.05's 12, 24.11's 16 and its
#: refusal of 12 are measured (benchmarks/results/upgrade-dbd.json); 13 is 23.02's.
SCHEMA = {"22.05": 12, "23.02": 13, "24.11": 16}
SCHEMA_MIN = {"24.11": 13}
#: What 24.11's slurmdbd prints, then exits 1, on a schema older than its minimum.
TOO_OLD = "Database schema is too old for this version of Slurm to upgrade."
#: 23.02's whole conversion from schema 12, as SQL: one column renamed (its
#: _convert_clus_res_table_pre), the rest is the table checks 24.11 makes itself; then the
#: version 23.02 writes. Replayed on a copy, it lets 24.11 convert 22.05's database.
#: SchedMD does not support this.
REPLAY = {12: ("alter table clus_res_table change percent_allowed allowed int unsigned "
               "default 0", "update convert_version_table set version = 13, "
               "mod_time = unix_timestamp()")}

#: Each job's and step's fields that 22.05 and 24.11 both have: the conversion must leave
#: them as they were (compared as one digest a table, ordered by these keys).
DIGEST = {
    "job": ("job_db_inx", "id_job, id_user, id_group, id_assoc, account, `partition`, "
            "job_name, state, exit_code, derived_ec, time_submit, time_start, time_end, "
            "timelimit, nodelist, tres_alloc, tres_req, env_hash_inx, script_hash_inx, "
            "work_dir, submit_line"),
    "step": ("job_db_inx, id_step, step_het_comp", "job_db_inx, id_step, step_het_comp, state, "
             "exit_code, time_start, time_end, nodelist, tres_alloc, tres_usage_in_tot, "
             "tres_usage_out_tot, user_sec, sys_sec"),
}


def accounting_route(codename: str) -> dict[str, object]:
    """What the accounting host's conversion (pyhpc/admin/accounting_convert.py, which runs
    there without pyhpc) needs to know of the Slurm that ``codename`` ships: the schema it
    leaves and the oldest it converts, the steps replayed by schema version, its refusal
    line, the fields compared."""
    release = SHIPPED[codename]
    return {"release": release, "schema": SCHEMA[release], "schema_min": SCHEMA_MIN[release],
            "replay": {str(v): list(steps) for v, steps in REPLAY.items()},
            "too_old": TOO_OLD,
            "digest": {table: {"order": order, "fields": fields}
                       for table, (order, fields) in DIGEST.items()}}


KNOWN = tuple(sorted({*UPGRADES_FROM, *(r for v in UPGRADES_FROM.values() for r in v)}))
SLURM_VERSION = re.compile(r"(\d{2})\.(\d{2})(?:\.\d+)?")


def upstream(debian_version: str) -> str:
    """``1:10.11.19-0+deb12u1`` -> ``10.11.19``: no epoch, no Debian revision."""
    return debian_version.split(":", 1)[-1].rsplit("-", 1)[0].split("+", 1)[0]


def slurm_major(version: str, where: str) -> str:
    """``22.05.8`` -> ``22.05``; refused unless the rule above knows the release."""
    match = SLURM_VERSION.fullmatch(version)
    major = f"{match.group(1)}.{match.group(2)}" if match else None
    if major not in KNOWN:
        raise UpgradeError(f"{where}: unknown Slurm version {version!r}; the upgrade rule "
                           f"knows {', '.join(KNOWN)} (pyhpc/admin/upgrade_releases.py)")
    return major


def supported(old: str, new: str) -> bool:
    """Whether SchedMD supports ``new`` taking over ``old``'s state and database directly."""
    return old == new or old in UPGRADES_FROM.get(new, ())


def chain(old: str, new: str) -> tuple[str, ...]:
    """The fewest supported jumps from ``old`` to ``new``: the releases passed through,
    ``old`` and ``new`` included; empty where none leads there."""
    paths: list[tuple[str, ...]] = [(old,)]
    seen = {old}
    while paths:
        path = paths.pop(0)
        if path[-1] == new:
            return path
        for nxt in sorted(r for r, accepts in UPGRADES_FROM.items() if path[-1] in accepts):
            if nxt not in seen:
                seen.add(nxt)
                paths.append((*path, nxt))
    return ()


if __name__ == "__main__":  # the accounting_convert role asks: python -m ... accounting trixie
    import json
    import sys

    if sys.argv[1:2] != ["accounting"] or len(sys.argv) != 3 or sys.argv[2] not in SHIPPED:
        sys.exit(f"usage: python -m pyhpc.admin.upgrade_releases accounting "
                 f"{{{','.join(SHIPPED)}}}")
    print(json.dumps(accounting_route(sys.argv[2]), indent=2))
