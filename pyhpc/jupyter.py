"""``python -P -m pyhpc.jupyter``: start JupyterLab in a job and report where it really listens.

The ``jupyter`` job template runs it. It starts the server, reads the address the server
bound from the server itself (its ``jpserver-PID.json`` in the job's private runtime
directory), and checks in ``/proc`` that this very process holds a listening socket on
that port. Only then does it print the ``ssh -L`` tunnel: a port someone else holds on a
shared node is never the one the researcher is told to send their token to. A port that
was taken is said so (the server takes the next free one); a server that never listens,
or a port that is not the server's, stops the job with one line and exit status 1.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pyhpc import files
from pyhpc.errors import PyhpcError

#: How long the server may take to listen (JupyterLab imports a lot; nodes may be busy).
START_TIMEOUT_S = 300.0
#: /proc/net/tcp's state of a listening socket.
LISTEN = "0A"
INFO_LIMIT = 64 << 10


class JupyterError(PyhpcError):
    """The server cannot be handed to the researcher: it never listened, or not where it says."""


def _hex_address(text: str) -> str:
    """``/proc/net/tcp[6]``'s local address (host byte order, in 32-bit words) as text."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def listening(tables: Iterable[str]) -> dict[int, tuple[str, int]]:
    """Listening sockets in ``/proc/net/tcp``-style tables: inode -> (address, port)."""
    found: dict[int, tuple[str, int]] = {}
    for table in tables:
        for line in table.splitlines()[1:]:
            cols = line.split()
            if len(cols) < 10 or cols[3] != LISTEN:
                continue
            host, _, port = cols[1].partition(":")
            found[int(cols[9])] = (_hex_address(host), int(port, 16))
    return found


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets process ``pid`` has open (its ``/proc/PID/fd`` links)."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def addresses(host: str) -> set[str]:
    """Every address ``host`` resolves to (what the server was told to bind)."""
    return {str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}


def holds(pid: int, port: int, allowed: set[str]) -> bool:
    """Whether process ``pid`` itself listens on ``port`` at one of the ``allowed`` addresses."""
    tables = []
    for name in ("tcp", "tcp6"):
        try:
            tables.append(Path(f"/proc/{pid}/net/{name}").read_text())
        except OSError:
            continue
    mine = socket_inodes(pid)
    return any(inode in mine and p == port and addr in allowed
               for inode, (addr, p) in listening(tables).items())


def server_info(runtime: Path, pid: int) -> dict[str, Any] | None:
    """The server's own record of where it listens (``jpserver-PID.json``), once written."""
    fh, _ = files.try_open_regular(runtime / f"jpserver-{pid}.json")
    if fh is None:
        return None
    with fh:
        try:
            info = json.loads(fh.read(INFO_LIMIT))
        except ValueError:  # being written
            return None
    return info if isinstance(info, dict) else None


def wait_listening(child: subprocess.Popen[bytes], runtime: Path, addr: str,
                   timeout_s: float) -> int:
    """The port ``child`` listens on, read from the server and checked in /proc; a
    :class:`JupyterError` line when it exits first, never listens, or the port it names
    is not its own by the deadline.

    jupyter_server writes its record before it listens: it probes a free port, closes
    it, writes ``jpserver-PID.json``, and binds once its event loop runs. So a record
    whose port the server does not hold yet is waited on, not refused at once; it is
    refused when the deadline passes and the server still does not hold it."""
    deadline, allowed = time.monotonic() + timeout_s, addresses(addr)
    port: int | None = None
    while True:
        if child.poll() is not None:
            raise JupyterError(f"jupyter: the server exited with status {child.returncode} "
                                  "before it listened (a port it could not take?)", "jupyter")
        if port is None:
            info = server_info(runtime, child.pid)
            if info is not None:
                named = info.get("port")
                if info.get("pid") != child.pid or not isinstance(named, int):
                    raise JupyterError("jupyter: the server's record names another process "
                                          "or no port", "jupyter")
                port = named
        if port is not None and holds(child.pid, port, allowed):
            return port
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if port is not None:
        raise JupyterError(f"jupyter: port {port} on {addr} is not held by this "
                              "job's server; no token is handed out", "jupyter")
    raise JupyterError(f"jupyter: the server did not listen within {timeout_s:.0f} s",
                          "jupyter")


def tunnel(node: str, addr: str, asked: int, port: int, login: str, state: Path,
           job: str) -> list[str]:
    """What the job log says: where the server listens and the ssh tunnel to it."""
    user = os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name
    lines = [] if port == asked else [
        f"pyhpc: port {asked} is taken on {node}; JupyterLab listens on {port} instead."]
    return [*lines, f"pyhpc: Jupyter on {node}, {addr}:{port} (checked: this job's server "
                    "listens there). On your laptop run:",
            f"  ssh -N -L {port}:{addr}:{port} {user}@{login}",
            f"then open http://127.0.0.1:{port}/lab with the token in {state}/{job}.token",
            f"(server log: {state}/{job}.log)."]


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -P -m pyhpc.jupyter", description=__doc__)
    for name in ("node", "addr", "login", "state", "job"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=START_TIMEOUT_S)
    parser.add_argument("command", nargs="+", help="the server's command line")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    state = Path(args.state)
    runtime = Path(os.environ.get("JUPYTER_RUNTIME_DIR", state / f"{args.job}.runtime"))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    log = os.open(state / f"{args.job}.log", flags, 0o600)
    child = subprocess.Popen(args.command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    os.close(log)
    for signum in (signal.SIGTERM, signal.SIGINT):  # scancel: the server stops too
        signal.signal(signum, lambda s, _: child.send_signal(s))
    try:
        port = wait_listening(child, runtime, args.addr, args.timeout)
    except JupyterError as exc:
        child.kill()
        child.wait()
        print(f"pyhpc: error: {exc} (server log: {state}/{args.job}.log)", file=sys.stderr,
              flush=True)
        return 1
    print("\n".join(tunnel(args.node, args.addr, args.port, port, args.login, state, args.job)),
          flush=True)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
