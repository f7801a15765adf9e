"""pyhpc.deploy.file: ansible.builtin.file, with a path that is already as asked (a
directory, a plain file's owner, group and mode, or an absent path) checked in one shell
command (plugin_utils/probe.py) instead of a module run. Anything else, and every change,
is the file module's."""
from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.pyhpc.deploy.plugins.plugin_utils import probe


class ActionModule(ActionBase):
    """ansible.builtin.file, probed first."""

    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: Any = None) -> Any:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        path = args.get("path") or args.get("dest")
        if isinstance(path, str) and path:
            settled = probe.settled(args, probe.ask(self, path))
            if settled is not None:
                return {**result, **settled}
        result.update(self._execute_module(module_name="ansible.legacy.file", module_args=args,
                                           task_vars=task_vars))
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
