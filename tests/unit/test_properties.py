"""Property-based tests (Hypothesis, derandomized, fixed budget): whatever a definition or
a ``--set`` value holds, what pyhpc renders has exactly the intended shape."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_slurm_templates import context
from test_slurm_templates import render as render_conf

from pyhpc import cluster, paths
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
FAKE = ('#!/bin/sh\nn=$(ls "$PYHPC_FAKE_DIR" | wc -l)\n'
        'printf "%s\\0" "$@" > "$PYHPC_FAKE_DIR/$n-$(basename "$0")"\n')


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
             ("ddp-srun", {"module": "m", "args": value}, "args"),
             ("ddp-srun", {"module": "m", "python": value}, "python"),
             ("array", {"command": "echo", "values": value}, "values")]
    for template, values, key in cases:
        try:
            text = render.render(template, values, lab)
        except PyhpcError as exc:
            assert str(exc).startswith(f"{key}") and "\n" not in str(exc)
            continue
        calls = run_script(text, fake_bin, tmp_path)
        # Exactly the intended programs ran (scontrol only to find the rendezvous host).
        expected = ["scontrol", "srun"] if template == "ddp-srun" else ["echo"]
        assert calls == expected, (template, key, value, calls)
        assert sorted(p for p in os.listdir(tmp_path) if p not in ("job.sh", "calls")) == \
            [p for p in before if p not in ("job.sh", "calls")]
