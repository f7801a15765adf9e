"""The slurm role's accounts tasks, run on this machine against a stand-in sacctmgr: the
definition's accounts carry pyhpc's marker, accounts of before markers are marked, an
account of the definition's name that someone else made stops the deploy before any
change, per-user limits are set, and a second run changes nothing.

The stand-in answers as Slurm 22.05's sacctmgr did on the lab (parsable2 rows; GrpTRES
shown sorted, ``gres/gpu=4,node=2``; ``-1`` clears a limit to an empty field).
The lab test (tests/integration/test_ownership.py) checks the real accounts after a deploy.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

# pytest puts tests/unit on sys.path (no package).
from roleplay import ANSIBLE, extra, results, run_playbook

from pyhpc import cluster, paths
from pyhpc.admin import owner

FAKE = r'''#!/usr/bin/env python3
import json, os, sys
path = os.environ["FAKE_SACCTMGR_STATE"]
state = json.load(open(path))
args = [a for a in sys.argv[1:] if not a.startswith("--")]
state["calls"].append(args)
verb, entity, rest = args[0], args[1], args[2:]
kv = {}
for a in rest:
    if "=" in a:
        k, v = a.split("=", 1)
        kv.setdefault(k.lower(), v)
def limits(a):
    tres = ",".join(sorted(f"{k}={v}" for k, v in a["grptres"].items()))
    return f"{a['maxjobs']}|{a['maxsubmit']}|{tres}"
if verb == "show" and entity == "cluster":
    print("\n".join(state["clusters"]))
elif verb == "show" and entity == "tres":
    # Known once slurmctld has registered AccountingStorageTRES (a fresh database has none).
    state["tres_asks"] = state.get("tres_asks", 0) + 1
    if state["tres_asks"] > state.get("tres_after", 0):
        print("1001")
elif verb == "show" and entity == "account":
    for name, (org, desc) in sorted(state["accounts"].items()):
        print(f"{name}|{org}|{desc}")
elif verb == "show" and entity == "associations":
    for a in state["assocs"]:
        print(f"{a['account']}|{a['user']}|{limits(a)}")
elif verb == "add" and entity == "cluster":
    state["clusters"].append(kv["name"])
elif verb == "add" and entity == "account":
    state["accounts"][kv["name"]] = [kv["organization"], kv["description"].lower()]
    state["assocs"].append({"account": kv["name"], "user": "", "maxjobs": "", "maxsubmit": "",
                            "grptres": {}})
elif verb == "modify" and entity == "account":
    state["accounts"][kv["name"]] = [kv["organization"], kv["description"].lower()]
elif verb == "add" and entity == "user":
    state["assocs"].append({"account": kv["account"], "user": kv["name"], "maxjobs": "",
                            "maxsubmit": "", "grptres": {}})
elif verb == "modify" and entity == "user":
    for a in state["assocs"]:
        if (a["account"], a["user"]) == (kv["account"], kv["name"]):
            a["maxjobs"] = "" if kv["maxjobs"] == "-1" else kv["maxjobs"]
            a["maxsubmit"] = "" if kv["maxsubmitjobs"] == "-1" else kv["maxsubmitjobs"]
            for item in kv["grptres"].split(","):
                k, v = item.split("=")
                a["grptres"].pop(k, None) if v == "-1" else a["grptres"].__setitem__(k, v)
elif verb == "delete" and entity == "user":
    state["assocs"] = [a for a in state["assocs"]
                       if (a["account"], a["user"]) != (kv["account"], kv["name"])]
json.dump(state, open(path, "w"))
'''
PLAYBOOK = """\
- name: Register the definition's accounts
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Run the slurm role's accounts tasks
      ansible.builtin.include_role:
        name: slurm
        tasks_from: accounts
    # As controller.yml does, once slurmctld has started.
    - name: Run the slurm role's per-user limits tasks
      ansible.builtin.include_role:
        name: slurm
        tasks_from: account-limits
"""


def definition(**limits: int) -> dict[str, Any]:
    data = yaml.safe_load(paths.LAB_CLUSTER.read_text())
    data["accounts"] = data["accounts"][:1]  # lab: root, user1, user2
    if limits:
        data["accounts"][0]["limits"] = limits
    return cluster.parse(data, 24 * 1024).to_dict()


class Slurmdbd:
    """The stand-in's state file, and a run of the tasks against it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "state.json"
        self.save({"clusters": ["lab"], "accounts": {"root": ["root", "default root account"]},
                   "assocs": [], "calls": []})
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        (bin_dir / "sacctmgr").write_text(FAKE)
        (bin_dir / "sacctmgr").chmod(0o755)
        (tmp / "play.yml").write_text(PLAYBOOK)
        (tmp / "hosts").write_text("localhost ansible_connection=local"
                                   " ansible_python_interpreter=/usr/bin/python3\n")
        self.env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SACCTMGR_STATE": str(self.state)}

    def load(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.state.read_text())
        return data

    def save(self, data: dict[str, Any]) -> None:
        self.state.write_text(json.dumps(data))

    def deploy(self, spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        data = self.load()
        data["calls"] = []
        self.save(data)
        old = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            proc, report = run_playbook(self.tmp / "hosts", self.tmp / "play.yml",
                                        *extra(slurm_cluster=spec))
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        return proc.returncode, report

    def changes(self) -> list[list[str]]:
        return [c for c in self.load()["calls"] if c[0] != "show"]


@pytest.fixture
def dbd(tmp_path: Path) -> Slurmdbd:
    return Slurmdbd(tmp_path)


def test_the_role_keeps_pyhpcs_marker_in_step_with_owner() -> None:
    role_vars = yaml.safe_load((ANSIBLE / "roles" / "slurm" / "vars" / "main.yml").read_text())
    assert role_vars["slurm_account_organization"] == owner.ORGANIZATION
    assert role_vars["slurm_account_marker"] == owner.DEFINITION == owner.DEFINITION.lower()


def test_new_accounts_carry_the_marker_and_a_second_run_changes_nothing(dbd: Slurmdbd) -> None:
    code, _ = dbd.deploy(definition())
    state = dbd.load()
    assert code == 0 and state["accounts"]["lab"] == ["pyhpc", "pyhpc: cluster.yml"]
    assert {(a["account"], a["user"]) for a in state["assocs"]} == {
        ("lab", ""), ("lab", "root"), ("lab", "user1"), ("lab", "user2")}
    code, report = dbd.deploy(definition())
    assert code == 0 and report["stats"]["localhost"]["changed"] == 0 and dbd.changes() == []


def test_an_account_of_before_markers_is_marked_and_nothing_else_changes(dbd: Slurmdbd) -> None:
    data = dbd.load()
    data["accounts"]["lab"] = ["lab", "lab"]  # what `sacctmgr add account lab` alone gives
    data["assocs"] = [{"account": "lab", "user": u, "maxjobs": "", "maxsubmit": "",
                       "grptres": {}} for u in ("", "root", "user1", "user2")]
    dbd.save(data)
    code, _ = dbd.deploy(definition())
    assert code == 0 and dbd.load()["accounts"]["lab"] == ["pyhpc", "pyhpc: cluster.yml"]
    assert dbd.changes() == [["modify", "account", "where", "name=lab", "set",
                              "Organization=pyhpc", "Description=pyhpc: cluster.yml"]]


def test_an_account_someone_else_made_stops_the_deploy_before_any_change(dbd: Slurmdbd) -> None:
    data = dbd.load()
    data["accounts"]["lab"] = ["physics", "the physics group"]
    data["assocs"] = [{"account": "lab", "user": u, "maxjobs": "", "maxsubmit": "",
                       "grptres": {}} for u in ("", "prof")]
    dbd.save(data)
    code, report = dbd.deploy(definition())
    failed = [r for r in results(report).values() if r.get("failed")]
    assert code != 0 and len(failed) == 1
    assert failed[0]["msg"].startswith("accounts: Slurm account lab exists and is not pyhpc's")
    assert failed[0]["msg"].endswith("nothing was changed") and "\n" not in failed[0]["msg"]
    assert dbd.changes() == [] and dbd.load()["accounts"]["lab"] == ["physics", "the physics group"]


def test_per_user_limits_are_set_changed_and_cleared_once_each(dbd: Slurmdbd) -> None:
    code, _ = dbd.deploy(definition(jobs=4, submitted_jobs=20, nodes=2, gpus=0))
    rows = {a["user"]: a for a in dbd.load()["assocs"]}
    assert code == 0 and (rows["user1"]["maxjobs"], rows["user1"]["maxsubmit"],
                          rows["user1"]["grptres"]) == ("4", "20", {"node": "2", "gres/gpu": "0"})
    code, report = dbd.deploy(definition(jobs=4, submitted_jobs=20, nodes=2, gpus=0))
    assert report["stats"]["localhost"]["changed"] == 0
    dbd.deploy(definition(jobs=2))
    rows = {a["user"]: a for a in dbd.load()["assocs"]}
    assert (rows["user2"]["maxjobs"], rows["user2"]["maxsubmit"], rows["user2"]["grptres"]) == (
        "2", "", {})
    assert len(dbd.changes()) == 3  # root, user1, user2: each once
    code, report = dbd.deploy(definition())
    assert all(a["maxjobs"] == "" for a in dbd.load()["assocs"])
    assert dbd.deploy(definition())[1]["stats"]["localhost"]["changed"] == 0


def test_limits_wait_until_slurmctld_has_registered_the_gpu_tres(dbd: Slurmdbd) -> None:
    """A fresh database knows no gres/gpu until slurmctld's first start registers it:
    sacctmgr refused the limit there (a new machine's first deploy). The task waits."""
    data = dbd.load()
    data["tres_after"] = 2  # the first two asks find none
    dbd.save(data)
    code, _ = dbd.deploy(definition(gpus=1))
    state = dbd.load()
    assert code == 0 and state["tres_asks"] == 3
    assert {a["user"]: a["grptres"] for a in state["assocs"] if a["user"]}["user1"] == {"gres/gpu": "1"}


def test_no_wait_for_the_tres_when_every_limit_already_holds(dbd: Slurmdbd) -> None:
    dbd.deploy(definition(gpus=1))
    data = dbd.load()
    data["tres_asks"], data["tres_after"] = 0, 99  # a wait now would fail the run
    dbd.save(data)
    code, report = dbd.deploy(definition(gpus=1))
    assert code == 0 and report["stats"]["localhost"]["changed"] == 0
    assert dbd.load()["tres_asks"] == 0
