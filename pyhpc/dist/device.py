"""Where a task computes: the device decision (pure), and the few lines that differ on GPUs.

:func:`choose` decides from plain values — the requested device, ``CUDA_VISIBLE_DEVICES``,
the local rank, how many devices CUDA sees, whether Slurm bound one GPU to each task —
so every combination is unit-tested without a GPU. :func:`resolve` reads those values
from the environment and torch, checks the precision, and returns a :class:`Placement`.

The training and benchmark code is written once for every device: it reads the
placement's flags (``pin_memory``, ``non_blocking``, ``device_ids``...), which are all
false or ``None`` on the CPU, so the same lines run in the CPU tests. The lines that only
ever run on a GPU are few, live here, and each is marked ``# GPU-only:``
(docs/gpu-lines.md lists them, with the rest of the code base's).

Importing this module does not import torch.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyhpc.errors import PyhpcError, echo

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
#: CUDA_VISIBLE_DEVICES values that mean "no device" (Slurm writes NoDevFiles).
NO_DEVICES = ("", "NoDevFiles", "-1")


class DeviceError(PyhpcError):
    """A device or precision this task cannot use; the message names the option."""


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`choose`: ``cpu``, or ``cuda`` with an index, and why."""

    type: str
    index: int | None
    reason: str

    @property
    def name(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


def visible(cuda_visible_devices: str | None) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES``: ``None`` when unset (all devices visible)."""
    if cuda_visible_devices is None:
        return None
    if cuda_visible_devices.strip() in NO_DEVICES:
        return []
    return [d.strip() for d in cuda_visible_devices.split(",") if d.strip()]


def one_gpu_per_task(env: Mapping[str, str]) -> bool:
    """Whether Slurm bound one GPU to each task (``--gpus-per-task=1``, ``--gpu-bind``)."""
    return env.get("SLURM_GPUS_PER_TASK", "").strip() == "1" or bool(
        env.get("SLURM_GPU_BIND", "").strip())


def choose(requested: str, *, cuda_visible_devices: str | None, local_rank: int,
           device_count: int, one_per_task: bool, in_slurm: bool) -> Choice:
    """The device of one task.

    - ``cpu``: the CPU.
    - ``auto``: the task's GPU when it was given one — CUDA sees a device and, inside a
      Slurm job, Slurm set ``CUDA_VISIBLE_DEVICES`` to the job's GPUs (a job without GPUs
      on a GPU node must not take one another job owns); else the CPU.
    - ``cuda``: the task's GPU; none visible is a :class:`DeviceError`.

    The task's GPU: ``cuda:0`` when Slurm bound one GPU per task and the task sees exactly
    one; otherwise the local rank among the visible devices. A local rank with no device
    of its own is a :class:`DeviceError` (two ranks on one GPU: NCCL refuses it).
    """
    if requested not in DEVICES:
        raise DeviceError(f"device: {echo(requested)} is not allowed; allowed: "
                          f"{', '.join(DEVICES)}", "device")
    if requested == "cpu":
        return Choice("cpu", None, "--device cpu")
    shown = visible(cuda_visible_devices)
    cvd = "unset" if cuda_visible_devices is None else repr(cuda_visible_devices)
    if device_count <= 0:
        if requested == "auto":
            return Choice("cpu", None, f"auto: CUDA sees no device (CUDA_VISIBLE_DEVICES {cvd})")
        hint = ("Slurm listed GPUs that CUDA cannot use (a CPU-only torch, or the lab's "
                "stand-in devices); use --device auto or cpu" if shown else
                "request GPUs with --gpus-per-node on a partition that has them, or use "
                "--device auto or cpu")
        raise DeviceError(f"device: cuda requested, but no GPU is visible to this task "
                          f"(CUDA sees 0 devices; CUDA_VISIBLE_DEVICES {cvd}); {hint}",
                          "device")
    if requested == "auto" and in_slurm and not shown:
        return Choice("cpu", None, f"auto: Slurm gave this job no GPU (CUDA_VISIBLE_DEVICES "
                                   f"{cvd})")
    if one_per_task and device_count == 1:
        return Choice("cuda", 0, "Slurm bound one GPU to this task")
    if 0 <= local_rank < device_count:
        return Choice("cuda", local_rank, f"local rank {local_rank} of {device_count} "
                                          "visible devices")
    raise DeviceError(f"device: local rank {local_rank} has no GPU of its own ({device_count} "
                      f"visible, CUDA_VISIBLE_DEVICES {cvd}); run one task per GPU or use "
                      "--device cpu", "device")


def check_precision(precision: str, choice: Choice, *, cpu_bf16: bool, cuda_bf16: bool,
                    gpu: str = "") -> None:
    """Refuse a precision the device cannot run.

    bf16 runs as ``torch.autocast(dtype=bfloat16)``. On a GPU it needs native bfloat16
    (compute capability 8.0+, Ampere and later). On the CPU it is allowed whenever torch
    has CPU autocast for bfloat16 (torch 1.10 and later, on every x86/Arm CPU): CPUs
    without native bf16 instructions emulate it, so it is slow there, but the numerics
    are the GPU's, and it is what lets the bf16 path run in CPU-only tests.
    """
    if precision not in PRECISIONS:
        raise DeviceError(f"precision: {echo(precision)} is not allowed; allowed: "
                          f"{', '.join(PRECISIONS)}", "precision")
    if precision != "bf16":
        return
    if choice.type == "cuda" and not cuda_bf16:
        raise DeviceError(f"precision: bf16 needs a GPU with bfloat16 support (compute "
                          f"capability 8.0+); {choice.name} is {gpu or 'older'}; use "
                          "--precision fp32", "precision")
    if choice.type == "cpu" and not cpu_bf16:
        raise DeviceError("precision: bf16 on the CPU needs torch's CPU autocast for "
                          "bfloat16, which this torch lacks; use --precision fp32",
                          "precision")


@dataclass(frozen=True)
class Placement:
    """A task's device and precision, and what follows from them for the code."""

    type: str
    index: int | None
    precision: str = "fp32"
    reason: str = ""

    @property
    def name(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    @property
    def cuda(self) -> bool:
        return self.type == "cuda"

    @property
    def backend(self) -> str:
        """NCCL only on GPUs; gloo on the CPU."""
        return "nccl" if self.cuda else "gloo"

    @property
    def pin_memory(self) -> bool:
        """Page-locked host batches, so copies to the GPU can be asynchronous."""
        return self.cuda

    @property
    def non_blocking(self) -> bool:
        return self.cuda

    @property
    def channels_last(self) -> bool:
        """NHWC on GPUs (tensor cores); the CPU keeps NCHW, and its results bit for bit."""
        return self.cuda

    @property
    def device_ids(self) -> list[int] | None:
        """DDP's ``device_ids``: the one GPU of this process; ``None`` on the CPU."""
        return [self.index] if self.cuda and self.index is not None else None

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"

    def torch_device(self) -> torch.device:
        import torch

        return torch.device(self.name)

    def memory_format(self) -> torch.memory_format:
        import torch

        return torch.channels_last if self.channels_last else torch.preserve_format

    def autocast(self) -> AbstractContextManager[Any]:
        """bf16 autocast for the forward pass and loss; a no-op context in fp32."""
        import torch

        return torch.autocast(device_type=self.type, dtype=torch.bfloat16, enabled=self.bf16)

    def activate(self) -> None:
        """Make this GPU the process's current device (before the process group exists)."""
        import torch

        if self.cuda:
            torch.cuda.set_device(self.index)  # GPU-only: current device before NCCL init

    def synchronize(self) -> None:
        """Wait for the device's queued work (timers); nothing to wait for on the CPU."""
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.index)  # GPU-only: kernels run asynchronously


def peak_memory_bytes(place: Placement) -> int:
    """The most memory this task has held: on a GPU, what torch's allocator had allocated
    on it; on the CPU, the process's peak resident set (torch and the data included)."""
    import resource

    import torch

    if place.cuda:
        return int(torch.cuda.max_memory_allocated(place.index))  # GPU-only: the device's peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def host_buffers(place: Placement, nbytes: int) -> dict[str, torch.Tensor]:
    """Host buffers of ``nbytes`` to copy from and to, their pages already touched:
    ``pageable`` always, and ``pinned`` (page-locked) where there is a GPU to copy to —
    pinning needs one, and on the CPU a "pinned" buffer would be just another copy."""
    import torch

    buffers = {"pageable": torch.zeros(nbytes, dtype=torch.uint8)}
    if place.pin_memory:
        buffers["pinned"] = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=True)  # GPU-only: pinned
    return buffers


def nvidia_smi(place: Placement, *args: str) -> str | None:
    """``nvidia-smi ARGS -i GPU`` about this task's GPU, named by its UUID (which
    ``CUDA_VISIBLE_DEVICES`` does not renumber); ``None`` on the CPU or when it fails."""
    import torch

    if not place.cuda:
        return None
    uuid = torch.cuda.get_device_properties(place.index).uuid  # GPU-only: the physical GPU
    return command_text(["nvidia-smi", *args, "-i", f"GPU-{uuid}"])  # GPU-only: ask the driver


def command_text(argv: Sequence[str], timeout_s: float = 30.0) -> str | None:
    """A (non-Slurm) command's standard output, or ``None`` if it is missing or fails."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


#: The CPU in fp32: what code that names no device runs on.
CPU = Placement("cpu", None, "fp32", "default")


def _cpu_bf16() -> bool:
    import torch

    return bool(torch.amp.is_autocast_available("cpu"))


def local_rank(env: Mapping[str, str]) -> int:
    """The task's rank on its node, as :func:`pyhpc.dist.export_env` will export it:
    Slurm's ``SLURM_LOCALID`` in a Slurm task not launched by torchrun, else
    ``LOCAL_RANK`` (torchrun's), else 0. Readable before anything is exported."""
    key = "LOCAL_RANK"
    if ("TORCHELASTIC_RUN_ID" not in env and "SLURM_JOB_ID" in env
            and "SLURM_LOCALID" in env):
        key = "SLURM_LOCALID"
    text = env.get(key, "0")
    if not text.strip().isdigit():
        raise DeviceError(f"device: {key} is {echo(text)}, not a local rank", "device")
    return int(text)


def resolve(requested: str = "auto", precision: str = "fp32",
            env: Mapping[str, str] | None = None) -> Placement:
    """This task's :class:`Placement`, from the environment and what torch sees; a device
    or precision it cannot use is a :class:`DeviceError`. Sets nothing (see
    :meth:`Placement.activate`), so a run can be refused before it starts."""
    import torch

    env = os.environ if env is None else env
    choice = choose(requested, cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
                    local_rank=local_rank(env), device_count=torch.cuda.device_count(),
                    one_per_task=one_gpu_per_task(env), in_slurm="SLURM_JOB_ID" in env)
    cuda_bf16, gpu = False, ""
    if choice.type == "cuda" and precision == "bf16":
        major, minor = torch.cuda.get_device_capability(choice.index)  # GPU-only: bf16 is 8.0+
        name = torch.cuda.get_device_name(choice.index)  # GPU-only: named in the error
        cuda_bf16, gpu = major >= 8, f"{name} (compute capability {major}.{minor})"  # GPU-only:
    check_precision(precision, choice, cpu_bf16=_cpu_bf16(), cuda_bf16=cuda_bf16, gpu=gpu)
    return Placement(choice.type, choice.index, precision, choice.reason)
