"""A notebook server proves to the hub that it is the server the hub started.

batchspawner's server picks a free port, reports it, then binds it: another user on the
node may bind it first and would get the proxy's traffic (requests, cookies). So before
the spawn succeeds, and so before the proxy routes anything to the port, the hub sends a
fresh nonce there and wants back an HMAC of it under the server's own API token (which
only the hub and that server know), bound to the user and to the port the answer came in
on: a squatter cannot answer, and one that relays to the real server elsewhere gets the
real server's other port into the HMAC. The server side is a Jupyter server extension
(:func:`_load_jupyter_server_extension`, enabled on the server's command line by
:mod:`pyhpc.hub.spawner`); the hub side is :func:`check`. Standard library only.
"""
from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import re
import secrets
import time
from typing import Any

from pyhpc.errors import PyhpcError, echo

#: The proof's route under the server's prefix (``/user/NAME/``).
ROUTE = "pyhpc/proof"
EXTENSION = "pyhpc.hub.proof"
NONCE_RE = re.compile(r"[0-9a-f]{64}")
PAUSE_S = 0.5
ANSWER_MAX = 4096


class ProofError(PyhpcError):
    """What answers at a server's port is not that server."""


def proof(token: str, user: str, port: int, nonce: str) -> str:
    """The answer to ``nonce`` of ``user``'s server, reached at ``port``."""
    message = f"pyhpc-hub-proof\0{user}\0{port}\0{nonce}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def _ask(ip: str, port: int, path: str, timeout_s: float) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(ip, port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        return reply.status, reply.read(ANSWER_MAX)
    finally:
        connection.close()


def check(ip: str, port: int, user: str, prefix: str, token: str, timeout_s: float) -> None:
    """Return once the server at ``ip:port`` proves it is ``user``'s; raise ProofError at
    once on a wrong answer, or after ``timeout_s`` without one (nothing listens yet: the
    server is still starting)."""
    nonce = secrets.token_hex(32)
    where = f"{user}'s server at {ip}:{port}"
    path = f"{prefix.rstrip('/')}/{ROUTE}?nonce={nonce}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status, body = _ask(ip, port, path, max(1.0, min(10.0, deadline - time.monotonic())))
        except (ConnectionError, TimeoutError, OSError, http.client.HTTPException) as exc:
            if time.monotonic() >= deadline:
                raise ProofError(f"{where} did not prove it is {user}'s: nothing answered in "
                                 f"{timeout_s:.0f} s ({exc})") from None
            time.sleep(PAUSE_S)
            continue
        try:
            answer = json.loads(body).get("proof") if status == 200 else None
        except (ValueError, AttributeError):
            answer = None
        expected = proof(token, user, port, nonce)
        if isinstance(answer, str) and hmac.compare_digest(answer, expected):
            return
        raise ProofError(f"{where} did not prove it is {user}'s (HTTP {status}: "
                         f"{echo(body[:80].decode('utf-8', 'replace'))}): another process holds "
                         "the port; the server's job is cancelled")


# -- the server's side: a Jupyter server extension ----------------------------------------

def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": EXTENSION}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Serve ROUTE: the proof for a nonce, over the port the request came in on. Without
    the hub's settings (a server the hub did not start), nothing is served."""
    from tornado import web

    token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
    user = os.environ.get("JUPYTERHUB_USER", "")
    if not token or not user:
        return

    class ProofHandler(web.RequestHandler):
        def get(self) -> None:
            nonce = self.get_query_argument("nonce", "")
            if not NONCE_RE.fullmatch(nonce):
                raise web.HTTPError(400, "nonce: 64 hexadecimal digits")
            # The port this request came in on (the connection's socket), never a header.
            port = self.request.connection.stream.socket.getsockname()[1]  # type: ignore[union-attr]
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.finish(json.dumps({"proof": proof(token, user, int(port), nonce)}))

    route = serverapp.base_url.rstrip("/") + "/" + ROUTE
    serverapp.web_app.add_handlers(".*$", [(re.escape(route), ProofHandler)])
