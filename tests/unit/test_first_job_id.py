"""slurm.conf's FirstJobId from the upgrade's queue record (issue 46): the slurm role reads
the record pyhpc admin upgrade queue save writes, where pyhpc writes it, and renders
FirstJobId only where the record is. Without one, slurm.conf is as its golden files."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import yaml
from test_slurm_templates import ROLE, context, render
from test_upgrade_queue import root_only

from pyhpc import paths
from pyhpc.admin import queue_store as store

ROLE_VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())


def first_job_id(record: str | None) -> str:
    """The role's slurm_first_job_id on a host, the primary's read of the record given
    (None: the read found no file and printed nothing)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["from_json"] = json.loads
    read: dict[str, Any] = {"stdout": record or "", "rc": 0}
    return env.from_string(ROLE_VARS["slurm_first_job_id"]).render(
        hostvars={"ctl": {"slurm_queue_record_read": read}}, slurm_controller_host="ctl").strip()


def test_the_role_reads_the_record_where_pyhpc_writes_it() -> None:
    assert Path(ROLE_VARS["slurm_queue_record_file"]) == paths.UPGRADE_QUEUE / store.SAVE


@root_only
def test_the_role_takes_the_first_job_id_from_saves_own_record(tmp_path: Path) -> None:
    top = store.make(tmp_path / "queue")
    store.write_save(top, {**store.read_save(top), store.FIRST_JOB_ID: 60023340,
                           "next_job_id": 400})
    assert first_job_id((top / store.SAVE).read_text()) == "60023340"


def test_no_record_is_no_first_job_id() -> None:
    assert first_job_id(None) == "0"
    assert first_job_id(json.dumps({"saved": False})) == "0"  # a record from before the key


def test_slurm_conf_names_first_job_id_only_with_a_record() -> None:
    plain = render("slurm.conf", context("lab"))
    assert "FirstJobId" not in plain
    with_record = render("slurm.conf", {**context("lab"), "slurm_first_job_id": "60023340"})
    added = [line for line in with_record.splitlines() if line not in plain.splitlines()]
    assert added[-1] == "FirstJobId=60023340" and all(a.startswith("#") for a in added[:-1])
    assert render("slurm.conf", {**context("lab"), "slurm_first_job_id": "0"}) == plain
