"""``python -m pyhpc.admin.gpucheck``: one GPU node's own view of its GPUs, for ``pyhpc doctor --gpus``.

The doctor runs it as one Slurm step holding every GPU Slurm has on the node
(``srun -w NODE --gres=gpu:N``); it prints one line, ``PYHPC_GPUCHECK {json}``:

- ``seen``: the GPUs the node has: ``nvidia-smi -L`` where the driver is installed, else
  the device files its gres.conf names (``File=``; the lab's stand-ins under /dev/pyhpc-lab).
- ``matmul``: a seeded matmul on every GPU CUDA sees, else on the CPU (and it says so),
  compared with the float64 result.
- ``dcgm``: ``dcgmi diag -r 1`` where DCGM is installed, else ``absent``.

Each verdict is ``pass``, ``fail`` (the node answered, wrongly) or ``error`` (the check
could not run: no torch, a timeout); the doctor drains only for a ``fail``. The lines are
the same on the CPU and on a GPU (the device differs); torch is imported in :func:`matmul`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyhpc import validate
from pyhpc.dist import device
from pyhpc.errors import PyhpcError
from pyhpc.slurm import rows

#: Prefix of the one report line (the step's other output is not ours).
MARK = "PYHPC_GPUCHECK"
GRES_CONF = Path("/etc/slurm/gres.conf")
MATMUL_N = 256
#: Largest matmul error allowed, relative to the largest float64 entry: fp32 is near 1e-6,
#: TF32 near 1e-3; a faulty GPU gives garbage or NaN.
TOLERANCE = 1e-2
DCGM_TIMEOUT_S = 240.0


def nvidia_smi_count(text: str) -> int:
    """GPUs in ``nvidia-smi -L``'s output (``GPU 0: NVIDIA H100 ... (UUID: GPU-...)``)."""
    return sum(1 for line in text.splitlines() if re.match(r"GPU \d+:", line))


def gres_files(node: str, gres_conf: Path) -> list[str]:
    """The device files of ``node``'s ``Name=gpu`` lines in gres.conf (one parser:
    :func:`pyhpc.slurm.rows.gres_gpu_files`, which the job exporter reads too)."""
    return rows.gres_gpu_files(node, gres_conf.read_text())


def seen(node: str, gres_conf: Path = GRES_CONF) -> tuple[int, str]:
    """How many GPUs this node has, and how that was counted."""
    if shutil.which("nvidia-smi"):
        text = device.command_text(["nvidia-smi", "-L"])
        if text is None:
            return 0, "nvidia-smi -L failed (the driver does not answer)"
        return nvidia_smi_count(text), "nvidia-smi -L"
    try:
        files = gres_files(node, gres_conf)
    except OSError as exc:
        return 0, f"no nvidia-smi, and {gres_conf}: {exc.strerror}"
    if not files:
        return 0, f"no nvidia-smi, and no File= for {node} in {gres_conf}"
    missing = [f for f in files if not os.path.exists(f)]
    gone = f"; missing: {', '.join(missing)}" if missing else ""
    return len(files) - len(missing), f"device files in {gres_conf} ({len(files)} listed{gone})"


def matmul(cuda_expected: int = 0, n: int = MATMUL_N) -> tuple[str, str]:
    """A seeded ``n``x``n`` fp32 matmul on every GPU CUDA sees, else on the CPU, checked
    against float64. ``cuda_expected``: GPUs the driver lists, which CUDA must see too."""
    try:
        import torch
    except ImportError as exc:
        return "error", f"no torch in {sys.executable}: {exc}"
    count = torch.cuda.device_count()
    if count < cuda_expected:
        return "error", (f"CUDA sees {count} of the {cuda_expected} GPUs nvidia-smi lists "
                         "(a CPU-only torch, or CUDA_VISIBLE_DEVICES)")
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    want = a.double() @ b.double()
    scale = float(want.abs().max())
    places = [device.Placement("cuda", i, reason="gpucheck") for i in range(count)] or [device.CPU]
    worst = 0.0
    for place in places:
        try:
            where = place.torch_device()
            got = a.to(where) @ b.to(where)
            place.synchronize()
            error = float((got.cpu().double() - want).abs().max()) / scale
        except RuntimeError as exc:  # a CUDA error: the GPU failed
            return "fail", f"{place.name}: {str(exc).strip().splitlines()[0]}"
        if not error <= TOLERANCE:  # NaN fails too
            return "fail", f"{place.name}: wrong result, error {error:.1e} > {TOLERANCE:g}"
        worst = max(worst, error)
    where_text = ", ".join(p.name for p in places) if count else "cpu (no CUDA here)"
    return "pass", f"{where_text}: {n}x{n} fp32, error {worst:.1e}"


def dcgm(timeout_s: float = DCGM_TIMEOUT_S) -> tuple[str, str]:
    """``dcgmi diag -r 1`` (deployment and quick health tests) where DCGM is installed."""
    if not shutil.which("dcgmi"):
        return "absent", "dcgmi not installed"
    try:
        proc = subprocess.run(["dcgmi", "diag", "-r", "1"], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return "error", f"dcgmi diag -r 1: no answer within {timeout_s:.0f} s"
    except OSError as exc:
        return "error", f"dcgmi diag -r 1: {exc.strerror}"
    failed = re.findall(r"^\|\s*([^|]*?)\s*\|\s*Fail\b", proc.stdout, re.M)
    if failed:
        return "fail", f"dcgmi diag -r 1 failed: {', '.join(failed)}"
    if proc.returncode != 0:  # e.g. no nv-hostengine to talk to
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return "error", f"dcgmi diag -r 1: {lines[-1] if lines else f'exit {proc.returncode}'}"
    return "pass", "dcgmi diag -r 1: pass"


def report(node: str, gres_conf: Path = GRES_CONF) -> dict[str, Any]:
    """What this node says about its GPUs (the doctor compares ``seen`` with Slurm's GRES)."""
    count, source = seen(node, gres_conf)
    matmul_status, matmul_detail = matmul(count if source == "nvidia-smi -L" else 0)
    dcgm_status, dcgm_detail = dcgm()
    return {"node": node, "seen": count, "seen_source": source,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "matmul": matmul_status, "matmul_detail": matmul_detail,
            "dcgm": dcgm_status, "dcgm_detail": dcgm_detail}


def parse(stdout: str) -> dict[str, Any] | None:
    """The report in a step's output: its last ``PYHPC_GPUCHECK`` line, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK + " "):
            try:
                data = validate.read_json("gpucheck", line[len(MARK) + 1:])
            except PyhpcError:
                return None
            return data if isinstance(data, dict) else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyhpc.admin.gpucheck", description=__doc__)
    parser.add_argument("--gres-conf", type=Path, default=GRES_CONF, help="this node's gres.conf")
    args = parser.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    try:
        data = report(node, args.gres_conf)
    except PyhpcError as exc:
        data = {"node": node, "error": str(exc)}
    print(MARK, json.dumps(data, sort_keys=True), flush=True)
    return 0 if "error" not in data else 1


if __name__ == "__main__":
    sys.exit(main())
