"""A backup controller: the definition's ``controller`` section, ``scontrol ping``'s lines
and the doctor's word on which controller is in charge (the takeover itself runs on
hostlab: tests/integration/test_hostlab_takeover.py)."""
from __future__ import annotations

import pytest

from pyhpc import cluster
from pyhpc.admin.doctor import Doctor
from pyhpc.slurm import rows
from tests.unit.test_doctor import HEALTHY, srun_answers

BASE = {"name": "c", "mode": "hosts", "monitoring": {"listen": "10.0.0.0/16"},
        "nodes": [{"name": "n", "count": 2, "cpus": 2, "memory_mb": 1024}],
        "partitions": [{"name": "p", "nodes": ["n1", "n2"], "default": True}]}


def test_no_section_keeps_the_state_on_the_controllers_own_disk_and_slurms_timeout() -> None:
    assert cluster.parse(BASE).controller == cluster.Controller("/var/lib/slurm/slurmctld", 120)


def test_a_shared_state_directory_and_a_short_takeover() -> None:
    parsed = cluster.parse({**BASE, "controller": {"state_save_location": "/srv/slurmctld/", "timeout": 10}})
    assert parsed.controller == cluster.Controller("/srv/slurmctld", 10)
    assert parsed.to_dict()["controller"] == {"state_save_location": "/srv/slurmctld", "timeout": 10}


@pytest.mark.parametrize(("section", "line"), [
    ({"timeout": 4}, "controller.timeout: must be an integer from 5 to 65533, got 4"),
    ({"timeout": "10s"}, "controller.timeout: must be an integer from 5 to 65533, got '10s'"),
    ({"state_save_location": "/home/slurm"}, "controller.state_save_location: /home/slurm is not allowed;"),
    ({"state_save_location": "/srv/../etc"}, "controller.state_save_location: '/srv/../etc' is not allowed;"),
    ({"state_save_location": "srv"}, "controller.state_save_location: 'srv' is not allowed;"),
    ({"hosts": ["a", "b"]}, "controller.hosts: unknown key; allowed: state_save_location, timeout"),
    ([], "controller: "),
])
def test_a_bad_controller_section_is_one_line_naming_the_key(section: object, line: str) -> None:
    with pytest.raises(cluster.ConfigError) as err:
        cluster.parse({**BASE, "controller": section})
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


PRIMARY_UP = "Slurmctld(primary) at ctl is UP\nSlurmctld(backup) at db is UP\n"
PRIMARY_DOWN = "Slurmctld(primary) at ctl is DOWN\nSlurmctld(backup) at db is UP\n"


def test_ping_lines_become_rows_in_slurmctldhost_order() -> None:
    assert rows.controllers(PRIMARY_DOWN) == [rows.Controller("primary", "ctl", False),
                                              rows.Controller("backup", "db", True)]
    assert rows.controllers("Slurmctld(primary) at vm is UP\n") == [rows.Controller("primary", "vm", True)]
    # What a comment or a host could not forge into a row: other lines are left out.
    assert rows.controllers("error: x\nSlurmctld(primary) at ctl is UP and more\n") == []


@pytest.mark.parametrize(("text", "chief"), [
    (PRIMARY_UP, "ctl"), (PRIMARY_DOWN, "db"),
    ("Slurmctld(primary) at ctl is DOWN\nSlurmctld(backup) at db is DOWN\n", None),
    ("Slurmctld(primary) at a is DOWN\nSlurmctld(backup1) at b is DOWN\n"
     "Slurmctld(backup2) at c is UP\n", "c"),
])
def test_the_first_controller_that_answers_is_in_charge(text: str, chief: str | None) -> None:
    found = rows.in_charge(rows.controllers(text))
    assert (found.host if found else None) == chief


@pytest.mark.parametrize(("answer", "ok", "detail"), [
    ((0, "Slurmctld(primary) at vm is UP\n"), True, "vm in charge (primary)"),
    ((0, PRIMARY_UP), True, "ctl in charge (primary); backup db UP"),
    ((1, PRIMARY_DOWN), False, "db in charge (backup); primary ctl DOWN"),
    ((1, "Slurmctld(primary) at ctl is DOWN\n"), False, "scontrol ping: "),
])
def test_the_doctor_names_the_controller_in_charge(fake_slurm, answer: tuple[int, str], ok: bool,
                                                    detail: str) -> None:
    fake_slurm.answers.update({**HEALTHY, "srun": srun_answers(), "scontrol": answer})
    check = Doctor(sacct_wait=0, runtime="podman").slurmctld()
    assert (check.ok, check.detail.startswith(detail)) == (ok, True), check
