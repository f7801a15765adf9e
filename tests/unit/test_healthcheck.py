"""pyhpc-healthcheck (pyhpc/admin/healthcheck.py), installed into tmp_path as the slurm role
installs it, with its settings rendered from slurm/etc/pyhpc-healthcheck.json.j2, and run for real.

Its GPU stand-ins, spool and log live in tmp_path (its settings say so); munge, unmunge, df,
nvidia-smi and scontrol are fakes on PATH that record their calls, so no test touches
the lab. Time bounds only say "did not hang": every hang is 60 s, every bound far below.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_slurm_templates import context, render, role_source

from pyhpc import paths
from pyhpc.admin import healthcheck

HANG_S = 60
TOOLS = {
    "munge": 'echo "munge $*" >> "$CALLS"; echo MUNGE:cred:',
    "unmunge": 'echo "unmunge $*" >> "$CALLS"; cat >/dev/null; echo "STATUS: Success (0)"',
    "df": ('echo "df $*" >> "$CALLS"; echo "Filesystem 1024-blocks Used Available Capacity '
           'Mounted on"; echo "/dev/vda 100000000 1000 ${FREE_KB:-50000000} 1% /"'),
    "scontrol": ('echo "scontrol $*" >> "$CALLS"; '
                 '[ "$1" = show ] && echo "NodeName=$4 Arch=x86_64 State=${NODE_STATE:-IDLE} '
                 'ExtSensorsTemp=n/s ${NODE_REASON:-}"; exit 0'),
    "nvidia-smi": ('echo "nvidia-smi $*" >> "$CALLS"; i=0; while [ $i -lt ${GPUS:-4} ]; do '
                   'echo "GPU $i: NVIDIA H100 (UUID: GPU-$i)"; i=$((i+1)); done'),
}


class Node:
    """A rendered health check, its fake tools and what they were asked."""

    def __init__(self, tmp: Path, inventory: str = "lab", **settings: object) -> None:
        self.tmp = tmp
        ctx = context(inventory)
        ctx.update(slurm_lab_gpu_dir=str(tmp / "gpus"), slurm_spool_dir=str(tmp / "spool"),
                   slurm_log_dir=str(tmp / "log"), **settings)
        self.script = tmp / "pyhpc-healthcheck"
        shutil.copyfile(role_source("slurm_healthcheck_source"), self.script)
        self.config = tmp / "pyhpc-healthcheck.json"
        self.config.write_text(render("pyhpc-healthcheck.json", ctx))
        self.bin = tmp / "bin"
        self.bin.mkdir()
        for tool, body in TOOLS.items():
            self.tool(tool, body)
        (tmp / "log").mkdir()
        for node in ("gpu1", "gpu2", "cpu1"):
            (tmp / "spool" / node).mkdir(parents=True)
        for node in ("gpu1", "gpu2"):
            (tmp / "gpus" / node).mkdir(parents=True)
            for i in range(2):
                (tmp / "gpus" / node / f"nvidia{i}").touch()
        self.calls_file = tmp / "calls"

    def tool(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)

    def run(self, node: str = "gpu1", **env: str) -> subprocess.CompletedProcess[str]:
        """Run as slurmd does: no environment but SLURMD_NODENAME (and the fakes' PATH), no
        argument but the settings' path (slurmd's default one is /etc/slurm's)."""
        environ = {"PATH": f"{self.bin}:/usr/bin:/bin", "SLURMD_NODENAME": node,
                   "CALLS": str(self.calls_file), **env}
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(self.script), "--config", str(self.config)],
                              env=environ,
                              capture_output=True, text=True, timeout=HANG_S - 10)
        self.elapsed = time.monotonic() - start
        return proc

    @property
    def calls(self) -> list[str]:
        return self.calls_file.read_text().splitlines() if self.calls_file.exists() else []

    @property
    def drains(self) -> list[str]:
        return [c for c in self.calls if c.startswith("scontrol update")]

    @property
    def log(self) -> str:
        path = self.tmp / "log" / "pyhpc-healthcheck.log"
        return path.read_text() if path.exists() else ""


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_healthy_node_is_not_drained_and_exits_0(node: Node) -> None:
    proc = node.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert node.drains == []
    assert {c.split()[0] for c in node.calls} == {"munge", "unmunge", "df"}
    assert f"df -Pk {node.tmp}/spool/gpu1" in node.calls
    assert node.log == ""


def test_missing_gpu_device_drains_the_node_once_with_the_reason(node: Node) -> None:
    (node.tmp / "gpus" / "gpu1" / "nvidia1").unlink()
    proc = node.run()
    assert proc.returncode == 1
    missing = node.tmp / "gpus" / "gpu1" / "nvidia1"
    assert node.drains == [f"scontrol update NodeName=gpu1 State=DRAIN Reason=pyhpc-healthcheck: "
                           f"gpus: 1 of 2 GPU devices missing: {missing}"]
    assert "drained: pyhpc-healthcheck: gpus: 1 of 2" in node.log


def test_other_nodes_devices_do_not_count(node: Node) -> None:
    """Several slurmd share the lab's host: gpu2's check looks only at gpu2's stand-ins."""
    (node.tmp / "gpus" / "gpu1" / "nvidia1").unlink()
    assert node.run("gpu2").returncode == 0
    assert node.drains == []


def test_cpu_node_needs_no_gpus(node: Node) -> None:
    assert node.run("cpu1").returncode == 0
    assert node.drains == []


def test_unknown_node_is_logged_and_not_checked(node: Node) -> None:
    proc = node.run("elsewhere")
    assert proc.returncode == 0
    assert node.calls == []
    assert "elsewhere: not a node of cluster lab; nothing checked" in node.log


def test_hanging_check_is_killed_by_the_hard_timeout_and_drains_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path, slurm_healthcheck_timeout=2, slurm_healthcheck_command_timeout=HANG_S)
    node.tool("munge", f'echo "munge $*" >> "$CALLS"; exec sleep {HANG_S}')
    (node.tmp / "gpus" / "gpu1" / "nvidia1").unlink()  # a real fault, not reported in time
    proc = node.run()
    assert proc.returncode == 0
    assert node.elapsed < HANG_S / 2, "the hang was not cut short"
    assert node.drains == []
    assert "the checks did not finish within 2 s; nothing drained" in node.log


def test_command_that_does_not_answer_decides_nothing(tmp_path: Path) -> None:
    """munge hangs: undecided, logged; the GPU fault found beside it still drains."""
    node = Node(tmp_path, slurm_healthcheck_timeout=HANG_S // 2, slurm_healthcheck_command_timeout=1)
    node.tool("munge", f'echo "munge $*" >> "$CALLS"; exec sleep {HANG_S}')
    (node.tmp / "gpus" / "gpu1" / "nvidia0").unlink()
    proc = node.run()
    assert node.elapsed < HANG_S / 2, "the hang was not cut short"
    assert proc.returncode == 1
    assert len(node.drains) == 1
    assert "gpus: 1 of 2 GPU devices missing" in node.drains[0]
    assert "munge" not in node.drains[0].split("Reason=", 1)[1]
    assert "munge undecided (munge: no answer within 1 s); not a reason to drain" in node.log


def test_healthy_node_with_a_hanging_munge_is_not_drained(tmp_path: Path) -> None:
    node = Node(tmp_path, slurm_healthcheck_timeout=HANG_S // 2, slurm_healthcheck_command_timeout=1)
    node.tool("munge", f'echo "munge $*" >> "$CALLS"; exec sleep {HANG_S}')
    proc = node.run()
    assert proc.returncode == 0
    assert node.elapsed < HANG_S / 2
    assert node.drains == []


def test_munge_that_refuses_drains(node: Node) -> None:
    node.tool("munge", 'echo "munge: Error: Failed to access \\"/run/munge/munge.socket.2\\"" >&2; '
                       "exit 1")
    assert node.run().returncode == 1
    assert len(node.drains) == 1
    reason = node.drains[0].split("Reason=", 1)[1]
    assert reason.startswith("pyhpc-healthcheck: munge: munge -n: munge: Error: Failed to access")
    assert '"' not in reason


def test_full_spool_drains(node: Node) -> None:
    assert node.run(FREE_KB="1024").returncode == 1
    assert node.drains == [f"scontrol update NodeName=gpu1 State=DRAIN Reason=pyhpc-healthcheck: "
                           f"spool: {node.tmp}/spool/gpu1 has 1 MiB free, below 256 MiB"]


def test_missing_tools_decide_nothing(node: Node) -> None:
    for tool in ("munge", "df"):
        (node.bin / tool).unlink()
    proc = node.run(PATH=str(node.bin))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert node.drains == []


def test_node_drained_by_someone_else_keeps_its_reason(node: Node) -> None:
    (node.tmp / "gpus" / "gpu1" / "nvidia1").unlink()
    proc = node.run(NODE_STATE="IDLE+DRAIN", NODE_REASON="Reason=new DIMMs [root@2026-01-01T00:00:00]")
    assert proc.returncode == 1
    assert node.drains == []
    assert "already drained for another reason" in node.log


def test_own_drain_is_refreshed(node: Node) -> None:
    (node.tmp / "gpus" / "gpu1" / "nvidia1").unlink()
    node.run(NODE_STATE="IDLE+DRAIN", NODE_REASON="Reason=pyhpc-healthcheck: spool: full")
    assert len(node.drains) == 1


def test_nvml_node_counts_gpus_with_nvidia_smi(tmp_path: Path) -> None:
    """A real cluster's node (the example inventory: gn1 has 4 GPUs found through NVML)."""
    node = Node(tmp_path, "example")
    (tmp_path / "spool" / "gn1").mkdir()
    assert node.run("gn1", GPUS="4").returncode == 0
    assert node.drains == []
    assert node.run("gn1", GPUS="3").returncode == 1
    assert node.drains == ["scontrol update NodeName=gn1 State=DRAIN Reason=pyhpc-healthcheck: "
                           "gpus: nvidia-smi -L lists 3 of 4 GPUs"]
    assert f"df -Pk {tmp_path}/spool" in node.calls  # one slurmd per host: one spool


def test_installed_program_is_the_module_and_reads_the_roles_settings_by_default() -> None:
    installed = role_source("slurm_healthcheck_source")
    assert installed == Path(healthcheck.__file__).resolve() == paths.ROOT / "pyhpc/admin/healthcheck.py"
    assert healthcheck.CONFIG == "/etc/slurm/pyhpc-healthcheck.json"
    assert installed.read_text().startswith("#!/usr/bin/python3 -I\n")


def test_it_needs_nothing_but_the_standard_library() -> None:
    """Nodes run it with the system's Python: an import of pyhpc (or anything not in the
    standard library) would fail there."""
    import ast

    tree = ast.parse(Path(healthcheck.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names


@pytest.mark.parametrize(("text", "reason"), [
    ('munge: Error: "socket"\n', "munge: Error: socket"),
    ("a\tb`c'd\\e", "a b c d e"),
    ("x" * 300, "x" * 200),
])
def test_reason_is_one_line_without_quotes_of_at_most_200_characters(text: str, reason: str) -> None:
    assert healthcheck.reason_text(text) == reason


def test_unreadable_settings_check_nothing_and_exit_0(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, healthcheck.__file__, "--config", str(tmp_path / "none.json"),
                           "gpu1"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    assert "cannot read" in proc.stdout and "nothing checked" in proc.stdout
