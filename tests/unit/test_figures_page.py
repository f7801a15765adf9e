"""docs/benchmarks.md is what benchmarks/figures_page.py renders from benchmarks/results/*.json:
the figures are written once, in the JSON (`make bench-page` rewrites the page)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import figures_page, record


def test_the_committed_page_is_what_the_json_gives() -> None:
    assert figures_page.PAGE.read_text() == figures_page.render(), (
        "docs/benchmarks.md differs from the result files: run `make bench-page`")


def test_every_result_file_has_a_table() -> None:
    tables = {t.name for t in figures_page.TABLES}
    files = {p.stem for p in record.RESULTS.glob("*.json") if p.name not in figures_page.SAMPLES}
    assert files == tables


def test_a_result_file_without_a_table_is_refused(tmp_path: Path) -> None:
    shutil.copy(record.RESULTS / "hub.json", tmp_path / "hub.json")
    doc = json.loads((tmp_path / "hub.json").read_text())
    (tmp_path / "new.json").write_text(json.dumps({**doc, "benchmark": "new"}))
    with pytest.raises(ValueError, match="no table for new"):
        figures_page.render(tmp_path)


def test_a_changed_figure_changes_the_page(tmp_path: Path) -> None:
    doc = json.loads((record.RESULTS / "hub.json").read_text())
    doc["figures"]["declared"]["last_serving_s"] = 99.5
    (tmp_path / "hub.json").write_text(json.dumps(doc))
    page = figures_page.render(tmp_path)
    assert (f"| time until all run, 16 CPUs declared a node | 99.5 s | — | {doc['date'][:10]} |"
            in page)


def test_a_missed_target_says_so(tmp_path: Path) -> None:
    doc = json.loads((record.RESULTS / "monitoring.json").read_text())
    doc["figures"]["overhead"].update(ratio=0.989, met=False)
    (tmp_path / "monitoring.json").write_text(json.dumps(doc))
    page = figures_page.render(tmp_path)
    assert f"| samples/s, on / off | 0.989 | ≥ 0.99 (**missed**) | {doc['date'][:10]} |" in page


def test_a_carried_part_keeps_its_date() -> None:
    page = figures_page.render()
    assert "| bubble, 1F1B, 4 micro-batches, 200 blocks | 0.23 (bound 0.20) | — | 2026-11-25 |" in page


def test_check_fails_on_a_hand_edited_page(tmp_path: Path, monkeypatch, capsys) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(figures_page.render() + "a hand-written figure\n")
    monkeypatch.setattr(figures_page, "PAGE", page)
    monkeypatch.setattr(figures_page.record, "ROOT", tmp_path)
    assert figures_page.main(["--check"]) == 1
    assert "make bench-page" in capsys.readouterr().err
    page.write_text(figures_page.render())
    assert figures_page.main(["--check"]) == 0
