"""What both exporters share: the ``--listen ADDR:PORT`` they bind to, their one Prometheus
endpoint, and the count of Slurm commands a scrape ran.

An exporter listens only where it is told: ``--listen`` has no default, so it never opens
``0.0.0.0`` unless that address is named. A refused address is one line, exit 2.
"""
from __future__ import annotations

import argparse
import ipaddress
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
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


def serve(collector: Collector, listen: str) -> None:
    """Answer ``/metrics`` on ``listen`` until the process is stopped."""
    host, port = listen_address(listen)
    try:
        _, thread = start_http_server(port, addr=host, registry=registry(collector))
    except OSError as exc:
        raise ListenError(f"--listen: cannot listen on {listen} ({exc.strerror})",
                          "--listen") from None
    thread.join()


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--listen", required=True, metavar="ADDR:PORT",
                   help=f"where to answer /metrics: {LISTEN_RULE}; no default")
    return p


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
