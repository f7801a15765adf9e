"""Plain-language advice from a job's figures: what to ask for next time. Pure functions.

Each hint names the figure it comes from and the option to change, with a value worked out
from what the job used plus headroom, so the advice never shrinks a request below the use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: A GPU whose mean utilization is below this did no real work in the job.
USED_GPU_UTIL = 0.05
#: Memory and time requests are advised at this much above the use.
HEADROOM = 1.25
#: Below these shares of a request a hint suggests asking for less.
LOW_SHARE = 0.5
LOW_CPU = 0.5
LOW_GPU = 0.5
#: Above this share of the memory request a hint warns of the limit.
HIGH_MEMORY = 0.9
#: Jobs shorter than this are too short to judge CPU use or the time limit by.
MIN_ELAPSED_S = 60


@dataclass(frozen=True)
class Figures:
    """What a hint is computed from. Memory per node (what ``--mem`` asks for)."""

    state: str
    elapsed_s: int
    time_limit_s: int | None
    cpus: int
    nodes: int
    cpu_efficiency: float | None
    mem_peak_bytes: int | None
    mem_requested_bytes: int | None
    gpus: int
    gpus_used: int | None = None
    gpu_util_mean: float | None = None


def mem_option(nbytes: float) -> str:
    """A ``--mem`` value at least ``nbytes``: whole GiB from 1 GiB up, else 256 MiB steps."""
    gib = nbytes / (1 << 30)
    if gib >= 1:
        return f"{math.ceil(gib)}G"
    return f"{max(256, math.ceil(nbytes / (1 << 20) / 256) * 256)}M"


def time_option(seconds: float) -> str:
    """A ``--time`` value at least ``seconds``, in whole minutes (``D-HH:MM:00`` from a day)."""
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


def percent(share: float) -> str:
    return f"{share * 100:.0f}%"


def gpu_hints(f: Figures) -> list[str]:
    if not f.gpus or f.gpus_used is None:
        return []
    if f.gpus_used == 0:
        return [f"asked for {f.gpus} GPUs, used none: run it on CPUs, or check that the code "
                "puts its work on the GPU (torch.cuda.is_available() in the job)"]
    if f.gpus_used < f.gpus:
        per_node = max(1, math.ceil(f.gpus_used / max(f.nodes, 1)))
        return [f"asked for {f.gpus} GPUs, used {f.gpus_used}: use --gpus-per-node {per_node}"]
    if f.gpu_util_mean is not None and f.gpu_util_mean < LOW_GPU:
        return [f"GPU utilization {percent(f.gpu_util_mean)} on average: the GPUs waited for "
                "data; try more DataLoader workers (--cpus-per-task) or larger batches"]
    return []


def memory_hints(f: Figures) -> list[str]:
    if f.state == "OUT_OF_MEMORY" and f.mem_requested_bytes:
        return [f"the job ran out of memory: ask for --mem "
                f"{mem_option(2 * f.mem_requested_bytes)} (twice the request)"]
    if not f.mem_peak_bytes or not f.mem_requested_bytes:
        return []
    share = f.mem_peak_bytes / f.mem_requested_bytes
    advice = mem_option(f.mem_peak_bytes * HEADROOM)
    if share < LOW_SHARE and advice != mem_option(f.mem_requested_bytes):
        return [f"memory peak {percent(share)} of the request: ask for --mem {advice}"]
    if share > HIGH_MEMORY:
        return [f"memory peak {percent(share)} of the request: close to the limit; ask for "
                f"--mem {advice}"]
    return []


def cpu_hints(f: Figures) -> list[str]:
    eff = f.cpu_efficiency
    if eff is None or f.elapsed_s < MIN_ELAPSED_S or eff >= LOW_CPU:
        return []
    if f.cpus > 1:
        busy = max(1, round(eff * f.cpus))
        return [f"CPU efficiency {percent(eff)}: about {busy} of {f.cpus} CPUs were busy; ask "
                f"for {busy} (--cpus-per-task), or give the others work (threads, workers)"]
    if not f.gpus:
        return [f"CPU efficiency {percent(eff)}: the CPU mostly waited (on files or the "
                "network); read data in larger pieces or from node-local storage"]
    return []


def time_hints(f: Figures) -> list[str]:
    if f.state != "COMPLETED" or not f.time_limit_s or f.elapsed_s < MIN_ELAPSED_S:
        return []
    share = f.elapsed_s / f.time_limit_s
    if share < LOW_SHARE / 2:
        return [f"ran {percent(share)} of its time limit: ask for --time "
                f"{time_option(f.elapsed_s * HEADROOM)}; shorter jobs start sooner (backfill)"]
    return []


def hints(f: Figures) -> list[str]:
    """Every hint for ``f``, GPUs first (the dearest resource)."""
    return gpu_hints(f) + memory_hints(f) + cpu_hints(f) + time_hints(f)
