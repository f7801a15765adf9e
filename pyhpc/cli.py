"""The ``pyhpc`` command line. Heavy modules (torch) are imported inside commands."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from pyhpc import __version__, cli_containers, cli_jobs, doctor
from pyhpc.cluster import ConfigError

#: Errors the CLI turns into one line on stderr and exit status 2.
USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError, *cli_jobs.USER_ERRORS, *cli_containers.USER_ERRORS)
DESCRIPTION = ("Submit multi-node PyTorch jobs to a Slurm cluster and report their "
               "throughput; validate and check the cluster itself.")


def cmd_cluster_validate(args: argparse.Namespace) -> int:
    from pyhpc import cluster

    spec = cluster.load(args.file)
    if args.json:
        print(json.dumps(spec.to_dict(), indent=2, sort_keys=True))
    else:
        gpus = sum(n.gpus for n in spec.nodes)
        print(f"{args.file}: ok ({spec.name}, mode {spec.mode}, {len(spec.nodes)} nodes, "
              f"{gpus} GPUs, partitions {', '.join(p.name for p in spec.partitions)})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyhpc", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"pyhpc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    clus = sub.add_parser("cluster", help="cluster definition commands")
    csub = clus.add_subparsers(dest="cluster_command", required=True, metavar="SUBCOMMAND")
    val = csub.add_parser("validate", help="validate a cluster definition file")
    val.add_argument("file", help="cluster definition (YAML)")
    val.add_argument("--json", action="store_true", help="print the normalised definition")
    val.set_defaults(func=cmd_cluster_validate)
    cli_jobs.add_commands(sub)
    doctor.add_commands(sub)
    cli_containers.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except USER_ERRORS as exc:
        print(f"pyhpc: error: {exc}", file=sys.stderr)
        return 2
