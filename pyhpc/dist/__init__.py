"""torch.distributed set-up for jobs: nccl when the task's device is a GPU, gloo otherwise.

Inside a Slurm task the rank layout comes from Slurm's variables and the job's store
(:mod:`pyhpc.dist.launch`, which the job templates carry so that the tasks need no
pyhpc); under torchrun the agent has already exported RANK/WORLD_SIZE/MASTER_*.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from pyhpc.dist import device, launch
from pyhpc.dist.launch import export_env, import_path

__all__ = ["DistInfo", "all_up", "export_env", "import_path", "main", "setup", "teardown"]


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


def setup(place: device.Placement | None = None, timeout_s: float = 600.0) -> DistInfo:
    """Initialise the default process group for this task and describe it.

    ``place`` is the task's device (default: :func:`pyhpc.dist.device.resolve` of ``auto``).
    The backend follows it — NCCL only on a GPU, gloo on the CPU — and a GPU becomes the
    process's current device before the group is created. No task returns before every
    task's group is up (:func:`all_up`).
    """
    import torch.distributed as td

    export_env()
    if place is None:
        place = device.resolve("auto")
    place.activate()
    if not td.is_initialized():
        td.init_process_group(backend=place.backend)
        all_up(timeout_s)
    return DistInfo(
        rank=td.get_rank(), world_size=td.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")), backend=str(td.get_backend()),
        master_addr=os.environ["MASTER_ADDR"], master_port=int(os.environ["MASTER_PORT"]),
        place=place)


def all_up(timeout_s: float) -> None:
    """Wait, through the job's store, until every rank's group exists.

    ``init_process_group`` has no barrier of its own: a rank whose side of every gloo pair
    is connected returns while another is still connecting its mesh, and a rank that then
    ends at once (a short function, a failed check) closes the pairs under it, which fails
    that rank's set-up with "Connection closed by peer".
    """
    import datetime

    import torch.distributed as td
    from torch.distributed import distributed_c10d

    rank, world = td.get_rank(), td.get_world_size()
    if world == 1:
        return
    store = distributed_c10d._get_default_store()
    store.set(f"pyhpc/up/{rank}", "up")
    store.wait([f"pyhpc/up/{r}" for r in range(world)], datetime.timedelta(seconds=timeout_s))


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


def main(argv: list[str]) -> None:
    """``python -m pyhpc.dist SCRIPT|-m MODULE [ARGS]``: the job launcher from pyhpc's own
    install, for scripts written before the templates carried it (:func:`launch.main`)."""
    launch.main(argv)
