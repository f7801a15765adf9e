"""On one GPU machine (the device tool's H100 or H200): the GPU-only lines run, and figures.

Run on a machine where ``torch.cuda.is_available()``; ``--device cpu`` runs the same parts
on the CPU (the rehearsal here, before device time is spent). Every part runs even when
another fails; its error is recorded, never a figure in its place.

- **bench**: ``pyhpc.bench.job.run`` on one rank (no Slurm): host->device and device->host
  copies from pageable and pinned memory (``device.host_buffers``' pinned buffer), fp32 and
  bf16 matmul, the link row from ``nvidia-smi -q`` (``device.nvidia_smi``);
- **train**: ``python -P -m pyhpc.train`` on the GPU in fp32 and bf16 and on all the
  machine's CPU cores in fp32, side by side in one run (ABBA order, medians): samples/s of
  the wide CNN, and of the deep model (``--model deep``) with its peak GPU memory
  (``device.peak_memory_bytes``) at two depths;
- **kernels**: the deep model under ``--kernels default`` (two straight runs) and
  ``--kernels deterministic`` (two straight runs and one stopped after its first epoch and
  resumed): whether each pair agrees bit for bit (every epoch's loss, a digest of the final
  weights), and what deterministic kernels cost in samples/s;
- **gpucheck**: the health check's seeded matmul on every GPU CUDA sees;
- **nvml**: the job exporter's NVML samples against ``nvidia-smi --query-gpu``.

``--parts`` runs some parts only; the others are carried from the last ``gpu.json``, each
marked with the commit and date it was measured at (:func:`benchmarks.record.carried`).

Writes ``DIR/gpu.json`` in the result file's shape (:mod:`benchmarks.record`); the caller
copies it to ``benchmarks/results/gpu.json``. ``--commit`` names the code measured (the
device machine gets a copy of the tree without ``.git``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import record

ROOT = Path(__file__).resolve().parent.parent
#: The wide CNN on generated images: several thousand samples an epoch, big GPU batches.
WIDE = ["--mode", "synthetic", "--synthetic-samples", "20000", "--batch-size", "256",
        "--epochs", "2", "--warmup-steps", "5"]
#: The deep model (3x62x62 images, residual blocks) at two depths: memory per block.
DEEP = ["--model", "deep", "--synthetic-samples", "2000", "--batch-size", "64", "--epochs", "1",
        "--warmup-steps", "3"]
DEPTHS = (50, 200)
QUICK_WIDE = ["--mode", "synthetic", "--synthetic-samples", "2000", "--batch-size", "64",
              "--epochs", "1", "--warmup-steps", "3"]
QUICK_DEEP = ["--model", "deep", "--synthetic-samples", "400", "--batch-size", "32", "--epochs",
              "1", "--warmup-steps", "3"]
#: The kernels part: the deep model long enough for default kernels to drift, resumable.
KERNELS = ["--model", "deep", "--layers", "50", "--synthetic-samples", "2000", "--batch-size",
           "64", "--epochs", "3", "--warmup-steps", "3"]
QUICK_KERNELS = ["--model", "deep", "--layers", "4", "--synthetic-samples", "400",
                 "--batch-size", "32", "--epochs", "3", "--warmup-steps", "3"]
PARTS = ("facts", "bench", "train", "kernels", "gpucheck", "nvml")


def part(name: str, run: Callable[[], Any], errors: dict[str, str]) -> Any:
    """``run()``'s figures, or ``None`` with the error kept under ``name``."""
    started = time.perf_counter()
    try:
        result = run()
    except Exception as exc:  # noqa: BLE001 - one part's failure must not lose the others
        errors[name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
        print(f"benchmarks.gpu: {name} failed: {exc}", file=sys.stderr, flush=True)
        return None
    print(f"benchmarks.gpu: {name} done in {time.perf_counter() - started:.1f} s", flush=True)
    return result


def gpu_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                             "gpus": torch.cuda.device_count()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts |= {"name": props.name, "capability": f"{props.major}.{props.minor}",
                  "memory_gib": round(props.total_memory / 2**30, 1),
                  "multiprocessors": props.multi_processor_count}
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=driver_version,pcie.link.gen.max,"
                              "pcie.link.width.max", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        facts["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
    return facts


def bench(kind: str, work: Path) -> dict[str, Any]:
    """pyhpc bench's measurements on one rank; the largest copy of each kind, the matmuls."""
    from pyhpc.bench import job
    from pyhpc.bench.config import BenchConfig

    os.environ.pop("SLURM_JOB_ID", None)
    port = os.environ.setdefault("MASTER_PORT", "29511")
    doc = job.run(BenchConfig(out=str(work / "bench"), device=kind, threads=os.cpu_count() or 1))
    if doc is None:
        raise RuntimeError("pyhpc.bench.job.run returned nothing on rank 0")
    rows = doc["copy"]["ranks"][0]["rows"]
    top = max(r["bytes"] for r in rows)
    return {"device": doc["device"], "backend": doc["backend"], "master_port": port,
            "copy_top_bytes": top,
            "copy_GBps": {f"{r['direction']} {r['memory']}": round(r["GBps"], 2)
                          for r in rows if r["bytes"] == top},
            "copy_GBps_64KiB": {f"{r['direction']} {r['memory']}": round(r["GBps"], 2)
                                for r in rows if r["bytes"] == 64 * 1024},
            "matmul": {r["dtype"]: {"n": r["n"], "tflops": round(r["tflops"], 1)}
                       for r in doc["matmul"]["ranks"][0]["rows"]},
            "allreduce_skipped": doc["allreduce"]["skipped"],
            "link": doc["link"]["ranks"][0]}


def train_once(work: Path, name: str, flags: list[str], keep: bool = False) -> dict[str, Any]:
    """One ``python -P -m pyhpc.train`` run: its summary line and the process's wall time.
    ``keep``: run in the directory as it is (a resume), not an emptied one."""
    out = work / name
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("SLURM_JOB_ID", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-P", "-m", "pyhpc.train", *flags, "--out", str(out)],
                          capture_output=True, text=True, check=False, env=env, cwd=work)
    wall = time.perf_counter() - started
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name}: exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
    summary = json.loads(lines[-1])
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "rank 0 on " in line]
    return {"samples_per_s": summary["samples_per_s"], "step_time_p50": summary["step_time_p50"],
            "wall_s": round(wall, 2), "placed": said[0] if said else None,
            "loss": summary.get("extra_final_loss")}


def train(kind: str, work: Path, reps: int, quick: bool = False) -> dict[str, Any]:
    """Wide CNN: GPU fp32, GPU bf16, all CPU cores fp32, in ABBA order; medians.
    ``quick``: a tenth of the samples and shallow deep models (the rehearsal)."""
    wide_flags, deep_flags, depths = WIDE, DEEP, DEPTHS
    if quick:
        wide_flags, deep_flags, depths = QUICK_WIDE, QUICK_DEEP, (2, 4)
    cores = str(os.cpu_count() or 1)
    arms = {f"{kind} fp32": ["--device", kind, "--precision", "fp32"],
            f"{kind} bf16": ["--device", kind, "--precision", "bf16"]}
    if kind == "cuda":
        arms[f"cpu fp32 ({cores} threads)"] = ["--device", "cpu", "--threads", cores]
    order = list(arms)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for rep in range(reps):
        for arm in order if rep % 2 == 0 else order[::-1]:
            runs[arm].append(train_once(work, f"wide-{len(runs[arm])}", wide_flags + arms[arm]))
    wide = {arm: {"samples_per_s_median": round(statistics.median(r["samples_per_s"] for r in rs), 1),
                  "samples_per_s": [round(r["samples_per_s"], 1) for r in rs],
                  "wall_s": [r["wall_s"] for r in rs], "placed": rs[0]["placed"]}
            for arm, rs in runs.items()}
    first = wide[order[0]]["samples_per_s_median"]
    for arm in order:
        wide[arm]["vs_first"] = round(wide[arm]["samples_per_s_median"] / first, 2) if first else None
    deep: dict[str, Any] = {}
    for layers in depths:
        for precision in ("fp32", "bf16"):
            flags = deep_flags + ["--layers", str(layers), "--device", kind, "--precision", precision,
                            "--threads", cores]
            row = train_once(work, f"deep-{layers}-{precision}", flags)
            row["peak_memory_bytes"] = peak(work / f"deep-{layers}-{precision}")
            deep[f"{layers} blocks {precision}"] = row
    return {"wide": wide, "wide_flags": wide_flags, "deep": deep, "deep_flags": deep_flags}


def peak(out: Path) -> int | None:
    """Rank 0's peak memory from the run's ranks file, where the run recorded it."""
    ranks = out / "ranks.jsonl"
    if not ranks.is_file():
        return None
    for line in ranks.read_text().splitlines():
        row = json.loads(line)
        if "peak_memory_bytes" in row:
            return int(row["peak_memory_bytes"])
    return None


def outcome(out: Path) -> dict[str, Any]:
    """A finished run's every-epoch losses (exact floats), and a digest of its final
    weights: SHA-256 over the checkpoint's model tensors, in key order."""
    import hashlib

    import torch

    from pyhpc.train.loop import CHECKPOINT, load_checkpoint

    digest = hashlib.sha256()
    model = load_checkpoint(out / CHECKPOINT)["model"]
    for key in sorted(model):
        digest.update(key.encode())
        digest.update(model[key].detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
    history = json.loads((out / "history.json").read_text())
    return {"losses": [h["loss"] for h in history], "attempts": [h["attempt"] for h in history],
            "weights_sha256": digest.hexdigest()[:16]}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Bit for bit: the same losses at every epoch and the same final weights."""
    return bool(a["losses"] == b["losses"] and a["weights_sha256"] == b["weights_sha256"])


def kernels(kind: str, work: Path, quick: bool = False) -> dict[str, Any]:
    """The deep model twice with default kernels, twice with deterministic ones, and once
    with deterministic ones stopped after its first epoch and resumed (the second process
    finds the checkpoint in the same run directory). Alternated, so drift in the machine
    falls on both arms."""
    flags = (QUICK_KERNELS if quick else KERNELS) + ["--device", kind, "--precision", "fp32"]
    runs: dict[str, Any] = {}
    for name, chosen in (("default 1", "default"), ("deterministic 1", "deterministic"),
                         ("default 2", "default"), ("deterministic 2", "deterministic")):
        tag = name.replace(" ", "-")
        row = train_once(work, f"kernels-{tag}", flags + ["--kernels", chosen])
        runs[name] = row | outcome(work / f"kernels-{tag}")
    stopped = flags + ["--kernels", "deterministic"]
    epochs = stopped.index("--epochs") + 1
    first = stopped[:epochs] + ["1"] + stopped[epochs + 1:]
    train_once(work, "kernels-resumed", first)
    row = train_once(work, "kernels-resumed", stopped, keep=True)
    runs["deterministic resumed"] = row | outcome(work / "kernels-resumed")
    speed = {k: statistics.median(runs[f"{k} {i}"]["samples_per_s"] for i in (1, 2))
             for k in ("default", "deterministic")}
    return {"flags": flags, "runs": runs,
            "default_repeat_same": same(runs["default 1"], runs["default 2"]),
            "deterministic_repeat_same": same(runs["deterministic 1"], runs["deterministic 2"]),
            "resumed_same_as_straight": same(runs["deterministic 1"], runs["deterministic resumed"]),
            "deterministic_vs_default_samples_per_s": round(
                speed["deterministic"] / speed["default"], 3) if speed["default"] else None}


def gpucheck() -> dict[str, Any]:
    import torch

    from pyhpc.admin import gpucheck as check

    verdict, detail = check.matmul(cuda_expected=torch.cuda.device_count())
    return {"verdict": verdict, "detail": detail}


def nvml() -> dict[str, Any]:
    from pyhpc.monitor.gpus import Nvml

    nv = Nvml()
    samples = nv.samples()
    smi = shutil.which("nvidia-smi")
    query = None
    if smi:
        query = subprocess.run([smi, "--query-gpu=minor_number,utilization.gpu,memory.used,"
                                "memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, check=False).stdout.strip()
    return {"ok": nv.ok, "why": nv.why,
            "samples": None if samples is None else [
                {"minor": s.minor, "name": s.name, "utilization": s.utilization,
                 "memory_used_mib": s.memory_used_bytes // 2**20,
                 "memory_total_mib": s.memory_total_bytes // 2**20} for s in samples],
            "nvidia_smi": query}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="small runs (the rehearsal)")
    parser.add_argument("--commit", default=None, help="the commit measured (no .git there)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, of {', '.join(PARTS)}; the rest are carried")
    parser.add_argument("--out", type=Path, required=True, help="directory for gpu.json")
    args = parser.parse_args()
    chosen = args.parts.split(",")
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        parser.error(f"--parts: {', '.join(unknown)} not allowed; allowed: {', '.join(PARTS)}")
    errors: dict[str, str] = {}
    work = Path(tempfile.mkdtemp(prefix="pyhpc-gpu-"))
    runs: dict[str, Callable[[], Any]] = {
        "facts": gpu_facts,
        "bench": lambda: bench(args.device, work),
        "train": lambda: train(args.device, work, args.reps, args.quick),
        "kernels": lambda: kernels(args.device, work, args.quick),
        "gpucheck": gpucheck,
        "nvml": nvml}
    figures: dict[str, Any] = {"device": args.device}
    for name in PARTS:
        if name in chosen or name == "facts":  # the GPU measured, named in every run
            figures[name] = part(name, runs[name], errors)
    figures["errors"] = errors
    if set(chosen) != set(PARTS):
        previous = record.read("gpu")
        was = (previous.get("figures", {}).get("facts") or {}).get("name")
        figures = record.carried(figures, previous) | {"device": args.device, "errors": errors}
        for name in PARTS:
            if name not in chosen and name != "facts" and isinstance(figures.get(name), dict):
                # A part carried twice keeps the GPU it was measured on.
                figures[name]["measured"] = {"gpu": was} | figures[name]["measured"]
    doc = record.document("gpu", figures)
    doc["commit"] = args.commit or doc["commit"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.json").write_text(json.dumps(record.check(doc, "gpu"), indent=2) + "\n")
    print(json.dumps(figures, indent=1)[-6000:], flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
