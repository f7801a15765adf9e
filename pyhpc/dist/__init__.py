"""torch.distributed set-up for jobs: nccl when the task's device is a GPU, gloo otherwise.

Inside a Slurm task the rank layout comes from submitit's
``TorchDistributedEnvironment`` (which parses Slurm's variables and node lists);
under torchrun the agent has already exported RANK/WORLD_SIZE/MASTER_*.
``python -P -m pyhpc.dist SCRIPT|-m MODULE [ARGS]`` exports the variables, then runs
the program, so scripts written for torchrun also run under plain srun. The job
templates start it with ``-P``: the directory the task runs in is not on the import path
(another user may be able to write there); :func:`import_path` puts back only what the
program needs and can trust.
"""
from __future__ import annotations

import importlib.util
import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

from pyhpc import files
from pyhpc.dist import device


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    master_addr: str
    master_port: int
    #: The task's device and precision, as :func:`pyhpc.dist.device.resolve` chose them.
    place: device.Placement = device.CPU


def export_env() -> None:
    """Export RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT unless torchrun did already."""
    if "TORCHELASTIC_RUN_ID" in os.environ or "SLURM_JOB_ID" not in os.environ:
        for key, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                             ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
            os.environ.setdefault(key, default)
        return
    from submitit.helpers import TorchDistributedEnvironment

    # submitit only reads Slurm's variables when it believes it launched the task.
    os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")
    # MASTER_PORT from the batch script (derived from the job id) wins over submitit's choice.
    # CUDA_VISIBLE_DEVICES stays as Slurm set it: pyhpc.device picks the task's GPU from it.
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def setup(place: device.Placement | None = None) -> DistInfo:
    """Initialise the default process group for this task and describe it.

    ``place`` is the task's device (default: :func:`pyhpc.dist.device.resolve` of ``auto``).
    The backend follows it — NCCL only on a GPU, gloo on the CPU — and a GPU becomes the
    process's current device before the group is created.
    """
    import torch.distributed as td

    export_env()
    if place is None:
        place = device.resolve("auto")
    place.activate()
    if not td.is_initialized():
        td.init_process_group(backend=place.backend)
    return DistInfo(
        rank=td.get_rank(), world_size=td.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")), backend=str(td.get_backend()),
        master_addr=os.environ["MASTER_ADDR"], master_port=int(os.environ["MASTER_PORT"]),
        place=place)


def teardown(timeout_s: float = 60.0) -> None:
    """Destroy the process group if one is up, rank 0 last.

    Rank 0 hosts the rendezvous store: if it tore down first, a rank still shutting
    down its gloo group could abort ("terminate called without an active exception").
    So every other rank destroys its group, then says so through the store, and
    rank 0 waits for all of them before destroying its own.
    """
    import datetime

    import torch.distributed as td
    from torch.distributed import distributed_c10d

    if not (td.is_available() and td.is_initialized()):
        return
    rank, world = td.get_rank(), td.get_world_size()
    store = distributed_c10d._get_default_store()
    if rank == 0:
        store.wait([f"pyhpc/teardown/{r}" for r in range(1, world)],
                   datetime.timedelta(seconds=timeout_s))
        td.destroy_process_group()
    else:
        td.destroy_process_group()
        store.set(f"pyhpc/teardown/{rank}", "done")


def import_path(argv: list[str], cwd: Path) -> list[str]:
    """The directories :func:`main` puts first on the import path for ``argv``: a script's
    own directory (as ``python SCRIPT`` does); for ``-m MODULE`` the working directory,
    only when it passes the one check (:func:`pyhpc.files.safe_dir`: the user's alone)."""
    if argv[0] != "-m":
        return [os.path.dirname(os.path.abspath(argv[0]))]
    try:
        return [str(files.safe_dir(cwd, arg="cwd", writable=False))]
    except files.FileError:
        return []


def main(argv: list[str]) -> None:
    """Run a script or ``-m module`` with the torch.distributed variables exported."""
    if not argv:
        sys.exit("usage: python -m pyhpc.dist SCRIPT|-m MODULE [ARGS...]")
    if argv[0] == "-m" and len(argv) < 2:
        sys.exit("pyhpc.dist: -m needs a module name")
    sys.path[:0] = import_path(argv, Path.cwd())
    export_env()
    if argv[0] == "-m":
        if importlib.util.find_spec(argv[1].split(".")[0]) is None:
            sys.exit(f"pyhpc.dist: no module named {argv[1].split('.')[0]!r} on the import "
                     f"path; the working directory {os.getcwd()} is on it only when nobody "
                     "else can write it: install your code or set PYTHONPATH")
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")

