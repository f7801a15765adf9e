"""Does Debian 13's slurmdbd (24.11) take over Debian 12's accounting database (22.05)?
Issue 46's design question, measured; writes benchmarks/results/upgrade-dbd.json.

1. hostlab's db host (Debian 12, as deployed): its versions, its database's row counts and
   schema version (``convert_version_table``), ``mysqldump --single-transaction`` of it and
   ``sacct`` of its jobs. Read-only: nothing on db changes.
2. A container of its own, ``upgrade-probe``, from hostlab's Debian 13 image, with Debian
   13's mariadb-server, slurmdbd, slurm-client and munge from apt (on hostlab's network),
   then without routes: the copy's cluster_table names hostlab's live ctl, which slurmdbd
   would try to reach.
3. Per size (the real dump, then its job table grown with copies of its rows under new
   ids): the dump loaded afresh, ``slurmdbd -D -vvv`` run in the foreground until it says it
   started (converted) or exits (refused or failed), timed; its fatal line, the row counts
   and the schema version after. ``slurmdbd -u`` (reports whether a conversion is needed).
4. The same with 23.02's one conversion step from schema 12 replayed by SQL first (``--no-
   replay`` skips it): the column rename 23.02's slurmdbd makes, and schema version 13.
   SchedMD does not support this. After: a digest of every job's and step's fields before
   and after, and ``sacct`` from the converted database against db's.
5. Which Slurm releases apt offers on each side (an intermediate release would be one).

The container is removed at the end (``--keep`` keeps it).

    python -m benchmarks.upgrade_dbd                     # sizes 5,000, 20,000, 100,000
    python -m benchmarks.upgrade_dbd --jobs 5000 --address 10.89.77.201
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks import record
from pyhpc.admin import upgrade_releases as releases

HOSTLAB = ["python3", "hostlab/hostlab.py"]
PROBE = "upgrade-probe"
IMAGE = "localhost/pyhpc-hostlab:trixie"
NETWORK = "pyhpc-hostlab"
DB = "db"
PACKAGES = ("mariadb-server", "mariadb-client", "slurmdbd", "slurm-client", "munge", "bc")
DUMP = Path("/tmp/upgrade-dbd-22.05.sql")
STARTED = re.compile(r"slurmdbd version \S+ started")
TIMEOUT_S = 1800
#: slurmdbd.conf in the probe: the keys slurmdbd needs, nothing of db's.
CONF = """AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc={db}
StorageUser=slurm
StoragePass=probe
"""
#: MariaDB and munged without systemd (the probe runs ``sleep``, not init).
DAEMONS = """set -e
mkdir -p /run/mysqld /run/munge /var/log/slurm /etc/slurm
chown mysql: /run/mysqld; chown munge: /run/munge; chown slurm: /var/log/slurm
test -s /etc/munge/munge.key || mungekey --create
(mariadbd --user=mysql >/var/log/mariadbd.log 2>&1 &)
runuser -u munge -- munged
for i in $(seq 60); do mysqladmin ping >/dev/null 2>&1 && break; sleep 1; done
mysql -e "create user if not exists slurm@localhost identified by 'probe'"
"""
#: slurmdbd in the foreground until it says it started (left running: sacct asks it) or
#: exits (its status), at most TIMEOUT_S; and the time that took.
RUN = """cd /root; rm -f dbd.out; start=$(date +%s.%N)
slurmdbd -D -vvv >dbd.out 2>&1 & pid=$!; echo $pid >dbd.pid
deadline=$(( $(date +%s) + {timeout} ))
while kill -0 $pid 2>/dev/null && ! grep -Eq 'slurmdbd version \\S+ started' dbd.out \\
    && [ $(date +%s) -lt $deadline ]; do sleep 0.05; done
end=$(date +%s.%N)
if kill -0 $pid 2>/dev/null; then rc=running; else wait $pid; rc=$?; fi
echo "seconds=$(echo "$end - $start" | bc) rc=$rc"
"""
STOP = "kill $(cat /root/dbd.pid) 2>/dev/null; while pgrep -x slurmdbd >/dev/null; do sleep 0.2; done"
#: slurm.conf in the probe, for sacct only: its cluster, its slurmdbd.
SLURM_CONF = """ClusterName={cluster}
SlurmctldHost=localhost
AuthType=auth/munge
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
"""
#: 23.02's one conversion step from schema 12 (22.05), as the upgrade replays it.
REPLAY = "; ".join(releases.REPLAY[12])
SACCT = ("sacct -a -P -n -o jobidraw,uid,account,elapsed,exitcode,state,alloctres "
         "-S 2000-01-01 -E now")


def hostlab(*args: str, check: bool = True, stdin: str | None = None) -> str:
    proc = subprocess.run([*HOSTLAB, *args], cwd=record.ROOT, text=True, input=stdin,
                          capture_output=True, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"benchmarks.upgrade_dbd: {' '.join(args[:4])} ... exit status "
                         f"{proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}")
    return proc.stdout


def on_db(command: str) -> str:
    return hostlab("run", DB, "--", "bash", "-c", command)


def probe(command: str, check: bool = True) -> str:
    return hostlab("podman", "exec", PROBE, "bash", "-c", command, check=check)


def sql(side: str, database: str, query: str) -> list[list[str]]:
    """``query`` on db or in the probe, on its stdin (no shell quoting)."""
    argv = ["run", DB, "--"] if side == DB else ["podman", "exec", "--interactive", PROBE]
    out = hostlab(*argv, "mysql", "-N", "-B", database, stdin=query)
    return [line.split("\t") for line in out.splitlines() if line]


def versions(where: Any) -> dict[str, str]:
    out = where("cat /etc/debian_version; dpkg-query -W -f '${Package} ${Version}\\n' "
                "mariadb-server slurmdbd munge")
    lines = out.split("\n")
    return {"debian": lines[0].strip(),
            **dict(line.split(" ", 1) for line in lines[1:] if " " in line)}


def counts(side: str, database: str, cluster: str) -> dict[str, Any]:
    rows = sql(side, database, f"select count(*) from {cluster}_job_table; "
               f"select count(*) from {cluster}_step_table; "
               f"select version from convert_version_table")
    return {"jobs": int(rows[0][0]), "steps": int(rows[1][0]), "schema_version": int(rows[2][0])}


def source() -> dict[str, Any]:
    """db's side: versions, the database, its counts; the dump written to DUMP."""
    conf = dict(line.split("=", 1) for line in on_db("cat /etc/slurm/slurmdbd.conf").splitlines()
                if "=" in line and not line.startswith("#"))
    database = conf["StorageLoc"]
    cluster = sql(DB, database, "select name from cluster_table where deleted = 0")[0][0]
    DUMP.write_text(on_db(f"mysqldump --single-transaction {database}"))
    return {"host": DB, "versions": versions(on_db), "database": database, "cluster": cluster,
            "dump_bytes": DUMP.stat().st_size, "rows": counts(DB, database, cluster),
            "apt_slurmdbd": on_db("apt-cache madison slurmdbd | awk '{print $3}'").split()}


def start_probe(address: str) -> dict[str, Any]:
    hostlab("podman", "rm", "--force", PROBE, check=False)
    hostlab("podman", "run", "--detach", "--name", PROBE, "--hostname", PROBE,
            "--network", NETWORK, "--ip", address, "--init", "--cap-add", "NET_ADMIN",
            IMAGE, "sleep", "infinity")
    started = time.monotonic()
    probe("export DEBIAN_FRONTEND=noninteractive; apt-get update -q >/dev/null && "
          f"apt-get install -y -q --no-install-recommends {' '.join(PACKAGES)} >/dev/null")
    installed = round(time.monotonic() - started, 1)
    # No routes from here on: the address stays (slurmdbd listens only where there is one).
    probe("ip route flush table main")
    ctl = probe("timeout 2 bash -c '</dev/tcp/ctl/6817' 2>/dev/null && echo yes || echo no",
                check=False).strip()
    probe(DAEMONS)
    return {"image": IMAGE, "address": address, "install_s": installed, "reaches_ctl": ctl,
            "versions": versions(probe),
            "apt_slurmdbd": probe("apt-cache madison slurmdbd | awk '{print $3}'").split()}


def load(database: str, cluster: str, jobs: int | None) -> None:
    """The dump afresh into ``database``; the job table grown to ``jobs`` rows (copies of
    the real rows, new job_db_inx and id_job; no steps) when given."""
    hostlab("podman", "cp", str(DUMP), f"{PROBE}:/root/acct.sql")
    probe(f"mysql -e 'drop database if exists {database}; create database {database}; "
          f"grant all on {database}.* to slurm@localhost' && mysql {database} < /root/acct.sql")
    if jobs is None:
        return
    table = f"{cluster}_job_table"
    columns = sql(PROBE, database, "select group_concat(concat('`', column_name, '`')) from "
                  "information_schema.columns where table_schema = database() and "
                  f"table_name = '{table}' and column_name not in ('job_db_inx', 'id_job')")
    cols = columns[0][0]
    real = counts(PROBE, database, cluster)["jobs"]
    top = int(sql(PROBE, database, f"select max(id_job) from {table}")[0][0])
    copies = -(-jobs // max(real, 1))
    sql(PROBE, database, f"insert into {table} ({cols}, id_job) select {cols}, "
        f"t.id_job + s.seq * {top + 1} from {table} t join seq_1_to_{copies} s "
        f"where t.id_job <= {top} order by s.seq, t.job_db_inx limit {jobs - real}")


def digests(cluster: str, database: str) -> dict[str, str]:
    query = "; ".join(f"select md5(group_concat(concat_ws('|', {cols}) order by {order} "
                      f"separator '\\n')) from {cluster}_{table}_table"
                      for table, (order, cols) in releases.DIGEST.items())
    probe("mysql -e 'set global group_concat_max_len = 1073741824'")
    return dict(zip(releases.DIGEST, (row[0] for row in sql(PROBE, database, query)), strict=True))


def finished(lines: list[str], ids: set[str]) -> list[str]:
    """sacct's lines of the jobs (and their steps) in ``ids``."""
    return sorted(line for line in lines if re.split(r"[._+]", line, maxsplit=1)[0] in ids)


def convert(database: str, cluster: str, jobs: int | None, replay: bool,
            sacct_db: list[str] | None = None) -> dict[str, Any]:
    """One try: the dump loaded (grown to ``jobs``; 23.02's step replayed), slurmdbd
    started on it, and what it did."""
    load(database, cluster, jobs)
    before = counts(PROBE, database, cluster)
    digest = digests(cluster, database) if replay else None
    if replay:
        sql(PROBE, database, REPLAY)
    probe(f"echo '{CONF.format(db=database)}' >/etc/slurm/slurmdbd.conf && "
          "chown slurm: /etc/slurm/slurmdbd.conf && chmod 600 /etc/slurm/slurmdbd.conf && "
          f"echo '{SLURM_CONF.format(cluster=cluster)}' >/etc/slurm/slurm.conf")
    result = dict(item.split("=", 1) for item in probe(RUN.format(timeout=TIMEOUT_S)).split())
    out = probe("cat /root/dbd.out").splitlines()
    outcome = ("converted" if any(STARTED.search(line) for line in out) else
               "refused" if any(releases.TOO_OLD in line for line in out) else "failed")
    run: dict[str, Any] = {
        "jobs_before": before["jobs"], "replayed_23_02_step": replay, "outcome": outcome,
        "seconds": round(float(result["seconds"]), 2), "exit": result["rc"],
        "fatal": next((line for line in out if "fatal:" in line), None),
        "conversion_lines": [line for line in out if "Conversion done" in line
                             or "converting" in line],
    }
    if outcome == "converted" and sacct_db is not None:
        ids = {row[0] for row in sql(PROBE, database, f"select id_job from {cluster}_job_table "
                                     "where time_end > 0")}
        mine = finished(probe(f"{SACCT} 2>&1", check=False).splitlines(), ids)
        theirs = finished(sacct_db, ids)
        run["sacct"] = {"lines": len(mine), "equal_to_db": mine == theirs,
                        "differ": [line for line in mine if line not in theirs][:5]}
    probe(STOP)
    run.update(before=before, after=counts(PROBE, database, cluster))
    if digest is not None:
        run["fields_equal"] = digests(cluster, database) == digest
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="5000,20000,100000",
                        help="job table sizes to grow the real one to, comma-separated")
    parser.add_argument("--address", default="10.89.77.200",
                        help="the probe's address on hostlab's network (one no host has)")
    parser.add_argument("--no-replay", action="store_true",
                        help="skip the tries with 23.02's step replayed by SQL")
    parser.add_argument("--keep", action="store_true", help="keep the probe container")
    args = parser.parse_args()
    sizes: list[int | None] = [None, *(int(n) for n in args.jobs.split(",") if n)]
    old = source()
    sacct_db = on_db(SACCT).splitlines()
    try:
        new = start_probe(args.address)
        runs = [convert(old["database"], old["cluster"], n, False) for n in sizes]
        check = probe("slurmdbd -u 2>&1; echo rc=$?", check=False).strip().splitlines()
        replayed = [] if args.no_replay else [
            convert(old["database"], old["cluster"], n, True, sacct_db if n is None else None)
            for n in sizes]
    finally:
        if not args.keep:
            hostlab("podman", "rm", "--force", "--time", "1", PROBE, check=False)
    figures = {
        "old": old, "new": new, "runs": runs, "slurmdbd_u": check,
        "outcome": runs[0]["outcome"], "refusal": runs[0]["fatal"],
        "rows_kept": all(r["after"][k] == r["before"][k] for r in runs for k in ("jobs", "steps")),
        "replayed": replayed,
        "replayed_outcome": replayed[0]["outcome"] if replayed else None,
        "replayed_seconds": {str(r["jobs_before"]): r["seconds"] for r in replayed
                             if r["outcome"] == "converted"},
    }
    # What each 1,000 more job records add: the smallest size's run against the largest's
    # (slurmdbd's start and the other tables' changes are in both).
    done = [r for r in replayed if r["outcome"] == "converted"]
    if len(done) > 1:
        small, large = min(done, key=lambda r: r["jobs_before"]), max(
            done, key=lambda r: r["jobs_before"])
        figures["replayed_seconds_per_1000_more_jobs"] = round(
            (large["seconds"] - small["seconds"]) * 1000
            / (large["jobs_before"] - small["jobs_before"]), 4)
    print(json.dumps(figures, indent=2))
    print(record.write("upgrade-dbd", figures))


if __name__ == "__main__":
    main()
