"""Property-based tests (Hypothesis, derandomized, fixed budget): whatever a definition or
a ``--set`` value holds, what pyhpc renders has exactly the intended shape; no word Slurm
reserves passes, in any case; a workshop changes only what carries its own marker."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_slurm_templates import context
from test_slurm_templates import render as render_conf
from test_workshop import SlurmState

from pyhpc import cluster, paths, validate
from pyhpc.admin import directory_sync, owner, workshop
from pyhpc.errors import PyhpcError
from pyhpc.slurm import render

BUDGET = settings(max_examples=80, derandomize=True, database=None, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow])
#: Text a hostile or careless user types: shell and config syntax, newlines, unicode.
NASTY = st.text(alphabet=st.sampled_from(list("ab1-_ .,:;=$`'\"\\\n\r\t#%*&|<>()[]{}/~é")) |
                st.characters(), max_size=24)
NAMES = st.one_of(st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True), NASTY)


@st.composite
def definitions(draw: Any) -> dict[str, Any]:
    groups = draw(st.lists(st.fixed_dictionaries({
        "name": NAMES, "cpus": st.integers(-1, 5000), "memory_mb": st.integers(0, 4096),
    }, optional={"count": st.integers(0, 3), "gpus": st.integers(0, 20), "gpu_type": NAMES}),
        min_size=1, max_size=3))
    names = [g["name"] + (str(k) if "count" in g else "") for g in groups
             for k in range(1, (g.get("count") or 1) + 1)]
    parts = draw(st.lists(st.fixed_dictionaries({
        "name": NAMES, "nodes": st.lists(st.sampled_from(names) | NAMES, min_size=1, max_size=3),
    }, optional={"max_time": st.sampled_from(["1-00:00:00", "UNLIMITED", "60", "1:00:00\n"])}),
        min_size=1, max_size=3))
    accounts = draw(st.lists(st.fixed_dictionaries({"name": NAMES},
                                                   optional={"users": st.lists(NAMES, max_size=3)}),
                             max_size=3))
    return {"name": draw(NAMES), "mode": "hosts", "nodes": groups, "partitions": parts,
            "accounts": accounts}


@BUDGET
@given(definitions())
def test_any_accepted_definition_renders_each_name_once_on_its_own_line(data) -> None:
    try:
        spec = cluster.parse(data)
    except cluster.ConfigError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 600
        return
    ctx = context("example")
    ctx["slurm_cluster"] = spec.to_dict()
    conf = render_conf("slurm.conf", ctx)
    gres = render_conf("gres.conf", ctx)
    nodes = re.findall(r"^NodeName=(\S+) ", conf, re.M)
    assert sorted(nodes) == sorted(n.name for n in spec.nodes)
    partitions = re.findall(r"^PartitionName=(\S+) ", conf, re.M)
    assert sorted(partitions) == sorted(p.name for p in spec.partitions)
    for line in (conf + gres).splitlines():
        assert line == "" or line.startswith("#") or re.match(r"[A-Z][A-Za-z]*=", line), line
    gpu_nodes = {n.name for n in spec.nodes if n.gpus}
    assert set(re.findall(r"^NodeName=(\S+) ", gres, re.M)) == gpu_nodes


#: Stand-ins that run nothing: each call leaves a file N-TOOL holding its arguments.
#: Records its call; as the job's store host (``--store``) it also prints a port.
FAKE = ('#!/bin/sh\nn=$(ls "$PYHPC_FAKE_DIR" | wc -l)\n'
        'printf "%s\\0" "$@" > "$PYHPC_FAKE_DIR/$n-$(basename "$0")"\n'
        'for last; do :; done; [ "$last" = --store ] && echo 40000\nexit 0\n')


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory) -> Path:
    bin_dir = tmp_path_factory.mktemp("fake-bin")
    for tool in ("srun", "python", "echo", "scontrol", "hostname", "sleep"):
        (bin_dir / tool).write_text(FAKE)
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def run_script(text: str, fake_bin: Path, tmp: Path) -> list[str]:
    script = tmp / "job.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    calls = tmp / "calls"
    subprocess.run(["rm", "-rf", str(calls)], check=True)
    calls.mkdir()
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "PYHPC_FAKE_DIR": str(calls), "HOME": str(tmp),
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "cpu1", "SLURM_NTASKS": "1",
           "SLURMD_NODENAME": "cpu1",
           "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "7"}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          cwd=tmp, timeout=20)
    assert proc.returncode == 0, proc.stderr
    made = sorted(os.listdir(calls), key=lambda n: int(n.split("-", 1)[0]))
    return [n.split("-", 1)[1] for n in made]


@BUDGET
@given(value=NASTY)
def test_any_set_value_runs_only_the_intended_command(value: str, fake_bin: Path,
                                                      tmp_path: Path) -> None:
    lab = cluster.load(paths.LAB_CLUSTER)
    before = sorted(os.listdir(tmp_path))
    cases = [("single", {"command": f"echo {value}"}, "command"),
             ("single", {"command": "echo x", "job_name": value}, "job_name"),
             ("single", {"command": "echo x", "array": value}, "array"),
             ("ddp-srun", {"module": "m", "args": value, "python": str(fake_bin / "python")},
              "args"),
             ("ddp-srun", {"module": "m", "python": value}, "python"),
             ("array", {"command": "echo", "values": value}, "values")]
    for template, values, key in cases:
        try:
            text = render.render(template, values, lab)
        except PyhpcError as exc:
            assert str(exc).startswith(f"{key}") and "\n" not in str(exc)
            continue
        if key == "python":
            # The batch script runs the named Python itself (the job's store): as one word.
            assert f"exec {render.q(value)} -P -c " in text, text
            continue
        calls = run_script(text, fake_bin, tmp_path)
        # Exactly the intended programs ran (the job's Python, to host its store, and srun).
        expected = ["python", "srun"] if template == "ddp-srun" else ["echo"]
        assert calls == expected, (template, key, value, calls)
        assert sorted(p for p in os.listdir(tmp_path) if p not in ("job.sh", "calls")) == \
            [p for p in before if p not in ("job.sh", "calls")]


# -- issue 22: reserved words, in any case, and ownership markers ---------------------------

#: Where each field of the validator's reserved words sits in a definition.
FIELD_PATHS = {"node": ("nodes", 0, "name"), "partition": ("partitions", 0, "name"),
               "account": ("accounts", 0, "name"), "cluster": ("name",),
               "gres_type": ("nodes", 1, "gpu_type")}


@st.composite
def reserved_in_any_case(draw: Any) -> tuple[str, str]:
    field = draw(st.sampled_from(sorted(validate.RESERVED)))
    word = draw(st.sampled_from(sorted(validate.RESERVED[field])))
    upper = draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    return field, "".join(c.upper() if u else c for c, u in zip(word, upper, strict=True))


@BUDGET
@given(reserved_in_any_case())
def test_a_reserved_word_in_any_case_is_refused_in_its_field(case: tuple[str, str]) -> None:
    field, word = case
    data = yaml.safe_load(paths.LAB_CLUSTER.read_text())
    data["nodes"][0].pop("count")  # nodes[0] names one node, not a prefix
    data["partitions"][0]["nodes"] = [word if field == "node" else "cpu"]
    data["partitions"][1]["nodes"] = ["gpu1", "gpu2"]
    *parents, last = FIELD_PATHS[field]
    target = data
    for key in parents:
        target = target[key]
    target[last] = word
    with pytest.raises(cluster.ConfigError) as exc:
        cluster.parse(data, 24 * 1024)
    where = ".".join(str(p) for p in FIELD_PATHS[field]).replace(".0.", "[0].").replace(".1.", "[1].")
    assert str(exc.value).startswith(f"{where}: {word!r} is a word Slurm reserves in {field}")
    assert "\n" not in str(exc.value)


@BUDGET
@given(definitions())
def test_no_accepted_definition_holds_a_reserved_word_in_any_case(data) -> None:
    try:
        spec = cluster.parse(data)
    except cluster.ConfigError:
        return
    names = {"node": [n.name for n in spec.nodes], "partition": [p.name for p in spec.partitions],
             "account": [a.name for a in spec.accounts], "cluster": [spec.name],
             "gres_type": [n.gpu_type for n in spec.nodes if n.gpu_type]}
    for field, words in names.items():
        assert not {w.casefold() for w in words} & set(validate.RESERVED[field]), (field, words)


#: Markers an object of the workshop's name may carry: its own, near misses, anything.
MARKERS = st.one_of(st.just("pyhpc: workshop dl"),
                    st.sampled_from(["", "pyhpc: workshop dl ", "pyhpc: workshop d", "dl",
                                     "pyhpc: workshop dl2", "PYHPC: WORKSHOP DL", "pyhpc",
                                     "pyhpc: cluster.yml", "pyhpc-workshop"]),
                    NASTY)


@BUDGET
@given(qos=st.none() | MARKERS, account=st.none() | MARKERS, reservation=st.none() | st.booleans(),
       group=st.none() | MARKERS)
def test_create_changes_nothing_unless_everything_of_its_name_carries_its_marker(
        qos, account, reservation, group, fake_slurm, fake_ldap, monkeypatch,
        tmp_path_factory) -> None:
    """Whatever QOS, account, reservation and group of the workshop's name exist, with
    whatever markers: create proceeds only if each carries the workshop's own, and else
    refuses in one line having changed nothing."""
    state, lab = _fresh(fake_slurm, fake_ldap, monkeypatch)
    if qos is not None:
        state.qos["dl"] = qos
    if account is not None:
        state.accounts["dl"] = ("pyhpc", account)
    if reservation is not None:  # True: it admits the account dl (the workshop's marker)
        state.reservations["dl"] = "dl" if reservation else "(null)"
    if group is not None:
        fake_ldap.entries["cn=dl,ou=groups,dc=lab,dc=pyhpc"] = {
            "objectClass": ["posixGroup"], "cn": ["dl"], "gidNumber": ["25000"],
            "description": [group]}
    mark = owner.workshop("dl")
    ours = (qos in (None, mark) and account in (None, mark) and group in (None, mark)
            and (reservation is None or (reservation and account == mark)))
    before = (dict(state.qos), dict(state.accounts), dict(state.reservations),
              {dn: dict(e) for dn, e in fake_ldap.entries.items()})
    fake_slurm.calls.clear()
    plan = workshop.plan("dl", "2", "now", "1", "1", lab)
    try:
        workshop.create(plan, lab, tmp_path_factory.mktemp("sheet"))
    except owner.OwnershipError as exc:
        assert not ours and "\n" not in str(exc) and str(exc).startswith("name: ")
        assert (dict(state.qos), dict(state.accounts), dict(state.reservations),
                {dn: dict(e) for dn, e in fake_ldap.entries.items()}) == before
        assert not [c for c in fake_slurm.calls if c[:2] in (["sacctmgr", "--immediate"],
                                                              ["scontrol", "create"])]
        return
    assert ours
    assert state.qos["dl"] == state.accounts["dl"][1] == mark and state.reservations["dl"] == "dl"


@BUDGET
@given(qos=st.none() | MARKERS, reservation=st.none() | st.booleans(),
       organization=st.sampled_from(["pyhpc", "pyhpc-workshop", "physics", ""]),
       description=MARKERS)
def test_delete_touches_only_what_carries_the_workshops_marker(
        qos, reservation, organization, description, fake_slurm, fake_ldap, monkeypatch) -> None:
    state, lab = _fresh(fake_slurm, fake_ldap, monkeypatch)
    state.accounts["dl"] = (organization, description)
    state.assocs.add(("dl", "dl-01"))
    state.jobs = {"5": ("dl-01", "dl"), "6": ("user1", "lab")}
    if qos is not None:
        state.qos["dl"] = qos
    if reservation is not None:
        state.reservations["dl"] = "dl" if reservation else "(null)"
    mark = owner.workshop("dl")
    account_ours = owner.account_marker("dl", organization, description) == mark
    try:
        workshop.delete("dl", lab)
    except owner.OwnershipError as exc:
        assert not account_ours and "\n" not in str(exc)
        assert state.accounts["dl"] == (organization, description) and set(state.jobs) == {"5", "6"}
        assert ("dl" in state.qos) == (qos is not None)
        return
    assert account_ours and "dl" not in state.accounts and set(state.jobs) == {"6"}
    assert ("dl" in state.qos) == (qos is not None and qos != mark)
    assert ("dl" in state.reservations) == (reservation is False)
    assert state.assocs == {("lab", "root"), ("lab", "user1")}


def _fresh(fake_slurm, fake_ldap, monkeypatch) -> tuple[SlurmState, cluster.Cluster]:
    """A new lab Slurm and directory for one example (the fixtures live across examples)."""
    lab = cluster.load(paths.LAB_CLUSTER)
    monkeypatch.setenv("PYHPC_CLUSTER", str(paths.LAB_CLUSTER))
    state = SlurmState()
    fake_slurm.answers.update({"sacctmgr": state.sacctmgr, "scontrol": state.scontrol,
                               "squeue": state.squeue, "scancel": state.scancel})
    fake_ldap.entries.clear()
    fake_ldap.entries["dc=lab,dc=pyhpc"] = {"objectClass": ["dcObject"]}
    directory_sync.sync(workshop.directory_of(lab), lab.accounts)
    return state, lab
