"""pyhpc.deploy.group: ansible.builtin.group, an existing group checked by one getent instead
of a module run (plugin_utils/accounts.py); every change is the module's."""
from __future__ import annotations

from typing import Any

from ansible_collections.pyhpc.deploy.plugins.plugin_utils import accounts
from ansible_collections.pyhpc.deploy.plugins.plugin_utils.probed import ProbedAction


class ActionModule(ProbedAction):
    """ansible.builtin.group, an existing group settled by getent."""

    module = "ansible.legacy.group"

    def settle(self, args: dict[str, Any]) -> dict[str, Any] | None:
        line = accounts.lookup_line(args.get("name"), args.get("name"))
        done = self.shell(line) if line else {}
        return accounts.group_settled(args, str(done["stdout"])) if done.get("rc") == 0 else None
