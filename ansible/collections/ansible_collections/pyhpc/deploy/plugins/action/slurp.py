"""pyhpc.deploy.slurp: ansible.builtin.slurp, a regular file read in one shell command
(base64 on the host) instead of a module run; anything else (a missing or unreadable file,
a directory) is the module's, with its message."""
from __future__ import annotations

import base64
from typing import Any

from ansible_collections.pyhpc.deploy.plugins.plugin_utils.asked import plain_path, unknown
from ansible_collections.pyhpc.deploy.plugins.plugin_utils.probed import ProbedAction


class ActionModule(ProbedAction):
    """ansible.builtin.slurp, the file read through the shell first."""

    module = "ansible.legacy.slurp"

    def settle(self, args: dict[str, Any]) -> dict[str, Any] | None:
        src = args.get("src") or args.get("path")
        if unknown(args, frozenset({"src", "path"})) or not isinstance(src, str) or not plain_path(src):
            return None
        content = self.read(src)
        if content is None:
            return None
        return {"changed": False, "content": base64.b64encode(content).decode("ascii"),
                "encoding": "base64", "source": src}
