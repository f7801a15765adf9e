"""The deploy's first play (ansible/validate.yml) refuses bad input before any host changes.

It runs only on the control node, so these tests need no cluster. The schema's
own messages are tested in test_cluster.py; here, that Ansible surfaces them and
checks the inventory against the definition.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from pyhpc import paths

BIN = Path(sys.executable).parent
INVENTORIES = paths.ROOT / "ansible" / "inventories"


def play(inventory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(paths.ROOT / "ansible" / "ansible.cfg"))
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), *extra,
                           str(paths.ROOT / "ansible" / "validate.yml")],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def test_example_inventory_matches_its_definition() -> None:
    proc = play(INVENTORIES / "example" / "hosts.yml")
    assert proc.returncode == 0, proc.stdout


def test_hostlab_inventory_matches_its_definition() -> None:
    proc = play(INVENTORIES / "hostlab" / "hosts.yml")
    assert proc.returncode == 0, proc.stdout


def test_compute_hosts_must_equal_node_names(tmp_path: Path) -> None:
    hosts = yaml.safe_load((INVENTORIES / "example" / "hosts.yml").read_text())
    hosts["all"]["children"]["compute"]["hosts"] = {"cn[1:4]": None, "gn[1:11]": None}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(hosts))
    proc = play(tmp_path / "hosts.yml",
                "-e", f"pyhpc_cluster_file={INVENTORIES / 'example' / 'cluster.yml'}")
    assert proc.returncode != 0
    assert "nodes: the compute group" in proc.stdout
    assert "must equal the definition's node names" in proc.stdout


def test_invalid_definition_fails_with_the_validators_message(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yml"
    text = (INVENTORIES / "lab" / "cluster.yml").read_text()
    bad.write_text(text.replace("count: 2", "count: 0", 1))
    proc = play(INVENTORIES / "lab" / "hosts.yml", "-e", f"pyhpc_cluster_file={bad}")
    assert proc.returncode != 0
    assert "nodes[0].count: must be an integer from 1 to 1024, got 0" in proc.stdout
