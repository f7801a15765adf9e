"""Scaling reports: a table and a PNG of throughput and efficiency against workers.

:func:`write_report` is the whole command: collect the runs, compute their efficiency,
plot them and say where the plot went.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pyhpc import files, metrics
from pyhpc.errors import echo

#: The plot's name when only a directory is given (or nothing).
PNG_NAME = "scaling.png"

COLUMNS = (("mode", "mode", "{}"), ("workers", "workers", "{}"),
           ("local_batch", "batch/worker", "{}"), ("global_batch", "global batch", "{}"),
           ("samples_per_s", "samples/s", "{:.1f}"),
           ("samples_per_s_per_worker", "samples/s/worker", "{:.1f}"),
           ("step_time_p50", "p50 step (ms)", "{:.2f}"),
           ("step_time_p90", "p90 step (ms)", "{:.2f}"),
           ("efficiency", "efficiency", "{:.0%}"), ("job_id", "job", "{}"))


def collect(dirs: Sequence[Path]) -> list[metrics.Summary]:
    """The last summary of every metrics.jsonl under ``dirs`` (one per training run)."""
    found: list[metrics.Summary] = []
    for top in dirs:
        paths = [top] if top.is_file() else sorted(top.rglob("metrics.jsonl"))
        for path in paths:
            runs = metrics.read_jsonl(path)
            if runs:
                found.append(runs[-1])
    if not found:
        raise metrics.MetricsError(f"dirs: no metrics.jsonl under {', '.join(map(str, dirs))}",
                                   "dirs")
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
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(summaries: Sequence[metrics.Summary], path: Path) -> Path:
    """Two panels: samples/s and scaling efficiency against workers, a line per series.

    Written to a temp file renamed over ``path`` (never through a link); a missing parent
    directory is created, one that cannot be is a one-line :class:`~pyhpc.files.FileError`.
    """
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
    try:
        if not path.parent.is_dir():  # an existing one (or a link to one) is used as it is
            files.make_dir(path.parent, arg="png")
        files.write_with(path, lambda fh: fig.savefig(fh, format="png", dpi=100,
                                                      metadata={"Software": None}), arg="png")
    finally:
        plt.close(fig)
    return path


def png_path(dirs: Sequence[Path], png: Path | None) -> Path:
    """Where :func:`write_report` writes the plot; checks the name, creates nothing.

    ``None``: ``scaling.png`` in the deepest directory common to ``dirs`` (a metrics file
    given counts as its directory); an existing directory: ``DIR/scaling.png``; anything
    else must end in ``.png``.
    """
    if png is None:
        if not dirs:
            raise metrics.MetricsError("dirs: name at least one run directory", "dirs")
        tops = [os.path.abspath(d if Path(d).is_dir() else Path(d).parent) for d in dirs]
        return Path(os.path.commonpath(tops)) / PNG_NAME
    if png.is_dir():
        return png / PNG_NAME
    if png.suffix.lower() != ".png":
        raise files.FileError(f"png: must end in .png, got {echo(str(png))}", "png")
    return png


def write_report(dirs: Sequence[Path], scaling: str, png: Path | None,
                 ) -> tuple[list[metrics.Summary], Path]:
    """Collect the runs under ``dirs``, compute their ``scaling`` efficiency, plot them.

    Returns the runs (sorted as :func:`metrics.efficiency` sorts them) and the PNG path
    actually written (see :func:`png_path`), through a temp file and ``os.replace``.
    Everything is read and checked before anything is written: a bad ``scaling``, a bad
    metrics file (:class:`~pyhpc.metrics.MetricsError` naming file:line) or a bad ``png``
    (:class:`~pyhpc.files.FileError`) leaves no file and no directory behind.
    """
    if scaling not in metrics.SCALING:
        raise metrics.MetricsError(f"scaling: {scaling!r} is not allowed; allowed: "
                                   f"{', '.join(metrics.SCALING)}", "scaling")
    target = png_path(dirs, png)
    runs = metrics.efficiency(collect(dirs), scaling)
    return runs, plot(runs, target)
