"""The job templates' launcher (pyhpc/dist/launch.py): standard library only, its store on
a port it holds before anyone learns it, and one line for what it refuses."""
from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpc import cluster, paths
from pyhpc.dist import launch
from pyhpc.slurm import render

SOURCE = Path(launch.__file__).read_text()


def test_the_launcher_imports_only_the_standard_library() -> None:
    """The tasks of a researcher's own venv (torch, no pyhpc) run it: only stdlib imports,
    and torch only inside the store host."""
    top = {alias.name.split(".")[0] for node in ast.walk(ast.parse(SOURCE))
           if isinstance(node, ast.Import) for alias in node.names}
    top |= {node.module.split(".")[0] for node in ast.walk(ast.parse(SOURCE))
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert top - {"torch"} <= set(sys.stdlib_module_names), top
    assert "PYHPC_LAUNCH_END" not in SOURCE.replace("PYHPC_LAUNCH_END\n)", "")


def test_a_script_runs_in_a_python_that_has_no_pyhpc(tmp_path: Path) -> None:
    """-I -S: no site-packages at all, so neither pyhpc nor submitit can be imported; the
    script still gets its rank from Slurm's variables and its own directory on the path."""
    (tmp_path / "helper.py").write_text("VALUE = 'mine'\n")
    script = tmp_path / "train.py"
    script.write_text("import os, sys, helper\n"
                      "print(helper.VALUE, sys.argv[1:], *(os.environ[k] for k in ('RANK', "
                      "'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_PORT', "
                      "'TORCHELASTIC_USE_AGENT_STORE')))\n"
                      "import pyhpc\n")
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_PROCID": "3", "SLURM_NTASKS": "4",
           "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "2(x2)",
           "MASTER_ADDR": "cpu1", "MASTER_PORT": "40001"}
    proc = subprocess.run([sys.executable, "-I", "-S", "-P", "-c", SOURCE, str(script), "--lr", "1"],
                          env=env, cwd="/", capture_output=True, text=True, check=False)
    assert proc.stdout == "mine ['--lr', '1'] 3 4 1 2 40001 True\n", proc.stderr
    assert proc.stderr.rstrip().endswith("ModuleNotFoundError: No module named 'pyhpc'")


@pytest.mark.parametrize(("value", "node", "count"), [
    ("2", 0, 2), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1), ("4,1(x2)", 2, 1)])
def test_tasks_on_node_reads_slurms_compressed_counts(value: str, node: int, count: int) -> None:
    assert launch.tasks_on_node(value, node) == count


@pytest.mark.parametrize(("value", "node", "message"), [
    ("2(x3)", 3, r"^pyhpc: SLURM_NODEID=3 is not in SLURM_TASKS_PER_NODE='2\(x3\)'$"),
    ("two", 0, r"^pyhpc: cannot read SLURM_TASKS_PER_NODE='two'$")])
def test_tasks_on_node_refuses_what_it_cannot_read(value: str, node: int, message: str) -> None:
    with pytest.raises(launch.LaunchError, match=message):
        launch.tasks_on_node(value, node)


def test_torchruns_variables_are_left_as_its_agent_set_them() -> None:
    assert launch.distributed_env({"TORCHELASTIC_RUN_ID": "9", "SLURM_JOB_ID": "9",
                                   "SLURM_PROCID": "1"}) == {}


def test_one_process_outside_a_job_binds_whatever_port_is_free() -> None:
    assert launch.distributed_env({}) == {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
    # A job's only task with no store (a plain sbatch script) is one process too.
    assert launch.distributed_env({"SLURM_JOB_ID": "5", "SLURM_PROCID": "0",
                                   "SLURM_NTASKS": "1"})["MASTER_PORT"] == "0"


def test_ranks_of_a_job_without_its_store_are_one_line_not_a_port_of_their_own(
        tmp_path: Path) -> None:
    """Never a port of the rank's own choosing (that is the one a squatter could hold)."""
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "12", "SLURM_PROCID": "0",
           "SLURM_NTASKS": "2"}
    (tmp_path / "t.py").write_text("print('ran')\n")
    proc = subprocess.run([sys.executable, "-I", "-S", "-P", "-c", SOURCE, str(tmp_path / "t.py")],
                          env=env, capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("pyhpc: MASTER_ADDR and MASTER_PORT not set in job 12: start the tasks "
                           "from a pyhpc job script, whose first node holds the job's rendezvous "
                           "store\n")


def test_a_module_comes_from_the_working_directory_only_when_it_is_private(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    (own / "mytrain.py").write_text("print('mine')\n")
    run = [sys.executable, "-I", "-S", "-P", "-c", SOURCE, "-m", "mytrain"]
    proc = subprocess.run(run, cwd=own, env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, check=False)
    assert proc.stdout == "mine\n", proc.stderr
    own.chmod(0o770)  # group-writable: someone else may have planted mytrain.py
    proc = subprocess.run(run, cwd=own, env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, check=False)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("pyhpc: no module named 'mytrain' on the import path; ")
    assert proc.stderr.count("\n") == 1


def _store(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-P", "-c", SOURCE, "--store"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_store_prints_a_port_it_already_holds_and_serves_it_until_killed() -> None:
    pytest.importorskip("torch")
    from datetime import timedelta

    from torch.distributed import TCPStore

    host = _store({**os.environ, "MASTER_ADDR": "127.0.0.1"})
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        with socket.socket() as squat, pytest.raises(OSError, match="in use"):
            squat.bind(("127.0.0.1", port))
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=20))
        client.set("k", "v")
        assert client.get("k") == b"v"
    finally:
        host.send_signal(signal.SIGTERM)
        assert host.wait(20) == 0


def test_a_store_that_cannot_start_says_why_in_one_line() -> None:
    pytest.importorskip("torch")
    host = _store({**os.environ, "MASTER_ADDR": "no-such-host.invalid"})
    out, err = host.communicate(timeout=60)
    assert (host.returncode, out) == (2, "")
    assert err.startswith("pyhpc: cannot host the job's rendezvous store on no-such-host.invalid: ")
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("template", ["ddp-srun", "node-gpus", "torchrun"])
def test_every_distributed_template_carries_the_launcher_and_hosts_the_store(template: str) -> None:
    values = {"module": "m", **({"partition": "gpu"} if template == "node-gpus" else {})}
    text = render.render(template, values, cluster.load(paths.LAB_CLUSTER))
    assert render.launcher_source() in text
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "pyhpc.dist" not in text.split("PYHPC_LAUNCH_END\n)")[1]
    assert '-P -c "$PYHPC_LAUNCH" -m m' in text and "coproc PYHPC_STORE" in text, srun
    if template == "torchrun":
        assert "--rdzv-conf=is_host=0" in text


RANK_PROBE = """
import json, sys, time
import torch.distributed as td
from pyhpc import dist

real = td.init_process_group


def late(*args, **kwargs):
    real(*args, **kwargs)
    if td.get_rank() == 0:  # the last rank to finish its mesh, by far
        time.sleep(2)
    print(json.dumps(["group", time.monotonic()]), flush=True)


td.init_process_group = late
dist.setup(dist.device.CPU)
print(json.dumps(["setup", time.monotonic()]), flush=True)
dist.teardown()
"""


def test_no_rank_leaves_set_up_before_every_ranks_group_is_up() -> None:
    """A rank that ended as soon as its own group was up closed the pairs of a rank still
    connecting its mesh: "Gloo connectFullMesh failed ... Connection closed by peer"."""
    pytest.importorskip("torch")
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(store.port), "TORCHELASTIC_RUN_ID": "probe",
           "TORCHELASTIC_USE_AGENT_STORE": "1", "TORCHELASTIC_RESTART_COUNT": "0",
           "GLOO_SOCKET_IFNAME": "lo"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_PROBE],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], [err for _, err in outs]
    times = [dict(json.loads(line) for line in out.splitlines()) for out, _ in outs]
    assert times[1]["setup"] >= times[0]["group"]
