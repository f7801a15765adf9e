"""benchmarks/backup.py's row multiplier: the INSERT ... SELECT it builds from a table's
columns. Runs no database."""
from __future__ import annotations

import pytest

from benchmarks import backup as bench


def test_every_column_is_copied_in_the_schemas_order_but_the_replaced_ones() -> None:
    sql = bench.multiply_sql("`lab_job_table`", ["job_db_inx", "account", "id_job"],
                             {"job_db_inx": "s.seq", "id_job": "s.seq"}, 10_000,
                             "`src`.job", 409)
    assert sql == ("INSERT INTO `lab_job_table` (`job_db_inx`, `account`, `id_job`) "
                   "SELECT s.seq, r.`account`, s.seq FROM seq_1_to_10000 s "
                   "JOIN `src`.job r ON r.k = (s.seq - 1) % 409")


def test_steps_come_from_the_joined_table_of_the_copied_job() -> None:
    sql = bench.multiply_sql("`lab_step_table`", ["job_db_inx", "id_step"],
                             {"job_db_inx": "s.seq"}, 5, "`src`.job", 3, values="t",
                             join=" JOIN `src`.step t ON t.job_db_inx = r.job_db_inx")
    assert sql == ("INSERT INTO `lab_step_table` (`job_db_inx`, `id_step`) "
                   "SELECT s.seq, t.`id_step` FROM seq_1_to_5 s "
                   "JOIN `src`.job r ON r.k = (s.seq - 1) % 3 "
                   "JOIN `src`.step t ON t.job_db_inx = r.job_db_inx")


def test_a_replaced_column_the_schema_lacks_is_refused_naming_the_columns() -> None:
    with pytest.raises(ValueError, match=r"`t`: no column id_job \(its columns: job_db_inx\)"):
        bench.multiply_sql("`t`", ["job_db_inx"], {"id_job": "s.seq"}, 1, "`src`.job", 1)


@pytest.mark.parametrize(("rows", "sources"), [(0, 1), (1, 0)])
def test_no_rows_or_no_source_rows_is_refused(rows: int, sources: int) -> None:
    with pytest.raises(ValueError, match="must be at least 1"):
        bench.multiply_sql("`t`", ["a"], {}, rows, "`src`.job", sources)


def test_per_10k_scales_to_ten_thousand_jobs() -> None:
    assert bench.per_10k(3.0, 50_000) == 0.6
