"""pyhpc_login's virtualenv after a release upgrade: one that another Python built (Debian
12's 3.11 on a host now on Debian 13's 3.13) is removed, so the role builds it again; one
this host's Python built, a missing one, and one whose pyvenv.cfg is a planted link are left
as they are. The role's venv_python tasks run on this machine (connection local) against
environments under the test's own directory."""
from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

# pytest puts tests/unit on sys.path (no package).
from roleplay import run_playbook

HOST_PYTHON = "/usr/bin/python3"
PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Check each environment
      ansible.builtin.include_role:
        name: pyhpc_login
        tasks_from: venv_python
      vars:
        pyhpc_login_venv: "{{ item }}"
        pyhpc_login_python: %s
      loop: %s
"""


def cfg_version(venv: Path, version: str) -> None:
    cfg = venv / "pyvenv.cfg"
    lines = [f"version = {version}" if line.startswith("version") else line
             for line in cfg.read_text().splitlines()]
    cfg.write_text("\n".join(lines) + "\n")


def test_only_an_environment_another_python_built_is_removed(tmp_path: Path) -> None:
    venvs = {name: tmp_path / name for name in ("same", "other", "missing", "linked")}
    for name in ("same", "other", "linked"):
        subprocess.run([HOST_PYTHON, "-m", "venv", "--without-pip", str(venvs[name])],
                       check=True)
    cfg_version(venvs["other"], "3.9.2")
    # A link to a file that names another Python is not read: the role never wrote one.
    planted = tmp_path / "planted.cfg"
    planted.write_text("version = 3.9.2\n")
    (venvs["linked"] / "pyvenv.cfg").unlink()
    (venvs["linked"] / "pyvenv.cfg").symlink_to(planted)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": HOST_PYTHON}}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK % (HOST_PYTHON, [str(p) for p in venvs.values()]))
    proc, report = run_playbook(inventory, playbook, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not venvs["other"].exists()
    assert (venvs["same"] / "bin" / "python").exists()
    assert not venvs["missing"].exists()
    assert (venvs["linked"] / "pyvenv.cfg").is_symlink() and planted.exists()
    read = [result["stdout"] for p in report["plays"] for task in p["tasks"]
            if task["task"]["name"].endswith("Read which Python built the virtualenv")
            for result in [task["hosts"]["localhost"]]]
    assert read == ["same", "other", "none", "none"]
    removed = [task["hosts"]["localhost"]["changed"] for p in report["plays"]
               for task in p["tasks"]
               if task["task"]["name"].endswith("Remove a virtualenv that another Python built")]
    assert removed.count(True) == 1
