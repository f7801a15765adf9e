"""``pyhpc report --cluster [--since 24h] --html DIR``: the cluster over a window, from
Prometheus' range queries, as one page with its plots: how busy the nodes were, jobs by
state, GPU-hours per account, and the jobs that used least of what they held.

Every figure is one the exporters sampled (:mod:`pyhpc.monitor.slurm_exporter`,
:mod:`pyhpc.monitor.job_exporter`, node_exporter); one Prometheus has nothing of is left out
or said to be missing, never guessed. The page and its PNGs are written privately, never
through a link (:mod:`pyhpc.files`); it names no time but the window's, so the same answers
give the same bytes.
"""
from __future__ import annotations

import html
import math
import re
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyhpc import files, plots
from pyhpc.errors import PyhpcError, echo
from pyhpc.monitor import prometheus

SINCE = re.compile(r"([1-9][0-9]{0,4})(m|h|d)")
UNIT_S = {"m": 60, "h": 3600, "d": 86400}
#: --since from 10 minutes to 31 days.
SINCE_S = (600, 31 * 86400)
#: Points per series: enough for a plot, far below Prometheus' 11,000.
POINTS = 240
#: Rows of the least-used table.
LEAST = 10
PAGE = "index.html"
PNG = {"utilization": "utilization.png", "jobs": "jobs.png", "gpu_hours": "gpu-hours.png",
       "least": "least-used.png"}
#: What each part of the page asks Prometheus ({rate}: the window a rate is taken over;
#: {step}: one step, so a job shorter than a step still counts). A state with no node or
#: job has no series; the ``*_ok`` answers say when the exporter's command answered, so
#: such a state is 0 then, and unknown (a gap) when it did not.
QUERIES = {
    "nodes": "count by (state) (pyhpc_slurm_node_state)",
    "nodes_ok": 'max(pyhpc_exporter_command_ok{{command="scontrol"}})',
    "host_cpu": 'avg by (instance) (1 - rate(node_cpu_seconds_total{{mode="idle"}}[{rate}]))',
    "gpus_allocated": "sum(slurm_gpus_alloc) / sum(slurm_gpus_total)",
    "jobs": "sum by (state) (max_over_time(pyhpc_slurm_jobs[{step}]))",
    "jobs_ok": 'max(pyhpc_exporter_command_ok{{command="squeue"}})',
    "gpus_by_account": "sum by (account) (pyhpc_job_gpus)",
    "cpus_held": "sum by (jobid, user, account) (cgroup_cpus)",
    "cpu_used": "sum by (jobid, user, account) (rate(cgroup_cpu_total_seconds[{rate}]))",
    "gpus_held": "sum by (jobid, user, account) (pyhpc_job_gpus)",
    # The GPU exporter's duty cycle is a percentage; the report's shares are 0..1.
    "gpu_used": 'avg by (jobid, user, account) (nvidia_gpu_duty_cycle{{jobid!=""}}) / 100',
}
Series = list[tuple[dict[str, str], list[tuple[float, float]]]]


class ReportError(PyhpcError):
    """A window or an output directory the cluster report cannot use."""


@dataclass(frozen=True)
class Window:
    """The range asked for: ``start`` to ``end`` (epoch seconds), a point every ``step``."""

    start: float
    end: float
    step: float

    @property
    def rate(self) -> str:
        """A rate over at least a minute (two scrapes at least, whatever the interval)."""
        return f"{int(max(60.0, 2 * self.step))}s"

    @property
    def times(self) -> list[float]:
        """Every point's time, as Prometheus' range query gives them."""
        return [self.start + i * self.step
                for i in range(int((self.end - self.start) / self.step) + 1)]


@dataclass(frozen=True)
class JobUse:
    """One job over the window: what it held and the share of it that it used."""

    job_id: str
    user: str
    account: str
    cpus: int
    cpu_use: float | None
    gpus: int
    gpu_use: float | None
    seen_s: float

    @property
    def share(self) -> float | None:
        """Its GPUs' use where it holds GPUs with figures (NVML), else its CPUs'."""
        return self.gpu_use if self.gpus and self.gpu_use is not None else self.cpu_use


def window(since: str, now: float) -> Window:
    """The ``since`` (``90m``, ``24h``, ``7d``) up to ``now``, aligned to its step."""
    match = SINCE.fullmatch(since)
    seconds = int(match.group(1)) * UNIT_S[match.group(2)] if match else 0
    if not SINCE_S[0] <= seconds <= SINCE_S[1]:
        raise ReportError(f"--since: {echo(since)} is not allowed; use a number and m, h or d, "
                          "from 10m to 31d (e.g. 24h)", "--since")
    step = float(max(15, math.ceil(seconds / POINTS)))
    end = math.floor(now / step) * step
    return Window(end - seconds, end, step)


def ask(base: str, win: Window) -> dict[str, Series]:
    """Every query of :data:`QUERIES` over the window: one range query each."""
    return {name: prometheus.query_range(base, promql.format(rate=win.rate,
                                                             step=f"{int(win.step)}s"),
                                         win.start, win.end, win.step)
            for name, promql in QUERIES.items()}


def rounded(value: float) -> float:
    """One rule for every figure the page, its plots and ``--json`` show: 3 significant
    digits (0.00833, 48.2, 1230)."""
    return round(value, 2 - math.floor(math.log10(abs(value)))) if value else 0.0


def shown(value: float) -> str:
    """:func:`rounded` as text, without an exponent."""
    value = rounded(value)
    return f"{value:.{max(0, 2 - math.floor(math.log10(abs(value))))}f}" if value else "0"


def counts(series: Series, ok: Series) -> Series:
    """Counts by state with the zeros put back: at a time the exporter's command answered
    (``ok`` 1), a state without a point had none; where it did not, no point (a gap)."""
    answered = {t for _, points in ok for t, v in points if v >= 1}
    out: Series = []
    for labels, points in series:
        held = dict(points)
        out.append((labels, sorted({**{t: 0.0 for t in answered}, **held}.items())))
    return out


def gpu_hours(series: Series, step: float) -> dict[str, float]:
    """GPU-hours each account's jobs held: the held GPUs summed over the points."""
    out: dict[str, float] = {}
    for labels, points in series:
        account = labels.get("account") or "(none)"
        out[account] = out.get(account, 0.0) + sum(v for _, v in points) * step / 3600
    return {a: rounded(h) for a, h in sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))}


def _by_job(series: Series) -> dict[tuple[str, str, str], dict[float, float]]:
    return {(s.get("jobid", ""), s.get("user", ""), s.get("account", "")): dict(points)
            for s, points in series if s.get("jobid")}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def job_use(answers: dict[str, Series], step: float) -> list[JobUse]:
    """Every job the window saw holding CPUs, least used first (those without a figure
    last): the mean over its points of CPU time used per CPU held, and of its GPUs'
    utilization where NVML gave one."""
    cpus, used = _by_job(answers["cpus_held"]), _by_job(answers["cpu_used"])
    gpus, gpu_used = _by_job(answers["gpus_held"]), _by_job(answers["gpu_used"])
    out = []
    for key, held in cpus.items():
        busy = used.get(key, {})
        shares = [busy[t] / n for t, n in held.items() if n > 0 and t in busy]
        gpu_points = gpu_used.get(key, {})
        out.append(JobUse(key[0], key[1], key[2], int(max(held.values())),
                          _mean(shares), int(max(gpus.get(key, {0.0: 0.0}).values())),
                          _mean(list(gpu_points.values())), len(held) * step))
    return sorted(out, key=lambda j: (j.share is None, j.share or 0.0, j.job_id))


def _clock(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _on_grid(points: list[tuple[float, float]], win: Window,
             scale: float) -> tuple[list[datetime], list[float]]:
    """The series at every point of the window, NaN where it has none, so that a line
    breaks at a gap instead of joining across it."""
    held = dict(points)
    return ([_clock(t) for t in win.times],
            [held[t] * scale if t in held else math.nan for t in win.times])


def _lines(ax: Any, series: Series, key: str, win: Window, scale: float = 1.0,
           style: str = "-", label: str | None = None) -> None:
    """One line per series; a marker on each point, so a point alone shows too."""
    for labels, points in sorted(series, key=lambda s: s[0].get(key, "")):
        x, y = _on_grid(points, win, scale)
        ax.plot(x, y, style, marker=".", markersize=3, label=label or labels.get(key) or key)


def _nothing(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in this window", ha="center", va="center",
            transform=ax.transAxes)


def utilization_figure(answers: dict[str, Series], win: Window) -> Any:
    fig, (nodes, busy) = plots.figure(2)
    _lines(nodes, counts(answers["nodes"], answers["nodes_ok"]), "state", win)
    nodes.set(title="Nodes by state (Slurm)", ylabel="nodes")
    nodes.set_ylim(bottom=0)
    _lines(busy, answers["host_cpu"], "instance", win, 100)
    _lines(busy, answers["gpus_allocated"], "", win, 100, "--", "GPUs allocated")
    busy.set(title="Hosts' CPUs busy, GPUs allocated", ylabel="%", ylim=(0, 105))
    for ax, keys in ((nodes, ("nodes",)), (busy, ("host_cpu", "gpus_allocated"))):
        plots.clock_axis(ax, _clock(win.start), _clock(win.end))
        if not any(answers[key] for key in keys):
            _nothing(ax, "samples")
    return fig


def jobs_figure(answers: dict[str, Series], win: Window) -> Any:
    fig, (ax,) = plots.figure(1)
    _lines(ax, counts(answers["jobs"], answers["jobs_ok"]), "state", win)
    ax.set(title="Jobs by state", ylabel="jobs")
    ax.set_ylim(bottom=0)
    plots.clock_axis(ax, _clock(win.start), _clock(win.end))
    if not answers["jobs"]:
        _nothing(ax, "jobs")
    return fig


def _bars(ax: Any, names: list[str], values: list[float], labels: list[str]) -> None:
    """Bars labelled with the figures the page's tables show (a bar of 0 shows its 0)."""
    bars = ax.barh(range(len(names)), values)
    ax.bar_label(bars, labels, padding=3, fontsize="small")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()


def gpu_hours_figure(hours: dict[str, float]) -> Any:
    fig, (ax,) = plots.figure(1)
    _bars(ax, list(hours), list(hours.values()), [shown(h) for h in hours.values()])
    ax.set(title="GPU-hours held, per account", xlabel="GPU-hours")
    ax.margins(x=0.15)
    if not hours:
        _nothing(ax, "GPUs held")
    return fig


def least_figure(jobs: list[JobUse]) -> Any:
    fig, (ax,) = plots.figure(1)
    with_figures = [j for j in jobs[:LEAST] if j.share is not None]
    _bars(ax, [f"{j.job_id} ({j.user})" for j in with_figures],
          [100 * (j.share or 0.0) for j in with_figures], [_pct(j.share) for j in with_figures])
    ax.set(title="Jobs that used least of what they held", xlabel="% of held CPUs or GPUs used",
           xlim=(0, 115))
    if not with_figures:
        _nothing(ax, "jobs with figures")
    return fig


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


FIGURES = {
    "utilization": "Slurm's nodes by state; each host's CPUs busy (node_exporter) and the "
                   "share of the cluster's GPUs allocated to jobs.",
    "jobs": "Jobs by state (each array task one), as the Slurm exporter counted them: the "
            "most in each step, so a job shorter than a step shows too.",
    "gpu_hours": "GPUs the jobs of each account held, times how long (GPU-hours held, not "
                 "used: the lab's stand-in GPUs count too).",
    "least": "Running jobs by the share of what they held that they used: their GPUs' "
             "utilization where NVML measured it, else CPU time per CPU held.",
}


def page(base: str, win: Window, hours: dict[str, float], jobs: list[JobUse]) -> str:
    """The HTML: a figure per plot, the GPU-hours and the least-used jobs as tables."""
    esc = html.escape
    figures = "".join(
        f'<figure id="{name}"><img src="{PNG[name]}" alt="{esc(FIGURES[name])}">'
        f"<figcaption>{esc(FIGURES[name])}</figcaption></figure>\n" for name in PNG)
    account_rows = "".join(f"<tr><td>{esc(a)}</td><td>{shown(h)}</td></tr>\n"
                           for a, h in hours.items()) or '<tr><td colspan="2">none</td></tr>\n'
    job_rows = "".join(
        f"<tr><td>{esc(j.job_id)}</td><td>{esc(j.user)}</td><td>{esc(j.account)}</td>"
        f"<td>{j.cpus}</td><td>{_pct(j.cpu_use)}</td><td>{j.gpus}</td>"
        f"<td>{_pct(j.gpu_use) if j.gpus else ''}</td><td>{j.seen_s / 60:.0f}</td></tr>\n"
        for j in jobs[:LEAST]) or '<tr><td colspan="8">no jobs in this window</td></tr>\n'
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        "<title>pyhpc cluster report</title>\n<style>body{font-family:sans-serif;"
        "max-width:1100px;margin:1em auto}img{max-width:100%}table{border-collapse:collapse}"
        "td,th{padding:2px 10px;border-bottom:1px solid #ccc;text-align:left}</style>\n"
        "</head>\n<body>\n<h1>pyhpc cluster report</h1>\n"
        f"<p>From {_stamp(win.start)} to {_stamp(win.end)}, a point every {win.step:g} s, "
        f"from Prometheus at {esc(base)}.</p>\n{figures}"
        "<h2>GPU-hours held per account</h2>\n<table>\n<tr><th>account</th><th>GPU-hours</th>"
        f"</tr>\n{account_rows}</table>\n"
        "<h2>Jobs that used least of what they held</h2>\n<table>\n<tr><th>job</th>"
        "<th>user</th><th>account</th><th>CPUs</th><th>CPU use</th><th>GPUs</th>"
        f"<th>GPU use</th><th>minutes seen</th></tr>\n{job_rows}</table>\n</body>\n</html>\n")


def write(base: str, since: str, out: Path, now: float | None = None) -> dict[str, Any]:
    """Ask Prometheus, then write the page and its plots into ``out`` (created privately;
    refused if it or a directory above it is someone else's or writable by others).
    Returns what ``--json`` prints."""
    win = window(since, time.time() if now is None else now)
    answers = ask(base, win)  # everything asked before anything is written
    hours = gpu_hours(answers["gpus_by_account"], win.step)
    jobs = job_use(answers, win.step)
    where = files.make_dir(out, "html")
    figures = {"utilization": utilization_figure(answers, win),
               "jobs": jobs_figure(answers, win), "gpu_hours": gpu_hours_figure(hours),
               "least": least_figure(jobs)}
    written = [plots.save(fig, where / PNG[name], integer_x=False)
               for name, fig in figures.items()]
    html_path = files.write_text(where / PAGE, page(base, win, hours, jobs), "html")
    return {"html": str(html_path), "pngs": [str(p) for p in written],
            "window": asdict(win), "gpu_hours": hours,
            "jobs": {labels.get("state", ""): points
                     for labels, points in counts(answers["jobs"], answers["jobs_ok"])},
            "least_used": [{**asdict(j), "share": j.share} for j in jobs[:LEAST]]}
