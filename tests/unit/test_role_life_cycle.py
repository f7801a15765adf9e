"""Each role owns its life cycle: <role>_state present|absent (and <role>_purge) handled in
its own main.yml, site.yml the one role list, undeploy.yml that list with absent.

The first tests read the roles; the last adds a role to a copy of ansible/ with one play in
site.yml and nothing else, then deploys and undeploys it on this machine (every other play
switched off).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

# pytest puts tests/unit on sys.path (no package).
from roleplay import ANSIBLE, extra, run_playbook

ROLES = sorted(p.name for p in (ANSIBLE / "roles").iterdir() if (p / "tasks" / "main.yml").exists())
FLAGS = {f"pyhpc_deploy_{flag}": False
         for flag in ("nfs", "login", "nvidia", "directory", "munge", "slurm", "containers",
                      "jupyterhub")}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_site_yml_includes_every_role() -> None:
    named = set(re.findall(r"^\s+name: (\w+)$", (ANSIBLE / "site.yml").read_text(), re.M))
    assert set(ROLES) <= named


def test_undeploy_is_site_yml_with_absent_and_names_no_role() -> None:
    plays = load(ANSIBLE / "undeploy.yml")
    assert [p["ansible.builtin.import_playbook"] for p in plays] == ["site.yml", "site.yml"]
    assert all(p["vars"]["pyhpc_state"] == "absent" for p in plays)
    text = yaml.safe_dump(plays)  # what it does, not its comments
    assert not any(re.search(rf"\b{role}\b", text) for role in ROLES)
    assert "roles/" not in text and "include_vars" not in text


@pytest.mark.parametrize("role", ROLES)
def test_role_declares_and_handles_its_state_and_purge(role: str) -> None:
    base = ANSIBLE / "roles" / role
    defaults = load(base / "defaults" / "main.yml")
    assert defaults[f"{role}_state"] == "{{ pyhpc_state | default('present') }}"
    assert defaults[f"{role}_purge"] == "{{ pyhpc_purging | default(false) }}"
    options = load(base / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert options[f"{role}_state"]["choices"] == ["present", "absent"]
    assert options[f"{role}_purge"]["type"] == "bool"
    main = (base / "tasks" / "main.yml").read_text()
    assert f"{role}_state == 'absent'" in main and (base / "tasks" / "absent.yml").exists()
    assert f"{role}_purge" in (base / "tasks" / "absent.yml").read_text() + main


def test_every_play_reads_the_definition_from_pyhpc_cluster() -> None:
    assert "hostvars['localhost']" not in (ANSIBLE / "site.yml").read_text()


def test_the_directory_server_host_is_chosen_in_one_place() -> None:
    rule = "((groups['directory'] | default([])) + groups['controller'])[0]"
    found = [str(p.relative_to(ANSIBLE)) for p in sorted(ANSIBLE.rglob("*.yml"))
             if rule in p.read_text() and "meta" not in p.parts]
    assert found == ["roles/directory/defaults/main.yml"]


HELLO_TASKS = """\
---
- name: Write the greeting and its data
  ansible.builtin.copy:
    content: hello
    dest: "{{ item }}"
    mode: "0644"
  loop: ["{{ hello_file }}", "{{ hello_data }}"]
  when: hello_state == 'present'

- name: Remove the greeting, and its data with hello_purge
  ansible.builtin.include_tasks: absent.yml
  when: hello_state == 'absent'
"""
HELLO_ABSENT = """\
---
- name: Remove the greeting
  ansible.builtin.file:
    path: "{{ item }}"
    state: absent
  loop: "{{ [hello_file] + ([hello_data] if hello_purge | bool else []) }}"
"""
HELLO_PLAY = """
- name: Greet
  hosts: login
  tasks:
    - name: Deploy hello
      ansible.builtin.include_role:
        name: hello
"""


def test_a_new_role_needs_one_play_in_site_yml_and_nothing_in_undeploy_yml(tmp_path: Path) -> None:
    ansible = tmp_path / "ansible"
    shutil.copytree(ANSIBLE, ansible, ignore=shutil.ignore_patterns(".ansible"))
    hello = ansible / "roles" / "hello"
    (hello / "tasks").mkdir(parents=True)
    (hello / "defaults").mkdir()
    (hello / "tasks" / "main.yml").write_text(HELLO_TASKS)
    (hello / "tasks" / "absent.yml").write_text(HELLO_ABSENT)
    (hello / "defaults" / "main.yml").write_text(
        "---\nhello_state: \"{{ pyhpc_state | default('present') }}\"\n"
        "hello_purge: \"{{ pyhpc_purging | default(false) }}\"\n")
    with (ansible / "site.yml").open("a") as site:
        site.write(HELLO_PLAY)
    undeploy = (ansible / "undeploy.yml").read_text()
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {"localhost": local},
        "vars": {"pyhpc_cluster_file": str(ANSIBLE / "inventories" / "lab" / "cluster.yml")},
        "children": {g: {"hosts": {"localhost": None}} for g in ("controller", "login", "compute")}}}))
    greeting, data = tmp_path / "greeting", tmp_path / "data"
    files = extra(hello_file=str(greeting), hello_data=str(data), **FLAGS)

    def run(playbook: str, *args: str) -> dict[str, Any]:
        proc, report = run_playbook(inventory, ansible / playbook, *files, *args)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
        return report

    run("site.yml")
    assert greeting.read_text() == data.read_text() == "hello"
    report = run("undeploy.yml")
    assert not greeting.exists() and data.exists()  # absent; the data stays without PURGE
    assert report["stats"]["localhost"]["changed"] == 1
    run("site.yml")
    run("undeploy.yml", *extra(pyhpc_purge=True))
    assert not greeting.exists() and not data.exists()
    assert (ansible / "undeploy.yml").read_text() == undeploy
