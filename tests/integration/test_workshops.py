"""The workshop notebooks run as written: executed top to bottom on the lab, from the
login node's environment (/opt/pyhpc/venv's Jupyter), as a participant would run them.

`jupyter nbconvert --execute` stops at the first cell that raises, exactly as a
participant would see it; each notebook also asserts its own results (accuracy,
COMPLETED states, a full benchmark record).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpc import paths

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

NOTEBOOKS = sorted((paths.ROOT / "workshops").glob("*.ipynb"))
JUPYTER = paths.SHARED_VENV / "bin" / "jupyter"


def execute(notebook: Path, work: Path) -> dict:
    """Run ``notebook`` in ``work`` (a copy, so the repository's stays stripped)."""
    copy = work / notebook.name
    shutil.copy(notebook, copy)
    proc = subprocess.run([str(JUPYTER), "nbconvert", "--to", "notebook", "--execute", "--inplace",
                           "--ExecutePreprocessor.timeout=900", copy.name],
                          cwd=work, capture_output=True, text=True, timeout=1800)
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    assert proc.returncode == 0, f"{notebook.name} failed:\n{proc.stderr[-4000:]}"
    return json.loads(copy.read_text())


def text_output(nb: dict) -> str:
    return "".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                   for o in c.get("outputs", []))


def test_the_workshop_has_the_four_notebooks() -> None:
    assert [n.name for n in NOTEBOOKS] == ["01-hello-cluster.ipynb", "02-one-node-to-two.ipynb",
                                           "03-why-gpus-data-movement.ipynb", "04-containers.ipynb"]


def test_notebook_1_hello_cluster(work: Path) -> None:
    out = text_output(execute(NOTEBOOKS[0], work))
    assert "#SBATCH --job-name=hello" in out and "test accuracy" in out and "samples/s" in out


def test_notebook_2_one_node_to_two(work: Path) -> None:
    out = text_output(execute(NOTEBOOKS[1], work))
    assert "efficiency" in out and (work / "workshop-runs" / "scale" / "time-to-train.png").is_file()


def test_notebook_3_why_gpus_data_movement(work: Path) -> None:
    out = text_output(execute(NOTEBOOKS[2], work))
    assert "all-reduce backend gloo" in out


def test_notebook_4_containers(work: Path) -> None:
    # The admin's step before the workshop (`make containers`); cached when built already.
    subprocess.run([sys.executable, "-m", "pyhpc", "containers", "build", "--variant", "cpu"],
                   cwd=paths.ROOT, check=True, timeout=1800)
    out = text_output(execute(NOTEBOOKS[3], work))
    assert "2 workers, torch 2.13.0+cpu" in out
