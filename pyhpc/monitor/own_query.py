"""``pyhpc-jobstats-query JOB START END``: one job's GPU and memory figures from Prometheus,
for the job's owner only, as JSON on stdout.

Prometheus answers admins and pyhpc's own services only (its series carry every job's
user and account). ``pyhpc jobstats`` runs this through sudo as the monitoring user,
whose password it reads and its caller cannot: ``sudo -n -u prometheus
/usr/local/sbin/pyhpc-jobstats-query JOB START END`` (the monitoring role's rule, for
these three arguments only). The caller is sudo's ``SUDO_UID``, never an argument: every
query it makes names that user's label as well as the job's, so another user's job gives
no series, hence no figures. Those labels are the job exporter's, from slurmctld's view
of the job (``squeue --json``), not from job text.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
from dataclasses import asdict
from typing import Any

from pyhpc import validate
from pyhpc.errors import PyhpcError
from pyhpc.monitor import prometheus

#: The program (the monitoring role's wrapper) and the user sudo runs it as.
PROGRAM = "/usr/local/sbin/pyhpc-jobstats-query"
RUN_AS = "prometheus"
#: Job times: epoch seconds, 2001 to 2286 (ten digits), as sudo's rule allows them.
EPOCH_MIN, EPOCH_MAX = 10**9, 10**10 - 1


class QueryError(PyhpcError):
    """Not run through sudo, or arguments that are not a job id and two times."""


def caller() -> str:
    """The user sudo ran this for (``SUDO_UID``; sudo sets it, nobody else can here)."""
    uid = os.environ.get("SUDO_UID", "")
    if not uid.isdigit():
        raise QueryError("pyhpc-jobstats-query: run it through sudo (pyhpc jobstats does)",
                         "SUDO_UID")
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except KeyError:
        raise QueryError(f"pyhpc-jobstats-query: uid {uid} has no name", "SUDO_UID") from None


def figures(base: str, job: str, start: int, end: int, user: str) -> dict[str, Any]:
    """What jobstats needs of Prometheus for ``user``'s job: nulls for another's."""
    gpu = prometheus.gpu_figures(base, job, start, end, user=user)
    peak = prometheus.host_memory_peak(base, job, start, end, user=user)
    return {"gpu": asdict(gpu) if gpu else None, "host_mem_peak_bytes": peak}


def parse(data: Any) -> tuple[prometheus.GpuFigures | None, int | None]:
    """:func:`figures`' JSON, read back by ``pyhpc jobstats``."""
    try:
        g, peak = data["gpu"], data["host_mem_peak_bytes"]
        gpu = prometheus.GpuFigures(float(g["util_mean"]), float(g["util_peak"]),
                                    int(g["mem_peak_bytes"]), int(g["gpus"]),
                                    int(g["used"])) if g is not None else None
        return gpu, int(peak) if peak is not None else None
    except (KeyError, TypeError, ValueError):
        raise QueryError("pyhpc-jobstats-query: its answer is not a job's figures",
                         "pyhpc-jobstats-query") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyhpc-jobstats-query", description=__doc__)
    p.add_argument("--prometheus", required=True, help="Prometheus' URL (the wrapper's)")
    p.add_argument("job", help="job id (4242, or 4242_7)")
    p.add_argument("start", help="the job's start, epoch seconds")
    p.add_argument("end", help="its end (or now), epoch seconds")
    args = p.parse_args(argv)
    try:
        user = caller()
        job = validate.name("job", args.job, "job_id", QueryError)
        start = validate.integer("start", args.start, EPOCH_MIN, EPOCH_MAX, QueryError)
        end = validate.integer("end", args.end, start, EPOCH_MAX, QueryError)
        base = prometheus.url(args.prometheus)
        assert base is not None  # required above
        print(json.dumps(figures(base, job, start, end, user), sort_keys=True))
    except PyhpcError as exc:
        print(f"pyhpc-jobstats-query: {exc}" if not str(exc).startswith("pyhpc-") else str(exc),
              file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
