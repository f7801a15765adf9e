"""The "my jobs" page as HTML: a table of the user's jobs and, for each charted job, its
CPU, memory and GPU use as inline SVG with clock-time axes (UTC). No script or style from
elsewhere: the page's one script is :data:`REFRESH_JS`, served by the page's own service.

Everything shown goes through jinja2's autoescaping; what is shown are the job exporter's
labels (job ids, accounts, node names from slurmctld) and numbers, never job text.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import jinja2
import markupsafe

from pyhpc.hub.api import MY_JOBS_PART
from pyhpc.monitor.my_jobs import Chart, Overview

#: Each chart's size and margins, in CSS pixels.
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 380, 170, 58, 10, 22, 34
COLOURS = ("#1f77b4", "#d62728", "#2ca02c")
UNITS = {"bytes": ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B")),
         "cores": ((1, "cores"),), "%": ((1, "%"),)}

#: Fetches the page's main part again every data-refresh seconds and swaps it in; once
#: the hub's login has lapsed (a redirect, not the part), it loads the page anew. The hub's
#: services check an XSRF token on every fetch (the page's data-xsrf).
REFRESH_JS = """\
"use strict";
(function () {
  const main = document.getElementById("jobs");
  const every = 1000 * Number(main.dataset.refresh);
  async function refresh() {
    try {
      const answer = await fetch("part", {credentials: "same-origin", cache: "no-store",
                                          headers: {"X-XSRFToken": main.dataset.xsrf}});
      if (answer.ok && answer.headers.get("@PART@") === "1") {
        main.innerHTML = await answer.text();
      } else if (answer.redirected || answer.status === 403) {
        window.location.reload();
      }
    } catch (e) {  // a redirect to the hub's login (another origin), or no answer
      window.location.reload();
    }
    window.setTimeout(refresh, every);
  }
  window.setTimeout(refresh, every);
})();
""".replace("@PART@", MY_JOBS_PART)

PART = """\
<p class="updated">{{ user }} · updated <time id="updated">{{ clock(at, True) }}</time> UTC
 · refreshed every {{ refresh }} s · jobs with a sample in the last {{ hours }} hours</p>
{% if error %}<p class="error">{{ error }}</p>
{% elif not jobs %}<p class="none">No job of yours in the last {{ hours }} hours.</p>
{% else %}
<table><thead><tr><th>job</th><th>state</th><th>account</th><th>nodes</th><th>CPUs</th>
<th>GPUs</th><th>first seen</th><th>last seen</th><th>ran</th></tr></thead><tbody>
{% for j in jobs %}<tr data-job="{{ j.job_id }}"><td>{{ j.job_id }}</td>
<td>{{ "running" if j.running else "ended" }}</td><td>{{ j.account }}</td>
<td>{{ j.nodes | join(", ") }}</td><td>{{ j.cpus }}</td><td>{{ j.gpus }}</td>
<td>{{ clock(j.start) }}</td><td>{{ "now" if j.running else clock(j.end) }}</td>
<td>{{ duration(j.end - j.start) }}</td></tr>
{% endfor %}</tbody></table>
{% for j in jobs if j.job_id in charts %}<section class="job" id="job-{{ j.job_id }}">
<h2>Job {{ j.job_id }} ({{ "running" if j.running else "ended" }})</h2>
{% for c in charts[j.job_id] %}{{ svg(c) }}{% else %}<p>No sample to chart yet.</p>{% endfor %}
</section>
{% endfor %}{% endif %}
"""

PAGE = """\
<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>My jobs · {{ user }}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.8em; text-align: left; }
section.job { margin: 1.5em 0; }
section.job svg { margin-right: 1em; border: 1px solid #eee; }
.error { color: #a00; font-weight: bold; }
.updated { color: #555; }
</style></head>
<body><h1>My jobs</h1>
<main id="jobs" data-refresh="{{ refresh }}" data-xsrf="{{ xsrf }}">{{ part }}</main>
<script src="refresh.js"></script>
</body></html>
"""

ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)


@dataclass(frozen=True)
class Scale:
    """A unit's divisor and name, and the y axis' top in that unit."""

    divisor: float
    name: str
    top: float


def clock(t: float, seconds: bool = False) -> str:
    return time.strftime("%H:%M:%S" if seconds else "%H:%M", time.gmtime(t))


def duration(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def nice_top(value: float) -> float:
    """The least of 1, 2, 2.5, 5 times a power of ten that is at least ``value``."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(float(m * power) for m in (1, 2, 2.5, 5, 10) if m * power >= value * (1 - 1e-9))


def scale(chart: Chart) -> Scale:
    peak = max((v for line in chart.lines for _, v in line.points), default=0.0)
    if chart.unit == "%":
        return Scale(1, "%", 100.0)
    divisor, name = next(((d, n) for d, n in UNITS[chart.unit] if peak >= d),
                         UNITS[chart.unit][-1])
    return Scale(divisor, name, nice_top(peak / divisor))


def ticks(start: float, end: float) -> list[float]:
    """Three to six clock times on a round step (10 s to 6 h) within [start, end]."""
    span = max(end - start, 1.0)
    step = next((s for s in (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
                             21600) if span / s <= 6), 21600)
    first = math.ceil(start / step) * step
    return [first + i * step for i in range(int((end - first) // step) + 1)]


def svg(chart: Chart) -> str:
    """One chart as an inline SVG element: a polyline per line, a legend, both axes."""
    times = [t for line in chart.lines for t, _ in line.points]
    start, end = min(times), max(times)
    sc = scale(chart)
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - start) / max(end - start, 1e-9) * w

    def y(v: float) -> float:
        return TOP + h - min(v / sc.divisor, sc.top) / sc.top * h

    seconds = end - start < 300
    return str(ENV.from_string(SVG).render(
        chart=chart, sc=sc, w=w, h=h, x=x, y=y, colours=COLOURS, left=LEFT, top=TOP,
        width=WIDTH, height=HEIGHT, xticks=ticks(start, end),
        label=lambda t: clock(t, seconds), yticks=[sc.top * i / 4 for i in range(5)],
        number=lambda v: f"{v:g}" if v >= 10 or v == 0 else f"{v:.2g}"))


SVG = """\
<svg xmlns="http://www.w3.org/2000/svg" width="{{ width }}" height="{{ height }}" \
role="img" aria-label="{{ chart.title }}" data-chart="{{ chart.title }}">
<text x="{{ left }}" y="14" font-size="12" font-weight="bold">{{ chart.title }} \
({{ sc.name }})</text>
{% for v in yticks %}<line x1="{{ left }}" x2="{{ left + w }}" y1="{{ y(v * sc.divisor) }}" \
y2="{{ y(v * sc.divisor) }}" stroke="#eee"/><text x="{{ left - 4 }}" \
y="{{ y(v * sc.divisor) + 4 }}" font-size="10" text-anchor="end">{{ number(v) }}</text>
{% endfor %}{% for t in xticks %}<text x="{{ x(t) }}" y="{{ top + h + 14 }}" font-size="10" \
text-anchor="middle">{{ label(t) }}</text>
{% endfor %}<text x="{{ left + w }}" y="{{ top + h + 28 }}" font-size="10" \
text-anchor="end">UTC</text>
{% for line in chart.lines %}<polyline fill="none" stroke="{{ colours[loop.index0 % 3] }}" \
stroke-width="1.5" points="{% for t, v in line.points %}{{ '%.1f,%.1f' | format(x(t), y(v)) }} \
{% endfor %}"/><text x="{{ width - 10 - 70 * (chart.lines | length - loop.index) }}" y="14" \
font-size="10" text-anchor="end" fill="{{ colours[loop.index0 % 3] }}">{{ line.label }}</text>
{% endfor %}</svg>
"""


def part(overview: Overview | None, user: str, refresh_s: int, hours: int,
         error: str | None = None) -> str:
    """The page's main part (what the refresh swaps in)."""
    return str(ENV.from_string(PART).render(
        user=user, at=overview.at if overview else time.time(), refresh=refresh_s, hours=hours,
        error=error, jobs=overview.jobs if overview else [],
        charts=overview.charts if overview else {}, clock=clock, duration=duration,
        svg=lambda c: markupsafe.Markup(svg(c))))


def page(user: str, part_html: str, refresh_s: int, xsrf: str) -> str:
    return str(ENV.from_string(PAGE).render(
        user=user, refresh=refresh_s, xsrf=xsrf, part=markupsafe.Markup(part_html)))

