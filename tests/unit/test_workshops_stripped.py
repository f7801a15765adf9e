"""The repository keeps the workshop notebooks valid and with their outputs stripped."""
from __future__ import annotations

import json

import pytest

from pyhpc.paths import ROOT

NOTEBOOKS = sorted((ROOT / "workshops").glob("*.ipynb"))


def test_there_are_workshop_notebooks() -> None:
    assert len(NOTEBOOKS) == 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_nbformat_4_with_outputs_stripped(path) -> None:
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4 and nb["metadata"]["kernelspec"]["name"] == "python3"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert len({c["id"] for c in nb["cells"]}) == len(nb["cells"])
    for cell in code:  # every code cell at least compiles (IPython magics are not used)
        compile("".join(cell["source"]), f"{path.name}:{cell['id']}", "exec")
