"""The pipeline report: throughput against stages x nodes, and the bubble against
micro-batches (``pipeline.png``, beside the scaling plot, when any run was pipelined)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pyhpc import plots
from pyhpc.train import metrics

PNG_NAME = "pipeline.png"


def _number(run: metrics.Summary, key: str) -> float | None:
    value = run.extra.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def bubble(run: metrics.Summary) -> float | None:
    """The measured bubble of a pipelined run: the mean over its stages."""
    values = run.extra.get("stage_bubble")
    if not isinstance(values, list):
        return None
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(numbers) / len(numbers) if numbers else None


def nodes(run: metrics.Summary) -> int:
    return len(run.nodes.split(","))


def plot(runs: Sequence[metrics.Summary], path: Path) -> Path:
    """Left: samples/s against nodes, one line per stage count of each deep model. Right:
    the measured bubble against micro-batches, one line per schedule and stage count, with
    (P - 1) / (M + P - 1) for equal stages dotted."""
    deep = [r for r in runs if r.model.startswith("DeepResNet")]
    fig, (ax_rate, ax_bubble) = plots.figure(2)
    lines: dict[str, list[metrics.Summary]] = {}
    for run in deep:
        lines.setdefault(f"{run.model}, {metrics.stages(run)} stages", []).append(run)
    for label, series in sorted(lines.items()):
        series.sort(key=nodes)
        ax_rate.plot([nodes(r) for r in series], [r.samples_per_s for r in series], marker="o",
                     label=label)
    ax_rate.set(xlabel="nodes", ylabel="samples/s", title="Throughput by stages x nodes")
    ax_rate.set_ylim(bottom=0)
    curves: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for run in deep:
        micro, measured = _number(run, "microbatches"), bubble(run)
        if metrics.stages(run) > 1 and micro is not None and measured is not None:
            key = (str(run.extra.get("schedule", "?")), metrics.stages(run))
            curves.setdefault(key, []).append((micro, measured))
    for (schedule, stages), points in sorted(curves.items()):
        points.sort()
        (line,) = ax_bubble.plot([m for m, _ in points], [b for _, b in points], marker="o",
                                 label=f"{schedule}, {stages} stages")
        ax_bubble.plot([m for m, _ in points], [(stages - 1) / (m + stages - 1) for m, _ in points],
                       linestyle=":", color=line.get_color(), label=f"{stages} equal stages")
    ax_bubble.set(xlabel="micro-batches", ylabel="bubble (share of a step waiting)",
                  title="Pipeline bubble", ylim=(0, 1))
    return plots.save(fig, path)
