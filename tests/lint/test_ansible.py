"""Lint the deploy: ansible-playbook --syntax-check, ansible-lint (production), yamllint."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpc import paths

BIN = Path(sys.executable).parent
PLAYBOOKS = ["ansible/site.yml", "ansible/validate.yml", "ansible/undeploy.yml", "ansible/release.yml",
             "ansible/accounting.yml", "ansible/release_finish.yml"]


def _run(argv: list[str], cwd: Path = paths.ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(paths.ROOT / "ansible" / "ansible.cfg"),
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    print(proc.stdout, proc.stderr, sep="\n")
    return proc


@pytest.mark.parametrize("inventory", ["lab", "example", "hostlab"])
@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax_is_valid(playbook: str, inventory: str) -> None:
    proc = _run([str(BIN / "ansible-playbook"), "--syntax-check",
                 "-i", f"ansible/inventories/{inventory}/hosts.yml", playbook])
    assert proc.returncode == 0, proc.stderr


def test_ansible_lint_production_profile_passes() -> None:
    proc = _run([str(BIN / "ansible-lint"), "--profile", "production", "--strict"],
                cwd=paths.ROOT / "ansible")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_yamllint_passes() -> None:
    proc = _run([str(BIN / "yamllint"), "--strict", "."])
    assert proc.returncode == 0, proc.stdout
