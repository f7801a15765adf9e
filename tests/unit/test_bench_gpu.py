"""benchmarks.gpu's pure parts: a failing part is recorded, never a figure in its place;
the peak memory comes from the run's own rank records."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks import gpu


def test_a_part_that_fails_is_kept_as_its_error_and_the_others_still_run() -> None:
    errors: dict[str, str] = {}

    def broken() -> None:
        raise RuntimeError("CUDA error: out of memory")

    assert gpu.part("bench", broken, errors) is None
    assert gpu.part("nvml", lambda: {"ok": True}, errors) == {"ok": True}
    assert list(errors) == ["bench"] and "CUDA error: out of memory" in errors["bench"]


def test_peak_memory_is_rank_zeros_record_or_none(tmp_path: Path) -> None:
    assert gpu.peak(tmp_path) is None
    (tmp_path / "ranks.jsonl").write_text(
        json.dumps({"rank": 0, "device": "cuda:0", "peak_memory_bytes": 499368448}) + "\n")
    assert gpu.peak(tmp_path) == 499368448
    (tmp_path / "ranks.jsonl").write_text(json.dumps({"rank": 0, "device": "cpu"}) + "\n")
    assert gpu.peak(tmp_path) is None

