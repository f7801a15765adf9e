"""``pyhpc doctor --gpus [--drain]`` from faked Slurm answers (pyhpc.slurm's one RUNNER).

Slurm's view is ``scontrol show node -o``; each GPU node's view is the PYHPC_GPUCHECK line
its srun step prints (faked here; tests/unit/test_gpucheck.py runs the module itself).
The lab run is tests/integration/test_doctor_gpus.py.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from pyhpc.admin import doctor, gpucheck
from pyhpc.cli import main as cli
from pyhpc.slurm import slurm

NODE = ("NodeName={name} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 Gres={gres} NodeAddr=127.0.0.1 "
        "State={state} Partitions={part} OS=Linux 6.1 #1 SMP ExtSensorsTemp=n/s")
LAB = {"cpu1": ("(null)", "IDLE", "cpu"), "cpu2": ("(null)", "IDLE", "cpu"),
       "gpu1": ("gpu:lab:2", "IDLE", "gpu"), "gpu2": ("gpu:lab:2", "IDLE", "gpu")}


def report(node: str, seen: int = 2, **fields: Any) -> str:
    data = {"node": node, "seen": seen, "seen_source": "device files in /etc/slurm/gres.conf",
            "visible": "0,1", "matmul": "pass", "matmul_detail": "cpu (no CUDA here): ok",
            "dcgm": "absent", "dcgm_detail": "dcgmi not installed", **fields}
    return f"some other output\n{gpucheck.MARK} {json.dumps(data)}\n"


@pytest.fixture
def cluster(fake_slurm):
    """The lab as Slurm shows it; ``cluster.seen[node]`` is what that node's step reports."""
    nodes = dict(LAB)
    seen: dict[str, Any] = {"gpu1": report("gpu1"), "gpu2": report("gpu2")}

    def scontrol(argv: list[str]) -> tuple[int, str]:
        if argv[1:3] == ["show", "node"]:
            return 0, "".join(NODE.format(name=n, gres=g, state=s, part=p) + "\n"
                              for n, (g, s, p) in nodes.items())
        return 0, ""

    def srun(argv: list[str]) -> tuple[int, str] | tuple[int, str, str]:
        node = next(a.split("=", 1)[1] for a in argv if a.startswith("--nodelist="))
        answer = seen[node]
        return answer if isinstance(answer, tuple) else (0, answer)

    fake_slurm.answers.update(scontrol=scontrol, srun=srun)
    fake_slurm.nodes, fake_slurm.seen = nodes, seen
    return fake_slurm


def doctor_json(capsys, *args: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["doctor", "--gpus", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def rows(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["node"]: r for r in data["gpus"]}


def updates(fake) -> list[list[str]]:
    return [c for c in fake.calls if c[:2] == ["scontrol", "update"]]


def test_matching_nodes_pass(cluster, capsys) -> None:
    code, data = doctor_json(capsys)
    assert code == 0 and data["ok"] is True
    assert sorted(rows(data)) == ["gpu1", "gpu2"]  # the CPU nodes are not GPU nodes
    for row in data["gpus"]:
        assert row["ok"] is True and row["gres"] == row["seen"] == 2
    assert [c[0] for c in cluster.calls].count("srun") == 2


def test_check_step_holds_every_gpu_of_the_node_on_its_partition(cluster, capsys) -> None:
    doctor_json(capsys)
    steps = [c for c in cluster.calls if c[0] == "srun"]
    first = steps[0]
    for arg in ("--nodelist=gpu1", "--nodes=1", "--ntasks=1", "--gres=gpu:2", "--partition=gpu"):
        assert arg in first
    # Root's step: isolated (no directory of the step's on the import path), run from /.
    assert first[-4:] == [str(doctor.PYTHON), "-I", "-m", "pyhpc.admin.gpucheck"]
    assert "--chdir=/" in first and not any(a.startswith("--chdir=/tmp") for a in first)
    assert str(doctor.PYTHON) == "/opt/pyhpc/venv/bin/python"


def test_seen_count_that_differs_is_a_mismatch_naming_node_and_counts(cluster, capsys) -> None:
    cluster.seen["gpu2"] = report("gpu2", seen=1)
    code, data = doctor_json(capsys)
    assert code == 1 and data["ok"] is False
    bad = rows(data)["gpu2"]
    assert (bad["ok"], bad["gres"], bad["seen"], bad["fault"]) == (False, 2, 1, True)
    assert "Slurm has 2 GPUs as GRES, the node sees 1" in bad["why"]
    assert rows(data)["gpu1"]["ok"] is True
    assert updates(cluster) == []  # no --drain: nothing drained


def test_mismatch_in_the_table(cluster, capsys) -> None:
    cluster.seen["gpu2"] = report("gpu2", seen=1)
    assert cli.main(["doctor", "--gpus"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NODE", "GRES", "SEEN", "MATMUL", "DCGM", "RESULT", "DETAIL"]
    gpu2 = next(line for line in lines if line.startswith("gpu2"))
    assert gpu2.split()[:6] == ["gpu2", "2", "1", "pass", "absent", "FAIL"]
    assert "Slurm has 2 GPUs as GRES, the node sees 1" in gpu2


def test_drain_issues_exactly_one_drain_for_the_failing_node(cluster, capsys) -> None:
    cluster.seen["gpu2"] = report("gpu2", seen=1, seen_source='gres.conf "File=" \n missing')
    code, data = doctor_json(capsys, "--drain")
    assert code == 1
    assert len(updates(cluster)) == 1
    update = updates(cluster)[0]
    assert update[:4] == ["scontrol", "update", "NodeName=gpu2", "State=DRAIN"]
    reason = update[4]
    assert reason.startswith("Reason=pyhpc doctor: Slurm has 2 GPUs as GRES, the node sees 1")
    assert not any(c in reason for c in "\"'\n")
    assert rows(data)["gpu2"]["drained"] is True and rows(data)["gpu1"]["drained"] is False


def test_drain_on_a_healthy_cluster_drains_nothing(cluster, capsys) -> None:
    assert doctor_json(capsys, "--drain")[0] == 0
    assert updates(cluster) == []


@pytest.mark.parametrize("matmul, dcgm, ok, fault", [
    ("pass", "pass", True, False),
    ("pass", "absent", True, False),
    ("fail", "absent", False, True),     # a wrong matmul: the GPU is faulty
    ("pass", "fail", False, True),       # DCGM found a fault
    ("error", "absent", False, False),   # no torch: the check could not run
    ("pass", "error", False, False),     # no nv-hostengine: the same
])
def test_only_faults_the_node_reported_are_drained(cluster, capsys, matmul: str, dcgm: str,
                                                    ok: bool, fault: bool) -> None:
    cluster.seen["gpu1"] = report("gpu1", matmul=matmul, dcgm=dcgm, matmul_detail="m", dcgm_detail="d")
    _, data = doctor_json(capsys, "--drain")
    row = rows(data)["gpu1"]
    assert (row["ok"], row["fault"]) == (ok, fault)
    assert [u[2] for u in updates(cluster)] == (["NodeName=gpu1"] if fault else [])


def test_step_that_could_not_run_is_reported_and_not_drained(cluster, capsys) -> None:
    cluster.seen["gpu1"] = (1, "", "srun: error: Unable to allocate resources: Requested nodes are busy")
    code, data = doctor_json(capsys, "--drain")
    assert code == 1
    row = rows(data)["gpu1"]
    assert row["ok"] is False and row["fault"] is False and row["seen"] is None
    assert row["why"] == ("not checked: srun exit 1: srun: error: Unable to allocate resources: "
                          "Requested nodes are busy")
    assert updates(cluster) == []


def test_unavailable_node_is_reported_not_checked(cluster, capsys) -> None:
    cluster.nodes["gpu2"] = ("gpu:lab:2", "IDLE+DRAIN", "gpu")
    code, data = doctor_json(capsys, "--drain")
    assert code == 1
    assert rows(data)["gpu2"]["why"] == "not checked: node is IDLE+DRAIN"
    assert [a for c in cluster.calls if c[0] == "srun" for a in c if a.startswith("--nodelist")] == [
        "--nodelist=gpu1"]
    assert updates(cluster) == []


def test_drain_without_gpus_is_one_line_and_runs_nothing(cluster, capsys) -> None:
    assert cli.main(["doctor", "--drain"]) == 2
    err = capsys.readouterr().err
    assert err == "pyhpc: error: --drain: only with --gpus (it drains the GPU nodes that fail)\n"
    assert cluster.calls == []


def test_cluster_without_gpu_nodes_is_one_line(cluster, capsys) -> None:
    for name in ("gpu1", "gpu2"):
        cluster.nodes[name] = ("(null)", "IDLE", "cpu")
    assert cli.main(["doctor", "--gpus"]) == 2
    assert capsys.readouterr().err.startswith("pyhpc: error: --gpus: no node has GPUs as GRES")


def test_missing_scontrol_is_one_line(fake_slurm, capsys) -> None:
    def missing(argv: list[str]) -> tuple[int, str]:
        raise FileNotFoundError(argv[0])
    fake_slurm.answers["scontrol"] = missing
    assert cli.main(["doctor", "--gpus", "--drain"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyhpc: error: scontrol: command not found") and err.count("\n") == 1


def test_refused_drain_is_one_line(cluster, capsys) -> None:
    cluster.seen["gpu2"] = report("gpu2", seen=0)
    scontrol = cluster.answers["scontrol"]
    cluster.answers["scontrol"] = lambda argv: (
        (1, "", "slurm_update error: Invalid user id") if argv[1] == "update" else scontrol(argv))
    assert cli.main(["doctor", "--gpus", "--drain"]) == 2
    assert capsys.readouterr().err == "pyhpc: error: scontrol: slurm_update error: Invalid user id\n"


@pytest.mark.parametrize("gres, gpus", [
    ("(null)", 0), ("gpu:lab:2", 2), ("gpu:2", 2), ("gpu:h100:4(S:0-1)", 4),
    ("gpu:a100:2(S:0),gpu:v100:1(S:1)", 3), ("gpu:nvidia_a100-sxm4-80gb:8", 8),
    ("shard:8,gpu:h100:4", 4), ("gpuish:3", 0),
])
def test_gres_gpus(gres: str, gpus: int) -> None:
    assert doctor.gres_gpus(gres) == gpus


def test_drain_reason_is_one_clean_line() -> None:
    assert slurm.reason_text('a "quoted"\nreason\twith `ticks` and \\ ') == (
        "a quoted reason with ticks and")
    assert len(slurm.reason_text("x" * 1000)) == slurm.REASON_LIMIT
