"""pyhpc.gpucheck, the node side of ``pyhpc doctor --gpus``, as on a CPU machine.

nvidia-smi and dcgmi are fakes on PATH, and PATH holds nothing else (a GPU machine's own
nvidia-smi stays out); gres.conf is read by the job exporter's parser (hostlists by
submitit's); the matmul runs for real on the CPU, CUDA hidden where it is there.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpc.admin import gpucheck

GRES = """# gres.conf for cluster lab (mode lab).
NodeName=gpu1 Name=gpu Type=lab File={dir}/gpu1/nvidia[0-1]
NodeName=gpu2 Name=gpu Type=lab File={dir}/gpu2/nvidia[0-1]
NodeName=gn[1-2] AutoDetect=nvml Name=gpu Type=h100 Count=4
"""
DCGM_FAIL = """+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| Environmental Variables   | Pass                                           |
| Persistence Mode          | Fail                                           |
|   Warning                 | GPU 0 Persistence mode for GPU 0 is disabled.  |
+---------------------------+------------------------------------------------+
"""


@pytest.fixture
def node(tmp_path: Path, monkeypatch) -> Path:
    """gpu1's gres.conf with two stand-ins under tmp_path, no nvidia-smi or dcgmi on PATH."""
    for name in ("gpu1", "gpu2"):
        (tmp_path / name).mkdir()
        for i in range(2):
            (tmp_path / name / f"nvidia{i}").touch()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "cat").symlink_to(shutil.which("cat") or "/bin/cat")  # the fakes' one tool
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    conf = tmp_path / "gres.conf"
    conf.write_text(GRES.format(dir=tmp_path))
    return conf


@pytest.fixture
def no_cuda(monkeypatch) -> None:
    """CUDA sees no GPU, as on a CPU machine, also where these tests run on a GPU one."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def tool(conf: Path, name: str, body: str) -> None:
    path = conf.parent / "bin" / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_gres_files_are_this_nodes_files_expanded(node: Path) -> None:
    assert gpucheck.gres_files("gpu1", node) == [f"{node.parent}/gpu1/nvidia0",
                                                 f"{node.parent}/gpu1/nvidia1"]
    assert gpucheck.gres_files("gpu2", node) == [f"{node.parent}/gpu2/nvidia0",
                                                 f"{node.parent}/gpu2/nvidia1"]
    assert gpucheck.gres_files("gn1", node) == []  # AutoDetect lines list no files


def test_seen_counts_the_stand_ins_that_exist(node: Path) -> None:
    assert gpucheck.seen("gpu1", node) == (2, f"device files in {node} (2 listed)")
    (node.parent / "gpu1" / "nvidia1").unlink()
    count, source = gpucheck.seen("gpu1", node)
    assert count == 1 and source.endswith(f"missing: {node.parent}/gpu1/nvidia1)")


def test_seen_without_files_or_gres_conf_is_zero(node: Path, tmp_path: Path) -> None:
    assert gpucheck.seen("cpu1", node)[0] == 0
    assert gpucheck.seen("gpu1", tmp_path / "absent.conf")[0] == 0


def test_seen_asks_nvidia_smi_where_the_driver_is(node: Path) -> None:
    tool(node, "nvidia-smi", 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)"; '
                             'echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b)"')
    assert gpucheck.seen("gpu1", node) == (2, "nvidia-smi -L")
    tool(node, "nvidia-smi", 'echo "NVIDIA-SMI has failed because it could not communicate '
                             'with the NVIDIA driver."; exit 9')
    assert gpucheck.seen("gpu1", node)[0] == 0


def test_matmul_on_the_cpu_says_so(no_cuda: None) -> None:
    status, detail = gpucheck.matmul(n=64)
    assert status == "pass"
    assert detail.startswith("cpu (no CUDA here): 64x64 fp32, error ")


def test_matmul_errs_when_cuda_misses_gpus_the_driver_lists(no_cuda: None) -> None:
    status, detail = gpucheck.matmul(cuda_expected=2, n=8)
    assert status == "error" and "CUDA sees 0 of the 2 GPUs" in detail


def test_dcgm_absent_pass_fail_and_error(node: Path) -> None:
    assert gpucheck.dcgm() == ("absent", "dcgmi not installed")
    tool(node, "dcgmi", "echo '| Denylist | Pass |'")
    assert gpucheck.dcgm() == ("pass", "dcgmi diag -r 1: pass")
    tool(node, "dcgmi", f"cat <<'EOF'\n{DCGM_FAIL}EOF\nexit 226")
    assert gpucheck.dcgm() == ("fail", "dcgmi diag -r 1 failed: Persistence Mode")
    tool(node, "dcgmi", "echo 'Error: unable to establish a connection to the specified host: "
                        "localhost' >&2; exit 1")
    status, detail = gpucheck.dcgm()
    assert status == "error" and "unable to establish a connection" in detail


def test_main_prints_one_report_line_the_doctor_parses(node: Path, no_cuda: None, capsys,
                                                      monkeypatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "gpu1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpucheck.main(["--gres-conf", str(node)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(gpucheck.MARK + " ")
    data = gpucheck.parse("srun: warning\n" + out)
    assert data is not None
    assert (data["node"], data["seen"], data["visible"]) == ("gpu1", 2, "0,1")
    assert (data["matmul"], data["dcgm"]) == ("pass", "absent")
    assert json.loads(out.split(" ", 1)[1]) == data


def test_parse_finds_nothing_in_other_output() -> None:
    assert gpucheck.parse("srun: error: Unable to allocate resources\n") is None
    assert gpucheck.parse(f"{gpucheck.MARK} not json\n") is None


def test_importing_the_check_does_not_import_torch() -> None:
    code = "import sys, pyhpc.admin.doctor, pyhpc.admin.gpucheck; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
