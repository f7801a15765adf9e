"""The monitoring role's variables and templates as Ansible's own templar evaluates them on
each host of an inventory, after the role's address.yml ran on every host (the
monitoring_target facts the server reads through hostvars).

Run as a child process by tests/unit/test_monitoring_role.py (JSON in on stdin, answers out
on stdout): importing Ansible patches the interpreter (its sys.intern), after which torch
cannot be imported in it, and the unit tests share one process.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from pyhpc import paths

ROLE = paths.ROOT / "ansible" / "roles" / "monitoring"


def trusted(value: Any) -> Any:
    """The role's own YAML, as Ansible trusts a role's files: its strings are templates."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [trusted(v) for v in value]
    return value


def address_fact() -> dict[str, Any]:
    """address.yml's monitoring_target, each value an expression (the fact every host sets)."""
    tasks = yaml.safe_load((ROLE / "tasks" / "address.yml").read_text())
    fact = next(t for t in tasks if "ansible.builtin.set_fact" in t)
    values = fact["ansible.builtin.set_fact"]["monitoring_target"]
    return {k: v.strip().removeprefix("{{").removesuffix("}}") if isinstance(v, str) else v
            for k, v in values.items()}


def role_files() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for part in ("defaults/main.yml", "vars/main.yml", "vars/Debian.yml"):
        found.update(trusted(yaml.safe_load((ROLE / part).read_text())))
    return found


class Host:
    """One host's view of the role: its variables, through Ansible's templar."""

    def __init__(self, name: str, groups: dict[str, list[str]], definition: dict[str, Any],
                 facts: dict[str, dict[str, Any]], sysv: bool, extra: dict[str, Any]) -> None:
        self.name = name
        every = sorted({h for hosts in groups.values() for h in hosts})
        self.vars: dict[str, Any] = {
            **role_files(), "monitoring_cluster": definition, "inventory_hostname": name,
            "groups": {**groups, "all": every}, "ansible_facts": facts[name],
            "ansible_service_mgr": "sysvinit" if sysv else "systemd",
            # address.yml's picker: this host's one address in the definition's network.
            "monitoring_network_address": {"stdout": facts[name]["default_ipv4"]["address"]},
            **extra}
        self.templar = Templar(loader=DataLoader(), variables=self.vars)

    def get(self, expr: str) -> Any:
        return self.templar.template(trust_as_template("{{ " + expr + " }}"))

    def render(self, template: str, **extra: Any) -> str:
        """As the template module renders it (trim_blocks, backslashes kept)."""
        # A value that names the role's variables ("{{ monitoring_initd }}") is one, as a task's vars.
        extra = {k: trust_as_template(v) if isinstance(v, str) and "{{" in v else v
                 for k, v in extra.items()}
        templar = self.templar.copy_with_new_env(available_variables={**self.vars, **extra})
        source = trust_as_template((ROLE / "templates" / template).read_text())
        text: str = templar.template(source, escape_backslashes=False,
                                     overrides={"trim_blocks": True})
        return text


class Cluster:
    """Every host of an inventory, after the role's address.yml ran on each (the
    monitoring_target facts the server reads through hostvars)."""

    def __init__(self, groups: dict[str, list[str]], definition: dict[str, Any],
                 addresses: dict[str, str], sysv: bool, extra: dict[str, Any]) -> None:
        names = sorted({h for hosts in groups.values() for h in hosts})
        facts = {n: {"default_ipv4": {"address": addresses[n]}} for n in names}
        self.hosts = {n: Host(n, groups, definition, facts, sysv, extra) for n in names}
        hostvars: dict[str, Any] = {}
        for name, host in self.hosts.items():
            target = {k: host.get(v) if isinstance(v, str) else v
                      for k, v in address_fact().items()}
            hostvars[name] = {"inventory_hostname": name, "monitoring_target": target}
        for host in self.hosts.values():
            host.vars["hostvars"] = hostvars
            host.vars["monitoring_target"] = hostvars[host.name]["monitoring_target"]


def plain(value: Any) -> Any:
    """Ansible's answers as plain JSON values."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


def main() -> int:
    spec = json.load(sys.stdin)
    hosts = Cluster(spec["groups"], spec["definition"], spec["addresses"], spec["sysv"],
                    spec["extra"]).hosts
    answers = []
    for ask in spec["asks"]:
        host = hosts[ask["host"]]
        answers.append(plain(host.render(ask["template"], **ask.get("vars", {}))
                             if "template" in ask else host.get(ask["expr"])))
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
