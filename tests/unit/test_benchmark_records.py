"""Every benchmark's result file has the one shape of benchmarks/record.py; record.write
makes it, and the benchmarks are importable modules (no sys.path edits)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from benchmarks import record

BENCHMARKS = sorted(p for p in (record.ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py")
#: `pyhpc bench`'s own output (schema pyhpc.bench/1), kept as a sample: not a benchmark's record.
SAMPLES = {"pyhpc-bench-lab.json"}


@pytest.mark.parametrize("path", sorted(p for p in record.RESULTS.glob("*.json") if p.name not in SAMPLES),
                         ids=lambda p: p.name)
def test_every_result_file_has_the_one_shape(path: Path) -> None:
    doc = record.check(json.loads(path.read_text()), path.name)
    assert doc["benchmark"] == path.stem
    assert doc["date"].endswith("Z") and doc["machine"]  # older records describe less of it


def test_write_records_machine_date_commit_and_figures(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    out = record.write("demo", {"median_s": 1.5})
    doc = json.loads(out.read_text())
    assert out == tmp_path / "demo.json" and sorted(doc) == sorted(record.KEYS)
    assert doc["figures"] == {"median_s": 1.5} and len(doc["commit"]) == 40
    assert set(doc["machine"]) == {"cpus", "memory_mib", "kernel", "arch", "python"}
    assert record.read("demo") == doc and record.read("none") == {}


def test_machine_reads_memory_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683520 kB\nMemFree: 1 kB\n")
    assert record.machine(meminfo)["memory_mib"] == 24105
    assert record.machine(tmp_path / "absent")["memory_mib"] is None


@pytest.mark.parametrize(("doc", "message"), [
    ([], "keys list, expected"),
    ({k: {} for k in record.KEYS} | {"schema": "other/1"}, "schema 'other/1'"),
    ({k: "x" for k in record.KEYS} | {"schema": record.SCHEMA}, "machine is not an object"),
    ({"schema": record.SCHEMA}, "keys ['schema']"),
])
def test_a_file_of_another_shape_is_refused_naming_what(doc: object, message: str) -> None:
    with pytest.raises(ValueError, match="^demo: .*" + message.replace("[", r"\[").replace("(", r"\(")):
        record.check(doc, "demo")


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_no_benchmark_edits_sys_path(path: Path) -> None:
    tree = ast.parse(path.read_text())
    edits = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and n.attr == "path" and isinstance(n.value, ast.Name) and n.value.id == "sys"]
    assert not edits, f"{path.name}: sys.path at lines {edits}"


def test_a_partial_run_keeps_the_parts_it_did_not_measure_with_their_commit() -> None:
    previous = {"commit": "abc", "date": "2026-11-25T23:17:15Z",
                "figures": {"split": {"layers": 50}, "largest": {"rows": []},
                            "bubble": {"rows": [1], "measured": {"commit": "old", "date": "d"}}}}
    merged = record.carried({"largest": {"rows": [2]}}, previous)
    assert merged == {"split": {"layers": 50, "measured": {"commit": "abc", "date": "2026-11-25T23:17:15Z"}},
                      "bubble": {"rows": [1], "measured": {"commit": "old", "date": "d"}},
                      "largest": {"rows": [2]}}
    assert record.carried({"split": {}}, {}) == {"split": {}}
