"""pyhpc.deploy.copy: ansible.builtin.copy, with a file that is already right checked in
one shell command (plugin_utils/probe.py) instead of the stat and file modules' two runs.
A file that differs, a link or any option the probe does not understand goes through the
builtin action's own code."""
from __future__ import annotations

from typing import Any

from ansible.plugins.action.copy import ActionModule as BuiltinCopy
from ansible_collections.pyhpc.deploy.plugins.plugin_utils import probe


class ActionModule(BuiltinCopy):
    """ansible.builtin.copy, its remote stat and unchanged file's check probed."""

    _probes: dict[str, dict[str, Any]]

    def run(self, tmp: Any = None, task_vars: Any = None) -> Any:
        self._probes = {}
        return super().run(tmp, task_vars)

    def _execute_remote_stat(self, path: Any, all_vars: Any, follow: Any, tmp: Any = None,
                             checksum: bool = True) -> Any:
        if not follow:  # the probe's checksum costs a small file's read; asked for or not
            stat = probe.ask(self, str(path))
            if stat is not None:
                self._probes[str(path)] = stat
                return stat
        return super()._execute_remote_stat(path, all_vars, follow, tmp, checksum)

    def _execute_module(self, module_name: Any = None, module_args: Any = None, *args: Any,
                        **kwargs: Any) -> Any:
        if module_name == "ansible.legacy.file" and module_args:
            path = str(module_args.get("dest") or module_args.get("path"))
            result = probe.settled(module_args, self._probes.get(path))
            if result is not None:
                return result
        return super()._execute_module(module_name, module_args, *args, **kwargs)
