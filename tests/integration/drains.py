"""Nodes pyhpc drains on the lab, and putting them back: a test whose cause may drain a
node (a fake driver for ``pyhpc doctor --gpus``, a stand-in GPU taken away while Slurm's
HealthCheckProgram runs) resumes it afterwards, so the lab stays usable for the others.
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable

#: The reasons pyhpc drains with (a node drained for another reason is left alone).
OURS = ("pyhpc doctor:", "pyhpc-healthcheck:")


def node_fields(node: str) -> dict[str, str]:
    """``scontrol show node -o NODE``: State, and Reason in full (it has spaces)."""
    out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True,
                         text=True, timeout=60, check=False).stdout
    fields = dict(word.split("=", 1) for word in out.split() if "=" in word)
    if " Reason=" in out:
        fields["Reason"] = out.split(" Reason=", 1)[1].strip()
    return fields


def resume_ours(nodes: Iterable[str]) -> None:
    """Resume each of ``nodes`` that pyhpc drained, and wait until it responds."""
    for node in nodes:
        if node_fields(node).get("Reason", "").startswith(OURS):
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                           capture_output=True, timeout=60, check=False)
            assert "DRAIN" not in node_fields(node).get("State", ""), f"{node} stayed drained"
            # A resumed node is NOT_RESPONDING until slurmctld's ping reaches it (a second or
            # so): the next test (a doctor run) would find it unchecked.
            deadline = time.monotonic() + 60
            while "NOT_RESPONDING" in node_fields(node).get("State", ""):
                assert time.monotonic() < deadline, f"{node} still not responding after resume"
                time.sleep(0.5)
