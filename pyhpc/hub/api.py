"""Where the hub is, and what pyhpc asks of it: its URL (workshop sheets, the doctor), its
health, and forgetting a workshop's participants (``pyhpc workshop delete``) through its
REST API with the token of the ``pyhpc-workshop`` service. Standard library only; tests
replace :data:`OPEN`.
"""
from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from pyhpc import validate
from pyhpc.cluster import HUB_API_PORT, Cluster, JupyterHub
from pyhpc.errors import PyhpcError

#: The hub's own state on the login host (its database, cookie secret and tokens, 0600).
STATE_DIR = Path("/var/lib/pyhpc-hub")
#: The ``pyhpc-workshop`` service's token: the deploy generates it; the hub and root read it.
WORKSHOP_TOKEN = STATE_DIR / "workshop-token"
#: The CA the deploy generates when the definition names no certificate of the admin's.
CA_FILE = Path("/etc/pyhpc/hub/ca.crt")
#: The hub's REST API on the login host itself (the role binds it there, a privileged port).
LOCAL_API = f"http://127.0.0.1:{HUB_API_PORT}/hub/api"
TIMEOUT_S = 10.0
#: The hub's "my jobs" page (pyhpc.monitor.my_jobs_page): its service's name, and the
#: header its script reads, which the script (served without a login) names.
MY_JOBS, MY_JOBS_PART = "my-jobs", "X-My-Jobs-Part"
#: A user whose server is still stopping cannot be deleted yet: tries, seconds apart.
TRIES, PAUSE_S = 10, 2.0

#: ``OPEN(request, timeout_s, ca_file)`` -> (HTTP status, body); an https URL is verified
#: against ``ca_file`` (None: the system's trust). Tests replace it.
Opener = Callable[[urllib.request.Request, float, "Path | None"], tuple[int, bytes]]


class HubError(PyhpcError):
    """The hub did not answer, or refused; the message says which URL."""


def _open(request: urllib.request.Request, timeout_s: float,
          ca_file: Path | None) -> tuple[int, bytes]:
    context = (ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
               if request.full_url.startswith("https://") else None)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as reply:
            return int(reply.status), reply.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(1 << 16)


OPEN: Opener = _open


def settings(cluster: Cluster) -> JupyterHub:
    if cluster.jupyterhub is None or not cluster.jupyterhub.enabled:
        raise HubError("jupyterhub: the cluster definition runs no hub (jupyterhub.enabled)",
                       "jupyterhub")
    return cluster.jupyterhub


def hostname(cluster: Cluster) -> str:
    """The name browsers reach the hub at: the definition's, else localhost in the lab, else
    this (the login) host's name."""
    hub = settings(cluster)
    return hub.hostname or ("localhost" if cluster.mode == "lab" else socket.getfqdn())


def url(cluster: Cluster) -> str:
    return f"https://{hostname(cluster)}:{settings(cluster).port}/"


def ca_file(cluster: Cluster) -> Path | None:
    """What the hub's certificate is verified against: the generated CA, or the system's
    trust (None) for an admin's own certificate."""
    return CA_FILE if settings(cluster).tls_cert is None else None


def health(cluster: Cluster) -> tuple[bool, str]:
    """GET /hub/api through the proxy, over verified TLS, as a browser would reach it."""
    where = url(cluster) + "hub/api"
    try:
        status, body = OPEN(urllib.request.Request(where), TIMEOUT_S, ca_file(cluster))
    except (OSError, ssl.SSLError) as exc:
        return False, f"{where}: {getattr(exc, 'reason', exc)}"
    try:
        version = validate.read_json(where, body.decode("utf-8", "replace")).get("version", "?")
    except (PyhpcError, AttributeError):
        version = None
    if status != 200 or version is None:
        return False, f"{where}: HTTP {status}, not JupyterHub's API"
    return True, f"{url(cluster)}: JupyterHub {version}"


def my_jobs_url(cluster: Cluster) -> str:
    """The page at its own origin, ``my-jobs--service.<hub's name>`` (JupyterHub's name for
    a service's subdomain)."""
    return (f"https://{MY_JOBS}--service.{hostname(cluster)}:{settings(cluster).port}"
            f"/services/{MY_JOBS}/")


def my_jobs_health(cluster: Cluster) -> tuple[bool, str]:
    """The page's script through the proxy, over verified TLS: asked of the hub's own name
    with the page's Host (the proxy routes by it), since a service's name may resolve in
    browsers only (``*.localhost``)."""
    page = my_jobs_url(cluster)
    where = url(cluster) + f"services/{MY_JOBS}/refresh.js"
    request = urllib.request.Request(where, headers={"Host": page.split("/")[2]})
    try:
        status, body = OPEN(request, TIMEOUT_S, ca_file(cluster))
    except (OSError, ssl.SSLError) as exc:
        return False, f"{page}: {getattr(exc, 'reason', exc)}"
    if status != 200 or MY_JOBS_PART.encode() not in body:
        return False, f"{page}: HTTP {status}, not the my-jobs page (the hub starts it)"
    return True, page


def _token() -> str:
    try:
        return WORKSHOP_TOKEN.read_text().strip()
    except OSError as exc:
        raise HubError(f"jupyterhub: cannot read the hub's workshop token {WORKSHOP_TOKEN} "
                       f"({exc.strerror}); run as root on the hub's login host") from None


def forget(users: Sequence[str]) -> list[str]:
    """Delete ``users`` from the hub's database (their servers stopped first, their
    cookies void): the names a workshop gave may be given again later. Returns the users
    the hub knew; one it does not know is fine."""
    token = _token()
    forgotten = []
    for user in users:
        validate.name("user", user, "user")
        request = urllib.request.Request(f"{LOCAL_API}/users/{user}", method="DELETE",
                                         headers={"Authorization": f"token {token}"})
        for attempt in range(TRIES):
            try:
                status, body = OPEN(request, TIMEOUT_S, None)
            except OSError as exc:
                raise HubError(f"jupyterhub: {LOCAL_API} does not answer "
                               f"({getattr(exc, 'reason', exc)})") from None
            if status != 400 or attempt == TRIES - 1:
                break
            time.sleep(PAUSE_S)  # 400: the user's server is still stopping
        if status == 204:
            forgotten.append(user)
        elif status != 404:
            raise HubError(f"jupyterhub: deleting {user} got HTTP {status}: "
                           f"{body[:200].decode('utf-8', 'replace')}")
    return forgotten
