"""Backups' size and time per 10,000 job records, on the lab; writes
benchmarks/results/backup.json.

The lab's accounting database (slurmdbd's StorageLoc) is only read: its job and step rows
are copied once into a snapshot database. For each ``--jobs`` count N, a scratch database
gets the same schema (``CREATE TABLE ... LIKE`` of every table) and N synthetic jobs, each a
copy of a real one with a new ``job_db_inx`` and ``id_job``, with that job's steps. Then,
with pyhpc's own functions (:mod:`pyhpc.admin.backup`):

1. the backup's accounting part: ``dump_accounting`` (mysqldump, gzip) written as ``now``
   writes it, and its sha256 (``manifest_text``): time and compressed size;
2. the restore's load: ``feed`` of that dump into an empty scratch database: time;
3. verify's check: ``verify_dump`` (a scratch database, the load, the job table's rows
   counted): time and rows.

Each of these ``--repeat`` times; the medians, and each per 10,000 jobs.

Every database it made is dropped at the end, on failure too.

    python -m benchmarks.backup                        # 10,000 and 50,000 jobs, 3 each (~3 min)
    python -m benchmarks.backup --jobs 10000 20000 --repeat 1
"""
from __future__ import annotations

import argparse
import json
import secrets
import statistics
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import record
from pyhpc import files
from pyhpc.admin import backup
from pyhpc.admin import backup_store as store

SLURM_CONF = Path("/etc/slurm/slurm.conf")
PART = "accounting.sql.gz"
PREFIX = "pyhpc_bench_backup_"
PER = 10_000


def multiply_sql(target: str, columns: list[str], replaced: dict[str, str], rows: int,
                 snapshot: str, sources: int, values: str = "r", join: str = "") -> str:
    """``INSERT ... SELECT`` of ``rows`` rows into ``target``: row ``s.seq`` (1 to ``rows``,
    MariaDB's sequence table) copies row ``(s.seq - 1) mod sources`` of ``snapshot`` (alias
    ``r``, numbered from 0 in its column ``k``), or of what ``join`` adds to it (``values``:
    the alias the columns come from). Every column of ``columns`` (the schema's, in order)
    as it is, but those of ``replaced`` (column -> SQL expression)."""
    unknown = sorted(set(replaced) - set(columns))
    if unknown:
        raise ValueError(f"{target}: no column {', '.join(unknown)} (its columns: "
                         f"{', '.join(columns)})")
    if rows < 1 or sources < 1:
        raise ValueError(f"{target}: rows {rows} and sources {sources} must be at least 1")
    names = ", ".join(f"`{c}`" for c in columns)
    exprs = ", ".join(replaced.get(c, f"{values}.`{c}`") for c in columns)
    return (f"INSERT INTO {target} ({names}) SELECT {exprs} FROM seq_1_to_{rows} s "
            f"JOIN {snapshot} r ON r.k = (s.seq - 1) % {sources}{join}")


def per_10k(value: float, rows: int, digits: int = 3) -> float:
    return round(value * PER / rows, digits)


def columns(database: str, table: str) -> list[str]:
    return backup.mysql("SELECT column_name FROM information_schema.columns WHERE "
                        f"table_schema = '{database}' AND table_name = '{table}' "
                        "ORDER BY ordinal_position").split()


def count(database: str, table: str) -> int:
    return int(backup.mysql(f"SELECT COUNT(*) FROM `{table}`", database).split()[0])


def snapshot(real: str, cluster: str, into: str) -> tuple[int, int]:
    """The real job and step rows, copied into ``into`` (``job`` numbered by ``k``, ``step``);
    returns how many of each."""
    backup.mysql(f"CREATE DATABASE `{into}`")
    backup.mysql(
        f"CREATE TABLE job AS SELECT ROW_NUMBER() OVER (ORDER BY job_db_inx) - 1 AS k, j.* "
        f"FROM `{real}`.`{cluster}_job_table` j; ALTER TABLE job ADD INDEX (k); "
        f"CREATE TABLE step AS SELECT t.* FROM `{real}`.`{cluster}_step_table` t "
        "JOIN job r ON t.job_db_inx = r.job_db_inx; ALTER TABLE step ADD INDEX (job_db_inx)",
        into)
    return count(into, "job"), count(into, "step")


def fill(real: str, cluster: str, src: str, sources: int, scratch: str, jobs: int) -> int:
    """``scratch``: every table of ``real`` (empty), its job table ``jobs`` copies of the
    snapshot's jobs (new job_db_inx and id_job), its step table their steps; returns steps."""
    backup.mysql(f"CREATE DATABASE `{scratch}`")
    tables = backup.mysql("SELECT table_name FROM information_schema.tables WHERE "
                          f"table_schema = '{real}' AND table_type = 'BASE TABLE'").split()
    backup.mysql("; ".join(f"CREATE TABLE `{t}` LIKE `{real}`.`{t}`" for t in tables), scratch)
    job, step = f"{cluster}_job_table", f"{cluster}_step_table"
    backup.mysql(multiply_sql(f"`{job}`", columns(real, job),
                              {"job_db_inx": "s.seq", "id_job": "s.seq"}, jobs,
                              f"`{src}`.job", sources), scratch)
    backup.mysql(multiply_sql(f"`{step}`", columns(real, step), {"job_db_inx": "s.seq"}, jobs,
                              f"`{src}`.job", sources, values="t",
                              join=f" JOIN `{src}`.step t ON t.job_db_inx = r.job_db_inx"),
                 scratch)
    return count(scratch, step)


def gzip_size(path: Path) -> int:
    """The uncompressed size gzip's trailer records (mod 4 GiB: far above these dumps)."""
    with path.open("rb") as fh:
        fh.seek(-4, 2)
        return int(struct.unpack("<I", fh.read(4))[0])


def once(scratch: str, empty: str, job_table: str) -> dict[str, Any]:
    """One backup of ``scratch``'s dump, its load into ``empty`` (made, then dropped) and
    verify's check: seconds, sizes, rows."""
    with tempfile.TemporaryDirectory(prefix="pyhpc-bench-backup-") as work:
        dump = Path(work) / PART
        start = time.monotonic()
        files.write_with(dump, lambda out: backup.dump_accounting(scratch, out), "backup",
                         mode=0o600)
        dump_s = time.monotonic() - start
        start = time.monotonic()
        store.manifest_text(Path(work), [PART])
        checksum_s = time.monotonic() - start
        backup.mysql(f"CREATE DATABASE `{empty}`")
        try:
            start = time.monotonic()
            backup.feed(["mysql", empty], dump, backup.DUMP_END)
            load_s = time.monotonic() - start
            restored = count(empty, job_table)
        finally:
            backup.mysql(f"DROP DATABASE IF EXISTS `{empty}`")
        start = time.monotonic()
        verified = backup.verify_dump(dump, job_table)
        verify_s = time.monotonic() - start
        return {"dump_s": dump_s, "checksum_s": checksum_s, "backup_s": dump_s + checksum_s,
                "restore_load_s": load_s, "verify_s": verify_s,
                "compressed_bytes": dump.stat().st_size, "dump_bytes": gzip_size(dump),
                "restored_jobs": restored, "verify_jobs": verified["jobs"]}


TIMES = ("dump_s", "checksum_s", "backup_s", "restore_load_s", "verify_s")


def measure(real: str, cluster: str, src: str, sources: int, jobs: int, repeat: int,
            made: list[str]) -> dict[str, Any]:
    """``jobs`` synthetic jobs: ``repeat`` times :func:`once`; the median of each time."""
    scratch, empty = f"{PREFIX}{secrets.token_hex(4)}", f"{PREFIX}{secrets.token_hex(4)}"
    made += [scratch, empty]
    steps = fill(real, cluster, src, sources, scratch, jobs)
    samples = [once(scratch, empty, f"{cluster}_job_table") for _ in range(repeat)]
    backup.mysql(f"DROP DATABASE IF EXISTS `{scratch}`")
    last = samples[-1]
    median = {k: round(statistics.median(s[k] for s in samples), 4) for k in TIMES}
    return {
        "jobs": jobs, "steps": steps, "repeat": repeat,
        **median,
        "samples_s": {k: [round(s[k], 4) for s in samples] for k in TIMES},
        "compressed_bytes": last["compressed_bytes"], "dump_bytes": last["dump_bytes"],
        "restored_jobs": min(s["restored_jobs"] for s in samples),
        "verify_jobs": min(s["verify_jobs"] for s in samples),
        "per_10k": {"compressed_mib": per_10k(last["compressed_bytes"] / 2**20, jobs),
                    **{k: per_10k(median[k], jobs) for k in TIMES}},
    }


def left() -> list[str]:
    """Databases of this benchmark still there (none after a run)."""
    return backup.mysql("SELECT schema_name FROM information_schema.schemata WHERE "
                        f"schema_name LIKE '{PREFIX}%'").split()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.backup", description=__doc__)
    parser.add_argument("--jobs", type=int, nargs="+", default=[10_000, 50_000])
    parser.add_argument("--repeat", type=int, default=3, help="samples of each time")
    args = parser.parse_args(argv)
    real = backup.conf_value(backup.SLURMDBD_CONF, "StorageLoc")
    cluster = backup.conf_value(SLURM_CONF, "ClusterName")
    if not real or not cluster:
        raise SystemExit(f"benchmarks.backup: run it on the lab, as root ({backup.SLURMDBD_CONF}"
                         f" names no StorageLoc or {SLURM_CONF} no ClusterName)")
    src = f"{PREFIX}{secrets.token_hex(4)}"
    made = [src]
    try:
        real_jobs, real_steps = snapshot(real, cluster, src)
        if not real_jobs:
            raise SystemExit(f"benchmarks.backup: {real} holds no job to copy; run a job first")
        runs = [measure(real, cluster, src, real_jobs, n, args.repeat, made) for n in sorted(args.jobs)]
    finally:
        for name in made:
            backup.mysql(f"DROP DATABASE IF EXISTS `{name}`")
    small, large = runs[0], runs[-1]
    span = large["jobs"] - small["jobs"]
    figures = {
        "source": {"database": real, "read_only": True, "real_jobs": real_jobs,
                   "real_steps": real_steps},
        "part": PART, "runs": runs,
        # what 10,000 more jobs add, between the smallest and the largest count
        "marginal_per_10k": None if not span else {
            "compressed_mib": round((large["compressed_bytes"] - small["compressed_bytes"])
                                    * PER / span / 2**20, 3),
            **{k: round((large[k] - small[k]) * PER / span, 3) for k in TIMES}},
        "every_row_back": all(r["restored_jobs"] == r["verify_jobs"] == r["jobs"] for r in runs),
        "scratch_left": left(),
    }
    print(json.dumps(figures, indent=2))
    print(f"wrote {record.write('backup', figures)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
