"""Scaling reports: a table and a PNG of throughput and efficiency against workers.

:func:`write_report` is the whole command: collect the runs, compute their efficiency,
plot them and say where the plot went.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyhpc import files, plots, validate
from pyhpc.errors import PyhpcError, echo
from pyhpc.train import metrics

#: The plot's name when only a directory is given (or nothing).
PNG_NAME = "scaling.png"
#: The time-to-train plot, written beside the scaling plot.
TIME_TO_TRAIN_PNG = "time-to-train.png"
#: Largest history.json read back for a summary (it holds one small record per epoch).
HISTORY_LIMIT = 4 * 2**20

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


def _series(summaries: Sequence[metrics.Summary], weak: bool) -> dict[str, list[metrics.Summary]]:
    """Runs by series (mode and batch: per worker for weak scaling, global for strong),
    each sorted by workers."""
    series: dict[str, list[metrics.Summary]] = {}
    for s in summaries:
        batch = s.local_batch if weak else s.global_batch
        label = f"{s.mode}, {'batch/worker' if weak else 'global batch'} {batch}"
        if s.model.startswith("DeepResNet"):
            label = f"{s.model} ({metrics.stages(s)} stages), {label.split(', ', 1)[1]}"
        series.setdefault(label, []).append(s)
    return {k: sorted(v, key=lambda r: r.workers) for k, v in sorted(series.items())}


def plot(summaries: Sequence[metrics.Summary], path: Path) -> Path:
    """Two panels: samples/s (from 0, with each series' ideal scaling: its smallest run's
    rate per worker times the workers) and scaling efficiency against workers."""
    fig, (ax_rate, ax_eff) = plots.figure(2)
    scaling = summaries[0].scaling or "weak"
    for label, runs in _series(summaries, scaling == "weak").items():
        workers = [r.workers for r in runs]
        (line,) = ax_rate.plot(workers, [r.samples_per_s for r in runs], marker="o", label=label)
        if len(runs) > 1:
            per_worker = runs[0].samples_per_s / runs[0].workers
            ax_rate.plot(workers, [per_worker * w for w in workers], linestyle="--",
                         color=line.get_color(), alpha=0.6, label=f"{label}: ideal")
        ax_eff.plot(workers, [r.efficiency or 0 for r in runs], marker="o", label=label)
    ax_rate.set(xlabel="workers", ylabel="samples/s", title="Throughput")
    ax_rate.set_ylim(bottom=0)
    ax_eff.set(xlabel="workers", ylabel="efficiency", title=f"{scaling.capitalize()} scaling "
               "efficiency", ylim=(0, 1.2))
    ax_eff.axhline(1.0, color="grey", linestyle=":")
    return plots.save(fig, path)


def time_to_train(run: metrics.Summary, epochs: int) -> float:
    """Seconds to train ``epochs`` epochs at the run's measured throughput."""
    per_epoch = run.extra.get("samples_per_epoch")
    if not isinstance(per_epoch, int) or per_epoch <= 0:
        raise metrics.MetricsError(f"time_to_train: run {run.job_id} has no samples_per_epoch "
                                   "(runs record it since pyhpc 0.1.0); train it again",
                                   "time_to_train")
    return epochs * per_epoch / run.samples_per_s


def plot_time_to_train(summaries: Sequence[metrics.Summary], epochs: int, path: Path) -> Path:
    """The university cluster study's graph: time to train ``epochs`` epochs against
    workers (GPUs), one line per batch size per worker."""
    fig, (ax,) = plots.figure(1)
    for label, runs in _series(summaries, weak=True).items():
        ax.plot([r.workers for r in runs], [time_to_train(r, epochs) / 60 for r in runs],
                marker="o", label=label)
    ax.set(xlabel="workers (GPUs)", ylabel="minutes", title=f"Time to train {epochs} epochs")
    ax.set_ylim(bottom=0)
    return plots.save(fig, path)


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
                 epochs_to_train: int | None = None) -> tuple[list[metrics.Summary], list[Path]]:
    """Collect the runs under ``dirs``, compute their ``scaling`` efficiency, plot them.

    Returns the runs (sorted as :func:`metrics.efficiency` sorts them) and the PNG paths
    actually written (see :func:`png_path`), through a temp file and ``os.replace``; with
    ``epochs_to_train`` also ``time-to-train.png`` beside the scaling plot.
    Everything is read and checked before anything is written: a bad ``scaling``, a bad
    metrics file (:class:`~pyhpc.train.metrics.MetricsError` naming file:line) or a bad ``png``
    (:class:`~pyhpc.files.FileError`: also a directory others can write, see
    :func:`pyhpc.files.safe_dir`) leaves no file and no directory behind.
    """
    if scaling not in metrics.SCALING:
        raise metrics.MetricsError(f"scaling: {scaling!r} is not allowed; allowed: "
                                   f"{', '.join(metrics.SCALING)}", "scaling")
    target = png_path(dirs, png)
    # The plot's directory passes the one check (a link to one counts as where it points).
    parent = target.parent
    files.safe_dir(os.path.realpath(parent) if parent.is_symlink() else parent, "png")
    runs = metrics.efficiency(collect(dirs), scaling)
    if epochs_to_train is not None:
        for run in runs:  # every run must have what the plot needs, before any is written
            time_to_train(run, epochs_to_train)
    written = [plot(runs, target)]
    if epochs_to_train is not None:
        written.append(plot_time_to_train(runs, epochs_to_train, target.parent / TIME_TO_TRAIN_PNG))
    if any(metrics.stages(r) > 1 for r in runs):
        from pyhpc.train import stageplot

        written.append(stageplot.plot(runs, target.parent / stageplot.PNG_NAME))
    return runs, written


def _history(out: Path) -> list[dict[str, Any]]:
    """history.json of a run (one record per epoch); [] when it is missing or unreadable,
    or holds a number that is not finite and bounded (:func:`pyhpc.validate.read_json`)."""
    fh, _ = files.try_open_regular(out / "history.json")  # never blocks on a FIFO
    if fh is None:
        return []
    try:
        with fh:
            data = validate.read_json("history", fh.read(HISTORY_LIMIT + 1)[:HISTORY_LIMIT])
    except (OSError, PyhpcError):
        return []
    return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []


def run_summary(out: Path) -> dict[str, Any]:
    """What a researcher wants after a training run, from its directory: final accuracy
    and loss, throughput, step times, and where the files are."""
    present = os.path.lexists(out / "metrics.jsonl")
    runs = metrics.read_jsonl(out / "metrics.jsonl") if present else []
    history = _history(out)
    last = history[-1] if history else {}
    # A pipelined run commits each epoch in pipeline.json (its stages' files beside it).
    pipelined = os.path.lexists(out / "pipeline.json")
    summary: dict[str, Any] = {
        "epochs": len(history), "test_accuracy": last.get("test_accuracy"), "loss": last.get("loss"),
        "metrics": str(out / "metrics.jsonl"),
        "checkpoint": str(out / ("pipeline.json" if pipelined else "checkpoint.pt"))}
    if runs:
        run = runs[-1]
        summary.update(workers=run.workers, nodes=run.nodes, samples_per_s=run.samples_per_s,
                       step_time_p50_ms=run.step_time_p50 * 1000,
                       step_time_p90_ms=run.step_time_p90 * 1000)
        summary.update({key: run.extra[key] for key in PIPELINE_FIGURES if key in run.extra})
    return summary


#: A pipelined run's own figures (pyhpc.train.pipeline), shown after the others.
PIPELINE_FIGURES = ("pipeline", "replicas", "layers", "microbatches", "schedule",
                    "stage_peak_memory_bytes", "stage_bubble", "bubble_theory")


def _pipeline_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    if "pipeline" not in summary:
        return []
    memory = ", ".join("-" if b is None else f"{b / 2**20:.0f} MiB"
                       for b in summary.get("stage_peak_memory_bytes", []))
    bubble = ", ".join("-" if b is None else f"{b:.2f}" for b in summary.get("stage_bubble", []))
    return [("pipeline", f"{summary['pipeline']} stages x {summary.get('replicas', '-')} replicas, "
                         f"{summary.get('layers', '-')} blocks, {summary.get('microbatches', '-')} "
                         f"micro-batches ({summary.get('schedule', '-')})"),
            ("stage memory", f"{memory} (peak, per stage)"),
            ("bubble", f"{bubble} (per stage; equal stages: {summary.get('bubble_theory', '-')})")]


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def missing_results(out: Path, summary: dict[str, Any]) -> str | None:
    """Why a run that Slurm calls COMPLETED has nothing to show, or None when it has: no
    epoch trained, or no metrics record or checkpoint (a regular file; a pipelined run's
    is its commit record) in its directory."""
    lacking = [*([] if summary["epochs"] else ["0 epochs trained"]),
               *(f"no {Path(path).name}" for path in (summary["metrics"], summary["checkpoint"])
                 if not _regular(Path(path)))]
    if "samples_per_s" not in summary and _regular(out / "metrics.jsonl"):
        lacking.append("no metrics record")
    if lacking:
        return (f"out: the job ended COMPLETED but left no results in {out} "
                f"({', '.join(lacking)})")
    return None


def summary_text(summary: dict[str, Any]) -> str:
    """:func:`run_summary` as a few aligned lines."""
    def num(key: str, fmt: str) -> str:
        value = summary.get(key)  # history.json is the run's: a number, or shown as unknown
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return fmt.format(value) if is_number else "-"

    rows = [("test accuracy", f"{num('test_accuracy', '{:.3f}')} after {summary['epochs']} epochs"),
            ("loss", num("loss", "{:.4f}")),
            ("throughput", f"{num('samples_per_s', '{:.1f}')} samples/s on "
                           f"{summary.get('workers', '-')} workers ({summary.get('nodes', '-')})"),
            ("step time", f"p50 {num('step_time_p50_ms', '{:.2f}')} ms, "
                          f"p90 {num('step_time_p90_ms', '{:.2f}')} ms"),
            *_pipeline_rows(summary),
            ("metrics", summary["metrics"]), ("checkpoint", summary["checkpoint"])]
    return "\n".join(f"  {name:<14} {value}" for name, value in rows)
