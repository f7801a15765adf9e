"""benchmarks/monitoring.py's pure parts: the ABBA order, CPU time from /proc/PID/stat and
the Slurm exporter's own count of commands per scrape."""
from __future__ import annotations

import pytest

from benchmarks import monitoring


def test_samples_alternate_abba() -> None:
    assert monitoring.abba(3) == [True, False, False, True, True, False]


def test_cpu_seconds_are_utime_and_stime_even_with_spaces_in_the_name() -> None:
    stat = "4242 (python (a b)) S 1 4242 4242 0 -1 4194560 9 0 0 0 250 50 0 0 20 0 3 0 1"
    assert monitoring.cpu_seconds(stat, 100) == pytest.approx(3.0)


def test_cpu_seconds_count_the_waited_for_children_too() -> None:
    """The Slurm exporter's commands are its children: their CPU is the scrape's."""
    stat = "4242 (python3) S 1 4242 4242 0 -1 4194560 9 0 0 0 250 50 30 20 20 0 3 0 1"
    assert monitoring.cpu_seconds(stat, 100) == pytest.approx(3.5)


def test_commands_per_scrape_are_read_from_the_exporters_metric() -> None:
    text = ('pyhpc_exporter_scrape_slurm_commands{command="squeue"} 1.0\n'
            'pyhpc_exporter_scrape_slurm_commands{command="sacct"} 1.0\n'
            'pyhpc_exporter_slurm_commands_total{command="squeue"} 41.0\n')
    assert monitoring.commands_per_scrape(text) == {"squeue": 1.0, "sacct": 1.0}


def test_the_ratio_is_of_medians() -> None:
    assert monitoring.ratio([99.0, 100.0, 101.0], [100.0, 200.0, 100.0]) == 1.0
