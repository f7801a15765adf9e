"""pyhpc.deploy's copy, template and file actions: a path already as asked is checked in one
shell command, with no module run; anything else ends as the builtin actions leave it.

The probe runs here in ``sh`` on real paths; the actions run in ansible-playbook with the
repository's ansible.cfg, each beside its builtin twin on a twin path, and the twins must
agree after every run: first, again (nothing to do), and after drift made by hand.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.unit.roleplay import ANSIBLE, results, run_playbook

PLUGINS = ANSIBLE / "collections/ansible_collections/pyhpc/deploy/plugins"


def _load(path: str) -> ModuleType:
    """A plugin's file as a module (the collection's package is Ansible's to import)."""
    spec = importlib.util.spec_from_file_location(f"pyhpc_deploy_{Path(path).stem}", PLUGINS / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


probe = _load("plugin_utils/probe.py")


def probed(path: Path) -> dict[str, Any] | None:
    done = subprocess.run(["sh", "-c", probe.command(str(path))], capture_output=True, text=True,
                          check=True)
    result: dict[str, Any] | None = probe.parse(done.stdout)
    return result


def test_the_probe_reads_a_plain_file_as_the_stat_module_does(tmp_path: Path) -> None:
    path = tmp_path / "it's a file; $(true)"
    path.write_bytes(b"some bytes\n")
    path.chmod(0o4751)
    found = probed(path)
    assert found is not None
    info = path.stat()
    assert found == {"exists": True, "isdir": False, "isreg": True, "islnk": False,
                    "uid": info.st_uid, "gid": info.st_gid,
                    "pw_name": pwd.getpwuid(info.st_uid).pw_name,
                    "gr_name": subprocess.run(["stat", "-c", "%G", str(path)], capture_output=True,
                                              text=True, check=True).stdout.strip(),
                    "mode": "4751", "checksum": hashlib.sha1(b"some bytes\n").hexdigest()}


def test_the_probe_reads_a_directory_and_an_absent_path(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o710)
    (tmp_path / "d").chmod(0o710)
    found = probed(tmp_path / "d")
    assert found is not None and found["isdir"] and not found["isreg"] and found["mode"] == "0710"
    assert "checksum" not in found
    assert probed(tmp_path / "nothing") == {"exists": False, "isdir": False, "isreg": False,
                                            "islnk": False, "checksum": "1"}


def test_a_link_or_a_fifo_is_left_to_the_modules(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("x\n")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    os.mkfifo(tmp_path / "fifo")
    for name in ("link", "dangling", "fifo"):
        assert probed(tmp_path / name) is None, name
    for garbage in ("", "file 0 0 root root", "file 0 0 root root 644\nnot-a-digest  -",
                    "directory 0 0 root root 755\nextra", "file 0 0 root root 6x4\n" + "a" * 40):
        assert probe.parse(garbage) is None, garbage


FILE = {"exists": True, "isdir": False, "isreg": True, "islnk": False, "uid": 0, "gid": 42,
        "pw_name": "root", "gr_name": "shadow", "mode": "0640", "checksum": "a" * 40}


@pytest.mark.parametrize("args", [
    {"dest": "/x", "state": "file", "owner": "root", "group": "shadow", "mode": "0640"},
    {"dest": "/x", "state": "file", "owner": "0", "group": 42, "mode": "640"},
    {"dest": "/x", "state": "file", "mode": 0o640, "_original_basename": "x.j2", "recurse": False,
     "follow": True, "unsafe_writes": None, "seuser": None},
    {"path": "/x"},
])
def test_a_file_as_asked_is_settled_without_the_module(args: dict[str, Any]) -> None:
    settled = probe.settled(args, FILE)
    assert settled is not None and settled["changed"] is False and settled["path"] == "/x"


@pytest.mark.parametrize("args", [
    {"dest": "/x", "state": "file", "mode": "0644"},
    {"dest": "/x", "state": "file", "mode": "u=rw,g=r"},
    {"dest": "/x", "state": "file", "mode": True},
    {"dest": "/x", "state": "file", "owner": "nobody"},
    {"dest": "/x", "state": "file", "group": "root"},
    {"dest": "/x", "state": "file", "seuser": "system_u"},
    {"dest": "/x", "state": "file", "attributes": "+i"},
    {"dest": "/x", "state": "directory"},
    {"dest": "/x", "state": "absent"},
    {"dest": "/x", "state": "touch"},
    {"dest": "/x", "state": "link", "src": "/y"},
    {"dest": "/x", "state": "file", "recurse": True},
])
def test_anything_else_takes_the_module(args: dict[str, Any]) -> None:
    assert probe.settled(args, FILE) is None
    assert probe.settled(args, None) is None


def test_an_absent_path_asked_absent_is_settled() -> None:
    absent = probe.parse("absent\n")
    assert probe.settled({"path": "/x", "state": "absent"}, absent) == {
        "changed": False, "path": "/x", "state": "absent"}
    assert probe.settled({"path": "/x", "state": "directory"}, absent) is None


# --- the actions in ansible-playbook, each beside its builtin twin ------------------------

PLAY = """\
- hosts: localhost
  gather_facts: false
  vars:
    greeting: hello
  tasks:
{tasks}
"""
TASK = """\
    - name: {name} ({kind})
      {action}:
{args}
"""
#: (name, action's short name, arguments with {d} for the twin's directory).
CASES = [
    ("template", "template", {"src": "{t}/greeting.j2", "dest": "{d}/greeting.conf",
                              "owner": "root", "group": "root", "mode": "0640"}),
    ("copy", "copy", {"content": "a line\n", "dest": "{d}/copied", "mode": "0604"}),
    ("copy once", "copy", {"content": "first\n", "dest": "{d}/once", "force": False,
                           "mode": "0600"}),
    ("directory", "file", {"path": "{d}/dir", "state": "directory", "mode": "0750"}),
    ("absent", "file", {"path": "{d}/unwanted", "state": "absent"}),
    ("log touched, times kept", "file", {"path": "{d}/log", "state": "touch", "mode": "0640",
                                         "modification_time": "preserve", "access_time": "preserve"}),
]
TWINS = {"pyhpc": "pyhpc.deploy", "builtin": "ansible.builtin"}


def write_play(where: Path, kinds: list[str]) -> Path:
    tasks = []
    for kind in kinds:
        (where / kind).mkdir(exist_ok=True)
        for name, action, args in CASES:
            lines = "\n".join(
                f"        {key}: {value.format(d=where / kind, t=where / 'templates')!r}"
                if isinstance(value, str) else f"        {key}: {value}" for key, value in args.items())
            tasks.append(TASK.format(name=name, kind=kind, action=f"{TWINS[kind]}.{action}", args=lines))
    path = where / f"play-{'-'.join(kinds)}.yml"
    path.write_text(PLAY.format(tasks="".join(tasks)))
    return path


@pytest.fixture
def where(tmp_path: Path) -> Path:
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "greeting.j2").write_text("{{ greeting }}, world\n")
    (tmp_path / "hosts").write_text(
        "localhost ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n")
    return tmp_path


def converge(where: Path, kinds: list[str]) -> tuple[dict[str, dict[str, bool]], list[str]]:
    """Run the play of `kinds`: kind -> task -> changed, and the modules it sent to the
    host (kept: ANSIBLE_KEEP_REMOTE_FILES), sorted."""
    remote = where / "remote"
    shutil.rmtree(remote, ignore_errors=True)
    proc, report = run_playbook(where / "hosts", write_play(where, kinds), env={
        "ANSIBLE_KEEP_REMOTE_FILES": "1", "ANSIBLE_REMOTE_TMP": str(remote)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    changed: dict[str, dict[str, bool]] = {kind: {} for kind in kinds}
    for task in report["plays"][0]["tasks"]:
        name, kind = task["task"]["name"][:-1].split(" (")
        changed[kind][name] = bool(task["hosts"]["localhost"].get("changed"))
    sent = sorted(p.name for p in remote.rglob("AnsiballZ_*.py")) if remote.exists() else []
    return changed, sent


def snapshot(where: Path, kind: str) -> dict[str, tuple[Any, ...]]:
    """Each case's path: its type, mode, owner, group and content or link target."""
    found: dict[str, tuple[Any, ...]] = {}
    for path in sorted((where / kind).iterdir()):
        info = path.lstat()
        body: Any = (os.readlink(path) if path.is_symlink() else
                     None if path.is_dir() else path.read_bytes())
        found[path.name] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode),
                            info.st_uid, info.st_gid, body)
    return found


def test_the_actions_converge_as_the_builtins_do_and_run_no_module_when_nothing_changed(
        where: Path) -> None:
    both = list(TWINS)
    for kind in both:
        (where / kind).mkdir()
        (where / kind / "unwanted").write_text("planted\n")
    changed, _ = converge(where, both)
    assert changed["pyhpc"] == changed["builtin"] == {name: True for name, _, _ in CASES}
    assert snapshot(where, "pyhpc") == snapshot(where, "builtin")
    assert (where / "pyhpc" / "greeting.conf").read_text() == "hello, world\n"

    changed, sent = converge(where, ["pyhpc"])
    assert changed["pyhpc"] == {name: False for name, _, _ in CASES}
    assert sent == []  # not one module run: each path checked by the probe alone
    changed, sent = converge(where, ["builtin"])
    assert changed["builtin"] == {name: False for name, _, _ in CASES}
    assert sent  # the builtins' stat and file modules, for the same answer

    victim = where / "victim"
    victim.write_text("not pyhpc's\n")
    nobody = pwd.getpwnam("nobody")
    for kind in both:
        d = where / kind
        os.chown(d / "greeting.conf", nobody.pw_uid, nobody.pw_gid)
        (d / "greeting.conf").chmod(0o666)
        (d / "copied").unlink()
        (d / "copied").symlink_to(victim)  # planted: the write must replace the link
        (d / "once").write_text("edited by hand\n")  # force: false keeps it
        (d / "dir").chmod(0o777)
        (d / "log").chmod(0o666)
        (d / "unwanted").write_text("planted again\n")
    changed, _ = converge(where, both)
    expected = {name: name != "copy once" for name, _, _ in CASES}
    assert changed["pyhpc"] == changed["builtin"] == expected
    assert snapshot(where, "pyhpc") == snapshot(where, "builtin")
    assert victim.read_text() == "not pyhpc's\n"
    assert (where / "pyhpc" / "once").read_text() == "edited by hand\n"
    info = (where / "pyhpc" / "greeting.conf").stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o640)


# --- pyhpc.deploy.command: a plain argv through the shell, beside the command module ------

#: (name, the task's arguments); each runs as pyhpc.deploy.command and as the builtin, with
#: failed_when false, and the two registered answers must agree.
COMMANDS = [
    ("output and errors", {"argv": ["sh", "-c", "printf 'one\\n two \\n\\n'; echo err >&2"]}),
    ("words kept as they are", {"argv": ["printf", "%s|", "it's; `id` & a  b", "*", "'\"", ""]}),
    ("a failure", {"argv": ["sh", "-c", "echo out; echo err >&2; exit 3"]}),
    ("cmd split as the module splits it", {"cmd": "printf '%s|' 'two words' three"}),
    ("a variable, expanded by the module", {"argv": ["printf", "%s", "$HOME ~"]}),
    ("chdir, the module's", {"argv": ["pwd"], "chdir": "/"}),
    ("stdin, the module's", {"argv": ["cat"], "stdin": "given"}),
    ("creates there, skipped", {"argv": ["echo", "ran"], "creates": "/etc/hostname"}),
    ("creates missing, the module runs it", {"argv": ["echo", "ran"], "creates": "/nonexistent/x"}),
]
#: The cases that must run no module in pyhpc.deploy.command.
SHELL_ONLY = {"output and errors", "words kept as they are", "a failure",
              "cmd split as the module splits it", "creates there, skipped"}
KEYS = ("rc", "stdout", "stderr", "stdout_lines", "stderr_lines", "cmd", "changed", "msg")


def command_play(where: Path, kind: str) -> Path:
    tasks = []
    for name, args in COMMANDS:
        tasks.append(f"    - name: {name}\n      {TWINS[kind]}.command: {json.dumps(args)}\n"
                     "      failed_when: false\n")
    path = where / f"commands-{kind}.yml"
    path.write_text(PLAY.format(tasks="".join(tasks)))
    return path


def test_the_command_action_answers_as_the_command_module_with_no_module_run(where: Path) -> None:
    answers, sent = {}, {}
    for kind in TWINS:
        remote = where / f"remote-{kind}"
        proc, report = run_playbook(where / "hosts", command_play(where, kind), env={
            "ANSIBLE_KEEP_REMOTE_FILES": "1", "ANSIBLE_REMOTE_TMP": str(remote)})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        answers[kind] = {name: {key: result.get(key) for key in KEYS}
                         for name, result in results(report).items()}
        sent[kind] = len(list(remote.rglob("AnsiballZ_command.py"))) if remote.exists() else 0
    assert answers["pyhpc"] == answers["builtin"]
    assert answers["pyhpc"]["a failure"]["rc"] == 3
    assert answers["pyhpc"]["words kept as they are"]["stdout"] == "it's; `id` & a  b|*|'\"||"
    assert answers["pyhpc"]["a variable, expanded by the module"]["stdout"] == f"{Path.home()} ~"
    assert answers["pyhpc"]["creates there, skipped"]["stdout"] == "skipped, since /etc/hostname exists"
    assert answers["pyhpc"]["creates missing, the module runs it"]["stdout"] == "ran"
    assert sent["builtin"] == len(COMMANDS)
    assert sent["pyhpc"] == len(COMMANDS) - len(SHELL_ONLY)


@pytest.mark.parametrize("args", [
    {"argv": ["echo", "$PATH"]}, {"argv": ["ls", "~root"]}, {"argv": ["true"], "creates": "/x"},
    {"argv": ["true"], "removes": "/x"}, {"argv": ["true"], "strip_empty_ends": False},
    {"argv": ["true"], "expand_argument_vars": False}, {"argv": []}, {"argv": [True]},
    {"argv": ["true"], "cmd": "true"}, {},
])
def test_anything_but_a_plain_argv_takes_the_module(args: dict[str, Any]) -> None:
    assert _load("action/command.py").argv_of(args) is None


def test_a_plain_argv_is_quoted_word_for_word() -> None:
    command = _load("action/command.py")
    words = command.argv_of({"argv": ["printf", "%s", "a b; c", "'"], "chdir": None})
    assert words == ["printf", "%s", "a b; c", "'"]
    line = command.shell_line(words)
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    assert done.stdout == "a b; c'"


# --- pyhpc.deploy.service: a started service probed, as the service module reads it ------


@pytest.mark.parametrize(("rc", "stdout", "verdict"), [
    (0, "slurmctld is running\n", True),  # pyhpc's init scripts
    (0, "nslcd running (pid 14373).\n", True),
    (0, "Status of Name Service Cache Daemon service: :running..\n", True),  # Debian's nscd
    (0, "mariadb-admin  Ver 10.0\nServer version 10.11\nUptime: 21 min\n", True),  # rc decides
    (3, "slurmctld is not running\n", False),
    (0, "slurmctld is not running\n", False),  # the words win over rc 0, as in the module
    (0, "runner stopped\n", False),  # "stop" first
    (0, "pyhpc-slurmd: 4 nodes running\n", True),
    (0, "could not access PID file\n", False),
    (5, "something else\n", None),
    (0, "", True),
])
def test_the_status_is_read_by_the_service_modules_rules(rc: int, stdout: str,
                                                          verdict: bool | None) -> None:
    assert _load("action/service.py").running(rc, stdout, "slurmctld") is verdict


def test_the_sysv_probe_settles_only_a_running_enabled_service() -> None:
    service = _load("action/service.py")
    assert service.sysv_settled("links=4\nslurmctld is running\nrc=0", "slurmctld", True)
    assert service.sysv_settled("links=0\nslurmctld is running\nrc=0", "slurmctld", False)
    assert not service.sysv_settled("links=0\nslurmctld is running\nrc=0", "slurmctld", True)
    assert not service.sysv_settled("links=4\nslurmctld is not running\nrc=3", "slurmctld", True)
    assert service.sysv_settled("links=4\nno newline at the end rc=0", "x", True)
    for garbage in ("", "links=4", "links=x\nrc=0", "links=4\nrunning\nrc=", "links=4\nrunning"):
        assert not service.sysv_settled(garbage, "x", False), garbage


@pytest.mark.parametrize(("args", "asked"), [
    ({"name": "munge", "state": "started", "enabled": True}, ("munge", True)),
    ({"name": "munge", "state": "started"}, ("munge", False)),
    ({"name": "munge", "state": "stopped"}, None),
    ({"name": "munge", "state": "restarted"}, None),
    ({"name": "munge", "state": "started", "enabled": False}, None),
    ({"name": "munge", "enabled": True}, None),
    ({"name": "munge", "state": "started", "pattern": "munged"}, None),
    ({"name": "munge", "state": "started", "daemon_reload": True}, None),
    ({"name": "", "state": "started"}, None),
])
def test_only_started_and_enabled_is_probed(args: dict[str, Any], asked: Any) -> None:
    assert _load("action/service.py").probe_args(args) == asked
