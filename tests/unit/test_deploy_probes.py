"""pyhpc.deploy's wait_for and slurp, and the file action's links: what is already as asked
is settled by one shell command, with no module run; anything else ends as the builtin
modules leave it.

Each action runs in ansible-playbook beside its builtin twin (a twin file, the same port
or link), and the two must answer alike: first, again, and after drift by hand.
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
asked = importlib.import_module(f"{UTILS}.asked")

KINDS = {"pyhpc": "pyhpc.deploy", "builtin": "ansible.builtin"}
PLAY = "- hosts: localhost\n  gather_facts: false\n  tasks:\n{tasks}"
#: (name, action, arguments with {d} for the kind's directory), as the roles ask.
LINKS = [("link", "file", {"path": "{d}/pyhpc", "src": "{d}/hosts", "state": "link"})]


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
        for name in ("hosts", "other"):
            (tmp_path / kind / name).write_bytes(b"127.0.0.1 localhost\n")
    return tmp_path


def files(where: Path, kind: str) -> dict[str, Any]:
    d = where / kind
    return {p.name: str(Path(p.readlink()).relative_to(d)) if p.is_symlink() else p.read_bytes()
            for p in sorted(d.iterdir())}


def test_a_link_converges_as_the_module_does_and_runs_no_module_when_nothing_changed(where: Path) -> None:
    names = [name for name, _, _ in LINKS]
    found = twins(where, LINKS)
    assert changed(found, "pyhpc") == changed(found, "builtin") == dict.fromkeys(names, True)
    assert files(where, "pyhpc") == files(where, "builtin")

    found = twins(where, LINKS)
    assert changed(found, "pyhpc") == changed(found, "builtin") == dict.fromkeys(names, False)
    assert found["pyhpc"][1] == []  # the link read and decided, no module sent
    assert len(found["builtin"][1]) == len(LINKS)
    for name in names:
        assert alike(found, name, ("msg", "dest", "src", "state"), where), name

    for kind in KINDS:  # drift by hand: the link to another file
        d = where / kind
        (d / "pyhpc").unlink()
        (d / "pyhpc").symlink_to(d / "other")
    found = twins(where, LINKS)
    assert changed(found, "pyhpc") == changed(found, "builtin") == dict.fromkeys(names, True)
    assert files(where, "pyhpc") == files(where, "builtin")


# --- wait_for and slurp ---------------------------------------------------------------------


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
