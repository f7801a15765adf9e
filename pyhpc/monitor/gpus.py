"""GPUs on this host: NVML's figures where a driver answers, and which job holds which GPU.

Only NVML gives utilization and memory, so only a host whose driver answers has those
series. The lab's stand-ins (character devices with NVIDIA's major number, no driver)
get no figure at all: absent, not zero. A GPU is matched to a job by its device minor
number: from the job's v1 ``devices.list`` where the cgroup restricts devices, else from
Slurm's GRES index (squeue's JSON ``gres_detail``: ``gpu:2(IDX:0-1)``, read by
:func:`pyhpc.slurm.slurm.job_details`), which counts
along the node's GPUs in gres.conf's order (``File=/dev/nvidia[0-3]``, or NVML's with
``AutoDetect=nvml``), that is, by minor number.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuSample:
    """One GPU now. ``utilization``: share of the last sample period a kernel ran (0..1).
    ``index``: NVML's (nvidia-smi's) ordinal. Power and temperature are None where the GPU
    does not report them."""

    minor: int
    uuid: str
    name: str
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int
    index: int = 0
    power_milliwatts: int | None = None
    temperature_celsius: int | None = None

    @property
    def duty_cycle(self) -> float:
        """``utilization`` as a percentage, the GPU exporter's unit."""
        return round(self.utilization * 100, 6)


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
                    memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total),
                    index=index, power_milliwatts=self._optional(
                        "nvmlDeviceGetPowerUsage", handle),
                    temperature_celsius=self._optional(
                        "nvmlDeviceGetTemperature", handle,
                        getattr(nv, "NVML_TEMPERATURE_GPU", 0))))
            except nv.NVMLError:
                continue
        return sorted(out, key=lambda s: s.minor)

    def _optional(self, call: str, *args: Any) -> int | None:
        """A figure some GPUs do not report (``Not Supported``): None, never 0."""
        try:
            return int(getattr(self._nv, call)(*args))
        except (self._nv.NVMLError, AttributeError):
            return None

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


def minors_by_index(index: tuple[int, ...], node_minors: list[int]) -> frozenset[int]:
    """The minors of GRES indices ``index`` on a node whose GPUs have ``node_minors``."""
    ordered = sorted(node_minors)
    return frozenset(ordered[i] for i in index if 0 <= i < len(ordered))
