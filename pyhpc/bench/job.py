"""Inside the ``pyhpc bench`` job: the measurements (torch), one process per task.

Every task joins the job's process group on its device (:mod:`pyhpc.dist.device`: NCCL on
GPUs, gloo on the CPU). Copies and matmuls are timed on one task per node at a time
(tasks take turns within a node, nodes run side by side), all-reduces by every task of a
group together. Rank 0 gathers everything and writes the results
(:func:`pyhpc.bench.results.write_results`). The same lines run on the CPU and on GPUs; the
GPU-only ones are in :mod:`pyhpc.dist.device`.
"""
from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import submitit
import torch
import torch.distributed as td

from pyhpc import dist
from pyhpc.bench import config as bench
from pyhpc.bench import results
from pyhpc.bench.config import BenchConfig
from pyhpc.dist import device

#: Seconds one copy or matmul measurement aims at (repetitions double until reached).
BUDGET_S = {"copy": 0.05, "matmul": 0.2}
MAX_REPS = 4096
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def timed(call: Callable[[], object], place: device.Placement, budget_s: float) -> float:
    """Seconds per call: after one warm-up call, repetitions double until a batch of them
    takes ``budget_s``; the device is synchronised around each batch, not each call."""
    call()
    reps = 1
    while True:
        place.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            call()
        place.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s or reps >= MAX_REPS:
            return elapsed / reps
        reps *= 2


def copy_bandwidth(place: device.Placement, ladder: list[int]) -> list[dict[str, Any]]:
    """GB/s of ``copy_`` per size: host->device and device->host from pageable and pinned
    memory on a GPU; host->host (memory bandwidth) on the CPU."""
    top = ladder[-1]
    on_device = torch.zeros(top, dtype=torch.uint8, device=place.torch_device())
    rows: list[dict[str, Any]] = []
    for memory, host in device.host_buffers(place, top).items():
        pairs = [("h2d", host, on_device), ("d2h", on_device, host)] if place.cuda else [
            ("h2h", host, on_device)]
        for direction, src, dst in pairs:
            for n in ladder:
                copy = partial(dst[:n].copy_, src[:n], non_blocking=place.non_blocking)
                seconds = timed(copy, place, BUDGET_S["copy"])
                rows.append({"bytes": n, "direction": direction, "memory": memory,
                             "seconds": seconds, "GBps": bench.gbps(n, seconds)})
    return rows


def matmul(place: device.Placement, n: int) -> list[dict[str, Any]]:
    """TFLOP/s of an n x n matrix multiply in fp32 and in bf16."""
    rows: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(0)
    for name, dtype in DTYPES.items():
        a, b = (torch.randn(n, n, generator=gen).to(place.torch_device(), dtype)
                for _ in range(2))
        out = torch.empty(n, n, dtype=dtype, device=place.torch_device())
        seconds = timed(partial(torch.matmul, a, b, out=out), place, BUDGET_S["matmul"])
        rows.append({"dtype": name, "n": n, "seconds": seconds,
                     "tflops": bench.tflops(n, seconds)})
    return rows


def allreduce_rows(place: device.Placement, group: Any, size: int,
                   ladder: list[int]) -> list[dict[str, Any]]:
    """One group's all-reduce timings (every member calls it): per size, the mean over
    the group's ranks of each rank's average time (nccl-tests' default), its algbw and
    busbw."""
    where = place.torch_device()
    buffer = torch.zeros(ladder[-1] // 4, dtype=torch.float32, device=where)
    rows: list[dict[str, Any]] = []
    for n in ladder:
        part = buffer[: n // 4]
        td.all_reduce(part, group=group)  # warm-up: connections, buffers
        iters = bench.iterations(n)
        place.synchronize()
        td.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iters):
            td.all_reduce(part, group=group)
        place.synchronize()
        mine = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64,
                            device=where)
        td.all_reduce(mine, group=group)
        seconds = mine.item() / size
        algbw = bench.gbps(n, seconds)
        rows.append({"bytes": n, "iterations": iters, "seconds": seconds,
                     "algbw_GBps": algbw, "busbw_GBps": bench.busbw(algbw, size)})
    return rows


def allreduce(place: device.Placement, hosts: list[str], rank: int,
              ladder: list[int]) -> tuple[list[dict[str, Any]], list[str]]:
    """Within each node (its ranks together, nodes side by side), then across all ranks
    when there is more than one node. Returns the groups this rank took part in (``lead``:
    it is the group's first rank, which reports it) and notes on what was skipped."""
    nodes = list(dict.fromkeys(hosts))
    members = [[r for r, h in enumerate(hosts) if h == node] for node in nodes]
    # Every rank creates every group, in the same order (torch.distributed requires it).
    groups = [td.new_group(m) if len(m) > 1 else None for m in members]
    joined: list[dict[str, Any]] = []
    skipped = [f"intra-node all-reduce skipped on {node}: one rank there"
               for node, m in zip(nodes, members, strict=True) if len(m) == 1]
    mine = next(i for i, m in enumerate(members) if rank in m)
    if groups[mine] is not None:
        joined.append({"scope": "intra-node" if len(nodes) > 1 else "one node",
                       "nodes": [nodes[mine]], "ranks": len(members[mine]),
                       "rows": allreduce_rows(place, groups[mine], len(members[mine]), ladder),
                       "lead": rank == members[mine][0]})
    td.barrier()
    if len(nodes) > 1:
        joined.append({"scope": "inter-node", "nodes": nodes, "ranks": len(hosts),
                       "rows": allreduce_rows(place, None, len(hosts), ladder),
                       "lead": rank == 0})
    return joined, skipped


def measure(cfg: BenchConfig, info: dist.DistInfo) -> dict[str, Any] | None:
    """Every test on every rank; the assembled results on rank 0 (``None`` elsewhere)."""
    place, rank, world = info.place, info.rank, info.world_size
    host = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    hosts: list[Any] = [None] * world
    td.all_gather_object(hosts, host)
    on_node = [r for r, h in enumerate(hosts) if h == host]
    turns = max(hosts.count(h) for h in set(hosts))
    ladder = bench.sizes(cfg.top_bytes(place.type))
    n = cfg.matmul_n(place.type)
    copies = mm = None
    for turn in range(turns):  # one task per node at a time: no contention within a node
        if on_node.index(rank) == turn:
            copies = copy_bandwidth(place, ladder) if "copy" in cfg.tests else None
            mm = matmul(place, n) if "matmul" in cfg.tests else None
        td.barrier()
    groups, skipped = (allreduce(place, hosts, rank, ladder) if "allreduce" in cfg.tests
                       else ([], []))
    mine = {"rank": rank, "host": host, "device": place.name, "copy": copies, "matmul": mm,
            "groups": [{k: v for k, v in g.items() if k != "lead"} for g in groups if g["lead"]],
            "link": results.link_row(
                rank, host, place.cuda, device.nvidia_smi(place, "-q"),
                device.nvidia_smi(place, "nvlink", "-s"), copies, groups)}
    gathered: list[Any] = [None] * world
    td.all_gather_object(gathered, mine)
    if rank != 0:
        return None
    where = {"rank": 0, "host": 0, "device": 0}
    return {
        "schema": results.SCHEMA, "job_id": os.environ.get("SLURM_JOB_ID", "local"),
        "torch_version": torch.__version__, "device": place.type, "backend": info.backend,
        "nodes": list(dict.fromkeys(hosts)), "world_size": world, "tests": list(cfg.tests),
        "units": {"bandwidth": "GB/s = 10^9 bytes/s", "matmul": "TFLOP/s = 10^12 flop/s",
                  "time": "seconds"},
        "copy": None if "copy" not in cfg.tests else {
            "what": ("host<->device copies from pageable and pinned host memory (copy_, "
                     "non_blocking)") if place.cuda else (
                "host memory copy (copy_), no GPU: this is the node's memory bandwidth, not "
                "a host-device link; pinned memory needs a GPU"),
            "max_bytes": ladder[-1],
            "ranks": [{k: g[k] for k in where} | {"rows": g["copy"]} for g in gathered]},
        "allreduce": None if "allreduce" not in cfg.tests else {
            "backend": info.backend, "definition": "busbw = algbw * 2(n-1)/n (nccl-tests); "
            "time: mean over the group's ranks of each rank's average",
            "groups": [grp for g in gathered for grp in g["groups"]], "skipped": skipped},
        "matmul": None if "matmul" not in cfg.tests else {
            "n": n, "note": "n x n @ n x n, 2n^3 flop; fp32 without TF32 (torch's default)",
            "ranks": [{k: g[k] for k in where} | {"rows": g["matmul"]} for g in gathered]},
        "link": {"ranks": [g["link"] for g in gathered]},
    }


def run(cfg: BenchConfig) -> dict[str, Any] | None:
    """The whole job on this task; rank 0 writes the results and returns them."""
    cfg = BenchConfig(**asdict(cfg))  # an unpickled config was never checked
    place = device.resolve(cfg.device)
    torch.set_num_threads(cfg.threads)
    info = dist.setup(place)
    try:
        doc = measure(cfg, info)
        if doc is not None:
            results.write_results(Path(cfg.out), doc)
            print(results.table(doc), flush=True)
        td.barrier()
    finally:
        dist.teardown()
    return doc


class BenchTask(submitit.helpers.Checkpointable):
    """The submitit entry point: call it in each task (a requeue measures afresh)."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg

    def __call__(self) -> dict[str, Any] | None:
        return run(self.cfg)
