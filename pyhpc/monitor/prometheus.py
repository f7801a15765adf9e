"""Prometheus' query API (``/api/v1/query``, ``query_range``): a job's GPU and memory
figures over the samples the job exporter took while the job ran, and the range queries
of the cluster report.

Where no Prometheus is configured, or it does not answer, there are no figures: None,
never a guess. The URL comes from ``--prometheus`` or ``$PYHPC_PROMETHEUS_URL``.

The monitoring role's Prometheus answers over TLS, to a name and password only
(:data:`CA_ENV`, :data:`USER_ENV`, :data:`PASSWORD_ENV`; without them the CA at
:data:`CA_FILE` and the admins' password at :data:`ADMIN_PASSWORD`, where this user can
read it: root's). Users reach their own jobs' figures through ``pyhpc-jobstats-query``
(:mod:`pyhpc.monitor.own_query`), never Prometheus itself.
"""
from __future__ import annotations

import base64
import json
import math
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from pyhpc import validate
from pyhpc.errors import PyhpcError
from pyhpc.monitor.hints import USED_GPU_UTIL

ENV = "PYHPC_PROMETHEUS_URL"
CA_ENV, USER_ENV, PASSWORD_ENV = ("PYHPC_PROMETHEUS_CA", "PYHPC_PROMETHEUS_USER",
                                  "PYHPC_PROMETHEUS_PASSWORD_FILE")
#: The monitoring role's CA (public) and the admins' password (root's alone).
CA_FILE = "/etc/pyhpc/monitoring/ca.crt"
ADMIN_USER, ADMIN_PASSWORD = "admin", "/etc/pyhpc/secrets/prometheus-admin.password"
TIMEOUT_S = 10.0
#: Largest answer read (a job's series: a few per GPU).
MAX_BYTES = 4 << 20


class PrometheusError(PyhpcError):
    """Prometheus did not answer, or answered something that is not a query result."""


@dataclass(frozen=True)
class GpuFigures:
    """A job's GPUs over its run: mean and peak utilization (0..1), peak memory, how many
    GPUs had samples and how many of those worked (mean at least ``USED_GPU_UTIL``)."""

    util_mean: float
    util_peak: float
    mem_peak_bytes: int
    gpus: int
    used: int


def url(given: str | None) -> str | None:
    """The configured Prometheus, checked as a URL; None if none is."""
    value = given or os.environ.get(ENV) or None
    if value is None:
        return None
    checked = validate.name("--prometheus", value.rstrip("/"), "url", PrometheusError)
    if not checked.startswith("http"):
        raise PrometheusError(f"--prometheus: {checked[:60]!r} is not an http(s) URL",
                              "--prometheus")
    return checked


def credentials() -> tuple[str, str] | None:
    """(name, password) for Prometheus' basic auth: ``$PYHPC_PROMETHEUS_USER`` and the
    first line of ``$PYHPC_PROMETHEUS_PASSWORD_FILE``, else the admins' where readable."""
    name = os.environ.get(USER_ENV) or ADMIN_USER
    path = os.environ.get(PASSWORD_ENV) or ADMIN_PASSWORD
    try:
        with open(path, encoding="utf-8") as fh:
            password = fh.readline(256).strip()
    except OSError:
        return None
    return (name, password) if password else None


def request(address: str) -> tuple[urllib.request.Request, ssl.SSLContext | None]:
    """The request, with basic auth where there is a password, and the TLS context that
    trusts the monitoring CA (where one is installed; else the system's)."""
    req = urllib.request.Request(address)
    found = credentials()
    if found is not None:
        token = base64.b64encode(f"{found[0]}:{found[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    if not address.startswith("https:"):
        return req, None
    ca = os.environ.get(CA_ENV) or CA_FILE
    return req, ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)


def _get(base: str, api: str, params: dict[str, str]) -> list[Any]:
    """One call of the query API (``query`` or ``query_range``): its ``data.result``."""
    address = f"{base}/api/v1/{api}?" + urllib.parse.urlencode(params)
    try:
        req, context = request(address)
        # http(s) only: url() checked the scheme.
        with urllib.request.urlopen(req, timeout=TIMEOUT_S, context=context) as answer:
            body = answer.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        why = ("it answers admins and pyhpc's own services only" if exc.code in (401, 403)
               else exc.reason)
        raise PrometheusError(f"prometheus: {base} refused the query ({exc.code}: {why})",
                              "prometheus") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PrometheusError(f"prometheus: {base} did not answer ({exc})",
                              "prometheus") from None
    if len(body) > MAX_BYTES:
        raise PrometheusError(f"prometheus: answer larger than {MAX_BYTES} bytes", "prometheus")
    data: Any = validate.read_json("prometheus", body, PrometheusError)
    inner = data.get("data") if isinstance(data, dict) else None
    result = inner.get("result") if isinstance(inner, dict) else None
    if not isinstance(result, list) or data.get("status") != "success":
        raise PrometheusError(f"prometheus: the query failed ({json.dumps(data)[:120]})",
                              "prometheus")
    return result


def query(base: str, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
    """One instant query: each series' labels and value."""
    out = []
    for series in _get(base, "query", {"query": promql, "time": f"{at:.3f}"}):
        try:
            out.append((dict(series["metric"]), float(series["value"][1])))
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    return [(labels, value) for labels, value in out if value == value]  # NaN: no figure


def query_range(base: str, promql: str, start: float, end: float, step: float,
                ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    """One range query: each series' labels and its (time, value) points, NaN left out."""
    out = []
    params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    for series in _get(base, "query_range", params):
        try:
            points = [(float(t), float(v)) for t, v in series["values"]]
            out.append((dict(series["metric"]), [(t, v) for t, v in points if v == v]))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _window(start: float, end: float) -> str:
    """The job's run as a range, at least a minute (a shorter one may hold no sample)."""
    return f"{max(60, math.ceil(end - start))}s"


def selector(job_id_raw: str, user: str | None = None) -> str:
    """The series of one job (``jobid``, the label cgroup_exporter and the Jobstats GPU
    exporter use); with ``user``, only those pyhpc's job exporter labelled with that owner
    (``pyhpc-jobstats-query`` never shows a user another's)."""
    sel = f'jobid="{validate.name("job", job_id_raw, "job_id")}"'
    if user is not None:
        sel += f',user="{validate.name("user", user, "user")}"'
    return "{" + sel + "}"


def gpu_figures(base: str, job_id_raw: str, start: float, end: float,
                user: str | None = None) -> GpuFigures | None:
    """The job's GPU figures between ``start`` and ``end`` (epoch seconds); None if the
    exporter recorded no GPU sample of it (a CPU job, or stand-ins without a driver)."""
    def values(function: str, metric: str, scale: float = 1.0) -> list[float]:
        return [v * scale for _, v in query(base, f"{function}({metric}{sel}[{window}])", end)]

    sel = selector(job_id_raw, user)
    window = _window(start, end)
    # The GPU exporter's duty cycle is a percentage; the figures are shares (0..1).
    means = values("avg_over_time", "nvidia_gpu_duty_cycle", 0.01)
    if not means:
        return None
    peaks = values("max_over_time", "nvidia_gpu_duty_cycle", 0.01)
    memory = values("max_over_time", "nvidia_gpu_memory_used_bytes")
    return GpuFigures(util_mean=sum(means) / len(means), util_peak=max(peaks or means),
                      mem_peak_bytes=int(max(memory or [0])), gpus=len(means),
                      used=sum(1 for m in means if m >= USED_GPU_UTIL))


def host_memory_peak(base: str, job_id_raw: str, start: float, end: float,
                     user: str | None = None) -> int | None:
    """The largest peak memory of the job's cgroup on any of its nodes, per the exporter."""
    sel = selector(job_id_raw, user)
    window = _window(start, end)
    peaks = query(base, f"max_over_time(pyhpc_job_memory_peak_bytes{sel}[{window}])", end)
    return int(max(v for _, v in peaks)) if peaks else None
