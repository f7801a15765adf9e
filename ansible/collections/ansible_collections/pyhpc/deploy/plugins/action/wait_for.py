"""pyhpc.deploy.wait_for: ansible.builtin.wait_for, a port that already takes connections
checked by one connect from the host's shell instead of a module run.

Only `host`, `port`, `timeout`, `connect_timeout` and `state: started` take this path: bash
connects once (its /dev/tcp, bounded by connect_timeout, as the module's first try is);
where that fails, or anything else is asked (a path, a search string, a delay, another
state), the module waits as before. In check mode the module decides (it skips itself).
"""
from __future__ import annotations

from typing import Any

from ansible_collections.pyhpc.deploy.plugins.plugin_utils.asked import connect_line
from ansible_collections.pyhpc.deploy.plugins.plugin_utils.probed import ProbedAction


class ActionModule(ProbedAction):
    """ansible.builtin.wait_for, a port that answers at once settled by one connect."""

    module = "ansible.legacy.wait_for"

    def settle(self, args: dict[str, Any]) -> dict[str, Any] | None:
        line = None if self._task.check_mode else connect_line(args)
        if line is None or self.shell(line).get("rc") != 0:
            return None
        return {"changed": False, "state": "started", "port": int(args["port"]), "path": None,
                "search_regex": None, "match_groups": [], "match_groupdict": {}, "elapsed": 0}
