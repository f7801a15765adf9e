"""The accounting host's conversion (pyhpc/admin/accounting_convert.py), its steps and
its going back, against stand-ins for mysql, mysqldump, systemctl and slurmdbd on PATH
that keep a tiny "database" in files: its schema version and its jobs' fields. The real
MariaDB and slurmdbd 24.11: tests/integration/test_hostlab_release.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyhpc.admin import accounting_convert as ac
from pyhpc.admin import upgrade_releases as releases

#: The stand-ins. The database is $DB/schema and $DB/fields; a dump is both as two lines.
MYSQL = r"""#!/bin/bash
q=$(cat)
case "$q" in
  *"from cluster_table"*) [ -n "$MYSQL_DOWN" ] && { echo "ERROR 2002: Can't connect" >&2; exit 1; }
                          echo hostlab ;;
  *"alter table clus_res_table"*)
     [ -e "$DB/renamed" ] && { echo "ERROR 1054: Unknown column 'percent_allowed'" >&2; exit 1; }
     touch "$DB/renamed"; echo 13 > "$DB/schema" ;;
  *"select version from convert_version_table"*) cat "$DB/schema" ;;
  *"md5("*) printf '3\t%s\n' "$(cat "$DB/fields")" ;;
  "SCHEMA="*) sed -n 's/^SCHEMA=//p' <<<"$q" > "$DB/schema"
              sed -n 's/^FIELDS=//p' <<<"$q" > "$DB/fields"; rm -f "$DB/renamed"
              echo reload >> "$DB/log" ;;
  *) echo "unexpected query: $q" >&2; exit 1 ;;
esac
"""
MYSQLDUMP = """#!/bin/bash
echo "SCHEMA=$(cat "$DB/schema")"; echo "FIELDS=$(cat "$DB/fields")"
"""
SYSTEMCTL = """#!/bin/bash
echo "systemctl $*" >> "$DB/log"
"""
#: $SLURMDBD: converts (ok), refuses (too_old), or converts and changes a job (alters).
SLURMDBD = r"""#!/bin/bash
case "$SLURMDBD" in
  too_old) echo "slurmdbd: fatal: Database schema is too old for this version of Slurm to upgrade."
           exit 1 ;;
  alters) echo changed > "$DB/fields" ;;
esac
[ "$(cat "$DB/schema")" -ge 13 ] && echo 16 > "$DB/schema"
echo $$ > "$PIDFILE"
echo "slurmdbd: slurmdbd version 24.11.5 started"
exec sleep 30
"""


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A moved accounting host: schema 12, a job's fields, slurmdbd.conf; its state dir."""
    db, bin_dir = tmp_path / "db", tmp_path / "bin"
    db.mkdir()
    bin_dir.mkdir()
    (db / "schema").write_text("12\n")
    (db / "fields").write_text("abc\n")
    for name, text in (("mysql", MYSQL), ("mysqldump", MYSQLDUMP), ("systemctl", SYSTEMCTL),
                       ("slurmdbd", SLURMDBD)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("DB", str(db))
    monkeypatch.setenv("SLURMDBD", "ok")
    monkeypatch.setenv("PIDFILE", str(tmp_path / "slurmdbd.pid"))
    conf = tmp_path / "slurmdbd.conf"
    conf.write_text(f"# pyhpc\nStorageLoc=slurm_acct_db\nSlurmUser=slurm\n"
                    f"PidFile={tmp_path}/slurmdbd.pid\n")
    monkeypatch.setattr(ac, "SLURMDBD_CONF", conf)
    settings = tmp_path / "route.json"
    settings.write_text(json.dumps(releases.accounting_route("trixie")))
    return tmp_path


def convert(host: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    code = ac.main(["--settings", str(host / "route.json"), "--state-dir", str(host / "state"),
                    "--timeout", "20"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


def db(host: Path, name: str) -> str:
    path = host / "db" / name
    return path.read_text().strip() if path.exists() else ""


def test_the_route_replays_22_05s_schema_up_to_what_24_11_converts() -> None:
    route = releases.accounting_route("trixie")
    assert (route["release"], route["schema"], route["schema_min"]) == ("24.11", 16, 13)
    assert list(route["replay"]) == ["12"]  # 22.05's schema, one step to 23.02's 13
    assert route["replay"]["12"][-1].startswith("update convert_version_table set version = 13")


def test_a_conversion_replays_converts_compares_and_starts_slurmdbd(
        host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, done, err = convert(host, capsys)
    assert code == 0, err
    assert (done["outcome"], done["schema_before"], done["schema_after"]) == ("converted", 12, 16)
    assert [s["step"] for s in done["steps"]] == ["dump", "replay", "convert", "unit"]
    assert db(host, "log").splitlines() == ["systemctl start mariadb",
                                            "systemctl unmask slurmdbd.service",
                                            "systemctl enable --now slurmdbd.service"]
    dump = host / "state" / "accounting-before-24.11.sql"
    assert dump.stat().st_mode & 0o777 == 0o600
    for name in ("accounting-24.11", "accounting-digest-24.11.json"):
        assert (host / "state" / name).stat().st_mode & 0o777 == 0o600
    assert (host / "state" / "accounting-24.11").read_text() == "12 -> 16\n"

    assert not (host / "slurmdbd.pid").exists()  # the foreground slurmdbd's, removed

    code, done, _ = convert(host, capsys)  # the mark: nothing runs again
    assert (code, done["outcome"]) == (0, "converted already")
    assert len(db(host, "log").splitlines()) == 3


def test_a_refusal_after_the_replay_puts_the_database_back_and_a_second_run_resumes(
        host: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMDBD", "too_old")
    code, done, err = convert(host, capsys)
    assert code == 1
    assert err.count("\n") == 1 and "refused the database: Database schema is too old" in err
    assert "the database is back as it was" in err
    assert done["outcome"] == "rolled back"
    assert (db(host, "schema"), db(host, "renamed")) == ("12", "")  # the replay undone
    assert "unmask" not in db(host, "log")
    assert not (host / "state" / "accounting-24.11").exists()

    monkeypatch.setenv("SLURMDBD", "ok")
    code, done, err = convert(host, capsys)
    assert code == 0, err
    assert [s["step"] for s in done["steps"]] == ["reload", "replay", "convert", "unit"]
    assert db(host, "schema") == "16"


def test_a_conversion_that_changes_a_jobs_fields_is_undone(
        host: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMDBD", "alters")
    code, _, err = convert(host, capsys)
    assert code == 1
    assert "the jobs' and steps' fields differ after the conversion: hostlab_job" in err
    assert (db(host, "schema"), db(host, "fields")) == ("12", "abc")


@pytest.mark.parametrize(("schema", "conf", "line"), [
    ("11", "StorageLoc=slurm_acct_db\n", "convert_version_table: schema 11; slurmdbd 24.11 "
     "converts 13 and newer, and pyhpc knows no step from it (pyhpc/admin/upgrade_releases.py)"),
    ("12", "StorageLoc=acct`; drop database mysql; --\n", "StorageLoc: 'acct`; drop database "
     "mysql; --' is not a database or cluster name pyhpc deployed (letters, digits, _)"),
])
def test_what_it_cannot_begin_is_one_line_and_nothing_changed(
        host: Path, capsys: pytest.CaptureFixture[str], schema: str, conf: str, line: str) -> None:
    (host / "db" / "schema").write_text(schema)
    ac.SLURMDBD_CONF.write_text(conf)
    code, done, err = convert(host, capsys)
    assert (code, done) == (2, {})
    assert err == f"pyhpc-accounting-convert: {line}; nothing changed\n"
    assert not (host / "state" / "accounting-before-24.11.sql").exists()
    assert "unmask" not in db(host, "log") and db(host, "schema") == schema


def test_mariadb_not_answering_is_one_line_and_nothing_changed(
        host: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MYSQL_DOWN", "1")
    code, done, err = convert(host, capsys)
    assert (code, done) == (2, {})
    assert err == "pyhpc-accounting-convert: mysql: ERROR 2002: Can't connect; nothing changed\n"
    assert not (host / "state").exists() and db(host, "schema") == "12"
