"""pyhpc.hub.proof: the hub's check against real sockets on the loopback: the server's own
extension (a tornado app, as the notebook server's) passes; a squatter, a server with
another token, one relayed from another port, and a port where nothing listens fail in
one line. The lab test (tests/integration/test_hub_strangers.py) has the whole spawn."""
from __future__ import annotations

import asyncio
import http.server
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from tornado import httpserver, web

from pyhpc.hub import proof

TOKEN, USER, PREFIX = "f" * 32, "ws-01", "/user/ws-01/"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A tornado app with the extension loaded under the server's settings, on a free
    port of the loopback (its own thread and loop); yields the port."""
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", TOKEN)
    monkeypatch.setenv("JUPYTERHUB_USER", USER)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)  # tornado accepts on it from its loop
    loop = asyncio.new_event_loop()
    app = SimpleNamespace(web_app=web.Application(), base_url=PREFIX)
    proof._load_jupyter_server_extension(app)

    async def start() -> None:  # tornado's server joins the loop that runs it
        httpserver.HTTPServer(app.web_app).add_sockets([sock])

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@contextmanager
def squatter(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


class Answers200(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"proof": "00"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_real_server_passes(server: int) -> None:
    proof.check("127.0.0.1", server, USER, PREFIX, TOKEN, 10)


def test_a_squatter_fails_at_once_in_one_line() -> None:
    with squatter(Answers200) as port:
        with pytest.raises(proof.ProofError) as refused:
            proof.check("127.0.0.1", port, USER, PREFIX, TOKEN, 10)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(f"{USER}'s server at 127.0.0.1:{port} did not prove it is")
        assert "another process holds the port" in message


def test_a_server_with_another_token_fails(server: int) -> None:
    with pytest.raises(proof.ProofError, match="did not prove"):
        proof.check("127.0.0.1", server, USER, PREFIX, "e" * 32, 10)


def test_a_relay_to_the_real_server_on_another_port_fails(server: int) -> None:
    class Relay(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            import http.client
            upstream = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
            upstream.request("GET", self.path)
            reply = upstream.getresponse()
            body = reply.read()
            self.send_response(reply.status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with squatter(Relay) as port:
        with pytest.raises(proof.ProofError, match="did not prove"):
            proof.check("127.0.0.1", port, USER, PREFIX, TOKEN, 10)


def test_nothing_listening_fails_after_the_timeout() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(proof.ProofError, match="nothing answered in 1 s"):
        proof.check("127.0.0.1", port, USER, PREFIX, TOKEN, 1)


def test_a_bad_nonce_gets_400(server: int) -> None:
    import http.client
    connection = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    connection.request("GET", f"{PREFIX}{proof.ROUTE}?nonce=../../etc")
    assert connection.getresponse().status == 400


def test_no_route_without_the_hubs_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    app = SimpleNamespace(web_app=web.Application(), base_url=PREFIX)
    before = len(app.web_app.default_router.rules)
    proof._load_jupyter_server_extension(app)
    assert len(app.web_app.default_router.rules) == before


def test_the_proof_is_bound_to_token_user_port_and_nonce() -> None:
    base = proof.proof(TOKEN, USER, 4000, "a" * 64)
    assert base == proof.proof(TOKEN, USER, 4000, "a" * 64)
    assert len({base, proof.proof("e" * 32, USER, 4000, "a" * 64),
                proof.proof(TOKEN, "ws-02", 4000, "a" * 64), proof.proof(TOKEN, USER, 4001, "a" * 64),
                proof.proof(TOKEN, USER, 4000, "b" * 64)}) == 5
