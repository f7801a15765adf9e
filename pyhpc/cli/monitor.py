"""The monitoring commands of the ``pyhpc`` CLI: ``jobstats``. A parser and one call into
:mod:`pyhpc.monitor.jobstats`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pyhpc.monitor import jobstats, prometheus, record


def cmd_jobstats(args: argparse.Namespace) -> int:
    job = jobstats.find(args.job)
    sources = jobstats.Sources(Path(args.store), prometheus.url(args.prometheus))
    data = jobstats.summary(job, sources)
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else jobstats.text(data))
    return 0


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
