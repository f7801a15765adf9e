"""pyhpc.deploy.service: ansible.builtin.service, with a service already started (and
enabled, where asked) checked by one shell command instead of a module run.

The builtin action picks the module from the host's service manager; this one keeps that
choice and probes only where it can answer as that module would:
- `ansible.legacy.systemd`: `systemctl is-active` says exactly `active` (the module's
  ActiveState) and, where `enabled: true` is asked, `systemctl is-enabled` exactly
  `enabled` (rc 0, not `indirect` or `alias`);
- `ansible.legacy.service` on a host without systemd, upstart or OpenRC, with an init script
  and update-rc.d (the lab): `service NAME status` run as the module runs it (from `/`, with
  only its locale in the environment), read with the module's own rules (`running`), and
  an `S??NAME` link in `/etc/rc?.d` where `enabled: true` is asked.
A unit that is not active has its failure (and start limit) reset before the module
starts it, and every unit before the module restarts it. Only `name`, `state: started`
and `enabled: true` take the probe; a stopped or disabled service, any other argument,
check mode or async runs the module, so every start and enable is Ansible's.
"""
from __future__ import annotations

import shlex
from typing import Any

from ansible.plugins.action.service import ActionModule as BuiltinService

SYSTEMD = 'systemctl is-active -- {name}; systemctl is-enabled -- {name}'
#: A failed unit's start limit cleared before the module starts it.
RESET = 'systemctl reset-failed -- {name}'
#: The service module's tools on a SysV host (LinuxService.get_service_tools): where any other
#: manager is there, or the script or update-rc.d is missing, the module decides.
SYSV = ('n={name}; PATH="$PATH:/sbin:/usr/sbin:/bin:/usr/bin"; '
        'for d in /run/systemd/system/ /dev/.run/systemd/ /dev/.systemd/; do '
        '[ -e "$d" ] && exit 9; done; '
        '[ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && exit 9; '
        'for t in initctl rc-service; do command -v "$t" >/dev/null && exit 9; done; '
        '[ -f "/etc/init.d/$n" ] && command -v update-rc.d >/dev/null || exit 9; '
        's=$(command -v service) || exit 9; '
        'links=$(ls -d /etc/rc?.d/S??"$n" 2>/dev/null | wc -l); '
        'out=$(cd / && env -i LANG=C.UTF-8 LC_ALL=C.UTF-8 LC_MESSAGES=C.UTF-8 "$s" "$n" status </dev/null '
        '2>/dev/null; echo "rc=$?"); '
        'printf "links=%s\\n%s" "$links" "$out"')


def running(rc: int, stdout: str, name: str) -> bool | None:
    """The service module's verdict (LinuxService.get_service_status, SysV) on a status
    command's rc and output."""
    if rc in (1, 2, 3, 4, 69):
        return False
    if stdout.count("\n") <= 1:
        clean = stdout.lower().replace(name.lower(), "")
        if "stop" in clean:
            return False
        if "run" in clean:
            return "not " not in clean
        if "start" in clean and "not " not in clean:
            return True
        if any(dead in clean for dead in ("could not access pid file", "is dead and pid file exists",
                                          "dead but subsys locked", "dead but pid file exists")):
            return False
    return True if rc == 0 else None


def sysv_settled(stdout: str, name: str, enabled: bool) -> bool:
    """Whether SYSV's output says the service runs (and is enabled, where asked)."""
    head, _, rest = stdout.partition("\n")
    status, _, last = rest.rpartition("rc=")
    if not head.startswith("links=") or not head[6:].isdigit() or not last.isdigit():
        return False
    if enabled and int(head[6:]) == 0:
        return False
    return running(int(last), status, name) is True


def probe_args(args: dict[str, Any]) -> tuple[str, bool] | None:
    """The service's name and whether `enabled: true` is asked, where the task asks only
    that it be started (and enabled); None where the module must run."""
    name, enabled = args.get("name"), args.get("enabled")
    if set(args) - {"name", "state", "enabled"} or args.get("state") != "started":
        return None
    if not isinstance(name, str) or not name or enabled not in (None, True):
        return None
    return name, enabled is True


class ActionModule(BuiltinService):
    """ansible.builtin.service, a started service probed first."""

    def _execute_module(self, module_name: Any = None, module_args: Any = None, *args: Any,
                        **kwargs: Any) -> Any:
        self._reset_unsettled(module_name, dict(module_args or {}))
        asked = probe_args(dict(module_args or {}))
        if asked is not None and not self._task.check_mode and not kwargs.get("wrap_async"):
            name, enabled = asked
            if module_name == "ansible.legacy.systemd":
                done = self._low_level_execute_command(SYSTEMD.format(name=shlex.quote(name)))
                want = ["active", "enabled"] if enabled else ["active"]
                if done.get("stdout", "").splitlines()[:len(want)] == want:
                    return self._settled(name, enabled)
            elif module_name == "ansible.legacy.service":
                done = self._low_level_execute_command(SYSV.format(name=shlex.quote(name)))
                if done.get("rc") == 0 and sysv_settled(done.get("stdout", ""), name, enabled):
                    return self._settled(name, enabled)
        return super()._execute_module(module_name, module_args, *args, **kwargs)

    def _reset_unsettled(self, module_name: Any, args: dict[str, Any]) -> None:
        """Before systemd starts or restarts a unit that is not active (failed, or restarting
        on its own), clear its failure and start limit: its package started it before the
        role wrote its configuration (files that need the package's user), and that crash
        loop would make systemctl refuse the role's own start."""
        name = args.get("name")
        if module_name != "ansible.legacy.systemd" or self._task.check_mode \
                or args.get("state") not in ("started", "restarted") \
                or not isinstance(name, str) or not name:
            return
        quoted = shlex.quote(name)
        if args["state"] == "restarted":
            # A crash loop is `active` for a moment between its restarts: a restart always
            # clears the counter first (reset-failed resets it on an active unit too).
            self._low_level_execute_command(RESET.format(name=quoted))
            return
        done = self._low_level_execute_command(f"systemctl is-active -- {quoted}")
        if done.get("stdout", "").splitlines()[:1] != ["active"]:
            self._low_level_execute_command(RESET.format(name=quoted))

    @staticmethod
    def _settled(name: str, enabled: bool) -> dict[str, Any]:
        result: dict[str, Any] = {"changed": False, "name": name, "state": "started"}
        if enabled:
            result["enabled"] = True
        return result
