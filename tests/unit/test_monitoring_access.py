"""Who may read the monitoring (issue 51 item 6), without a lab: pyhpc's exporters over
TLS answer only a client certificate of the monitoring CA (and a client that says
nothing holds up no one); Prometheus' client sends its name and password over TLS;
``pyhpc-jobstats-query`` names its caller's user in every query, and jobstats reads it
back. The lab's two-user tests are tests/integration/test_monitoring_access.py.
"""
from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client.core import GaugeMetricFamily

from pyhpc.errors import PyhpcError
from pyhpc.monitor import jobstats, own_query, prometheus, serve


def _cert(subject: str, key: Any, issuer: tuple[x509.Name, Any] | None, ca: bool) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                   ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: Any) -> tuple[str, str]:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return str(path.with_suffix(".crt")), str(path.with_suffix(".key"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The monitoring CA and its daemons' certificate, and another CA's (a stranger's)."""
    out = tmp_path_factory.mktemp("pki")
    files: dict[str, Any] = {}
    for ca_name in ("ca", "stranger-ca"):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert(ca_name, ca_key, None, ca=True)
        files[ca_name] = _write(out / ca_name, ca, ca_key)[0]
        key = ec.generate_private_key(ec.SECP256R1())
        files[ca_name + "-leaf"] = _write(out / (ca_name + "-leaf"),
                                          _cert("pyhpc-monitoring", key, (ca.subject, ca_key),
                                                ca=False), key)
    return files


class OneGauge:
    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("pyhpc_test_jobs", "a job's figure", value=1.0)


@pytest.fixture
def exporter(pki: dict[str, Any]) -> Iterator[int]:
    cert, key = pki["ca-leaf"]
    server = serve.tls_server("127.0.0.1", 0, serve.registry(OneGauge()), (cert, key, pki["ca"]))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def get(port: int, ca: str, client: tuple[str, str] | None) -> str:
    context = ssl.create_default_context(cafile=ca)
    if client:
        context.load_cert_chain(*client)
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10,
                                context=context) as answer:
        return str(answer.read().decode())


def test_the_exporter_answers_prometheus_certificate_and_no_one_else(
        pki: dict[str, Any], exporter: int) -> None:
    assert "pyhpc_test_jobs 1.0" in get(exporter, pki["ca"], pki["ca-leaf"])
    for client in (None, pki["stranger-ca-leaf"]):  # no certificate, or a stranger CA's
        with pytest.raises(OSError):
            get(exporter, pki["ca"], client)
    with socket.create_connection(("127.0.0.1", exporter), timeout=10) as plain:
        plain.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # plain HTTP: no answer of metrics
        assert b"pyhpc_test_jobs" not in plain.recv(4096)


def test_a_client_that_says_nothing_holds_up_no_one(pki: dict[str, Any], exporter: int) -> None:
    """Each handshake runs in its request's thread: a silent connection, open meanwhile,
    does not stop Prometheus' scrape."""
    with socket.create_connection(("127.0.0.1", exporter), timeout=10):
        assert "pyhpc_test_jobs" in get(exporter, pki["ca"], pki["ca-leaf"])


def test_tls_files_are_all_three_or_none() -> None:
    args = serve.parser("x", "").parse_args(["--listen", "127.0.0.1:1", "--tls-cert", "c"])
    with pytest.raises(PyhpcError, match=r"^--tls-cert, --tls-key and --client-ca: give all "):
        serve.tls_files(args)
    none = serve.parser("x", "").parse_args(["--listen", "127.0.0.1:1"])
    assert serve.tls_files(none) is None


def test_the_client_sends_its_name_and_password_and_trusts_the_monitoring_ca(
        tmp_path: Path, pki: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "record.password"
    secret.write_text("s3cret\n")
    monkeypatch.setenv(prometheus.USER_ENV, "record")
    monkeypatch.setenv(prometheus.PASSWORD_ENV, str(secret))
    monkeypatch.setenv(prometheus.CA_ENV, pki["ca"])
    req, context = prometheus.request("https://127.0.0.1:9090/api/v1/query")
    assert req.get_header("Authorization") == "Basic cmVjb3JkOnMzY3JldA=="  # record:s3cret
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    monkeypatch.setenv(prometheus.PASSWORD_ENV, str(tmp_path / "unreadable"))
    assert prometheus.credentials() is None


def test_the_query_names_the_callers_user_beside_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def fake(base: str, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
        asked.append(promql)
        return [({}, 0.5)] if "utilization" in promql else [({}, 1024.0)]

    monkeypatch.setattr(prometheus, "query", fake)
    found = own_query.figures("https://p:9090", "42", 1_800_000_000, 1_800_000_600, "user1")
    assert asked and all('{jobid="42",user="user1"}' in q for q in asked)
    assert found["host_mem_peak_bytes"] == 1024 and found["gpu"]["gpus"] == 1
    assert own_query.parse(json.loads(json.dumps(found)))[1] == 1024


def test_the_query_runs_only_through_sudo(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SUDO_UID", raising=False)
    assert own_query.main(["--prometheus", "https://p:9090", "42", "1800000000",
                           "1800000600"]) == 2
    err = capsys.readouterr().err
    assert err == "pyhpc-jobstats-query: run it through sudo (pyhpc jobstats does)\n"


@pytest.mark.parametrize("args", [["42;id", "1800000000", "1800000600"],
                                  ["42", "1800000600", "1800000000"],
                                  ["42", "18", "1800000000"]])
def test_the_query_refuses_what_is_not_a_job_and_two_times(
        args: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SUDO_UID", "0")
    assert own_query.main(["--prometheus", "https://p:9090", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyhpc-jobstats-query: ") and err.count("\n") == 1


def job(**over: Any) -> jobstats.Accounting:
    base: dict[str, Any] = dict(
        job_id="42", job_id_raw="42", user="user1", account="lab", partition="gpu",
        state="COMPLETED", elapsed_s=60, time_limit_s=120, total_cpu_s=30.0, cpus=1, nodes=1,
        gpus=1, mem_requested_bytes=None, step_mem_peak_bytes=None, start=1_800_000_000.0,
        end=1_800_000_060.0)
    return jobstats.Accounting(**{**base, **over})


def test_jobstats_asks_through_sudo_and_reads_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, json.dumps(
            {"gpu": None, "host_mem_peak_bytes": 2048}), "")

    monkeypatch.setattr(jobstats.subprocess, "run", run)
    assert jobstats.through_sudo(job(), 1_800_000_000.0, 1_800_000_060.2) == (None, 2048)
    assert calls == [["sudo", "-n", "-u", "prometheus", "/usr/local/sbin/pyhpc-jobstats-query",
                      "42", "1800000000", "1800000061"]]


def test_a_refused_query_is_jobstats_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 2, "", "pyhpc-jobstats-query: prometheus: "
                                           "https://p:9090 did not answer (refused)\n")

    monkeypatch.setattr(jobstats.subprocess, "run", run)
    with pytest.raises(jobstats.JobstatsError, match=r"^pyhpc-jobstats-query: prometheus: "):
        jobstats.through_sudo(job(), 1_800_000_000.0, 1_800_000_060.0)
