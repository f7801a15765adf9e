"""slurm.conf's FirstJobId from the upgrade's queue record (issue 46): the slurm role reads
the record pyhpc admin upgrade queue save writes, where pyhpc writes it, and renders
FirstJobId only where the record is. Without one, slurm.conf is as its golden files."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml
from test_slurm_templates import ROLE, context, render
from test_upgrade_queue import root_only

from pyhpc import paths
from pyhpc.admin import queue_store as store

ROLE_VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())


def first_job_id(record: str | None, tmp_path: Path) -> str:
    """The role's slurm_first_job_id on a host: its reader (the host's Python) run on the
    record given (None: no file), its output through the role's variable."""
    path = tmp_path / "save.json"
    path.unlink(missing_ok=True)
    if record is not None:
        path.write_text(record)
    read = subprocess.run([sys.executable, "-I", "-c", ROLE_VARS["slurm_queue_record_reader"],
                           str(path)], capture_output=True, text=True, check=True)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    return env.from_string(ROLE_VARS["slurm_first_job_id"]).render(
        hostvars={"ctl": {"slurm_queue_record_read": {"stdout": read.stdout, "rc": 0}}},
        slurm_controller_host="ctl").strip()


def test_the_role_reads_the_record_where_pyhpc_writes_it() -> None:
    assert Path(ROLE_VARS["slurm_queue_record_file"]) == paths.UPGRADE_QUEUE / store.SAVE


@root_only
def test_the_role_takes_the_first_job_id_from_saves_own_record(tmp_path: Path) -> None:
    top = store.make(tmp_path / "queue")
    store.write_save(top, {**store.read_save(top), store.FIRST_JOB_ID: 60023340,
                           "next_job_id": 400})
    assert first_job_id((top / store.SAVE).read_text(), tmp_path) == "60023340"


def test_no_record_is_no_first_job_id(tmp_path: Path) -> None:
    assert first_job_id(None, tmp_path) == "0"
    # a record from before the key
    assert first_job_id(json.dumps({"saved": False}), tmp_path) == "0"


@pytest.mark.parametrize(("record", "read"), [
    ("{not json", "not JSON: Expecting property name enclosed in double quotes"),
    ("[1, 2]", "not a JSON object"),
    ('{"first_job_id": "60023340; rm -rf /"}', "60023340; rm -rf /"),
])
def test_a_record_that_is_not_saves_reads_as_what_is_wrong_for_the_roles_check(
        record: str, read: str, tmp_path: Path) -> None:
    """The role's check of the value (a whole number) stops the deploy with this in its
    line, before slurm.conf is rendered."""
    assert first_job_id(record, tmp_path).startswith(read)
    assert not re.fullmatch("[0-9]+", first_job_id(record, tmp_path))


def test_slurm_conf_names_first_job_id_only_with_a_record() -> None:
    plain = render("slurm.conf", context("lab"))
    assert "FirstJobId" not in plain
    with_record = render("slurm.conf", {**context("lab"), "slurm_first_job_id": "60023340"})
    added = [line for line in with_record.splitlines() if line not in plain.splitlines()]
    assert added[-1] == "FirstJobId=60023340" and all(a.startswith("#") for a in added[:-1])
    assert render("slurm.conf", {**context("lab"), "slurm_first_job_id": "0"}) == plain
