"""Does Debian 13's slurmdbd (24.11) take over Debian 12's accounting database (22.05)?
Issue 46's design question, measured; writes benchmarks/results/upgrade-dbd.json.

1. hostlab's db host (Debian 12, as deployed): its versions, its database's row counts and
   schema version (``convert_version_table``), and ``mysqldump --single-transaction`` of
   it. Read-only: nothing on db changes.
2. A container of its own, ``upgrade-probe``, from hostlab's Debian 13 image on hostlab's
   network, with Debian 13's mariadb-server, slurmdbd and munge from apt.
3. Per size (the real dump, then its job table grown with copies of its rows under new
   ids): the dump loaded afresh, ``slurmdbd -D -vvv`` run in the foreground until it says it
   started (converted) or exits (refused or failed), timed; its last lines, the row counts
   and the schema version after. ``slurmdbd -u`` (reports whether a conversion is needed).
4. Which Slurm releases apt offers on each side (an intermediate release would be one).

The container is removed at the end (``--keep`` keeps it).

    python -m benchmarks.upgrade_dbd                     # sizes 5,000 and 20,000 jobs
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

HOSTLAB = ["python3", "hostlab/hostlab.py"]
PROBE = "upgrade-probe"
IMAGE = "localhost/pyhpc-hostlab:trixie"
NETWORK = "pyhpc-hostlab"
DB = "db"
PACKAGES = ("mariadb-server", "mariadb-client", "slurmdbd", "munge")
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
#: slurmdbd in the foreground: started (then stopped), or its exit status; and the time.
RUN = """cd /root; rm -f dbd.out; start=$(date +%s.%N)
slurmdbd -D -vvv >dbd.out 2>&1 & pid=$!
while kill -0 $pid 2>/dev/null && ! grep -Eq 'slurmdbd version \\S+ started' dbd.out; do
  sleep 0.2; done
end=$(date +%s.%N)
if kill -0 $pid 2>/dev/null; then kill $pid; wait $pid; rc=running; else wait $pid; rc=$?; fi
echo "seconds=$(echo "$end - $start" | bc) rc=$rc"
"""


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
            "--network", NETWORK, "--ip", address, IMAGE, "sleep", "infinity")
    started = time.monotonic()
    probe("export DEBIAN_FRONTEND=noninteractive; apt-get update -q >/dev/null && "
          f"apt-get install -y -q --no-install-recommends {' '.join(PACKAGES)} bc >/dev/null")
    installed = round(time.monotonic() - started, 1)
    probe(DAEMONS)
    return {"image": IMAGE, "address": address, "install_s": installed,
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
    copies = -(-jobs // max(real, 1))
    sql(PROBE, database, f"insert into {table} ({cols}, id_job) select {cols}, "
        f"t.id_job + s.seq * 10000000 from {table} t join seq_1_to_{copies} s "
        f"where t.id_job < 10000000 order by s.seq, t.job_db_inx limit {jobs - real}")


def convert(database: str, cluster: str, jobs: int | None) -> dict[str, Any]:
    load(database, cluster, jobs)
    before = counts(PROBE, database, cluster)
    probe(f"echo '{CONF.format(db=database)}' >/etc/slurm/slurmdbd.conf && "
          "chown slurm: /etc/slurm/slurmdbd.conf && chmod 600 /etc/slurm/slurmdbd.conf")
    result = dict(item.split("=", 1) for item in probe(RUN).split())
    out = probe("cat /root/dbd.out").splitlines()
    outcome = ("converted" if any(STARTED.search(line) for line in out) else
               "refused" if any("too old" in line for line in out) else "failed")
    return {"jobs_before": before["jobs"], "outcome": outcome,
            "seconds": round(float(result["seconds"]), 2), "exit": result["rc"],
            "fatal": next((line for line in out if "fatal:" in line), None),
            "last_lines": out[-3:], "after": counts(PROBE, database, cluster),
            "before": before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="5000,20000",
                        help="job table sizes to grow the real one to, comma-separated")
    parser.add_argument("--address", default="10.89.77.200",
                        help="the probe's address on hostlab's network (one no host has)")
    parser.add_argument("--keep", action="store_true", help="keep the probe container")
    args = parser.parse_args()
    sizes = [int(n) for n in args.jobs.split(",") if n]
    old = source()
    try:
        new = start_probe(args.address)
        runs = [convert(old["database"], old["cluster"], None)]
        runs += [convert(old["database"], old["cluster"], n) for n in sizes]
        check = probe("slurmdbd -u 2>&1; echo rc=$?", check=False).strip().splitlines()
    finally:
        if not args.keep:
            hostlab("podman", "rm", "--force", PROBE, check=False)
    converted = [r for r in runs if r["outcome"] == "converted" and r["jobs_before"]]
    figures = {
        "old": old, "new": new, "runs": runs, "slurmdbd_u": check,
        "outcome": runs[0]["outcome"], "refusal": runs[0]["fatal"],
        "rows_kept": all(r["after"][k] == r["before"][k] for r in runs for k in ("jobs", "steps")),
        "seconds_per_1000_jobs": [round(r["seconds"] * 1000 / r["jobs_before"], 3)
                                  for r in converted] or None,
    }
    print(json.dumps(figures, indent=2))
    print(record.write("upgrade-dbd", figures))


if __name__ == "__main__":
    main()
