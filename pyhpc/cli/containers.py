"""``pyhpc containers render|build``: the framework image from containers/spec.yml."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyhpc.containers import build as container_build
from pyhpc.containers import spec as containers


def cmd_render(args: argparse.Namespace) -> int:
    text = containers.render_variant(args.variant, args.format, torch=args.torch,
                                     output=args.output or None)
    if not args.output:
        sys.stdout.write(text)
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    record = container_build.build_variant(
        args.variant, args.torch, Path(args.images_dir), oci_archive=args.oci_archive,
        force=args.force, context_only=args.context_only)
    selftest = record.get("selftest")
    for line in selftest if isinstance(selftest, list) else []:
        print(f"  {line}")
    return 0


# argparse does not export the subparsers type; its parameter is the parser class.
def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``containers render`` and ``containers build`` under ``sub``."""
    cont = sub.add_parser("containers",
                          help="framework image: render or build from containers/spec.yml")
    csub = cont.add_subparsers(dest="containers_command", required=True, metavar="SUBCOMMAND")
    ren = csub.add_parser("render", help="print the Containerfile or Apptainer .def of a variant")
    bld = csub.add_parser("build", help="build a variant offline with podman and export it")
    for parser in (ren, bld):
        parser.add_argument("--variant", required=True,
                            help="variant in containers/spec.yml (cpu, cuda)")
        parser.add_argument("--torch", help="torch version; must be the one in the spec")
    ren.add_argument("--format", choices=tuple(containers.FORMATS), default="oci", help="output format")
    ren.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    ren.set_defaults(func=cmd_render)
    bld.add_argument("--images-dir", default="/opt/pyhpc/images", help="shared images directory")
    bld.add_argument("--oci-archive", action="store_true", help="also export IMAGE.oci.tar")
    bld.add_argument("--context-only", action="store_true",
                     help="only prepare the build context (e.g. for apptainer build)")
    bld.add_argument("--force", action="store_true", help="rebuild even when up to date")
    bld.set_defaults(func=cmd_build)
