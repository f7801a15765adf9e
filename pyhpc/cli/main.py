"""The ``pyhpc`` command line. Heavy modules (torch) are imported inside commands.

One error path: every expected failure is a :class:`pyhpc.errors.PyhpcError`, printed
as one line on stderr with exit status 2; anything else is one line too, exit 1,
with ``--debug`` for the traceback.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import NoReturn

from pyhpc import __version__, cluster, files, paths
from pyhpc.admin import doctor, runaway
from pyhpc.cli import admin as cli_admin
from pyhpc.cli import containers as cli_containers
from pyhpc.cli import jobs as cli_jobs
from pyhpc.cli import monitor as cli_monitor
from pyhpc.errors import PyhpcError

DESCRIPTION = ("Submit multi-node PyTorch jobs to a Slurm cluster and report their "
               "throughput; validate and check the cluster itself.")


def one_line(text: str, limit: int = 1000) -> str:
    """``text`` as one printable line: control characters escaped, length capped."""
    line = re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], text)
    return line if len(line) <= limit else f"{line[:limit]}..."


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit 2) like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"pyhpc: error: {one_line(message)} (see {self.prog} --help)\n")


def cmd_cluster_validate(args: argparse.Namespace) -> int:
    spec = cluster.load(args.file)
    if args.json:
        print(json.dumps(spec.to_dict(), indent=2, sort_keys=True))
    else:
        gpus = sum(n.gpus for n in spec.nodes)
        print(f"{args.file}: ok ({spec.name}, mode {spec.mode}, {len(spec.nodes)} nodes, "
              f"{gpus} GPUs, partitions {', '.join(p.name for p in spec.partitions)})")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.drain and not args.gpus:
        raise PyhpcError("--drain: only with --gpus (it drains the GPU nodes that fail)", "--drain")
    if args.fix_runaway and args.gpus:
        raise PyhpcError("--fix-runaway: not with --gpus (run them one after the other)",
                         "--fix-runaway")
    if args.gpus:
        return doctor_gpus(args)
    if args.fix_runaway:
        return doctor_fix_runaway(args)
    checks = doctor.Doctor().checks()
    ok = all(c.ok for c in checks)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(doctor.table(checks))
    return 0 if ok else 1


def doctor_gpus(args: argparse.Namespace) -> int:
    rows = doctor.gpu_rows()
    if args.drain:
        rows = doctor.drain_faulty(rows)
    ok = all(r.ok for r in rows)
    if args.json:
        print(json.dumps({"ok": ok, "gpus": [asdict(r) for r in rows]}, indent=2))
    else:
        print(doctor.gpu_table(rows))
    return 0 if ok else 1


def doctor_fix_runaway(args: argparse.Namespace) -> int:
    found, said = runaway.fix()
    if args.json:
        print(json.dumps({"closed": [asdict(r) for r in found.records], "boot": found.boot,
                          "sacctmgr": said}, indent=2))
    elif not found.records:
        print("no runaway jobs: slurmctld knows every job accounting holds open")
    else:
        print(f"closed {runaway.summary(found)}; recorded in their owners' ledgers in "
              f"{paths.RUNAWAY_LEDGERS}\n"
              f"{runaway.table(found)}\n{runaway.AFTER_FIX}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pyhpc", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"pyhpc {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    parser.add_argument("--group-readable", action="store_true",
                        help="files pyhpc writes are readable by your group (default: private)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    clus = sub.add_parser("cluster", help="cluster definition commands")
    csub = clus.add_subparsers(dest="cluster_command", required=True, metavar="SUBCOMMAND")
    val = csub.add_parser("validate", help="validate a cluster definition file")
    val.add_argument("file", help="cluster definition (YAML)")
    val.add_argument("--json", action="store_true", help="print the normalised definition")
    val.set_defaults(func=cmd_cluster_validate)
    cli_jobs.add_commands(sub)
    cli_monitor.add_commands(sub)
    doc = sub.add_parser("doctor", help="check the running cluster (munge, slurmctld, "
                         "slurmdbd, nodes, a 2-node job, sacct, runaway jobs, and the hub where it runs)")
    doc.add_argument("--json", action="store_true", help="print the checks as JSON")
    doc.add_argument("--gpus", action="store_true",
                     help="GPU acceptance instead: per GPU node, the GPUs it sees against "
                     "Slurm's GRES, a matmul on them, DCGM diag level 1 where installed")
    doc.add_argument("--drain", action="store_true",
                     help="with --gpus: drain each node that reported a fault, with the reason")
    doc.add_argument("--fix-runaway", action="store_true",
                     help="root: close the runaway jobs the check lists (jobs accounting holds "
                     "open that slurmctld lost in a restart) with sacctmgr, after recording "
                     "each in the ledger that keeps them LOST for pyhpc status")
    doc.set_defaults(func=cmd_doctor)
    cli_containers.add_commands(sub)
    cli_admin.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    if args.group_readable:
        files.set_group_readable(True)
    try:
        return func(args)
    except PyhpcError as exc:
        print(f"pyhpc: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pyhpc: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        text = str(exc).strip().splitlines()
        print(f"pyhpc: error: unexpected {type(exc).__name__}"
              f"{': ' + one_line(text[0], 200) if text else ''}; run with --debug for the "
              "traceback", file=sys.stderr)
        return 1
