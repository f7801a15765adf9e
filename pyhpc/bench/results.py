"""``bench.json`` (schema ``pyhpc.bench/1``): the link row (the fraction of the nominal
PCIe/NVLink peak reached), the document's shape checked, its table and its plot; rank 0
writes all three through :mod:`pyhpc.files`."""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyhpc import files
from pyhpc.bench.config import GIB, KIB, MIB, BenchError
from pyhpc.errors import echo

SCHEMA = "pyhpc.bench/1"
RESULTS = {"json": "bench.json", "table": "bench.txt", "png": "bench.png"}
#: GB/s per lane and direction after line coding (PCIe 1-2: 8b/10b, 3-5: 128b/130b,
#: 6: FLIT), so Gen4 x16 is 31.5 GB/s each way.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


# -- the link row: the fraction of the nominal PCIe/NVLink peak reached -----------------


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


# -- the document's shape, its table and plot ----------------------------------------------


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


#: Largest bench.json read back (one run's is tens of KiB).
RESULTS_LIMIT = 64 << 20


def read_results(path: Path) -> dict[str, Any]:
    """A ``bench.json`` read back and checked."""
    fh, why = files.try_open_regular(path)  # a planted FIFO never hangs the reader
    if fh is None:
        raise BenchError(f"results: cannot read {path} ({why})", "results")
    try:
        with fh:
            data = fh.read(RESULTS_LIMIT + 1)
        if len(data) > RESULTS_LIMIT:
            raise ValueError("too large")
        doc = json.loads(data)
    except (OSError, ValueError) as exc:
        raise BenchError(f"results: cannot read {path} ({type(exc).__name__})",
                         "results") from None
    return check_document(doc)


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
