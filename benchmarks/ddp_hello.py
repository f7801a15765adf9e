"""A bare DDP hello world: the floor under pyhpc.train's time to first step.

Imports torch only, joins the process group (gloo), takes one SGD step of a DDP-wrapped
Linear, and records the marks :mod:`pyhpc.startup` defines (process start, imported,
rendezvous done, first step); rank 0 writes every rank's as ``startup.json`` does, to
the path given. pyhpc is imported only after the last mark, so none of it is timed.

Under torchrun the rank layout is exported already; under plain srun it comes from
Slurm's variables (MASTER_ADDR: the allocation's first node, unless exported, as the
batch templates do)::

    torchrun --nproc-per-node 2 benchmarks/ddp_hello.py /tmp/hello.json
    srun python benchmarks/ddp_hello.py hello.json
"""
from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as td
from torch import nn
from torch.nn.parallel import DistributedDataParallel

IMPORTED = time.time()


def export_slurm_env() -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT from Slurm's variables, where unset."""
    if "SLURM_PROCID" not in os.environ:
        return
    env = os.environ
    env.setdefault("RANK", env["SLURM_PROCID"])
    env.setdefault("WORLD_SIZE", env["SLURM_NTASKS"])
    env.setdefault("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
    # The port the batch templates derive from the job id (slurm/jobs/_rendezvous.sh.j2).
    env.setdefault("MASTER_PORT", str(20000 + int(env["SLURM_JOB_ID"]) % 40000))
    if "MASTER_ADDR" not in env:
        # baseline: the bare hello world imports no pyhpc before its last mark
        hosts = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]],
                               capture_output=True, text=True, check=True).stdout.split()
        env["MASTER_ADDR"] = hosts[0]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: ddp_hello.py OUT.json", file=sys.stderr)
        return 2
    export_slurm_env()
    td.init_process_group("gloo")
    rendezvous_done = time.time()
    model = DistributedDataParallel(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).square().mean().backward()
    opt.step()
    first_step = time.time()

    from pyhpc import dist, files
    from pyhpc.train import startup

    marks = startup.Marks(startup.this_process_start(), IMPORTED, rendezvous_done, first_step)
    mine = {"rank": td.get_rank(), "host": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
            "pid": os.getpid(), "marks": asdict(marks)}
    gathered: list[Any] = [None] * td.get_world_size()
    td.all_gather_object(gathered, mine)
    if td.get_rank() == 0:
        files.write_text(argv[0], json.dumps(startup.report(gathered, os.environ), indent=1))
    del model  # DDP holds the process group: free it before the group is torn down
    gc.collect()
    dist.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
