"""One user's jobs as Prometheus saw them: the running ones and those of the last hours,
each with its CPU, memory and GPU use over time. What the hub's "my jobs" page
(:mod:`pyhpc.monitor.my_jobs_page`) shows.

Every query names the user's label (the job exporter's ``user``, from slurmctld's view of
the job, never from job text) beside any job id: another user's job gives no series, so
nothing of it is ever shown. The user is the hub's, never a request's argument.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from pyhpc import validate
from pyhpc.monitor import prometheus

#: How far back "recent" reaches, and the jobs listed and charted at most.
HOURS = 24
MAX_JOBS, CHARTED = 20, 6
#: Points per chart: enough for a line, far below Prometheus' 11,000.
POINTS = 120
#: Every job has cgroup_cpus, one series per node it holds. {sel}: the user's (and the
#: job's) selector; {window}, {step}: the listing's range and the scrape interval (a
#: subquery at that step sees every sample); {rate}: a rate's range (two scrapes at least).
LIST = {
    "first": "min by (jobid, account) (min_over_time(timestamp(cgroup_cpus{sel})[{window}:{step}]))",
    "last": "max by (jobid, account) (max_over_time(timestamp(cgroup_cpus{sel})[{window}:{step}]))",
    "cpus": "max by (jobid, node) (max_over_time(cgroup_cpus{sel}[{window}]))",
    "gpus": "max by (jobid, node) (max_over_time(pyhpc_job_gpus{sel}[{window}]))",
    "running": "count by (jobid) (cgroup_cpus{sel})",
}
#: Each chart: its title, its unit and its lines (label, PromQL).
CHARTS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("CPU", "cores", (("used", "sum(rate(cgroup_cpu_total_seconds{sel}[{rate}]))"),
                      ("held", "sum(cgroup_cpus{sel})"))),
    ("Memory", "bytes", (("RSS", "sum(cgroup_memory_rss_bytes{sel})"),
                         ("limit", "sum(cgroup_memory_total_bytes{sel})"))),
    # The GPU exporter's duty cycle: percent of the sample period a kernel ran.
    ("GPU", "%", (("busy (mean)", "avg(nvidia_gpu_duty_cycle{sel})"),)),
)


@dataclass(frozen=True)
class Job:
    """One job of the user's: where it ran, what it held, when Prometheus saw it."""

    job_id: str
    account: str
    nodes: tuple[str, ...]
    cpus: int
    gpus: int
    start: float
    end: float
    running: bool


@dataclass(frozen=True)
class Line:
    label: str
    points: list[tuple[float, float]]


@dataclass(frozen=True)
class Chart:
    """One figure of a job over its run; a chart with no point is left out."""

    title: str
    unit: str
    lines: list[Line]


@dataclass(frozen=True)
class Overview:
    """What the page shows ``user`` at ``at``: the jobs, newest first, running ones first,
    and the charts of the first :data:`CHARTED` of them."""

    user: str
    at: float
    hours: int
    jobs: list[Job]
    charts: dict[str, list[Chart]] = field(default_factory=dict)


def selector(user: str, job_id: str | None = None) -> str:
    sel = f'user="{validate.name("user", user, "user")}"'
    if job_id is not None:
        sel = f'jobid="{validate.name("job", job_id, "job_id")}",' + sel
    return "{" + sel + "}"


def jobs(base: str, user: str, now: float, scrape_s: float, hours: int = HOURS) -> list[Job]:
    """The user's jobs with a sample in the last ``hours``: running first, then by end."""
    def ask(key: str) -> list[tuple[dict[str, str], float]]:
        promql = LIST[key].format(sel=selector(user), window=f"{hours}h", step=f"{scrape_s:g}s")
        return prometheus.query(base, promql, now)

    first = {labels.get("jobid", ""): (labels.get("account", ""), v) for labels, v in ask("first")}
    last = {labels.get("jobid", ""): v for labels, v in ask("last")}
    running = {labels.get("jobid", "") for labels, _ in ask("running")}
    held: dict[str, dict[str, float]] = {}
    for key in ("cpus", "gpus"):
        for labels, value in ask(key):
            held.setdefault(f"{key}:{labels.get('jobid', '')}", {})[labels.get("node", "")] = value
    found = []
    for job_id, (account, start) in first.items():
        if not job_id or job_id not in last:
            continue
        cpus = held.get(f"cpus:{job_id}", {})
        found.append(Job(job_id=job_id, account=account, nodes=tuple(sorted(cpus)),
                         cpus=int(sum(cpus.values())),
                         gpus=int(sum(held.get(f"gpus:{job_id}", {}).values())),
                         start=start, end=last[job_id], running=job_id in running))
    found.sort(key=lambda j: (not j.running, -j.end, j.job_id))
    return found[:MAX_JOBS]


def charts(base: str, user: str, job: Job, scrape_s: float) -> list[Chart]:
    """The job's charts from just before its first sample to just after its last."""
    start, end = job.start - scrape_s, job.end + scrape_s
    step = max(scrape_s, math.ceil((end - start) / POINTS))
    rate = f"{int(max(3 * scrape_s, 2 * step))}s"
    sel = selector(user, job.job_id)
    out = []
    for title, unit, lines in CHARTS:
        drawn = []
        for label, promql in lines:
            series = prometheus.query_range(base, promql.format(sel=sel, rate=rate),
                                            start, end, step)
            points = [p for _, ps in series for p in ps]
            if points:
                drawn.append(Line(label, points))
        if drawn:
            out.append(Chart(title, unit, drawn))
    return out


def overview(base: str, user: str, scrape_s: float, hours: int = HOURS,
             now: float | None = None) -> Overview:
    """Everything the page shows the user; raises :class:`prometheus.PrometheusError`
    where Prometheus does not answer."""
    at = time.time() if now is None else now
    found = jobs(base, user, at, scrape_s, hours)
    return Overview(user=user, at=at, hours=hours, jobs=found,
                    charts={j.job_id: charts(base, user, j, scrape_s) for j in found[:CHARTED]})
