"""pyhpc.deploy.template: ansible.builtin.template whose copy is pyhpc.deploy.copy.

The builtin action renders the template and hands the result to the copy action; this one
hands it to pyhpc.deploy.copy, so a file that is already right costs one shell command
instead of two module runs. Rendering, and every write, are the builtin's.
"""
from __future__ import annotations

from typing import Any

from ansible.plugins.action.template import ActionModule as BuiltinTemplate


class _Actions:
    """The plugin loader's action loader, answering pyhpc.deploy.copy for the builtin copy."""

    def __init__(self, actions: Any) -> None:
        self._actions = actions

    def get(self, name: str, *args: Any, **kwargs: Any) -> Any:
        wanted = "pyhpc.deploy.copy" if name == "ansible.legacy.copy" else name
        return self._actions.get(wanted, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._actions, name)


class _Loaders:
    """The shared loader object with _Actions for its action loader."""

    def __init__(self, loaders: Any) -> None:
        self._loaders = loaders
        self.action_loader = _Actions(loaders.action_loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loaders, name)


class ActionModule(BuiltinTemplate):
    """ansible.builtin.template with pyhpc.deploy.copy for its copy."""

    _shared_loader_obj: Any

    def run(self, tmp: Any = None, task_vars: Any = None) -> Any:
        self._shared_loader_obj = _Loaders(self._shared_loader_obj)
        return super().run(tmp, task_vars)
