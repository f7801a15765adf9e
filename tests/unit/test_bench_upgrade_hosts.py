"""benchmarks/upgrade_hosts.py's pure parts: apt's fetch count read from the move's log,
and the summary's ratios. Runs no hostlab command."""
from __future__ import annotations

from benchmarks import upgrade_hosts as bench

LOG = """== 2026-12-07T06:00:00Z bookworm -> trixie
Reading package lists...
Need to get 1,234 kB of archives.
After this operation, 12.0 MB of additional disk space will be used.
Need to get 201 MB/312 MB of archives.
After this operation, 450 MB of additional disk space will be used.
== 2026-12-07T06:04:00Z packages done
"""


def test_fetched_bytes_adds_what_each_step_still_had_to_fetch() -> None:
    assert bench.fetched_bytes(LOG) == 1_234_000 + 201_000_000


def test_fetched_bytes_of_a_log_without_downloads_is_zero() -> None:
    assert bench.fetched_bytes("0 upgraded, 0 newly installed\n") == 0


def _row(host: str, cached: bool, seconds: float, fetched: int, mirror: int) -> dict[str, object]:
    return {"host": host, "through_cache": cached, "move_s": seconds,
            "apt_fetched_bytes": fetched, "from_mirror_bytes": mirror}


def test_summary_compares_the_same_compute_move_with_and_without_the_cache() -> None:
    rows = [_row("cpu1", False, 200.0, 300, 300), _row("gpu1", True, 220.0, 300, 300),
            _row("gpu2", True, 150.0, 300, 0), _row("db", True, 250.0, 400, 100)]
    s = bench.summary(rows)
    assert s["warm_cache_move_ratio"] == 0.75
    assert s["cold_cache_move_ratio"] == 1.1
    assert s["from_mirror_bytes"] == 700
    assert s["mirror_bytes_through_cache_vs_without"] == round(400 / 1000, 3)
