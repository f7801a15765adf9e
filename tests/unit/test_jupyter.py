"""pyhpc.jupyter: the port a Jupyter job reports is the one its own server holds.

A stand-in server (a Python child that listens and writes its jpserver-PID.json, as
jupyter_server does) exercises the real /proc check; the lab test runs JupyterLab itself.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyhpc import jupyter

#: A stand-in that does what jupyter_server does, in its order: it records $2 as its port
#: in its jpserver-PID.json first, then after $4 seconds listens on 127.0.0.1:$1 (the
#: real server binds once its event loop runs), then waits to be stopped.
SERVER = """
import json, os, socket, sys, time
info = {"pid": os.getpid(), "port": int(sys.argv[2]), "hostname": "127.0.0.1"}
with open(os.path.join(sys.argv[3], f"jpserver-{os.getpid()}.json"), "w") as fh:
    json.dump(info, fh)
time.sleep(float(sys.argv[4]) if len(sys.argv) > 4 else 0)
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
time.sleep(60)
"""


@pytest.fixture
def held() -> Iterator[socket.socket]:
    """A port someone else (here: the test process) listens on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()


def start(tmp_path: Path, bind: int, claim: int, delay: float = 0) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SERVER, str(bind), str(claim), str(tmp_path),
                             str(delay)])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_proc_tables_parse_listening_sockets_only() -> None:
    table = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
             "timeout inode\n"
             "   0: 0100007F:22B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  "
             "1000        0 4242 1\n"
             "   1: 0100007F:22B9 0100007F:D431 01 00000000:00000000 00:00000000 00000000  "
             "1000        0 4243 1\n")
    assert jupyter.listening([table]) == {4242: ("127.0.0.1", 8888)}


def test_a_port_held_by_this_process_is_its_own(held: socket.socket) -> None:
    port = held.getsockname()[1]
    assert jupyter.holds(os.getpid(), port, {"127.0.0.1"})
    assert not jupyter.holds(os.getpid(), port, {"10.0.0.9"})
    assert not jupyter.holds(os.getpid(), port + 1 if port < 65535 else port - 1, {"127.0.0.1"})


def test_the_servers_own_port_is_reported_after_the_proc_check(tmp_path: Path) -> None:
    port = free_port()
    child = start(tmp_path, port, port)
    try:
        assert jupyter.wait_listening(child, tmp_path, "127.0.0.1", 30) == port
    finally:
        child.kill()
        child.wait()


def test_a_record_written_before_the_server_listens_is_waited_on(tmp_path: Path) -> None:
    # jupyter_server writes jpserver-PID.json before its event loop binds the port (CI
    # saw the job refused in that gap); the port is reported once the server holds it.
    port = free_port()
    child = start(tmp_path, port, port, delay=2)
    try:
        assert jupyter.wait_listening(child, tmp_path, "127.0.0.1", 30) == port
        assert jupyter.holds(child.pid, port, {"127.0.0.1"})
    finally:
        child.kill()
        child.wait()


def test_a_port_the_server_names_but_someone_else_holds_is_refused(
        tmp_path: Path, held: socket.socket) -> None:
    theirs = held.getsockname()[1]
    child = start(tmp_path, free_port(), theirs)  # it listens elsewhere, names their port
    try:
        with pytest.raises(jupyter.JupyterError, match=rf"^jupyter: port {theirs} on 127\.0\.0\.1 "
                                                       "is not held by this job's server; no token"):
            jupyter.wait_listening(child, tmp_path, "127.0.0.1", 3)
    finally:
        child.kill()
        child.wait()


def test_a_server_that_exits_before_it_listens_fails_the_job_in_one_line(
        tmp_path: Path, held: socket.socket, capsys) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    # The server cannot take the port (held), exits 1: the job fails, nothing is printed.
    code = jupyter.main(["--node=n1", "--addr=127.0.0.1", f"--port={held.getsockname()[1]}",
                         "--login=login", f"--state={state}", "--job=7", "--timeout=30", "--",
                         sys.executable, "-c", SERVER, str(held.getsockname()[1]), "0",
                         str(state)])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err == (f"pyhpc: error: jupyter: the server exited with status 1 before it listened "
                   f"(a port it could not take?) (server log: {state}/7.log)\n")
    assert "Address already in use" in (state / "7.log").read_text()


def test_a_taken_port_is_said_and_the_tunnel_names_the_real_one() -> None:
    lines = jupyter.tunnel("gpu1", "10.0.0.5", 8888, 8889, "login", Path("/h/.pyhpc/jupyter"),
                           "42")
    assert lines[0] == "pyhpc: port 8888 is taken on gpu1; JupyterLab listens on 8889 instead."
    assert "  ssh -N -L 8889:10.0.0.5:8889 " in lines[2] + " "
    assert lines[3] == "then open http://127.0.0.1:8889/lab with the token in /h/.pyhpc/jupyter/42.token"
    assert json.dumps(lines).count("8888") == 1
