"""pyhpc.deploy's lineinfile, replace, blockinfile, wait_for, slurp, user and group, and the
file action's links: what is already as asked is settled by one shell command, with no
module run; anything else ends as the builtin modules leave it.

Each action runs in ansible-playbook beside its builtin twin (a twin file, the same port,
account or link), and the two must answer alike: first, again, and after drift by hand.
"""
from __future__ import annotations

import importlib
import json
import shutil
import socket
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.roleplay import ANSIBLE, results, run_playbook

# The collection's namespace, as Ansible finds it. Only the pure modules: importing Ansible
# here would patch sys.intern under torch's later import in this worker (its dynamo refuses).
sys.path.insert(0, str(ANSIBLE / "collections"))
UTILS = "ansible_collections.pyhpc.deploy.plugins.plugin_utils"
edits, accounts, asked = (importlib.import_module(f"{UTILS}.{name}")
                          for name in ("edits", "accounts", "asked"))

KINDS = {"pyhpc": "pyhpc.deploy", "builtin": "ansible.builtin"}
PLAY = "- hosts: localhost\n  gather_facts: false\n  tasks:\n{tasks}"
NSCD = b"# nscd.conf\n\tpositive-time-to-live\tpasswd\t\t600\n\tenable-cache\t\tpasswd\t\tyes\n"
NSSWITCH = b"passwd:         files systemd\ngroup:          files\nhosts: files dns\n"
HOSTS = b"127.0.0.1 localhost\n::1 localhost\n"
#: (name, action, arguments with {d} for the kind's directory), as the roles ask.
EDITS = [
    ("lineinfile", "lineinfile", {"path": "{d}/nscd.conf", "regexp": r"^\s*positive-time-to-live\s+passwd\s",
                                  "line": "\tpositive-time-to-live\tpasswd\t\t60"}),
    ("replace", "replace", {"path": "{d}/nsswitch.conf",
                            "regexp": r"^(passwd|group):(\s+)((?:(?!\bldap\b).)*?)\s*$",
                            "replace": r"\1:\2\3 ldap"}),
    ("blockinfile", "blockinfile", {"path": "{d}/hosts", "marker": "# {mark} pyhpc lab nodes",
                                    "block": "127.0.0.1 cpu1\n127.0.0.1 cpu2\n", "unsafe_writes": True}),
    ("link", "file", {"path": "{d}/pyhpc", "src": "{d}/nscd.conf", "state": "link"}),
]


def play(where: Path, kind: str, cases: list[tuple[str, str, dict[str, Any]]], **task: Any) -> Path:
    """A play of `cases` as tasks of `kind`, each with the task keywords `task`."""
    d = str(where / kind)
    tasks = "".join(
        f"    - name: {name}\n      {KINDS[kind]}.{action}: "
        f"{json.dumps({k: v.replace('{d}', d) if isinstance(v, str) else v for k, v in args.items()})}\n"
        + "".join(f"      {key}: {json.dumps(value)}\n" for key, value in task.items())
        for name, action, args in cases)
    path = where / f"play-{kind}.yml"
    path.write_text(PLAY.format(tasks=tasks))
    return path


def twins(where: Path, cases: list[tuple[str, str, dict[str, Any]]], **task: Any,
          ) -> dict[str, tuple[dict[str, dict[str, Any]], list[str]]]:
    """Each kind's play run alone: kind -> (task name -> result, the modules it sent)."""
    found = {}
    for kind in KINDS:
        remote = where / f"remote-{kind}"
        shutil.rmtree(remote, ignore_errors=True)
        proc, report = run_playbook(where / "hosts", play(where, kind, cases, **task), env={
            "ANSIBLE_KEEP_REMOTE_FILES": "1", "ANSIBLE_REMOTE_TMP": str(remote)})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        sent = sorted(p.name for p in remote.rglob("AnsiballZ_*.py")) if remote.exists() else []
        found[kind] = (results(report), sent)
    return found


def alike(found: dict[str, tuple[dict[str, dict[str, Any]], list[str]]], name: str,
          keys: Iterable[str], where: Path | None = None) -> bool:
    """Whether both kinds answered task `name` alike in `keys` (each kind's directory under
    `where` read as one)."""
    def answer(kind: str) -> dict[str, Any]:
        got = {key: found[kind][0][name].get(key) for key in keys}
        return json.loads(json.dumps(got).replace(str(where / kind), "{d}")) if where else got
    return answer("pyhpc") == answer("builtin")


def changed(found: dict[str, tuple[dict[str, dict[str, Any]], list[str]]], kind: str) -> dict[str, bool]:
    return {name: bool(result.get("changed")) for name, result in found[kind][0].items()}


@pytest.fixture
def where(tmp_path: Path) -> Path:
    (tmp_path / "hosts").write_text(
        "localhost ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n")
    for kind in KINDS:
        (tmp_path / kind).mkdir()
        for name, body in (("nscd.conf", NSCD), ("nsswitch.conf", NSSWITCH), ("hosts", HOSTS)):
            (tmp_path / kind / name).write_bytes(body)
    return tmp_path


def files(where: Path, kind: str) -> dict[str, Any]:
    d = where / kind
    return {p.name: str(Path(p.readlink()).relative_to(d)) if p.is_symlink() else p.read_bytes()
            for p in sorted(d.iterdir())}


def test_the_edits_converge_as_the_modules_do_and_run_no_module_when_nothing_changed(where: Path) -> None:
    names = [name for name, _, _ in EDITS]
    found = twins(where, EDITS)
    assert changed(found, "pyhpc") == changed(found, "builtin") == dict.fromkeys(names, True)
    assert files(where, "pyhpc") == files(where, "builtin")
    assert b"group:          files ldap\n" in (where / "pyhpc" / "nsswitch.conf").read_bytes()

    found = twins(where, EDITS)
    assert changed(found, "pyhpc") == changed(found, "builtin") == dict.fromkeys(names, False)
    assert found["pyhpc"][1] == []  # each file read and decided, no module sent
    assert len(found["builtin"][1]) == len(EDITS)
    for name in names:
        assert alike(found, name, ("msg", "dest", "src", "state"), where), name

    for kind in KINDS:  # drift by hand: each file back to what the roles found first
        d = where / kind
        (d / "nscd.conf").write_bytes(NSCD.replace(b"600", b"3600"))
        (d / "nsswitch.conf").write_bytes(NSSWITCH.replace(b"files ldap", b"files"))
        (d / "hosts").write_bytes((d / "hosts").read_bytes().replace(b"cpu2", b"cpu9"))
        (d / "pyhpc").unlink()
        (d / "pyhpc").symlink_to(d / "hosts")
    found = twins(where, EDITS)
    assert changed(found, "pyhpc") == changed(found, "builtin") == dict.fromkeys(names, True)
    assert files(where, "pyhpc") == files(where, "builtin")


@pytest.mark.parametrize(("content", "settled"), [
    (b"a\n\tpositive-time-to-live\tpasswd\t\t60\n", True),
    (b"\tpositive-time-to-live\tpasswd\t\t60\n\tpositive-time-to-live passwd 600\n", False),  # the last match
    (b"\tpositive-time-to-live\tpasswd\t\t60", False),  # no newline: the module adds one
    (b"\tpositive-time-to-live\tpasswd\t\t60\r\n", False),
    (b"a\n", False),  # added
    (b"x\r\tpositive-time-to-live\tpasswd\t\t60\n", False),  # one line to the module: replaced
    (b"", False),
])
def test_lineinfile_is_decided_by_the_modules_rule(content: bytes, settled: bool) -> None:
    args = {"path": "/x", "regexp": r"^\s*positive-time-to-live\s+passwd\s",
            "line": "\tpositive-time-to-live\tpasswd\t\t60"}
    assert (edits.lineinfile(args, content) is not None) is settled


def test_lineinfile_finds_the_exact_line_where_the_regexp_matches_none() -> None:
    args = {"path": "/x", "regexp": "^nothing$", "line": "kept"}
    assert edits.lineinfile(args, b"a\nkept\n") == {"changed": False, "msg": "", "backup": ""}
    assert edits.lineinfile(args, b"a\nkept") is None


@pytest.mark.parametrize(("content", "settled"), [
    (b"x\n# BEGIN b\nblock\n# END b\ny\n", True),
    (b"x\n# END b\nblock\n# BEGIN b\ny\n", False),  # reversed: the module puts them in order
    (b"x\n# BEGIN b\nblock\n", False),
    (b"# BEGIN b\nold\n# END b\n", False),
    (b"# BEGIN b\nblock\n# END b\n# BEGIN b\nblock\n# END b\n", True),  # the module rewrites the last pair
    (b"# BEGIN b\nold\n# END b\n# BEGIN b\nblock\n# END b\n", True),
    (b"# BEGIN b\nblock\n# END b\n# BEGIN b\nold\n# END b\n", False),
])
def test_blockinfile_is_decided_by_the_modules_rule(content: bytes, settled: bool) -> None:
    args = {"path": "/x", "marker": "# {mark} b", "block": "block"}
    assert (edits.blockinfile(args, content) is not None) is settled


@pytest.mark.parametrize("args", [
    {"path": "/x", "regexp": "a", "line": "a", "insertafter": "b"},
    {"path": "/x", "regexp": "a", "line": "a", "backrefs": True},
    {"path": "/x", "regexp": "a", "line": "a", "create": True},
    {"path": "/x", "regexp": "a", "line": "a", "mode": "0644"},
    {"path": "/x", "regexp": "a", "line": "a", "state": "absent"},
    {"path": "/x", "regexp": "(", "line": "a"},
    {"path": "/x", "regexp": "", "line": "a"},
    {"path": "/x", "line": "a"},
])
def test_any_other_lineinfile_takes_the_module(args: dict[str, Any]) -> None:
    assert edits.lineinfile(args, b"a\n") is None


@pytest.mark.parametrize("args", [
    {"path": "~/x", "regexp": "a"}, {"path": "$HOME/x", "regexp": "a"}, {"path": "x", "regexp": "a"},
    {"path": "/x", "dest": "/y", "regexp": "a"},
])
def test_a_path_the_module_would_expand_is_not_read(args: dict[str, Any]) -> None:
    assert edits.path_of(args) is None


def test_replace_settles_only_where_nothing_would_change() -> None:
    args = {"path": "/x", "regexp": "^a(b)?$", "replace": "ab"}
    assert edits.replace(args, b"ab\nc\n") is not None
    assert edits.replace(args, b"c\n") is not None  # no match: nothing to do
    assert edits.replace(args, b"a\n") is None
    assert edits.replace({**args, "after": "c"}, b"ab\n") is None
    assert edits.replace({**args, "encoding": "latin-1"}, b"ab\n") is None


# --- wait_for, slurp, user and group ------------------------------------------------------


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def test_a_port_that_answers_is_settled_by_one_connect(where: Path, listening: int) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    cases = [("open", "wait_for", {"host": "127.0.0.1", "port": listening, "timeout": 10}),
             ("closed", "wait_for", {"port": free, "timeout": 1})]
    found = twins(where, cases, failed_when=False)
    keys = ("state", "port", "path", "search_regex", "changed", "msg")
    assert alike(found, "open", keys) and alike(found, "closed", keys)
    assert found["pyhpc"][0]["closed"]["msg"] == f"Timeout when waiting for 127.0.0.1:{free}"
    assert found["pyhpc"][1] == ["AnsiballZ_wait_for.py"]  # the closed port's wait alone
    assert len(found["builtin"][1]) == 2


@pytest.mark.parametrize("args", [
    {"port": 22, "delay": 1}, {"port": 22, "search_regex": "SSH"}, {"path": "/x"},
    {"port": 22, "state": "stopped"}, {"port": "twenty"}, {"port": 0}, {"port": 22, "connect_timeout": "x"},
])
def test_any_other_wait_takes_the_module(args: dict[str, Any]) -> None:
    assert asked.connect_line(args) is None
    assert asked.connect_line({"port": 22}) == \
        "timeout 5 bash -c 'exec 3<>\"/dev/tcp/$0/$1\"' 127.0.0.1 22"


def test_slurp_reads_a_file_as_the_module_does(where: Path) -> None:
    (where / "secret").write_bytes(bytes(range(256)) * 3)
    cases = [("read", "slurp", {"src": str(where / "secret")}),
             ("missing", "slurp", {"src": str(where / "nothing")})]
    found = twins(where, cases, failed_when=False)
    keys = ("content", "encoding", "source", "failed", "msg")
    assert alike(found, "read", keys) and alike(found, "missing", keys)
    assert "not found" in found["pyhpc"][0]["missing"]["msg"]
    assert found["pyhpc"][1] == ["AnsiballZ_slurp.py"]  # the missing file's error alone


def test_an_existing_account_as_asked_is_settled_and_a_missing_one_is_the_modules(where: Path) -> None:
    home = Path("~root").expanduser()
    shell = next(line.split(":")[6] for line in Path("/etc/passwd").read_text().splitlines()
                 if line.startswith("root:"))
    cases = [("user", "user", {"name": "root", "group": "root", "system": True, "shell": shell,
                               "home": str(home), "create_home": False}),
             ("group", "group", {"name": "root", "system": True}),
             ("missing user", "user", {"name": "pyhpc-no-such-user", "group": "root", "create_home": False}),
             ("missing group", "group", {"name": "pyhpc-no-such-group", "system": True})]
    found = twins(where, cases, check_mode=True)  # check mode: the missing ones are not made
    for name, action, _ in cases:
        keys = (accounts.USER if action == "user" else accounts.GROUP) | {"changed", "uid", "gid", "comment"}
        assert alike(found, name, keys), name
    assert changed(found, "pyhpc") == {"user": False, "group": False, "missing user": True,
                                       "missing group": True}
    assert found["pyhpc"][1] == ["AnsiballZ_group.py", "AnsiballZ_user.py"]


PASSWD = "hub:x:998:997:hub user:/var/lib/hub:/usr/sbin/nologin\nhub:x:997:\n"


@pytest.mark.parametrize(("args", "settled"), [
    ({"name": "hub", "group": "hub", "home": "/var/lib/hub", "shell": "/usr/sbin/nologin",
      "create_home": False}, True),
    ({"name": "hub", "create_home": False}, True),
    ({"name": "hub", "group": "hub", "shell": "/bin/bash", "create_home": False}, False),
    ({"name": "hub", "home": "/home/hub", "create_home": False}, False),
    ({"name": "hub", "group": "hub"}, False),  # create_home defaults to true: a missing home is made
    ({"name": "hub", "uid": 998, "create_home": False}, False),
    ({"name": "hub", "groups": ["a"], "create_home": False}, False),
    ({"name": "hub", "create_home": False, "state": "absent"}, False),
])
def test_a_user_is_settled_only_as_asked(args: dict[str, Any], settled: bool) -> None:
    assert (accounts.user_settled(args, PASSWD) is not None) is settled
    other_group = PASSWD.replace("hub:x:997:\n", "hub:x:5:\n")
    assert accounts.user_settled({"name": "hub", "group": "hub", "create_home": False}, other_group) is None
    assert accounts.user_settled({"name": "hub", "create_home": False}, "none\nnone\n") is None
