"""``pyhpc bench``: node and interconnect micro-benchmarks, run as one Slurm job.

On the nodes the job gets, every task measures (see :mod:`pyhpc.bench_job`):

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
directory, through :mod:`pyhpc.files`. This module is what the CLI needs — the checked
options, the submission, the formulas, the table and the plot — and imports neither
torch nor matplotlib (the plot imports matplotlib when it draws).
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pyhpc import device, files, validate, watch
from pyhpc._submit import cluster_or_default
from pyhpc.cluster import Cluster
from pyhpc.errors import PyhpcError, echo
from pyhpc.jobspec import JobSpec
from pyhpc.sweep import Resources, submit_task
from pyhpc.trainconfig import check_out

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
SCHEMA = "pyhpc.bench/1"
RESULTS = {"json": "bench.json", "table": "bench.txt", "png": "bench.png"}
#: GB/s per lane and direction after line coding (PCIe 1-2: 8b/10b, 3-5: 128b/130b,
#: 6: FLIT), so Gen4 x16 is 31.5 GB/s each way.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
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


def pcie_peak(gen: int | None, width: int | None) -> float | None:
    """Nominal PCIe bandwidth per direction in GB/s, or ``None`` when not known."""
    if gen is None or width is None or gen not in PCIE_LANE_GBPS or width < 1:
        return None
    return round(PCIE_LANE_GBPS[gen] * width, 3)


def _field(section: str, name: str) -> int | None:
    match = re.search(rf"^\s*{name}\s*:\s*([0-9]+)x?\s*$", section, re.MULTILINE)
    return int(match.group(1)) if match else None


def parse_pcie(text: str) -> tuple[int | None, int | None]:
    """PCIe generation and width from ``nvidia-smi -q``: the lower of the GPU's and the
    host's maximum generation (the link idles at a lower one), the current width."""
    gen_part = re.search(r"PCIe Generation\s*\n((?:\s+.*:.*\n?)+)", text)
    width_part = re.search(r"Link Width\s*\n((?:\s+.*:.*\n?)+)", text)
    gen = width = None
    if gen_part:
        maxima = [g for g in (_field(gen_part.group(1), "Max"),
                              _field(gen_part.group(1), "Host Max")) if g is not None]
        gen = min(maxima) if maxima else None
    if width_part:
        width = _field(width_part.group(1), "Current") or _field(width_part.group(1), "Max")
    return gen, width


def parse_nvlink(text: str) -> float | None:
    """Total NVLink bandwidth per direction in GB/s from ``nvidia-smi nvlink -s`` (the sum
    of the active links); ``None`` without any."""
    speeds = [float(s) for s in re.findall(r"Link\s+[0-9]+:\s*([0-9.]+)\s*GB/s", text)]
    return round(sum(speeds), 3) if speeds else None


def link_row(rank: int, host: str, on_gpu: bool, query: str | None, nvlink: str | None,
             copies: Sequence[Mapping[str, Any]] | None,
             groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One rank's nominal link speeds (from ``nvidia-smi -q`` and ``nvidia-smi nvlink -s``
    output, ``None`` where it did not answer) and the fraction of them reached: the best
    pinned host->device copy against PCIe, the best intra-node all-reduce busbw against
    NVLink (PCIe without it). On the CPU: unknown, and why."""
    row: dict[str, Any] = {"rank": rank, "host": host, "known": False,
                           "reason": "no GPU: the CPU path has no host-device link",
                           "pcie_gen": None, "pcie_width": None, "pcie_peak_GBps": None,
                           "nvlink_GBps": None, "copy_fraction": None,
                           "allreduce_fraction": None}
    if not on_gpu:
        return row
    gen, width = parse_pcie(query or "")
    peak, links = pcie_peak(gen, width), parse_nvlink(nvlink or "")
    row.update(pcie_gen=gen, pcie_width=width, pcie_peak_GBps=peak, nvlink_GBps=links,
               known=peak is not None or links is not None,
               reason="nvidia-smi" if query else "nvidia-smi did not answer")
    pinned = [r["GBps"] for r in copies or []
              if (r["direction"], r["memory"]) == ("h2d", "pinned")]
    if peak and pinned:
        row["copy_fraction"] = max(pinned) / peak
    intra = [r["busbw_GBps"] for g in groups if g["scope"] != "inter-node" for r in g["rows"]]
    nominal = links or peak
    if intra and nominal:
        row["allreduce_fraction"] = max(intra) / nominal
    return row


# -- the job's options and its submission ------------------------------------------------


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


def resources(res: Resources, gpus: bool, cluster: Cluster) -> Resources:
    """GPU tests without ``--gpus-per-node``: every GPU of the partition's nodes (at least
    one, so a partition without GPUs is refused by :func:`pyhpc.jobspec.check`)."""
    if not gpus or res.gpus_per_node:
        return res
    name = res.partition or cluster.default_partition.name
    try:
        have = cluster.partition_gpus(name)
    except PyhpcError:  # an unknown partition: jobspec.check says so, in its words
        have = 0
    return replace(res, gpus_per_node=max(1, have))


def check(cfg: BenchConfig, res: Resources, cluster: Cluster) -> JobSpec:
    """The benchmark job's spec, checked against the cluster; ``device=cuda`` (``--gpus``)
    on a partition without GPUs is a one-line :class:`~pyhpc.jobspec.JobSpecError`."""
    res = resources(res, cfg.device == "cuda", cluster)
    spec = res.spec("bench", cluster)
    check_out(cfg.out)
    return spec


def submit_bench(cfg: BenchConfig, res: Resources, cluster: Cluster | None = None) -> Any:
    """Submit the benchmark job (a submitit job of :class:`pyhpc.bench_job.BenchTask`)."""
    the_cluster = cluster_or_default(cluster)
    spec = check(cfg, res, the_cluster)
    from pyhpc.bench_job import BenchTask  # torch: only once the job is known to be good

    return submit_task(BenchTask(cfg), spec, res.folder, the_cluster)


def run(cfg: BenchConfig, res: Resources, cluster: Cluster | None = None, wait: bool = False,
        timeout_s: float | None = None) -> dict[str, Any]:
    """``pyhpc bench``: submit; with ``wait``, wait for the job and read its results back.

    Returns ``job_id`` and ``out``; after a wait also ``state`` and, when it completed,
    the paths of ``bench.json``/``.txt``/``.png`` and the ``table``.
    """
    job = submit_bench(cfg, res, cluster)
    result: dict[str, Any] = {"job_id": str(job.job_id), "out": cfg.out}
    if not wait:
        return result
    result["state"] = watch.watch([result["job_id"]], interval_s=1.0, timeout_s=timeout_s,
                                  fail_on_timeout=True)[result["job_id"]]
    if result["state"] == "COMPLETED":
        out = Path(cfg.out)
        doc = read_results(out / RESULTS["json"])
        result.update({k: str(out / name) for k, name in RESULTS.items()}, table=table(doc))
    return result


# -- results: shape, table, plot ------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """The keys (and their types) a part of ``bench.json`` must have."""

    keys: Mapping[str, type | tuple[type, ...]] = field(default_factory=dict)


NUMBER = (int, float)
OPTIONAL_NUMBER = (int, float, type(None))
TOP = Shape({"schema": str, "job_id": str, "torch_version": str, "device": str,
             "backend": str, "nodes": list, "world_size": int, "units": dict,
             "tests": list, "copy": (dict, type(None)), "allreduce": (dict, type(None)),
             "matmul": (dict, type(None)), "link": dict})
COPY_ROW = Shape({"bytes": int, "direction": str, "memory": str, "seconds": NUMBER,
                  "GBps": NUMBER})
ALLREDUCE_ROW = Shape({"bytes": int, "iterations": int, "seconds": NUMBER,
                       "algbw_GBps": NUMBER, "busbw_GBps": NUMBER})
MATMUL_ROW = Shape({"dtype": str, "n": int, "seconds": NUMBER, "tflops": NUMBER})
LINK_ROW = Shape({"rank": int, "host": str, "known": bool, "reason": str,
                  "pcie_gen": (int, type(None)), "pcie_width": (int, type(None)),
                  "pcie_peak_GBps": OPTIONAL_NUMBER, "nvlink_GBps": OPTIONAL_NUMBER,
                  "copy_fraction": OPTIONAL_NUMBER, "allreduce_fraction": OPTIONAL_NUMBER})


def _keep(shape: Shape, value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BenchError(f"results: {where} is not an object", "results")
    for key, kind in shape.keys.items():
        if key not in value or not isinstance(value[key], kind) or (
                isinstance(value[key], bool) and kind is not bool):
            raise BenchError(f"results: {where}.{key} is missing or of the wrong type",
                             "results")
    return value


def check_document(doc: object) -> dict[str, Any]:
    """``doc`` if it has the shape of ``bench.json`` (schema ``pyhpc.bench/1``), else a
    :class:`BenchError` naming the first part that does not."""
    top = _keep(TOP, doc, "bench")
    if top["schema"] != SCHEMA:
        raise BenchError(f"results: schema {echo(top['schema'])} is not {SCHEMA}", "results")
    for i, rank in enumerate((top["copy"] or {}).get("ranks", [])):
        for j, row in enumerate(_keep(Shape({"rank": int, "host": str, "rows": list}), rank,
                                      f"copy.ranks[{i}]")["rows"]):
            _keep(COPY_ROW, row, f"copy.ranks[{i}].rows[{j}]")
    for i, group in enumerate((top["allreduce"] or {}).get("groups", [])):
        _keep(Shape({"scope": str, "nodes": list, "ranks": int, "rows": list}), group,
              f"allreduce.groups[{i}]")
        for j, row in enumerate(group["rows"]):
            _keep(ALLREDUCE_ROW, row, f"allreduce.groups[{i}].rows[{j}]")
    for i, rank in enumerate((top["matmul"] or {}).get("ranks", [])):
        for j, row in enumerate(_keep(Shape({"rank": int, "host": str, "rows": list}), rank,
                                      f"matmul.ranks[{i}]")["rows"]):
            _keep(MATMUL_ROW, row, f"matmul.ranks[{i}].rows[{j}]")
    for i, row in enumerate(_keep(Shape({"ranks": list}), top["link"], "link")["ranks"]):
        _keep(LINK_ROW, row, f"link.ranks[{i}]")
    return top


def read_results(path: Path) -> dict[str, Any]:
    """A ``bench.json`` read back and checked: every number finite, normal and bounded
    (:func:`pyhpc.validate.read_json`), every part of its shape."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise BenchError(f"results: cannot read {path} ({exc.strerror})", "results") from None
    return check_document(validate.read_json(f"results: {path}", text, BenchError))


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _grid(title: str, head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [title, "  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return lines + [""]


def _fmt(value: float | None, spec: str | None = None) -> str:
    """A figure: 2 decimals from 1 up, 3 significant digits below (0.00412 GB/s)."""
    if value is None or math.isnan(value):
        return "-"
    if spec is None:
        spec = "{:.2f}" if abs(value) >= 1 or value == 0 else "{:.3g}"
    return spec.format(value)


def copy_series(doc: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    """``direction memory`` -> size -> GB/s of the slowest rank."""
    series: dict[str, dict[int, float]] = {}
    for rank in (doc.get("copy") or {}).get("ranks", []):
        for row in rank["rows"]:
            line = series.setdefault(f"{row['direction']} {row['memory']}", {})
            line[row["bytes"]] = min(line.get(row["bytes"], math.inf), row["GBps"])
    return series


def allreduce_series(doc: Mapping[str, Any]) -> dict[str, dict[int, float]]:
    """``scope`` -> size -> busbw GB/s (the slowest group of that scope)."""
    series: dict[str, dict[int, float]] = {}
    for group in (doc.get("allreduce") or {}).get("groups", []):
        label = f"{group['scope']} ({group['ranks']} ranks)"
        line = series.setdefault(label, {})
        for row in group["rows"]:
            line[row["bytes"]] = min(line.get(row["bytes"], math.inf), row["busbw_GBps"])
    return series


def matmul_best(doc: Mapping[str, Any]) -> dict[str, float]:
    """dtype -> TFLOP/s of the slowest rank."""
    best: dict[str, float] = {}
    for rank in (doc.get("matmul") or {}).get("ranks", []):
        for row in rank["rows"]:
            best[row["dtype"]] = min(best.get(row["dtype"], math.inf), row["tflops"])
    return best


def table(doc: Mapping[str, Any]) -> str:
    """The results as text: one grid per test, slowest rank (or group) per figure."""
    lines = [f"pyhpc bench: job {doc['job_id']}, {len(doc['nodes'])} node(s) "
             f"({', '.join(doc['nodes'])}), {doc['world_size']} rank(s), device "
             f"{doc['device']}, backend {doc['backend']}, torch {doc['torch_version']}",
             "GB/s = 10^9 bytes/s; each figure is the slowest rank's (or node's)", ""]
    copy = doc.get("copy")
    if copy:
        series = copy_series(doc)
        ladder = sorted({b for line in series.values() for b in line})
        lines += _grid(f"Copy bandwidth (GB/s): {copy['what']}", ["size", *series],
                       [[size_label(b), *(_fmt(s.get(b)) for s in series.values())]
                        for b in ladder])
    reduce = doc.get("allreduce")
    if reduce:
        series = allreduce_series(doc)
        ladder = sorted({b for line in series.values() for b in line})
        title = f"All-reduce bus bandwidth (GB/s, {reduce['backend']}), busbw = algbw x 2(n-1)/n"
        if series:
            lines += _grid(title, ["size", *series],
                           [[size_label(b), *(_fmt(s.get(b)) for s in series.values())]
                            for b in ladder])
        else:
            lines.append(f"{title}: no group of two or more ranks")
        lines += [f"  {note}" for note in reduce.get("skipped", [])]
        if reduce.get("skipped") or not series:
            lines.append("")
    if doc.get("matmul"):
        best = matmul_best(doc)
        lines += _grid(f"Matmul (n = {doc['matmul']['n']}), TFLOP/s", list(best),
                       [[_fmt(v) for v in best.values()]])
    links = doc["link"]["ranks"]
    known = [r for r in links if r["known"]]
    if not known:
        reason = links[0]["reason"] if links else "no ranks reported"
        lines.append(f"Fraction of nominal link peak: unknown ({reason})")
    else:
        lines += _grid("Fraction of nominal link peak", [
            "rank", "host", "PCIe", "peak GB/s", "NVLink GB/s", "copy", "all-reduce"],
            [[str(r["rank"]), r["host"], f"Gen{r['pcie_gen']} x{r['pcie_width']}"
              if r["pcie_gen"] else "-", _fmt(r["pcie_peak_GBps"]), _fmt(r["nvlink_GBps"]),
              _fmt(r["copy_fraction"], "{:.0%}"), _fmt(r["allreduce_fraction"], "{:.0%}")]
             for r in links])
    return "\n".join(lines).rstrip() + "\n"


def plot(doc: Mapping[str, Any], path: Path) -> Path:
    """Three panels — copy GB/s and all-reduce busbw against size, matmul TFLOP/s — written
    through a private temp file renamed over ``path`` (never through a link)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (ax_copy, ax_reduce, ax_mm) = plt.subplots(1, 3, figsize=(15, 4))
    for ax, series, title in ((ax_copy, copy_series(doc), "Copy bandwidth"),
                              (ax_reduce, allreduce_series(doc), "All-reduce bus bandwidth")):
        for label, line in sorted(series.items()):
            ladder = sorted(line)
            ax.plot(ladder, [line[b] for b in ladder], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: size_label(int(x))))
        ax.set(xlabel="bytes", ylabel="GB/s", title=title)
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
    best = matmul_best(doc)
    ax_mm.bar(list(best), list(best.values()), color=["tab:blue", "tab:orange"][:len(best)])
    ax_mm.set(ylabel="TFLOP/s", title=f"Matmul ({doc['device']})")
    fig.suptitle(f"pyhpc bench: job {doc['job_id']}, {len(doc['nodes'])} node(s), "
                 f"{doc['world_size']} rank(s), {doc['device']}/{doc['backend']}")
    fig.tight_layout()
    try:
        files.write_with(path, lambda fh: fig.savefig(fh, format="png", dpi=100,
                                                      metadata={"Software": None}), arg="out")
    finally:
        plt.close(fig)
    return path


def write_results(out: Path, doc: Mapping[str, Any]) -> dict[str, Path]:
    """``bench.json``, ``bench.txt`` and ``bench.png`` in ``out`` (created private)."""
    check_document(dict(doc))
    files.make_dir(out)
    paths = {k: out / name for k, name in RESULTS.items()}
    files.write_text(paths["json"], json.dumps(doc, indent=1, sort_keys=True) + "\n")
    files.write_text(paths["table"], table(doc))
    plot(doc, paths["png"])
    return paths
