"""``pyhpc-jobstats-record`` (``python -m pyhpc.monitor.record``): a job's GPU and memory
summary, stored as JSON when the job ends, so ``pyhpc jobstats`` has it after
Prometheus has dropped the samples.

slurmctld runs it as its ``EpilogSlurmctld`` (as SlurmUser, with ``SLURM_JOB_ID`` set). It
asks slurmctld for the job's owner and times (one ``squeue``), Prometheus for
the figures the job exporter sampled, and writes ``<store>/<raw job id>.json``: written
atomically, never through a link, mode 0640 (the store's group, slurm), in a store that
must be SlurmUser's and writable by nobody else (:func:`pyhpc.files.safe_dir`). A POSIX
ACL entry lets the job's owner, and no other user, read their own record; where the
filesystem has no ACLs only admins (the group) can, and users get the figures from
Prometheus while it keeps them. Without a Prometheus nothing is recorded.

The record holds the job's summary in Princeton jobstats' format too (``admin_comment``,
:mod:`pyhpc.monitor.admin_comment`); where this Slurm can store it (23.02 and later), it
goes into the job's AdminComment as well, where jobstats and reportseff read it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyhpc import files, validate
from pyhpc.errors import PyhpcError
from pyhpc.monitor import admin_comment, prometheus
from pyhpc.slurm import slurm

STORE = Path("/var/lib/pyhpc/jobstats")
SCHEMA = "pyhpc-jobstats/1"
MAX_BYTES = 64 << 10


class RecordError(PyhpcError):
    """The store is unusable, or a stored record is not one pyhpc wrote."""


@dataclass(frozen=True)
class Record:
    """What the store keeps for one job."""

    job_id_raw: str
    user: str
    start: float
    end: float
    gpu: prometheus.GpuFigures | None
    host_mem_peak_bytes: int | None
    #: The job's summary in jobstats' format (:mod:`admin_comment`); None in older records.
    admin_comment: str | None = None


def epoch(text: str) -> float | None:
    """Seconds since the epoch of a Slurm timestamp (``2026-11-25T16:27:43``, local time);
    None for ``Unknown`` or ``None`` (not started, not ended)."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def path_of(store: Path, job_id_raw: str) -> Path:
    return store / f"{validate.name('job', job_id_raw, 'job_id', RecordError)}.json"


def read(store: Path, job_id_raw: str) -> Record | None:
    """The stored record of a job, or None where there is none this user can read."""
    fh, _ = files.try_open_regular(path_of(store, job_id_raw))
    if fh is None:
        return None
    with fh:
        data: Any = validate.read_json(str(store), fh.read(MAX_BYTES + 1), RecordError)
    try:
        g, peak = data["gpu"], data["host_mem_peak_bytes"]
        gpu = prometheus.GpuFigures(float(g["util_mean"]), float(g["util_peak"]),
                                    int(g["mem_peak_bytes"]), int(g["gpus"]),
                                    int(g["used"])) if g is not None else None
        comment = data.get("admin_comment")
        return Record(str(data["job_id_raw"]), str(data["user"]), float(data["start"]),
                      float(data["end"]), gpu, int(peak) if peak is not None else None,
                      str(comment) if comment is not None else None)
    except (KeyError, TypeError, ValueError):
        raise RecordError(f"record: {path_of(store, job_id_raw)} is not a pyhpc jobstats "
                          "record", "record") from None


def write(store: Path, rec: Record, uid: int | None) -> Path:
    """Store ``rec`` (0640, atomically, no link followed); its owner may read it."""
    where = files.safe_dir(store, "store")
    data = {"schema": SCHEMA, **asdict(rec)}
    was = files.group_readable()
    files.set_group_readable(True)  # 0640 for this file only: the process's mode stays
    try:
        path = files.write_text(path_of(where, rec.job_id_raw),
                                json.dumps(validate.json_safe(data), sort_keys=True) + "\n",
                                "store")
    finally:
        files.set_group_readable(was)
    if uid is not None:
        files.let_read(path, uid, "store")
    return path


def from_slurm(job_id: str, base: str, sampling_s: int) -> tuple[Record, int | None]:
    """The job's record from slurmctld's view of it (its owner and times in columns no
    user sets, never its name or comment: :func:`pyhpc.slurm.slurm.job_owner`) and
    Prometheus' samples (``sampling_s``: its scrape interval)."""
    view = slurm.job_owner(validate.name("job", job_id, "job_id", RecordError))
    if view is None or not view.start or not view.end:
        raise RecordError(f"job: slurmctld has no start and end time for {job_id}", "job")
    start, end, raw = float(view.start), float(view.end), view.job_id
    return Record(raw, view.user, start, end, prometheus.gpu_figures(base, raw, start, end),
                  prometheus.host_memory_peak(base, raw, start, end),
                  jobstats_summary(base, raw, start, end, sampling_s)), view.uid


def jobstats_summary(base: str, raw: str, start: float, end: float,
                     sampling_s: int) -> str | None:
    """The summary, or None (and one line on stderr) where it is too large to keep: the
    record's other figures are kept all the same."""
    try:
        return admin_comment.summary(base, raw, start, end, sampling_s)
    except admin_comment.CommentError as exc:
        print(f"pyhpc-jobstats-record: job {raw}: {exc}", file=sys.stderr, flush=True)
        return None


def store_admin_comment(rec: Record) -> None:
    """The summary in the job's AdminComment too, where this Slurm can store it
    (:func:`pyhpc.slurm.slurm.stores_admin_comment`: 23.02 and later)."""
    if rec.admin_comment is not None and slurm.stores_admin_comment():
        slurm.set_admin_comment(rec.job_id_raw, rec.admin_comment)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyhpc-jobstats-record", description=__doc__)
    p.add_argument("job", nargs="?", default=os.environ.get("SLURM_JOB_ID"),
                   help="job id (default: $SLURM_JOB_ID, as EpilogSlurmctld sets it)")
    p.add_argument("--store", default=str(STORE), help=f"where records go (default {STORE})")
    p.add_argument("--prometheus", help=f"Prometheus' URL (default: ${prometheus.ENV})")
    p.add_argument("--scrape-interval", default="15s",
                   help="Prometheus' scrape interval (5s, 1m; default 15s): a run shorter "
                        "than two is jobstats' Short")
    args = p.parse_args(argv)
    try:
        if not args.job:
            raise RecordError("job: none given and $SLURM_JOB_ID is not set", "job")
        base = prometheus.url(args.prometheus)
        if base is None:
            return 0  # nothing to record: the summary comes from accounting alone
        sampling_s = admin_comment.interval_seconds(args.scrape_interval)
        rec, uid = from_slurm(args.job, base, sampling_s)
        write(Path(args.store), rec, uid)
        store_admin_comment(rec)
    except PyhpcError as exc:
        print(f"pyhpc-jobstats-record: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
