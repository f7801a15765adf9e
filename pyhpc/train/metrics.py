"""Throughput metrics: per-rank step times in, samples/s and scaling efficiency out.

A step's time on a rank is the wall time from the end of its previous step to the
end of this one (data loading included), so the harness's samples/s matches what
a stopwatch around the loop would say. Warm-up steps are dropped. In synchronous
data-parallel training the job moves at the pace of its slowest rank, so the
global rate of a step is global batch / the slowest rank's time for that step.
"""
from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, get_args, get_type_hints

from pyhpc import files, validate
from pyhpc.errors import PyhpcError, echo


class MetricsError(PyhpcError):
    """Timings that cannot be summarised (no steps left after warm-up, ragged ranks), or a
    metrics file that cannot be read back (named with its line)."""


def _nothing() -> None:
    """The CPU's synchronisation: nothing is queued."""


class StepTimer:
    """Records step-to-step wall times with one perf_counter call per step.

    ``sync`` is called first at every mark: on a GPU it waits for the step's kernels
    (:meth:`pyhpc.dist.device.Placement.synchronize`), so a step's time is its real duration
    and not the time to queue it; on the CPU it returns at once.
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.times: list[float] = []
        self._sync = sync if sync is not None else _nothing
        self._last = time.perf_counter()

    def restart(self) -> None:
        """Start timing from now (call before the first step of an epoch)."""
        self._sync()
        self._last = time.perf_counter()

    def step(self) -> None:
        """Mark the end of one step."""
        self._sync()
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now


class Clock(Protocol):
    """What a training loop marks its steps on: a :class:`StepTimer`, or the
    :class:`~pyhpc.train.meter.Meter` that holds one."""

    def restart(self) -> None: ...

    def step(self) -> None: ...


@dataclass(frozen=True)
class RankTimes:
    """The step times one rank measured."""

    rank: int
    host: str
    step_times: list[float]


@dataclass(frozen=True)
class Environment:
    """What was measured where: recorded next to every summary."""

    torch_version: str
    backend: str
    job_id: str
    nodes: list[str]
    local_batch: int
    mode: str = "digits"
    model: str = ""


@dataclass(frozen=True)
class Summary:
    """One run's throughput. Times in seconds, rates in samples/s."""

    workers: int
    local_batch: int
    global_batch: int
    steps: int
    warmup_steps: int
    step_time_p50: float
    step_time_p90: float
    step_time_mean: float
    samples_per_s: float
    samples_per_s_per_worker: float
    torch_version: str
    backend: str
    job_id: str
    nodes: str
    mode: str
    model: str
    efficiency: float | None = None
    scaling: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """Flat record for JSON lines and CSV."""
        data = asdict(self)
        data.update({f"extra_{k}": v for k, v in data.pop("extra").items()})
        return dict(validate.json_safe(data))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation (numpy's default)."""
    if not values:
        raise MetricsError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def slowest_steps(ranks: Sequence[RankTimes], warmup: int) -> list[float]:
    """Per step (after warm-up), the time of the slowest rank."""
    if not ranks:
        raise MetricsError("no ranks reported step times")
    lengths = {len(r.step_times) for r in ranks}
    if len(lengths) != 1:
        raise MetricsError(f"ranks report different step counts: {sorted(lengths)}")
    steps = lengths.pop()
    if steps <= warmup:
        raise MetricsError(f"{steps} steps recorded, all within the {warmup} warm-up steps")
    return [max(r.step_times[i] for r in ranks) for i in range(warmup, steps)]


def summarize(ranks: Sequence[RankTimes], warmup: int, env: Environment,
              extra: dict[str, Any] | None = None, workers: int | None = None,
              step_samples: Sequence[int] | None = None) -> Summary:
    """Throughput of one run from every rank's step times. ``workers``: the data-parallel
    workers, each with ``env.local_batch`` samples a step (default: every rank; a pipelined
    run has one per pipeline). ``step_samples``: the samples of each step over all ranks,
    where steps differ (a last, smaller batch): the rate is then the samples of the
    measured steps over their time."""
    slow = slowest_steps(ranks, warmup)
    workers = len(ranks) if workers is None else workers
    global_batch = env.local_batch * workers
    mean = sum(slow) / len(slow)
    rate = global_batch / mean
    if step_samples is not None:
        if len(step_samples) != len(slow) + warmup:
            raise MetricsError(f"{len(step_samples)} sample counts for "
                               f"{len(slow) + warmup} steps")
        rate = sum(step_samples[warmup:]) / sum(slow)
    return Summary(
        workers=workers, local_batch=env.local_batch, global_batch=global_batch,
        steps=len(slow), warmup_steps=warmup,
        step_time_p50=percentile(slow, 50), step_time_p90=percentile(slow, 90),
        step_time_mean=mean, samples_per_s=rate, samples_per_s_per_worker=rate / workers,
        torch_version=env.torch_version, backend=env.backend, job_id=env.job_id,
        nodes=",".join(env.nodes), mode=env.mode, model=env.model, extra=dict(extra or {}))


SCALING = ("weak", "strong")


def stages(run: Summary) -> int:
    """Pipeline stages of a run (1: every worker holds the whole model)."""
    value = run.extra.get("pipeline", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def efficiency(runs: Iterable[Summary], scaling: str = "weak") -> list[Summary]:
    """Scaling efficiency of each run against the run with fewest workers in its series.

    A series is one model with one stage count (pipelined runs scale over their replicas).
    weak: series share the per-worker batch, E(N) = X(N)·N0 / (N·X(N0)), which is
    X(N)/(N·X(1)) when the series starts at one worker. strong: series share the
    global batch (the work per step is fixed), same formula, different baseline.
    A run alone in its series gets ``None``.
    """
    if scaling not in SCALING:
        raise MetricsError(f"scaling: {scaling!r} is not allowed; allowed: {', '.join(SCALING)}")
    runs = list(runs)
    key: Callable[[Summary], int] = (
        (lambda s: s.local_batch) if scaling == "weak" else (lambda s: s.global_batch))
    out: list[Summary] = []
    for run in runs:
        series = [r for r in runs if key(r) == key(run) and r.mode == run.mode
                  and r.model == run.model and stages(r) == stages(run)]
        base = min(series, key=lambda s: s.workers)
        # A run alone in its series has nothing to scale against: no figure, not 100%.
        value = (run.samples_per_s * base.workers / (run.workers * base.samples_per_s)
                 if len(series) > 1 else None)
        out.append(Summary(**{**{f.name: getattr(run, f.name) for f in fields(run)},
                              "efficiency": value, "scaling": scaling}))
    return sorted(out, key=lambda s: (s.mode, s.model, stages(s), key(s), s.workers))


def write_jsonl(path: Path, summaries: Iterable[Summary]) -> None:
    """Append one JSON object per summary (never through a link: see :mod:`pyhpc.files`)."""
    files.append_text(path, "".join(json.dumps(s.row(), sort_keys=True) + "\n"
                                    for s in summaries))


def _kinds() -> dict[str, tuple[tuple[type, ...], bool]]:
    """Per Summary field (but ``extra``): the types a record may hold, and if null may be."""
    out = {}
    for name, hint in get_type_hints(Summary).items():
        args = get_args(hint) or (hint,)
        out[name] = (tuple(a for a in args if a is not type(None)), type(None) in args)
    del out["extra"]
    return out


#: A metrics.jsonl holds a line per run; anything this large is something else.
MAX_FILE_BYTES = 64 << 20
#: What each field of a record read back may hold.
_KINDS = _kinds()
#: Fields that are divided by or plotted: a record must have them above zero. (Every number
#: of a record is finite, normal and at most validate.FILE_NUMBER_MAX: validate.read_json.)
#: Smallest value of those: a rate or time below it is no measurement, and dividing by it
#: could overflow.
MIN_POSITIVE = 1e-9
_POSITIVE = ("workers", "local_batch", "global_batch", "steps", "samples_per_s",
             "samples_per_s_per_worker", "step_time_p50", "step_time_p90", "step_time_mean")


def _field_error(name: str, value: object) -> str | None:
    """Why ``value`` cannot be the Summary field ``name``, or None if it can."""
    kinds, nullable = _KINDS[name]
    if value is None:
        return None if nullable else "must not be null"
    if float in kinds:
        want, ok = "a number", isinstance(value, (int, float)) and not isinstance(value, bool)
    elif int in kinds:
        want, ok = "an integer", isinstance(value, int) and not isinstance(value, bool)
    else:
        want, ok = "printable text", isinstance(value, str) and value.isprintable()
    if not ok:
        return f"must be {want}, got {echo(value)}"
    if name in _POSITIVE and not (isinstance(value, (int, float)) and value >= MIN_POSITIVE):
        return f"must be at least {MIN_POSITIVE:g}, got {echo(value)}"
    return None


def _summary(row: object, where: str) -> Summary:
    """A Summary from one JSON record, or a MetricsError naming ``where`` (file:line)."""
    if not isinstance(row, dict):
        raise MetricsError(f"{where}: expected a JSON object, got {type(row).__name__}", where)
    required = [f.name for f in fields(Summary) if f.default is MISSING
                and f.default_factory is MISSING]
    missing = [k for k in required if k not in row]
    if missing:
        raise MetricsError(f"{where}: not a metrics record; missing {', '.join(missing)}",
                           where)
    values: dict[str, Any] = {}
    for name in _KINDS:
        if name in row:
            why = _field_error(name, row[name])
            if why:
                raise MetricsError(f"{where}: {name}: {why}", where)
            values[name] = row[name]
    extra = {k[len("extra_"):]: v for k, v in row.items() if k.startswith("extra_")}
    return Summary(**values, extra=extra)


def read_jsonl(path: Path) -> list[Summary]:
    """Summaries written by :func:`write_jsonl`. A file that is not text, a line that is
    not JSON, a number that is not finite, normal and bounded, a record of the wrong shape
    or types: one MetricsError naming file:line."""
    fh, why = files.try_open_regular(path)  # a planted FIFO never hangs the reader
    if fh is None:
        raise MetricsError(f"{path}: {why}", str(path))
    try:
        with fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise MetricsError(f"{path}: cannot read ({exc.strerror})", str(path)) from None
    if len(data) > MAX_FILE_BYTES:
        raise MetricsError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB; not a metrics file",
                           str(path))
    out = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MetricsError(f"{where}: not UTF-8 text", where) from None
        if not line.strip():
            continue
        out.append(_summary(validate.read_json(where, line, MetricsError), where))
    return out


def write_csv(path: Path, summaries: Sequence[Summary]) -> None:
    """Write summaries as CSV (header from the first row's keys), atomically and never
    through a link."""
    rows = [s.row() for s in summaries]
    if not rows:
        raise MetricsError("no summaries to write")
    keys = sorted({k for r in rows for k in r})
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    files.write_text(path, text.getvalue())
