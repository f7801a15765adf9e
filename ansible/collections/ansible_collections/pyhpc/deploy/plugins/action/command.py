"""pyhpc.deploy.command: ansible.builtin.command, with a plain argv run by one shell command
on the host instead of the command module's run (a new Python with Ansible's module code,
about 0.25 s here, for every command, on every re-run; most of them only read state).

The shell gets the argv quoted word for word, so it runs the same program with the same
arguments the module would. Only what the module would do the same way takes this path:
`argv` (or `cmd`, split as the module splits it) and nothing else, no word holding `$` or
starting with `~` (the module expands those itself), no task `environment`, not async, not
in check mode. Anything else (`chdir`, `creates`, `removes`, `stdin`, `strip_empty_ends`,
...) is the module's. The answer has the module's keys (`cmd`, `rc`, `stdout`, `stderr`
without trailing newlines and their `_lines`, `start`, `end`, `delta`, `changed`, and
`failed` with `msg: non-zero return code`). One difference: a program that is not installed fails with
the shell's rc 127 where the module says rc 2.

A plain argv with `creates` (an absolute path, no glob pattern) that already exists is the
module's skip, found by one `test` instead of a module run; where the path is missing, the
module runs the command.
"""
from __future__ import annotations

import datetime
import shlex
from typing import Any

from ansible.plugins.action.command import ActionModule as BuiltinCommand

#: The module's arguments this path handles; any other one set takes the module.
UNDERSTOOD = frozenset({"argv", "cmd", "_raw_params"})


def argv_of(args: dict[str, Any]) -> list[str] | None:
    """The words the module would run, or None where it must run them itself."""
    if any(value is not None for key, value in args.items() if key not in UNDERSTOOD):
        return None
    given = [args.get(key) for key in ("argv", "cmd", "_raw_params") if args.get(key) not in (None, "")]
    if len(given) != 1:
        return None
    words = shlex.split(given[0]) if isinstance(given[0], str) else given[0]
    if not isinstance(words, list) or not words or not all(isinstance(word, str) for word in words):
        return None
    if any("$" in word or word.startswith("~") for word in words):
        return None
    return words


def created(args: dict[str, Any]) -> tuple[list[str], str] | None:
    """The words and the path of `creates`, where only it stands beside a plain argv and
    the shell can test it as the module's glob would (absolute, no pattern); else None."""
    path = args.get("creates")
    words = argv_of({key: value for key, value in args.items() if key != "creates"})
    if not isinstance(path, str) or not path.startswith("/") or any(c in path for c in "*?[~$"):
        return None
    return (words, path) if words is not None else None


def skipped(words: list[str], path: str) -> dict[str, Any]:
    """The command module's answer where `creates` exists and it does not run the command."""
    return {"changed": False, "cmd": words, "rc": 0, "stdout": f"skipped, since {path} exists",
            "stdout_lines": [f"skipped, since {path} exists"], "stderr": "", "stderr_lines": [],
            "start": None, "end": None, "delta": None,
            "msg": f"Did not run command since '{path}' exists"}


def shell_line(words: list[str]) -> str:
    """The shell command that runs `words`, each quoted as it is."""
    return "exec " + shlex.join(words)


def answer(words: list[str], done: dict[str, Any], start: datetime.datetime,
           end: datetime.datetime) -> dict[str, Any]:
    """The command module's answer for what the shell returned."""
    result: dict[str, Any] = {
        "changed": True, "cmd": words, "rc": done.get("rc"),
        "stdout": str(done.get("stdout", "")).rstrip("\r\n"),
        "stderr": str(done.get("stderr", "")).rstrip("\r\n"),
        "start": str(start), "end": str(end), "delta": str(end - start), "msg": ""}
    result.update(stdout_lines=result["stdout"].splitlines(),
                  stderr_lines=result["stderr"].splitlines())
    if result["rc"] != 0:
        result.update(failed=True, msg="non-zero return code")
    return result


class ActionModule(BuiltinCommand):
    """ansible.builtin.command, a plain argv run through the connection's shell."""

    def run(self, tmp: Any = None, task_vars: Any = None) -> Any:
        args = dict(self._task.args)
        words, creates = argv_of(args), created(args)
        if self._task.async_val or self._task.check_mode or any(self._task.environment or ()):
            return super().run(tmp, task_vars)
        if creates is not None and self._exists(creates[1]):
            return {**super(BuiltinCommand, self).run(tmp, task_vars), **skipped(*creates)}
        if words is None:
            return super().run(tmp, task_vars)
        result = super(BuiltinCommand, self).run(tmp, task_vars)
        start = datetime.datetime.now()
        done = self._low_level_execute_command(shell_line(words))
        end = datetime.datetime.now()
        return {**result, **answer(words, done, start, end)}

    def _exists(self, path: str) -> bool:
        """Whether `path` is there (a dangling link too, as glob finds it)."""
        quoted = shlex.quote(path)
        return bool(self._low_level_execute_command(f"test -e {quoted} || test -h {quoted}").get("rc") == 0)
