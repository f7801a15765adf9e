"""Running one role's playbook on this machine for the role tests (nvidia, nfs).

ansible-playbook from this venv with the repository's ansible.cfg and the
ansible.posix.json callback, so a test reads each task's result, not log text.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from pyhpc import paths

BIN = Path(sys.executable).parent
ANSIBLE = paths.ROOT / "ansible"


def run_playbook(inventory: Path, playbook: Path, *args: str, timeout: int = 120,
                 env: dict[str, str] | None = None
                 ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """ansible-playbook -i INVENTORY ARGS PLAYBOOK (with `env` added to the environment);
    the process and its JSON report."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {}))
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), *args, str(playbook)],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False)
    return proc, json.loads(proc.stdout)


def results(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Task name (without its role) -> localhost's result, over every play."""
    return {task["task"]["name"].split(" : ", 1)[-1]: task["hosts"]["localhost"]
            for p in report["plays"] for task in p["tasks"] if "localhost" in task["hosts"]}


def other_plays_off(*keep: str) -> dict[str, bool]:
    """Every site.yml play's ``pyhpc_deploy_*`` flag false but those of ``keep``: a role
    test that runs site.yml on this machine runs its own role's play and no other. Read from
    site.yml, so the play of a role added later is off too."""
    flags = sorted(set(re.findall(r"pyhpc_deploy_(\w+)", (ANSIBLE / "site.yml").read_text())))
    return {f"pyhpc_deploy_{flag}": False for flag in flags if flag not in keep}


def extra(**values: Any) -> list[str]:
    return ["-e", json.dumps(values)]


def skip_if_present(writes: Iterable[Path]) -> None:
    """The tests assert the role wrote nothing: they cannot where its files already exist."""
    present = [str(p) for p in writes if p.exists()]
    if present:
        pytest.skip(f"this machine already has the role's files: {present}")


SERVICE_PLAY = """\
- hosts: {host}
  gather_facts: true
  gather_subset: [min]
  tasks:
{tasks}
"""


def service_twins(inventory: Path, host: str, names: Iterable[str], kinds: Iterable[str],
                  ) -> dict[str, dict[str, dict[str, Any]]]:
    """Each service of `names` asked started and enabled on `host`, as a task of each of
    `kinds` (``builtin``: ansible.builtin.service, ``pyhpc``: pyhpc.deploy.service):
    kind -> name -> the host's result."""
    actions = {"builtin": "ansible.builtin.service", "pyhpc": "pyhpc.deploy.service"}
    tasks = "".join(
        f"    - name: {name} ({kind})\n      {actions[kind]}:\n        name: {name}\n"
        "        state: started\n        enabled: true\n" for kind in kinds for name in names)
    with tempfile.TemporaryDirectory() as where:
        path = Path(where) / "services.yml"
        path.write_text(SERVICE_PLAY.format(host=host, tasks=tasks))
        proc, report = run_playbook(inventory, path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for task in report["plays"][0]["tasks"][1:]:
        name, kind = task["task"]["name"][:-1].split(" (")
        found.setdefault(kind, {})[name] = task["hosts"][host]
    return found
