#!/usr/bin/python3 -I
"""pyhpc-monitoring-ready: the deploy's readiness check of one monitoring daemon.

Installed by pyhpc (ansible/roles/monitoring) as /usr/local/sbin/pyhpc-monitoring-ready;
the host's python3, standard library only (hosts without the pyhpc environment run it).
A port that takes connections proves nothing: any user may bind a daemon's port while it
restarts. Ready means both: the port's listener belongs to the daemon's user (--owner,
from /proc/net/tcp and tcp6), and it answers over TLS with a certificate of the
monitoring CA (whose key no user can read), with HTTP 200 for the path given. A refused
connection (or a 503: Prometheus loading) is retried until --timeout; a listener of
another user, or an answer that is not the daemon's, fails at once, in one line, exit 1.
"""
from __future__ import annotations

import argparse
import base64
import http.client
import pwd
import ssl
import sys
import time
import urllib.parse

#: /proc/net/tcp's st column: TCP_LISTEN, and TCP_CLOSE (bound, not yet listening).
HOLDING = ("0A", "07")


def listeners(port: int) -> set[int]:
    """The uids of the sockets that hold ``port`` (listening, or bound to it alone, on
    any address), per the kernel."""
    uids = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if (len(fields) > 7 and fields[3] in HOLDING and set(fields[2]) <= {"0", ":"}
                    and int(fields[1].rsplit(":", 1)[1], 16) == port):
                uids.add(int(fields[7]))
    return uids


def name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def answer(url: urllib.parse.SplitResult, args: argparse.Namespace) -> int:
    """The HTTP status of one GET over TLS, the server's certificate checked."""
    context = ssl.create_default_context(cafile=args.ca)
    if args.cert:
        context.load_cert_chain(args.cert, args.key)
    conn = http.client.HTTPSConnection(url.hostname or "", url.port, timeout=10, context=context)
    headers = {}
    if args.user:
        with open(args.password_file, encoding="utf-8") as fh:
            secret = fh.readline().strip()
        headers["Authorization"] = "Basic " + base64.b64encode(
            f"{args.user}:{secret}".encode()).decode()
    try:
        conn.request("GET", url.path or "/", headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def check(args: argparse.Namespace) -> str | None:
    """None when the daemon is ready; else why not (retried while it is "refused")."""
    url = urllib.parse.urlsplit(args.url)
    owner = pwd.getpwnam(args.owner).pw_uid
    status, error, refused = 0, None, False
    try:
        status = answer(url, args)
    except ConnectionRefusedError:
        refused = True
    except (ssl.SSLError, ssl.CertificateError, OSError, http.client.HTTPException) as exc:
        error = exc
    held = listeners(url.port or 443)
    others = sorted(name_of(uid) for uid in held if uid != owner)
    if others:
        return (f"port {url.port} is held by {', '.join(others)}, not {args.owner}: "
                f"not {args.name} (ss -ltnp)")
    if refused or status == 503:  # Prometheus says 503 until its storage is loaded
        return "refused"
    if status == 0:
        return f"{args.url} did not answer as {args.name} ({error})"
    if status != 200:
        return f"{args.url} answered {status}, not 200: not {args.name} as deployed"
    return None


def main() -> int:
    p = argparse.ArgumentParser(prog="pyhpc-monitoring-ready", description=__doc__)
    p.add_argument("url", help="https://ADDR:PORT/PATH of the daemon")
    p.add_argument("--name", required=True, help="the daemon, for the message")
    p.add_argument("--owner", required=True, help="the user its listening socket must be")
    p.add_argument("--ca", required=True, help="the monitoring CA")
    p.add_argument("--cert", help="a client certificate (the exporters ask for one)")
    p.add_argument("--key", help="its key")
    p.add_argument("--user", help="a basic-auth name (Prometheus asks for one)")
    p.add_argument("--password-file", help="its password's file")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it")
    args = p.parse_args()
    deadline = time.monotonic() + args.timeout
    while (why := check(args)) == "refused" and time.monotonic() < deadline:
        time.sleep(0.5)
    if why is None:
        return 0
    if why == "refused":
        why = f"{args.url}: {args.name} is not listening after {args.timeout:g} s"
    print(f"pyhpc-monitoring-ready: {why}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
