"""Workshop planning and its Slurm and LDAP calls, against the fake Slurm and directory."""
from __future__ import annotations

import os
import stat
from datetime import datetime
from pathlib import Path

import pytest

from pyhpc import cluster, paths
from pyhpc.admin import directory, directory_sync, owner, workshop
from pyhpc.cli import main as cli

NOW = datetime(2026, 3, 1, 12, 0)


@pytest.fixture
def lab() -> cluster.Cluster:
    return cluster.load(paths.LAB_CLUSTER)


class SlurmState:
    """Enough of sacctmgr, scontrol and squeue to follow a workshop's create and delete:
    QOS with descriptions, accounts with organization and description, associations,
    reservations with their Accounts, and queued jobs by user and account."""

    def __init__(self) -> None:
        self.qos: dict[str, str] = {"normal": "normal qos default"}
        self.accounts: dict[str, tuple[str, str]] = {"lab": ("lab", "lab")}
        self.assocs: set[tuple[str, str]] = {("lab", "root"), ("lab", "user1")}
        self.reservations: dict[str, str] = {}
        self.jobs: dict[str, tuple[str, str]] = {}  # id -> (user, account)

    def sacctmgr(self, argv: list[str]) -> tuple[int, str]:
        args = [a for a in argv[1:] if not a.startswith("--")]
        verb, entity, rest = args[0], args[1], args[2:]
        cond = dict(a.split("=", 1) for a in rest if "=" in a and not a.startswith("format="))
        columns = argv[-1].split("=", 1)[1].split(",") if argv[-1].startswith("format=") else []
        if verb == "show" and entity == "qos":
            return 0, "".join(f"{q}|{d}\n" for q, d in self.qos.items() if q == cond.get("name"))
        if verb == "show" and entity == "account":
            names = [cond["name"]] if "name" in cond else list(self.accounts)
            return 0, "".join(f"{a}|{self.accounts[a][0]}|{self.accounts[a][1]}\n"
                              for a in names if a in self.accounts)
        if verb == "show" and entity == "associations":
            rows = [(a, u) for a, u in sorted(self.assocs)
                    if ("account" not in cond or a == cond["account"])
                    and ("users" not in cond or u in cond["users"].split(","))]
            values = [{"user": u, "account": a, "cluster": "lab"} for a, u in rows]
            return 0, "".join("|".join(v[c] for c in columns) + "\n" for v in values)
        if (verb, entity) == ("add", "qos"):
            self.qos[cond["name"]] = cond["Description"]
        elif (verb, entity) == ("add", "account"):
            self.accounts[cond["name"]] = (cond["Organization"], cond["Description"])
        elif (verb, entity) == ("add", "user"):
            self.assocs |= {(cond["account"], u) for u in cond["name"].split(",")}
        elif (verb, entity) == ("delete", "user"):
            self.assocs -= {(cond["account"], u) for u in cond["name"].split(",")}
        elif (verb, entity) == ("delete", "account"):
            self.accounts.pop(cond["name"])
        elif (verb, entity) == ("delete", "qos"):
            self.qos.pop(cond["name"])
        return 0, ""

    def scontrol(self, argv: list[str]) -> tuple[int, str]:
        if argv[1:3] == ["show", "reservation"]:
            name = argv[-1]
            return (0, f"ReservationName={name} StartTime=now Nodes=cpu1 "
                       f"Accounts={self.reservations[name]}\n") \
                if name in self.reservations else (1, "")
        if argv[1:3] == ["create", "reservation"]:
            fields = dict(a.split("=", 1) for a in argv[3:])
            self.reservations[fields["ReservationName"]] = fields.get("Accounts", "(null)")
        if argv[1] == "delete":
            self.reservations.pop(argv[2].split("=", 1)[1])
        return 0, ""

    def squeue(self, argv: list[str]) -> tuple[int, str]:
        account = next(a.split("=", 1)[1] for a in argv if a.startswith("--account="))
        return 0, "".join(f"{j}\n" for j, (_, a) in self.jobs.items() if a == account)

    def scancel(self, argv: list[str]) -> tuple[int, str]:
        for job in argv[2:]:
            self.jobs.pop(job)
        return 0, ""


@pytest.fixture
def state(fake_slurm, fake_ldap, monkeypatch) -> SlurmState:
    monkeypatch.setenv("PYHPC_CLUSTER", str(paths.LAB_CLUSTER))
    s = SlurmState()
    fake_slurm.answers.update({"sacctmgr": s.sacctmgr, "scontrol": s.scontrol,
                               "squeue": s.squeue, "scancel": s.scancel})
    directory_sync.sync(workshop.directory_of(cluster.load(paths.LAB_CLUSTER)),
                        cluster.load(paths.LAB_CLUSTER).accounts)
    return s


def test_plan_names_participants_and_sets_per_job_and_per_user_limits(lab) -> None:
    p = workshop.plan("dl", "3", "2026-03-02T09:00", "8", "2", lab, "gpu", now=NOW)
    assert p.participants == ("dl-01", "dl-02", "dl-03")
    assert p.qos_limits() == ["Description=pyhpc: workshop dl", "MaxTRESPerJob=node=2,gres/gpu=4",
                              "MaxWall=480", "MaxJobsPerUser=2", "MaxSubmitJobsPerUser=10",
                              "MaxTRESPerUser=node=2,gres/gpu=4",
                              "Flags=DenyOnLimit,RequiresReservation"]
    assert p.reservation() == {"ReservationName": "dl", "StartTime": "2026-03-02T09:00:00",
                               "Duration": "480", "NodeCnt": "2", "PartitionName": "gpu",
                               "Users": "dl-01,dl-02,dl-03", "Accounts": "dl"}


def test_the_instructor_sets_per_user_limits_and_may_allow_the_partition(lab) -> None:
    p = workshop.plan("dl", "3", "now", "1", "2", lab, "gpu", outside=True,
                      limits={"jobs_per_user": "1", "submitted_per_user": "3",
                              "nodes_per_user": "1", "gpus_per_user": "1"})
    assert p.qos_limits()[3:] == ["MaxJobsPerUser=1", "MaxSubmitJobsPerUser=3",
                                  "MaxTRESPerUser=node=1,gres/gpu=1", "Flags=DenyOnLimit"]
    cpu = workshop.plan("dl", "1", "now", "1", "1", lab)
    assert cpu.qos_limits()[1] == "MaxTRESPerJob=node=1,gres/gpu=0"  # no GPU at all


BAD = [
    (("Bad Name", "2", "now", "1", "1"), "name: 'Bad Name' is not allowed"),
    (("ROOT", "2", "now", "1", "1"), "name: 'ROOT' is a word Slurm reserves in account names"),
    (("dl", "0", "now", "1", "1"), "participants: must be an integer from 1 to 999, got '0'"),
    (("dl", "2", "tomorrow", "1", "1"), "start: 'tomorrow' is not an ISO time"),
    (("dl", "2", "2020-01-01T09:00", "1", "1"), "start: 2020-01-01T09:00 is in the past"),
    (("dl", "2", "9999-12-31T23:59:59-14:00", "1", "1"), "start: '9999-12-31T23:59:59-14:00' "
                                                          "is out of range"),
    (("dl", "2", "2999-01-01T09:00", "1", "1"), "start: 2999-01-01T09:00 is more than 366 days"),
    (("dl", "2", "now", "0", "1"), "hours: must be a number from 0.25 to 336"),
    (("dl", "2", "now", "1", "3"), "nodes: must be an integer from 1 to 2, got '3'"),
    (("a" * 29, "2", "now", "1", "1"), "is longer than 28 characters"),
    (("dl", "2", "now", "1", "1", "--jobs-per-user", "0"), "jobs_per_user: must be an integer"),
    (("dl", "2", "now", "1", "1", "--jobs-per-user", "4", "--submitted-per-user", "3"),
     "submitted_per_user: must be an integer from 4 to 10000"),
    (("dl", "2", "now", "1", "1", "--nodes-per-user", "2"),
     "nodes_per_user: must be an integer from 1 to 1"),
    (("dl", "2", "now", "1", "1", "--gpus-per-user", "1"),
     "gpus_per_user: must be an integer from 0 to 0"),
    (("dl", "2", "now", "1", "1", "--jobs-per-user", "9" * 4000), "jobs_per_user: must be an"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[b[1][:30] for b in BAD])
def test_bad_request_is_one_line_exit_2_and_changes_nothing(args, message, state, capsys,
                                                            fake_slurm, fake_ldap) -> None:
    fake_slurm.calls.clear()
    before = dict(fake_ldap.entries)
    name, participants, start, hours, nodes, *more = args
    code = cli.main(["workshop", "create", name, "--participants", participants, "--start",
                     start, "--hours", hours, "--nodes", nodes, *more])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert fake_slurm.calls == [] and fake_ldap.entries == before


def test_create_then_create_again_is_a_no_op(state, lab, tmp_path: Path, fake_ldap) -> None:
    p = workshop.plan("dl", "2", "now", "2", "1", lab)
    done = workshop.create(p, lab, tmp_path / "sheet")
    assert done["users_added"] == ["dl-01", "dl-02"] and done["changed"]
    assert state.qos["dl"] == "pyhpc: workshop dl"
    assert state.accounts["dl"] == ("pyhpc", "pyhpc: workshop dl")
    assert ("dl", "dl-01") in state.assocs and state.reservations == {"dl": "dl"}
    csv = tmp_path / "sheet" / "dl.csv"
    assert stat.S_IMODE(os.stat(csv).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "sheet").st_mode) == 0o700
    assert csv.read_text().splitlines()[0] == ("user,password,login,notebooks,reservation,"
                                               "start,minutes")
    page = (tmp_path / "sheet" / "dl.txt").read_text()
    assert "Workshop dl: your account on cluster lab\n" in page
    assert "only in the reservation dl" in page and "2 jobs running and 10 queued" in page
    entries = dict(fake_ldap.entries)
    again = workshop.create(p, lab, tmp_path / "sheet2")
    assert not again["changed"] and fake_ldap.entries == entries
    assert not (tmp_path / "sheet2").exists()


def test_delete_removes_only_the_workshop_and_cancels_only_its_accounts_jobs(
        state, lab, tmp_path: Path) -> None:
    workshop.create(workshop.plan("dl", "2", "now", "2", "1", lab), lab, tmp_path)
    state.jobs = {"7": ("dl-01", "dl"), "8": ("user1", "lab"), "9": ("dl-02", "lab")}
    done = workshop.delete("dl", lab)
    assert done["changed"] and done["users_deleted"] == ["dl-01", "dl-02"]
    assert done["jobs_cancelled"] == ["7"] and set(state.jobs) == {"8", "9"}
    assert state.assocs == {("lab", "root"), ("lab", "user1")}
    assert "dl" not in state.accounts and "dl" not in state.qos and not state.reservations
    assert done["left_alone"] == []
    d = workshop.directory_of(lab)
    assert sorted(directory.users(d)) == ["user1", "user2"]
    assert not workshop.delete("dl", lab)["changed"]


def test_delete_refuses_an_account_that_is_not_a_workshop(state, lab, fake_slurm) -> None:
    with pytest.raises(owner.OwnershipError, match=r"^name: Slurm account 'lab' exists and is "
                       r"not this one's \(no pyhpc marker"):
        workshop.delete("lab", lab)
    assert not [c for c in fake_slurm.calls if c[:2] == ["sacctmgr", "--immediate"]]


def test_delete_of_a_name_only_foreign_objects_have_deletes_nothing(state, lab, capsys,
                                                                      fake_slurm) -> None:
    state.reservations["normal"] = "(null)"
    fake_slurm.calls.clear()
    assert cli.main(["workshop", "delete", "normal"]) == 0
    out = capsys.readouterr().out
    assert out == ("workshop normal: nothing to delete; left alone, not this workshop's: "
                   "Slurm QOS normal, reservation normal\n")
    assert state.qos["normal"] == "normal qos default" and "normal" in state.reservations
    assert not [c for c in fake_slurm.calls if c[:2] in (["sacctmgr", "--immediate"],
                                                          ["scontrol", "delete"])]
    assert not [c for c in fake_slurm.calls if c[0] == "scancel"]


def test_list_shows_workshops_only(state, lab, tmp_path: Path) -> None:
    workshop.create(workshop.plan("dl", "2", "now", "2", "1", lab), lab, tmp_path)
    assert [(w["name"], w["participants"]) for w in workshop.listing(lab)] == [("dl", 2)]


def _foreign_researcher(state: SlurmState, fake_ldap, name: str) -> None:
    """A researcher the admin made by hand: a directory user without pyhpc's marker."""
    fake_ldap.entries[f"uid={name},ou=people,dc=lab,dc=pyhpc"] = {
        "objectClass": ["posixAccount"], "uid": [name], "uidNumber": ["30000"],
        "gidNumber": ["30000"]}


FOREIGN = {
    "qos": (lambda s, ldap: s.qos.update(dl="the admin's own"),
            "name: Slurm QOS 'dl' exists and is not this one's (marked \"the admin's own\""),
    "account": (lambda s, ldap: s.accounts.update(dl=("physics", "dl")),
                "name: Slurm account 'dl' exists and is not this one's (no pyhpc marker"),
    "workshop account": (lambda s, ldap: s.accounts.update(dl=("pyhpc", "pyhpc: workshop ml")),
                         "name: Slurm account 'dl' exists and is not this one's (marked "
                         "'pyhpc: workshop ml'"),
    "reservation": (lambda s, ldap: s.reservations.update(dl="(null)"),
                    "name: reservation 'dl' exists and is not this one's (no pyhpc marker"),
    "group": (lambda s, ldap: ldap.entries.update({"cn=dl,ou=groups,dc=lab,dc=pyhpc": {
        "objectClass": ["posixGroup"], "cn": ["dl"], "gidNumber": ["30000"]}}),
        "name: directory group 'dl' exists and is not this one's (no pyhpc marker"),
    "user": (lambda s, ldap: _foreign_researcher(s, ldap, "dl-02"),
             "name: directory user 'dl-02' exists and is not this one's (no pyhpc marker"),
    "definition user": (lambda s, ldap: ldap.entries[
        "uid=user1,ou=people,dc=lab,dc=pyhpc"]["uid"].__setitem__(0, "dl-01"),
        "name: directory user 'dl-01' exists and is not this one's (marked 'pyhpc: cluster.yml'"),
    "slurm user": (lambda s, ldap: s.assocs.add(("lab", "dl-02")),
                   "name: Slurm user 'dl-02' exists and is not this one's (no pyhpc marker"),
}


@pytest.mark.parametrize("what", sorted(FOREIGN))
def test_create_refuses_a_name_something_else_has_and_changes_nothing(
        what, state, fake_ldap, fake_slurm, capsys, tmp_path: Path) -> None:
    plant, message = FOREIGN[what]
    plant(state, fake_ldap)
    before = (dict(state.qos), dict(state.accounts), set(state.assocs), dict(state.reservations),
              {dn: dict(e) for dn, e in fake_ldap.entries.items()})
    fake_slurm.calls.clear()
    fake_ldap.calls.clear()
    code = cli.main(["workshop", "create", "dl", "--participants", "2", "--start", "now",
                     "--hours", "1", "--out", str(tmp_path / "sheet")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert err.rstrip().endswith("nothing was changed")
    assert (dict(state.qos), dict(state.accounts), set(state.assocs), dict(state.reservations),
            {dn: dict(e) for dn, e in fake_ldap.entries.items()}) == before
    assert not [c for c in fake_slurm.calls if c[:2] in (["sacctmgr", "--immediate"],
                                                          ["scontrol", "create"])]
    assert not [c for c in fake_ldap.calls if c[0] != "ldapsearch"]
    assert not (tmp_path / "sheet").exists()


def test_create_refuses_a_participant_whose_home_was_left_behind(
        state, lab, fake_ldap, fake_slurm, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(directory, "HOME", str(tmp_path))
    (tmp_path / "dl-02").mkdir()
    fake_slurm.calls.clear()
    with pytest.raises(workshop.WorkshopError, match=r"^name: participant dl-02's home .* exists "
                       r"\(an earlier user's files\); remove it"):
        workshop.create(workshop.plan("dl", "2", "now", "1", "1", lab), lab, tmp_path / "s")
    assert not [c for c in fake_slurm.calls if c[:2] == ["sacctmgr", "--immediate"]]
    assert "uid=dl-01,ou=people,dc=lab,dc=pyhpc" not in fake_ldap.entries


def test_create_refuses_a_participant_who_is_a_local_user(state, lab, fake_ldap,
                                                          monkeypatch) -> None:
    monkeypatch.setattr(workshop.pwd, "getpwnam", lambda n: n if n == "dl-01" else {}[n])
    with pytest.raises(workshop.WorkshopError, match="^name: participant dl-01 would be the "
                       "local user dl-01 of this host"):
        workshop.create(workshop.plan("dl", "2", "now", "1", "1", lab), lab, Path("/nonexistent"))
    assert "dl" not in state.accounts and "cn=dl,ou=groups,dc=lab,dc=pyhpc" not in fake_ldap.entries


def test_a_workshop_of_before_markers_is_still_deleted_but_not_its_unmarked_qos(
        state, lab, fake_ldap) -> None:
    """Accounts of earlier pyhpc (organization pyhpc-workshop) are recognised; their QOS and
    reservation carried no marker then, so they are left alone and reported."""
    state.accounts["old"] = ("pyhpc-workshop", "workshop old")
    state.qos["old"] = "old"
    state.reservations["old"] = "(null)"
    state.assocs.add(("old", "old-01"))
    directory_sync.add_members(workshop.directory_of(lab), "old", ["old-01"],
                               owner.workshop("old"), {"old-01": "pw"})
    done = workshop.delete("old", lab)
    assert done["account_deleted"] and done["users_deleted"] == ["old-01"]
    assert done["left_alone"] == ["Slurm QOS old", "reservation old"]
    assert state.qos["old"] == "old" and "old" in state.reservations


def test_from_100_participants_on_names_have_three_digits(lab) -> None:
    p = workshop.plan("vt", "200", "now", "8", "1", lab)
    assert (p.participants[0], p.participants[99], p.participants[-1]) == (
        "vt-001", "vt-100", "vt-200")
    assert workshop.plan("vt", "99", "now", "8", "1", lab).participants[-1] == "vt-99"
    with pytest.raises(workshop.WorkshopError, match=r"^name: 'a{28}' is longer than 27 "
                       r"characters, and 100 participants are NAME-001 to NAME-NNN$"):
        workshop.plan("a" * 28, "100", "now", "8", "1", lab)


def test_the_sheet_and_the_readme_give_the_terminal_steps_beside_the_hubs(lab) -> None:
    from pyhpc.admin import workshop_sheet as sheet

    p = workshop.plan("dl", "1", "now", "1", "1", lab, partition="gpu")
    rows = sheet.sheet_rows(p, {"dl-01": "pw"}, "login.lab", "https://login.lab:8000/")
    terminal = ["1. ssh dl-01@login.lab",
                "2. pyhpc train --partition gpu --nodes 1 --epochs 1 --out run1 --wait",
                "3. pyhpc report run1"]
    hub = ["1. open https://login.lab:8000/ and log in (the same user and password)",
           "2. Start My Server (it starts in the reservation)",
           "3. open workshop/01-hello-cluster.ipynb and run it"]
    for text in (sheet.page(p, rows), sheet.readme(p, "dl-01", "login.lab",
                                                   "https://login.lab:8000/")):
        lines = [line.strip() for line in text.splitlines()]
        start = lines.index("from a terminal:")
        assert lines[start + 1:start + 8] == [*terminal, "from the hub:", *hub]
    assert "pw" not in sheet.readme(p, "dl-01", "login.lab")
    on_default = workshop.plan("dl", "1", "now", "1", "1", lab)
    assert "pyhpc train --nodes 1" in sheet.readme(on_default, "dl-01", "login.lab")


def test_create_asks_slurm_the_same_few_questions_for_200_participants_as_for_2(
        state, lab, tmp_path: Path, fake_slurm) -> None:
    """A day-one workshop: Slurm's calls do not grow with the participants (one sacctmgr
    call a participant made a second create of 200 take 38 s on the lab)."""
    counts = []
    for name, count in (("small", "2"), ("big", "200")):
        fake_slurm.calls.clear()
        workshop.create(workshop.plan(name, count, "now", "1", "1", lab), lab, tmp_path / name)
        counts.append(len(fake_slurm.calls))
    assert counts[0] == counts[1] and counts[1] < 15, counts
