"""``pyhpc bench``: node and interconnect micro-benchmarks, run as one Slurm job.

On the nodes the job gets, every task measures (see :mod:`pyhpc.bench.job`):

- **copy**: host<->device copy bandwidth from pageable and from pinned host memory, over
  sizes 4 KiB .. ``max_bytes``; without a GPU, host memory-copy bandwidth (``copy_``),
  and the results say so;
- **allreduce**: all-reduce bus bandwidth with nccl-tests' definition
  ``busbw = algbw * 2(n-1)/n`` (NCCL on GPUs, gloo on the CPU), within each node and
  across all the job's ranks;
- **matmul**: matrix-multiply throughput in fp32 and bf16 (TFLOP/s);
- **link**: where ``nvidia-smi`` tells the PCIe generation and width or the NVLink speed,
  the fraction of that nominal peak reached (GPUs only; ``unknown`` on the CPU).

Rank 0 writes ``bench.json``, ``bench.txt`` (the table) and ``bench.png`` to the run
directory, through :mod:`pyhpc.files`. This module holds what both sides share: the
checked options and the formulas. :mod:`pyhpc.bench.submit` submits the job, and
:mod:`pyhpc.bench.results` checks, tabulates and plots what it wrote. None of them
imports torch (the plot imports matplotlib when it draws).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pyhpc import validate
from pyhpc.dist import device
from pyhpc.errors import PyhpcError, echo

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
TESTS = ("copy", "allreduce", "matmul")
#: The size ladder: MIN_BYTES, x LADDER_FACTOR, ... up to the largest size asked for.
MIN_BYTES = 4 * KIB
LADDER_FACTOR = 4
MAX_BYTES_LIMIT = GIB
#: ``max_bytes=0`` (auto): the ladder's top on a GPU and on the CPU (kept short there).
AUTO_MAX_BYTES = {"cuda": GIB, "cpu": 64 * MIB}
#: ``matmul_size=0`` (auto): n of the n x n matrices on a GPU and on the CPU.
AUTO_MATMUL = {"cuda": 8192, "cpu": 512}
BYTES_RE = re.compile(r"([0-9]{1,13})\s*([KMG]?)(?:i?B)?", re.IGNORECASE)


class BenchError(PyhpcError):
    """A benchmark option or result that cannot be used; the message names it."""


def parse_bytes(where: str, value: object) -> int:
    """A byte count from an integer or text such as ``4096``, ``64M``, ``64MiB``, ``1G``
    (binary units), from 4 KiB to 1 GiB; 0 means auto."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and (match := BYTES_RE.fullmatch(value.strip())):
        number = int(match.group(1)) * {"": 1, "K": KIB, "M": MIB, "G": GIB}[
            match.group(2).upper()]
    if number is None or (number != 0 and not MIN_BYTES <= number <= MAX_BYTES_LIMIT):
        raise BenchError(f"{where}: {echo(value)} is not allowed; use a size from 4K to 1G "
                         "(bytes, or K, M, G as in 64M), or 0 for auto", where)
    return number


def sizes(max_bytes: int, min_bytes: int = MIN_BYTES, factor: int = LADDER_FACTOR,
          ) -> list[int]:
    """The message sizes: ``min_bytes``, times ``factor``, ... while at most ``max_bytes``."""
    if not 0 < min_bytes <= max_bytes or factor < 2:
        raise BenchError(f"max_bytes: the ladder needs {min_bytes} <= max_bytes, got "
                         f"{max_bytes}", "max_bytes")
    ladder = [min_bytes]
    while ladder[-1] * factor <= max_bytes:
        ladder.append(ladder[-1] * factor)
    return ladder


def iterations(nbytes: int) -> int:
    """Timed repetitions of one all-reduce size: the same on every rank (a collective),
    about 256 MiB moved per size, from 2 to 20."""
    return max(2, min(20, (256 * MIB) // max(nbytes, 1)))


def gbps(nbytes: float, seconds: float) -> float:
    """Bandwidth in GB/s (10^9 bytes per second, as nccl-tests and vendors quote it)."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw(algbw: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce over ``ranks`` ranks: each rank sends
    and receives 2(n-1)/n of the buffer, so ``busbw = algbw * 2(n-1)/n`` is comparable to
    a link's speed whatever n is (doc/PERFORMANCE.md in NVIDIA/nccl-tests)."""
    if ranks < 1:
        raise BenchError(f"ranks: must be at least 1, got {ranks}", "ranks")
    return algbw * 2 * (ranks - 1) / ranks


def tflops(n: int, seconds: float) -> float:
    """TFLOP/s of one n x n by n x n matrix multiply (2 n^3 floating-point operations)."""
    return 2 * n**3 / seconds / 1e12 if seconds > 0 else 0.0


# -- the job's options -------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark job's options, checked when made."""

    out: str
    device: str = "auto"
    max_bytes: int = 0
    matmul_size: int = 0
    tests: tuple[str, ...] = TESTS
    threads: int = 1

    def __post_init__(self) -> None:
        if self.device not in device.DEVICES:
            raise BenchError(f"device: {echo(self.device)} is not allowed; allowed: "
                             f"{', '.join(device.DEVICES)}", "device")
        object.__setattr__(self, "max_bytes", parse_bytes("max_bytes", self.max_bytes))
        object.__setattr__(self, "matmul_size", validate.integer(
            "matmul_size", self.matmul_size, 0, 32768, error=BenchError))
        object.__setattr__(self, "threads", validate.integer("threads", self.threads, 1, 256,
                                                             error=BenchError))
        tests = tuple(self.tests)
        unknown = [t for t in tests if t not in TESTS]
        if not tests or unknown or len(set(tests)) != len(tests):
            raise BenchError(f"tests: {echo(','.join(map(str, tests)))} is not allowed; give "
                             f"some of {', '.join(TESTS)}, each once", "tests")
        object.__setattr__(self, "tests", tests)
        if not isinstance(self.out, str) or not self.out or "\0" in self.out:
            raise BenchError(f"out: must be a directory path, got {echo(self.out)}", "out")

    def top_bytes(self, kind: str) -> int:
        """The ladder's top on a device of ``kind`` (``cpu`` or ``cuda``)."""
        return self.max_bytes or AUTO_MAX_BYTES[kind]

    def matmul_n(self, kind: str) -> int:
        return self.matmul_size or AUTO_MATMUL[kind]


def tests_list(text: str) -> tuple[str, ...]:
    """``copy,allreduce`` to its tuple (checked by :class:`BenchConfig`)."""
    return tuple(t.strip() for t in text.split(",") if t.strip())
