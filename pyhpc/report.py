"""Scaling reports: a table and a PNG of throughput and efficiency against workers."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pyhpc import metrics

COLUMNS = (("mode", "mode", "{}"), ("workers", "workers", "{}"),
           ("local_batch", "batch/worker", "{}"), ("global_batch", "global batch", "{}"),
           ("samples_per_s", "samples/s", "{:.1f}"),
           ("samples_per_s_per_worker", "samples/s/worker", "{:.1f}"),
           ("step_time_p50", "p50 step (ms)", "{:.2f}"), ("step_time_p90", "p90 step (ms)", "{:.2f}"),
           ("efficiency", "efficiency", "{:.0%}"), ("job_id", "job", "{}"))


def collect(dirs: Sequence[Path]) -> list[metrics.Summary]:
    """The last summary of every metrics.jsonl under ``dirs`` (one per training run)."""
    found: list[metrics.Summary] = []
    for top in dirs:
        files = [top] if top.is_file() else sorted(top.rglob("metrics.jsonl"))
        for path in files:
            runs = metrics.read_jsonl(path)
            if runs:
                found.append(runs[-1])
    if not found:
        raise metrics.MetricsError(f"no metrics.jsonl under {', '.join(map(str, dirs))}")
    return found


def _cell(summary: metrics.Summary, key: str, fmt: str) -> str:
    value = getattr(summary, key)
    if value is None:
        return "-"
    if key.startswith("step_time"):
        value *= 1000
    return fmt.format(value)


def table(summaries: Sequence[metrics.Summary]) -> str:
    """A fixed-width text table, one row per run."""
    rows = [[title for _, title, _ in COLUMNS]]
    rows += [[_cell(s, key, fmt) for key, _, fmt in COLUMNS] for s in summaries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(summaries: Sequence[metrics.Summary], path: Path) -> Path:
    """Two panels: samples/s and scaling efficiency against workers, a line per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_rate, ax_eff) = plt.subplots(1, 2, figsize=(10, 4))
    scaling = summaries[0].scaling or "weak"
    series: dict[str, list[metrics.Summary]] = {}
    for s in summaries:
        batch = s.local_batch if scaling == "weak" else s.global_batch
        label = f"{s.mode}, {'batch/worker' if scaling == 'weak' else 'global batch'} {batch}"
        series.setdefault(label, []).append(s)
    for label, runs in sorted(series.items()):
        runs = sorted(runs, key=lambda r: r.workers)
        workers = [r.workers for r in runs]
        ax_rate.plot(workers, [r.samples_per_s for r in runs], marker="o", label=label)
        ax_eff.plot(workers, [r.efficiency or 0 for r in runs], marker="o", label=label)
    ax_rate.set(xlabel="workers", ylabel="samples/s", title="Throughput")
    ax_eff.set(xlabel="workers", ylabel="efficiency", title=f"{scaling.capitalize()} scaling "
               "efficiency", ylim=(0, 1.2))
    ax_eff.axhline(1.0, color="grey", linestyle=":")
    for ax in (ax_rate, ax_eff):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path
