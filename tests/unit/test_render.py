"""Job templates: golden files, quoting, strict variables, resource checks, extends."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpc import cluster, paths
from pyhpc.slurm import render
from pyhpc.slurm.jobspec import JobSpecError

HOSTILE = 'x"; touch /tmp/pwned; #'
#: One rendering per shipped template, compared with tests/golden/jobs/<name>.sbatch.
CASES = {
    "single": {"command": "python -c 'print(42)'"},
    "node-gpus": {"module": "pyhpc.train", "args": "--out run --epochs 2", "partition": "gpu",
                  "gpus_per_node": "2"},
    "ddp-srun": {"module": "pyhpc.train", "args": "--out run --epochs 2", "nodes": "2"},
    "torchrun": {"script": "train.py", "args": "--lr 0.1", "nodes": "2"},
    "array": {"command": "python sweep.py --lr", "values": "0.1,0.01,0.001", "concurrency": "2"},
    "jupyter": {"port": "8899"},
}


def test_every_shipped_template_has_a_golden_case() -> None:
    mine = set(CASES)
    assert mine <= set(render.available())


@pytest.mark.parametrize("name", sorted(CASES))
def test_template_renders_to_its_golden_file(name: str, lab: cluster.Cluster, golden) -> None:
    golden.check(f"jobs/{name}.sbatch", render.render(name, CASES[name], lab))


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendering_is_deterministic_and_sbatch_lines_sorted(name: str, lab: cluster.Cluster) -> None:
    first = render.render(name, CASES[name], lab)
    assert first == render.render(name, dict(reversed(list(CASES[name].items()))), lab)
    keys = [m.group(1) for m in re.finditer(r"^#SBATCH --([\w-]+)", first, re.M)]
    assert keys == sorted(keys) and keys
    assert first.startswith("#!/bin/bash\n# pyhpc template")


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_script_is_valid_bash(name: str, lab: cluster.Cluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(render.render(name, CASES[name], lab))
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_job_name_is_refused_by_every_template(name: str, lab: cluster.Cluster) -> None:
    with pytest.raises(render.RenderError, match=r"^job_name: .* is not allowed; use letters"):
        render.render(name, {**CASES[name], "job_name": HOSTILE}, lab)


def test_hostile_values_run_inert(lab: cluster.Cluster, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = f'x"; touch {marker}; #'
    text = render.render("array", {"command": f"echo $(touch {marker})",
                                   "values": f"1,$(touch {marker}),';touch {marker};'",
                                   "output": "x-%A.out"}, lab)
    assert hostile
    script = tmp_path / "job.sh"
    script.write_text(text)
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_JOB_ID": "7"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True)
    assert not marker.exists()
    assert f"$(touch {marker})" in out.stdout


def test_unknown_variable_is_named(lab: cluster.Cluster) -> None:
    with pytest.raises(render.RenderError, match=r"^colour: unknown variable .*allowed: .*command"):
        render.render("single", {"command": "true", "colour": "red"}, lab)


def test_missing_variable_is_named(lab: cluster.Cluster) -> None:
    with pytest.raises(render.RenderError, match=r"^command: missing variable .*--set command="):
        render.render("single", {}, lab)


def test_unknown_template_lists_the_available_ones(lab: cluster.Cluster) -> None:
    with pytest.raises(render.RenderError, match=r"template: unknown template 'nope'; available: .*ddp-srun"):
        render.render("nope", {}, lab)


@pytest.mark.parametrize(("values", "message"), [
    ({"nodes": "0"}, r"^nodes: must be an integer from 1 to 4096, got '0'"),
    ({"nodes": "3"}, r"^nodes: partition 'cpu' has 2 nodes, 3 requested"),
    ({"partition": "bigmem"}, r"^partition: unknown partition 'bigmem'; allowed: cpu, gpu"),
    ({"gpus_per_node": "1"}, r"^gpus_per_node: partition 'cpu' has 0 GPUs .*partitions with GPUs: gpu"),
    ({"partition": "gpu", "gpus_per_node": "4"}, r"^gpus_per_node: partition 'gpu' has 2 GPUs"),
    ({"time": "99-00:00:00"}, r"^time: 99-00:00:00 is longer than partition 'cpu' allows"),
])
def test_bad_resource_request_is_named(values: dict, message: str, lab: cluster.Cluster) -> None:
    with pytest.raises((JobSpecError, render.RenderError), match=message):
        render.render("ddp-srun", {"module": "m", **values}, lab)


@pytest.mark.parametrize("name", ["single", "node-gpus", "ddp-srun", "torchrun"])
def test_array_adds_exactly_one_sorted_sbatch_line(name: str, lab: cluster.Cluster) -> None:
    plain = render.render(name, CASES[name], lab)
    text = render.render(name, {**CASES[name], "array": "0-999%50"}, lab)
    added = [line for line in text.splitlines() if line not in plain.splitlines()]
    assert added == ["#SBATCH --array=0-999%50"]
    assert text.replace("#SBATCH --array=0-999%50\n", "") == plain
    keys = [m.group(1) for m in re.finditer(r"^#SBATCH --([\w-]+)", text, re.M)]
    assert keys == sorted(keys)


@pytest.mark.parametrize("spec", ["-1", "5-2", "0-9;rm", "0-9\n#SBATCH --uid=0", "", "1%0"])
def test_bad_array_variable_is_refused_naming_array(spec: str, lab: cluster.Cluster) -> None:
    with pytest.raises(render.RenderError, match=r"^array: "):
        render.render("single", {"command": "true", "array": spec}, lab)


def test_array_template_keeps_its_own_array(lab: cluster.Cluster) -> None:
    with pytest.raises(render.RenderError, match=r"^array: unknown variable for template"):
        render.render("array", {**CASES["array"], "array": "0-9"}, lab)


def test_gpu_request_on_a_cluster_without_gpus_is_refused() -> None:
    cpu_only = cluster.parse({"name": "c", "nodes": [{"name": "n", "count": 2, "cpus": 2,
                                                      "memory_mb": 100}],
                              "partitions": [{"name": "all", "nodes": ["n1", "n2"]}],
                              "monitoring": {"listen": "10.0.0.0/16"}})
    with pytest.raises(JobSpecError, match=r"gpus_per_node: .*this cluster has no GPUs"):
        render.render("single", {"command": "true", "gpus_per_node": "1"}, cpu_only)


def test_newline_in_an_sbatch_value_is_refused(lab: cluster.Cluster) -> None:
    with pytest.raises(render.RenderError, match=r"^job_name: control characters"):
        render.render("single", {"command": "true", "job_name": "a\n#SBATCH --x"}, lab)


def test_every_printed_value_is_quoted_even_without_the_filter(lab: cluster.Cluster,
                                                               tmp_path: Path) -> None:
    (tmp_path / "t.sbatch.j2").write_text("echo {{ x }} {{ y|q }}\n")
    assert render.render(str(tmp_path / "t.sbatch.j2"), {"x": "a b", "y": "$(c)"}, lab) == \
        "echo 'a b' '$(c)'\n"


def test_container_hook_extends_the_srun_template(lab: cluster.Cluster, tmp_path: Path) -> None:
    child = tmp_path / "container.sbatch.j2"
    child.write_text('{% extends "ddp-srun.sbatch.j2" %}\n'
                     '{% block launch_prefix %}podman run --rm {{ image|q }} {% endblock %}\n')
    env = render.environment(lab, child, child.read_text())
    assert "image" in render.variables(env, str(child))
    text = render.render(str(child), {"module": "pyhpc.train", "image": "lab/torch:1"}, lab)
    assert re.search(r"^srun --kill-on-bad-exit=1 podman run --rm lab/torch:1 "
                     r"/opt/pyhpc/venv/bin/python -P -c \"\$PYHPC_LAUNCH\" -m pyhpc.train$", text, re.M)


def test_srun_template_has_the_launch_prefix_block_before_python() -> None:
    source = (paths.SLURM_JOBS / "ddp-srun.sbatch.j2").read_text()
    assert re.search(r"^srun .*\{% block launch_prefix %\}\{% endblock %\}\{\{ python", source, re.M)


def test_the_rendezvous_port_is_one_the_jobs_store_already_holds(lab: cluster.Cluster) -> None:
    """The batch script learns MASTER_PORT from its store, which bound it first (a port the
    kernel chose, not one derived from the job id that another user could bind before)."""
    pytest.importorskip("torch")
    text = render.render("ddp-srun", {"module": "m", "python": sys.executable}, lab)
    end = text.index("export MASTER_PORT\n") + len("export MASTER_PORT\n")
    block = text[text.index("PYHPC_LAUNCH="):end]
    check = ('python3 -c "import socket, sys; s = socket.socket(); '
             's.bind((\'127.0.0.1\', int(sys.argv[1])))" "$MASTER_PORT" 2>&1 || true; '
             'echo "port=$MASTER_PORT"')
    out = subprocess.run(["bash", "-c", "set -euo pipefail\n" + block + check],
                         env={**os.environ, "SLURM_JOB_ID": "1001", "SLURMD_NODENAME": "localhost"},
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert "Address already in use" in out, out
    assert 1024 <= int(out.split("port=")[1]) < 65536, out


def test_parse_sets_needs_key_and_value() -> None:
    assert render.parse_sets(["a=1", "job-name=x=y"]) == {"a": "1", "job_name": "x=y"}
    with pytest.raises(render.RenderError, match=r"^--set: expected KEY=VALUE, got 'oops'"):
        render.parse_sets(["oops"])
