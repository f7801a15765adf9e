"""GPUs on this host: NVML's figures where a driver answers, and which job holds which GPU.

Only NVML gives utilization and memory, so only a host whose driver answers has those
series. The lab's stand-ins (character devices with NVIDIA's major number, no driver)
get no figure at all: absent, not zero. A GPU is matched to a job by its device minor
number: from the job's v1 ``devices.list`` where the cgroup restricts devices, else from
Slurm's GRES index (``scontrol -d show job``: ``GRES=gpu:2(IDX:0-1)``), which counts
along the node's GPUs in gres.conf's order (``File=/dev/nvidia[0-3]``, or NVML's with
``AutoDetect=nvml``), that is, by minor number.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any

from pyhpc.slurm.rows import hostlist


@dataclass(frozen=True)
class GpuSample:
    """One GPU now. ``utilization``: share of the last sample period a kernel ran (0..1)."""

    minor: int
    uuid: str
    name: str
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int


class Nvml:
    """NVML, if a driver answers on this host; ``ok`` says whether it did, ``why`` why not.

    ``module`` stands in for ``pynvml`` (nvidia-ml-py) in tests.
    """

    def __init__(self, module: Any = None) -> None:
        self.ok, self.why = False, ""
        try:
            self._nv = module if module is not None else importlib.import_module("pynvml")
        except ImportError:
            self._nv, self.why = None, "nvidia-ml-py is not installed"
            return
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as exc:  # no library, no driver loaded
            self.why = f"NVML: {exc}"
            return
        self.ok = True

    def samples(self) -> list[GpuSample] | None:
        """Every GPU that answers (a GPU lost off the bus is left out, so fewer are seen
        than Slurm declares); None where no driver answers."""
        if not self.ok:
            return None
        nv, out = self._nv, []
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError:
            return None
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                memory = self._memory(handle)
                out.append(GpuSample(
                    minor=int(nv.nvmlDeviceGetMinorNumber(handle)),
                    uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                    name=_text(nv.nvmlDeviceGetName(handle)),
                    utilization=float(nv.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0,
                    memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total)))
            except nv.NVMLError:
                continue
        return sorted(out, key=lambda s: s.minor)

    def _memory(self, handle: Any) -> Any:
        """The GPU's memory as ``nvidia-smi`` counts it. Version 2 of the call leaves out
        what the driver reserves; version 1 counts it as used (615 MiB of an idle H200 with
        driver 580, where nvidia-smi said 0 MiB). Version 1 where the bindings or the
        driver lack version 2."""
        nv, v2 = self._nv, getattr(self._nv, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                return nv.nvmlDeviceGetMemoryInfo(handle, version=v2)
            except nv.NVMLError:  # an older driver: no nvmlDeviceGetMemoryInfo_v2
                pass
        return nv.nvmlDeviceGetMemoryInfo(handle)


def _text(value: str | bytes) -> str:
    """NVML strings are bytes in older bindings, str in newer ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class JobInfo:
    """What slurmctld says of one job: owner, account, and per node its GPU indices and
    how many CPUs it holds there (``CPU_IDs``)."""

    job_id: str
    user: str
    account: str
    gpu_index: dict[str, tuple[int, ...]] = field(default_factory=dict)
    cpus: dict[str, int] = field(default_factory=dict)


def _indices(spec: str) -> tuple[int, ...]:
    """``0-1,3`` -> (0, 1, 3)."""
    out: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            out += range(int(low), int(high or low) + 1)
    return tuple(out)


_DETAIL = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=(\S*) Mem=\S* GRES=(\S*)")


def job_details(text: str) -> dict[str, JobInfo]:
    """``scontrol -d -o show job``'s lines, by job id (``UserId=alice(1000)``,
    ``Account=``, and each ``Nodes=... CPU_IDs=0-3 ... GRES=gpu:a100:2(IDX:0-1)`` block)."""
    out: dict[str, JobInfo] = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(?:^|\s)(JobId|UserId|Account)=(\S*)", line))
        if not fields.get("JobId", "").isdigit():
            continue
        per_node: dict[str, tuple[int, ...]] = {}
        cpus: dict[str, int] = {}
        for nodes, cpu_ids, gres in _DETAIL.findall(line):
            index = tuple(i for item in re.findall(r"gpu[^,(]*\(IDX:([0-9,-]+)\)", gres)
                          for i in _indices(item))
            for node in hostlist(nodes):
                per_node[node] = index
                cpus[node] = len(_indices(cpu_ids))
        out[fields["JobId"]] = JobInfo(fields["JobId"], fields.get("UserId", "").split("(")[0],
                                       fields.get("Account", ""), per_node, cpus)
    return out


def minors_by_index(index: tuple[int, ...], node_minors: list[int]) -> frozenset[int]:
    """The minors of GRES indices ``index`` on a node whose GPUs have ``node_minors``."""
    ordered = sorted(node_minors)
    return frozenset(ordered[i] for i in index if 0 <= i < len(ordered))
