"""pyhpc.deploy.user: ansible.builtin.user, an existing user as asked checked by one getent
instead of a module run (plugin_utils/accounts.py); every change is the module's."""
from __future__ import annotations

from typing import Any

from ansible_collections.pyhpc.deploy.plugins.plugin_utils import accounts
from ansible_collections.pyhpc.deploy.plugins.plugin_utils.probed import ProbedAction


class ActionModule(ProbedAction):
    """ansible.builtin.user, an existing user as asked settled by getent."""

    module = "ansible.legacy.user"

    def settle(self, args: dict[str, Any]) -> dict[str, Any] | None:
        name = args.get("name") or args.get("user")
        line = accounts.lookup_line(name, args.get("group") or name)
        done = self.shell(line) if line else {}
        return accounts.user_settled(args, str(done["stdout"])) if done.get("rc") == 0 else None
