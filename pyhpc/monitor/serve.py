"""What both exporters share: the ``--listen ADDR:PORT`` they bind to, their one Prometheus
endpoint, and the count of Slurm commands a scrape ran.

An exporter listens only where it is told: ``--listen`` has no default, so it never opens
``0.0.0.0`` unless that address is named. A refused address is one line, exit 2. With
``--tls-cert``, ``--tls-key`` and ``--client-ca`` (the monitoring role gives all three) it
answers over TLS only, and only a client with a certificate of that CA (Prometheus')
gets an answer: the jobs' users and accounts are no one else's to read.
"""
from __future__ import annotations

import argparse
import ipaddress
import socket
import ssl
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector, CollectorRegistry

from pyhpc import validate
from pyhpc.errors import PyhpcError
from pyhpc.slurm import slurm

LISTEN_RULE = "ADDR:PORT, e.g. 127.0.0.1:9810 or [::1]:9810 (an address or host name, port 1-65535)"


class ListenError(PyhpcError):
    """A ``--listen`` value that names no address and port."""


def listen_address(text: str) -> tuple[str, int]:
    """``(address, port)`` from ``ADDR:PORT`` (``[v6]:PORT`` for IPv6); no address is
    assumed: ``:9810`` is refused rather than bound to every interface."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            host = ""
    elif host:
        try:
            validate.name("--listen", host, "host", ListenError)
        except ListenError:
            host = ""
    if not sep or not host:
        raise ListenError(f"--listen: {text[:60]!r} is not {LISTEN_RULE}", "--listen")
    number = validate.integer("--listen", port, 1, 65535, ListenError)
    return host, number


class CommandCount:
    """Slurm commands run by this process (:data:`pyhpc.slurm.slurm.CALLS`), in total and
    in the scrape that just ran: the proof that a scrape runs one of each."""

    def __init__(self) -> None:
        self._before: Counter[str] = Counter()

    def start(self) -> None:
        self._before = Counter(slurm.CALLS)

    def metrics(self, tools: Sequence[str]) -> Iterator[Metric]:
        """``pyhpc_exporter_scrape_slurm_commands`` (this scrape) and
        ``pyhpc_exporter_slurm_commands_total`` (since start), for each of ``tools``."""
        scrape = GaugeMetricFamily("pyhpc_exporter_scrape_slurm_commands",
                                   "Slurm commands run by the last scrape, by command",
                                   labels=["command"])
        total = CounterMetricFamily("pyhpc_exporter_slurm_commands",
                                    "Slurm commands run since the exporter started, by command",
                                    labels=["command"])
        for tool in tools:
            scrape.add_metric([tool], slurm.CALLS[tool] - self._before[tool])
            total.add_metric([tool], slurm.CALLS[tool])
        yield scrape
        yield total


class Serialised:
    """A collector whose scrapes never overlap (two Prometheus servers scraping at once
    would otherwise run every Slurm command twice in parallel)."""

    def __init__(self, collect: Callable[[], Iterator[Metric]]) -> None:
        self._collect = collect
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from list(self._collect())


def registry(collector: Collector) -> CollectorRegistry:
    """A registry holding only ``collector`` (no process or platform metrics, and no
    scrape at registration: nothing runs before Prometheus asks)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg


#: Seconds a client has for its TLS handshake and each read after it.
CLIENT_TIMEOUT_S = 10.0


class _Quiet(WSGIRequestHandler):
    """No request log (the exporters' logs hold errors only)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        return


class _TLSServer(ThreadingWSGIServer):
    """prometheus_client's server over TLS, each handshake in its request's own thread: a
    client that connects and says nothing holds up no one else (prometheus_client wraps
    the listening socket, whose accept does the handshake for everyone in turn)."""

    context: ssl.SSLContext

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        sock.settimeout(CLIENT_TIMEOUT_S)
        return self.context.wrap_socket(sock, server_side=True,
                                        do_handshake_on_connect=False), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request.do_handshake()
        except OSError:  # ssl.SSLError among them: no certificate of the CA, or none at all
            return
        super().finish_request(request, client_address)


def tls_server(host: str, port: int, reg: CollectorRegistry, tls: Sequence[str]) -> _TLSServer:
    """The server on ``host:port`` that answers only clients with a certificate of the
    client CA (``tls``: certificate, key, client CA)."""
    cert, key, client_ca = tls
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=client_ca)
    context.verify_mode = ssl.CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("Server", (_TLSServer,), {"address_family": family, "context": context})
    server: _TLSServer = make_server(host, port, make_wsgi_app(reg), server_class,
                                     handler_class=_Quiet)
    return server


def serve(collector: Collector, listen: str, tls: Sequence[str] | None = None) -> None:
    """Answer ``/metrics`` on ``listen`` until the process is stopped; with ``tls``
    (certificate, key, client CA) over TLS, to clients with a certificate of that CA only."""
    host, port = listen_address(listen)
    try:
        if tls:
            tls_server(host, port, registry(collector), tls).serve_forever()
            return
        _, thread = start_http_server(port, addr=host, registry=registry(collector))
    except OSError as exc:
        raise ListenError(f"--listen: cannot listen on {listen} ({exc.strerror or exc})",
                          "--listen") from None
    thread.join()


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--listen", required=True, metavar="ADDR:PORT",
                   help=f"where to answer /metrics: {LISTEN_RULE}; no default")
    p.add_argument("--tls-cert", metavar="FILE", help="answer over TLS with this certificate "
                   "(with --tls-key and --client-ca)")
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's key")
    p.add_argument("--client-ca", metavar="FILE", help="answer only clients with a "
                   "certificate of this CA (Prometheus')")
    return p


def tls_files(args: argparse.Namespace) -> tuple[str, str, str] | None:
    """``(cert, key, client CA)``, all three or none; one given alone is refused."""
    given = (args.tls_cert, args.tls_key, args.client_ca)
    if not any(given):
        return None
    if not all(given):
        raise ListenError("--tls-cert, --tls-key and --client-ca: give all three or none",
                          "--tls-cert")
    return args.tls_cert, args.tls_key, args.client_ca


def run_main(name: str, body: Callable[[], None]) -> int:
    """``body()``, with a refusal printed as one line (exit 2) instead of a traceback."""
    try:
        body()
    except PyhpcError as exc:
        print(f"{name}: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
