"""The monitoring commands of the ``pyhpc`` CLI: ``jobstats``, and ``report --cluster``
(its options; ``report`` itself is parsed with the job commands). A parser and one call
into :mod:`pyhpc.monitor.jobstats` or :mod:`pyhpc.monitor.cluster_report`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pyhpc.errors import PyhpcError
from pyhpc.monitor import cluster_report, jobstats, prometheus, record


def cmd_jobstats(args: argparse.Namespace) -> int:
    job = jobstats.find(args.job)
    sources = jobstats.Sources(Path(args.store), prometheus.url(args.prometheus))
    data = jobstats.summary(job, sources)
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else jobstats.text(data))
    return 0


def cmd_cluster_report(args: argparse.Namespace) -> int:
    """``pyhpc report --cluster --html DIR [--since 24h]``: the page, from Prometheus."""
    mixed = [flag for flag, given in (("DIR", args.dirs), ("--png", args.png),
                                      ("--time-to-train", args.time_to_train)) if given]
    if not args.cluster or not args.html or mixed:
        raise PyhpcError("report: --cluster takes --html DIR (and --since, --prometheus), and "
                         "no run directories, --png or --time-to-train"
                         + (f"; got {', '.join(mixed)}" if mixed else ""), "--cluster")
    base = prometheus.url(args.prometheus)
    if base is None:
        raise PyhpcError(f"--prometheus: none given and ${prometheus.ENV} is not set (login "
                         "shells on a login host have it)", "--prometheus")
    data = cluster_report.write(base, args.since or "24h", Path(args.html))
    text = "\n".join([f"page: {data['html']}", *(f"plot: {p}" for p in data["pngs"])])
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else text)
    return 0


def cluster_report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", action="store_true", help="the cluster's use instead, from "
                   "Prometheus: node utilization, jobs by state, GPU-hours per account, the "
                   "least-used jobs (an HTML page and its PNGs in --html DIR)")
    p.add_argument("--since", help="with --cluster: the window, 10m to 31d (default 24h)")
    p.add_argument("--html", metavar="DIR", help="with --cluster: where the page goes "
                   "(created private; index.html and the PNGs)")
    p.add_argument("--prometheus", metavar="URL", help="with --cluster: Prometheus to ask "
                   f"(default: ${prometheus.ENV})")


def add_commands(sub: Any) -> None:
    p = sub.add_parser("jobstats", help="one job's CPU, memory and GPU use against its "
                       "request, with hints (any of your jobs, running or ended)")
    p.add_argument("job", help="job id (4242, or 4242_7 for an array task)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--prometheus", metavar="URL", help="Prometheus to ask for GPU figures "
                   f"(default: ${prometheus.ENV}; none: no GPU figures unless recorded)")
    p.add_argument("--store", default=str(record.STORE), help="where job-end records are "
                   f"kept (default {record.STORE})")
    p.set_defaults(func=cmd_jobstats)
