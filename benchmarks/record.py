"""The one shape of a benchmark's result file, ``benchmarks/results/<name>.json``.

``{"schema": "pyhpc.benchmark/1", "benchmark": NAME, "machine": {...}, "date": ISO UTC,
"commit": the checkout's commit or null, "figures": {...}}``: the machine described the same
way by every benchmark, the figures as each benchmark measures them (samples, medians,
targets and whether they were met).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SCHEMA = "pyhpc.benchmark/1"
KEYS = ("schema", "benchmark", "machine", "date", "commit", "figures")


def machine(meminfo: Path = Path("/proc/meminfo")) -> dict[str, Any]:
    """This machine: CPUs, memory, kernel, architecture and the Python that ran the benchmark."""
    memory_mib = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_mib = int(line.split()[1]) // 1024
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "memory_mib": memory_mib, "kernel": platform.release(),
            "arch": platform.machine(), "python": platform.python_version()}


def commit(root: Path = ROOT) -> str | None:
    """The checkout's commit (the code measured), or None outside a git checkout (or
    where git is not installed: the device machine's copy of the tree)."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=False)
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def document(name: str, figures: dict[str, Any]) -> dict[str, Any]:
    return {"schema": SCHEMA, "benchmark": name, "machine": machine(),
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit(),
            "figures": figures}


def path(name: str) -> Path:
    return RESULTS / f"{name}.json"


def check(doc: Any, where: str) -> dict[str, Any]:
    """``doc`` if it has the result file's shape, else ValueError naming what is wrong."""
    if not isinstance(doc, dict) or sorted(doc) != sorted(KEYS):
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{where}: keys {keys}, expected {sorted(KEYS)}")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"{where}: schema {doc['schema']!r}, expected {SCHEMA!r}")
    for key in ("machine", "figures"):
        if not isinstance(doc[key], dict):
            raise ValueError(f"{where}: {key} is not an object")
    return doc


def write(name: str, figures: dict[str, Any]) -> Path:
    """Write ``figures`` as benchmark ``name``'s result file; returns its path."""
    out = path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(check(document(name, figures), name), indent=2) + "\n")
    return out


def carried(figures: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
    """A partial run's figures (a benchmark's ``--only``/``--parts``) and the parts of the
    last recorded run (``previous``, :func:`read`'s) that this one did not measure, each
    marked with the commit and date it was measured at."""
    kept = {part: {**value, "measured": value.get("measured") or
                   {"commit": previous.get("commit"), "date": previous.get("date")}}
            for part, value in previous.get("figures", {}).items()
            if part not in figures and isinstance(value, dict)}
    return {**kept, **figures}


def read(name: str) -> dict[str, Any]:
    """Benchmark ``name``'s result file, checked; {} when there is none yet."""
    if not path(name).exists():
        return {}
    return check(json.loads(path(name).read_text()), str(path(name)))
