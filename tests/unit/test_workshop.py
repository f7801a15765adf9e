"""Workshop planning and its Slurm and LDAP calls, against the fake Slurm and directory."""
from __future__ import annotations

import os
import stat
from datetime import datetime
from pathlib import Path

import pytest

from pyhpc import cluster, paths
from pyhpc.admin import directory, workshop
from pyhpc.cli import main as cli

NOW = datetime(2026, 3, 1, 12, 0)


@pytest.fixture
def lab() -> cluster.Cluster:
    return cluster.load(paths.LAB_CLUSTER)


class SlurmState:
    """Enough of sacctmgr and scontrol to follow a workshop's create and delete."""

    def __init__(self) -> None:
        self.qos: set[str] = set()
        self.accounts: dict[str, str] = {"lab": ""}
        self.assocs: set[tuple[str, str]] = {("lab", "root"), ("lab", "user1")}
        self.reservations: set[str] = set()

    def sacctmgr(self, argv: list[str]) -> tuple[int, str]:
        args = [a for a in argv[1:] if not a.startswith("--")]
        verb, entity, rest = args[0], args[1], args[2:]
        cond = dict(a.split("=", 1) for a in rest if "=" in a and not a.startswith("format="))
        if verb == "show" and entity == "qos":
            return 0, "".join(f"{q}\n" for q in self.qos if q == cond.get("name"))
        if verb == "show" and entity == "account":
            names = [cond["name"]] if "name" in cond else list(self.accounts)
            columns = argv[-1].split("=", 1)[1].split(",")
            values = {"account": "{0}", "organization": "{1}", "description": "workshop {0}"}
            return 0, "".join("|".join(values[c] for c in columns).format(a, self.accounts[a])
                              + "\n" for a in names if a in self.accounts)
        if verb == "show" and entity == "associations":
            return 0, "".join(f"{u}\n" for a, u in sorted(self.assocs) if a == cond["account"])
        if (verb, entity) == ("add", "qos"):
            self.qos.add(rest[0])
        elif (verb, entity) == ("add", "account"):
            self.accounts[rest[0]] = cond["Organization"]
        elif (verb, entity) == ("add", "user"):
            self.assocs |= {(cond["account"], u) for u in rest[0].split(",")}
        elif (verb, entity) == ("delete", "user"):
            self.assocs -= {(cond["account"], u) for u in cond["name"].split(",")}
        elif (verb, entity) == ("delete", "account"):
            self.accounts.pop(cond["name"])
        elif (verb, entity) == ("delete", "qos"):
            self.qos.discard(cond["name"])
        return 0, ""

    def scontrol(self, argv: list[str]) -> tuple[int, str]:
        if argv[1:3] == ["show", "reservation"]:
            name = argv[-1]
            return (0, f"ReservationName={name} StartTime=now Nodes=cpu1\n") \
                if name in self.reservations else (1, "")
        if argv[1:3] == ["create", "reservation"]:
            self.reservations.add(argv[3].split("=", 1)[1])
        if argv[1] == "delete":
            self.reservations.discard(argv[2].split("=", 1)[1])
        return 0, ""


@pytest.fixture
def state(fake_slurm, fake_ldap, monkeypatch) -> SlurmState:
    monkeypatch.setenv("PYHPC_CLUSTER", str(paths.LAB_CLUSTER))
    s = SlurmState()
    fake_slurm.answers.update({"sacctmgr": s.sacctmgr, "scontrol": s.scontrol,
                               "squeue": (0, "")})
    directory.sync(workshop.directory_of(cluster.load(paths.LAB_CLUSTER)),
                   cluster.load(paths.LAB_CLUSTER).accounts)
    return s


def test_plan_names_participants_and_sets_per_job_limits(lab) -> None:
    p = workshop.plan("dl", "3", "2026-03-02T09:00", "8", "2", lab, "gpu", now=NOW)
    assert p.participants == ("dl-01", "dl-02", "dl-03")
    assert p.qos_limits() == ["MaxTRESPerJob=node=2,gres/gpu=4", "MaxWall=480",
                              "Flags=DenyOnLimit"]
    assert p.reservation() == {"ReservationName": "dl", "StartTime": "2026-03-02T09:00:00",
                               "Duration": "480", "NodeCnt": "2", "PartitionName": "gpu",
                               "Users": "dl-01,dl-02,dl-03"}


BAD = [
    (("Bad Name", "2", "now", "1", "1"), "name: 'Bad Name' is not allowed"),
    (("dl", "0", "now", "1", "1"), "participants: must be an integer from 1 to 99, got '0'"),
    (("dl", "2", "tomorrow", "1", "1"), "start: 'tomorrow' is not an ISO time"),
    (("dl", "2", "2020-01-01T09:00", "1", "1"), "start: 2020-01-01T09:00 is in the past"),
    (("dl", "2", "now", "0", "1"), "hours: must be a number from 0.25 to 336"),
    (("dl", "2", "now", "1", "3"), "nodes: must be an integer from 1 to 2, got '3'"),
    (("a" * 29, "2", "now", "1", "1"), "is longer than 28 characters"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[b[1][:30] for b in BAD])
def test_bad_request_is_one_line_exit_2_and_changes_nothing(args, message, state, capsys,
                                                            fake_slurm, fake_ldap) -> None:
    fake_slurm.calls.clear()
    before = dict(fake_ldap.entries)
    name, participants, start, hours, nodes = args
    code = cli.main(["workshop", "create", name, "--participants", participants, "--start",
                     start, "--hours", hours, "--nodes", nodes])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert fake_slurm.calls == [] and fake_ldap.entries == before


def test_create_then_create_again_is_a_no_op(state, lab, tmp_path: Path, fake_ldap) -> None:
    p = workshop.plan("dl", "2", "now", "2", "1", lab)
    done = workshop.create(p, lab, tmp_path / "sheet")
    assert done["users_added"] == ["dl-01", "dl-02"] and done["changed"]
    assert state.qos == {"dl"} and state.accounts["dl"] == workshop.ORGANIZATION
    assert ("dl", "dl-01") in state.assocs and state.reservations == {"dl"}
    csv = tmp_path / "sheet" / "dl.csv"
    assert stat.S_IMODE(os.stat(csv).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "sheet").st_mode) == 0o700
    assert csv.read_text().splitlines()[0] == "user,password,login,reservation,start,minutes"
    entries = dict(fake_ldap.entries)
    again = workshop.create(p, lab, tmp_path / "sheet2")
    assert not again["changed"] and fake_ldap.entries == entries
    assert not (tmp_path / "sheet2").exists()


def test_delete_removes_only_the_workshop(state, lab, tmp_path: Path, fake_slurm) -> None:
    workshop.create(workshop.plan("dl", "2", "now", "2", "1", lab), lab, tmp_path)
    fake_slurm.answers["squeue"] = lambda argv: (0, "")
    done = workshop.delete("dl", lab)
    assert done["changed"] and done["users_deleted"] == ["dl-01", "dl-02"]
    assert state.assocs == {("lab", "root"), ("lab", "user1")}
    assert "dl" not in state.accounts and not state.qos and not state.reservations
    d = workshop.directory_of(lab)
    assert sorted(directory.users(d)) == ["user1", "user2"]
    assert not workshop.delete("dl", lab)["changed"]


def test_delete_refuses_an_account_that_is_not_a_workshop(state, lab, fake_slurm) -> None:
    with pytest.raises(workshop.WorkshopError, match="name: account 'lab' is not a pyhpc"):
        workshop.delete("lab", lab)
    assert not [c for c in fake_slurm.calls if c[:2] == ["sacctmgr", "--immediate"]]


def test_list_shows_workshops_only(state, lab, tmp_path: Path) -> None:
    workshop.create(workshop.plan("dl", "2", "now", "2", "1", lab), lab, tmp_path)
    assert [(w["name"], w["participants"]) for w in workshop.listing(lab)] == [("dl", 2)]
