"""pyhpc.deploy.file: ansible.builtin.file, with a path that is already as asked (a
directory, a plain file's owner, group and mode, an absent path, or a link to the asked
source) checked in one shell command (plugin_utils/probe.py) instead of a module run.
Anything else, and every change, is the file module's."""
from __future__ import annotations

from typing import Any

from ansible_collections.pyhpc.deploy.plugins.plugin_utils import probe
from ansible_collections.pyhpc.deploy.plugins.plugin_utils.probed import ProbedAction


class ActionModule(ProbedAction):
    """ansible.builtin.file, probed first."""

    module = "ansible.legacy.file"

    def settle(self, args: dict[str, Any]) -> dict[str, Any] | None:
        path = args.get("path") or args.get("dest")
        if not isinstance(path, str) or not path:
            return None
        if args.get("state") == "link":
            line = probe.link_command(args, path)
            done = self.shell(line) if line else {}
            if done.get("rc") != 0:
                return None
            return probe.link_settled(args, path, str(done.get("stdout", "")))
        return probe.settled(args, probe.ask(self, path))
