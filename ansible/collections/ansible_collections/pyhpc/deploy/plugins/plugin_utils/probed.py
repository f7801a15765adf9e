"""The shape every probed action of pyhpc.deploy shares: ask the host one shell command
whether the module, given these arguments, would change nothing; if so, answer as the
module would, else run the module.

A subclass names its module and writes `settle`, which returns the module's unchanged
answer or None. None is the safe answer: anything the probe does not understand, an
argument it does not know, a read that fails, or any change runs the module, so every
write and every error message is Ansible's. The decisions themselves are pure functions
(asked.py, probe.py).
"""
from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.pyhpc.deploy.plugins.plugin_utils import asked


class ProbedAction(ActionBase):
    """A module run only where `settle` cannot answer that it would change nothing."""

    _supports_check_mode = True
    #: The module this action stands for, e.g. ``ansible.legacy.slurp``.
    module = ""

    def settle(self, args: dict[str, Any]) -> dict[str, Any] | None:
        """The module's unchanged answer for `args` on this host, or None."""
        raise NotImplementedError

    def shell(self, line: str) -> dict[str, Any]:
        """`line` through the task's connection and become."""
        done: dict[str, Any] = self._low_level_execute_command(line)
        return done

    def read(self, path: str) -> bytes | None:
        """A regular file's bytes on the host, or None."""
        done = self.shell(asked.read_line(path))
        return asked.decode(str(done.get("stdout", ""))) if done.get("rc") == 0 else None

    def run(self, tmp: Any = None, task_vars: Any = None) -> Any:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        settled = self.settle(args)
        if settled is not None:
            return {**result, **settled}
        result.update(self._execute_module(module_name=self.module, module_args=args,
                                           task_vars=task_vars))
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

