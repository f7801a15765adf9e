"""The batch script of one user's notebook server.

``slurm/jobs/_hub-server.sh.j2`` rendered in the job templates' sandbox
(:func:`pyhpc.slurm.render.environment`: every value shell-quoted, ``#SBATCH`` lines
sorted and checked through the job spec), from a checked
:class:`~pyhpc.hub.options.ServerRequest` and the hub's settings for this server. Same
inputs, same bytes (a golden test holds it). The script holds the server's token: it
goes to sbatch on stdin and is never written or logged by the hub.
"""
from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from urllib.parse import urlparse

from pyhpc import validate
from pyhpc.cluster import Cluster
from pyhpc.errors import echo
from pyhpc.hub.options import HubError, ServerRequest
from pyhpc.slurm import render

TEMPLATE = "_hub-server.sh.j2"
#: The hub's settings a server gets: its token, OAuth client, the hub's API and its own
#: URL prefix. Nothing else of the hub's environment reaches the job.
PASSED = re.compile(r"JUPYTERHUB_[A-Z0-9_]{1,60}|JPY_API_TOKEN")
#: Made in the job from the node's address, not passed.
MADE_IN_JOB = ("JUPYTERHUB_SERVICE_URL",)
#: The server's log, in the user's home (slurmd writes it as the user).
LOG_NAME = "pyhpc-hub-%j.log"
MAX_VALUE = 8192


def home_of(user: str) -> str:
    """The user's home, which must exist: the job starts there and keeps its log there."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise HubError(f"user: {user} is not known on this host (the directory)", "user") from None
    home = validate.name("home", entry.pw_dir, "abspath", error=HubError)
    if not os.path.isdir(home):
        raise HubError(f"home: {home} does not exist yet; log in once with ssh, which makes "
                       "it (a workshop's participants have theirs from the start)", "home")
    return home


def passed(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The variables of ``env`` the server gets, sorted; a value with a control character
    (a newline would end the export line) is refused."""
    out = []
    for name in sorted(env):
        if not PASSED.fullmatch(name) or name in MADE_IN_JOB:
            continue
        value = env[name]
        if not isinstance(value, str) or len(value) > MAX_VALUE or render.CONTROL_RE.search(value):
            raise HubError(f"environment: {name} has a value a script cannot carry "
                           f"({echo(value)})", "environment")
        out.append((name, value))
    return out


def prefix_of(env: Mapping[str, str]) -> str:
    """The server's URL prefix (``/user/NAME/``) from the hub's JUPYTERHUB_SERVICE_URL."""
    path = urlparse(env.get("JUPYTERHUB_SERVICE_URL", "")).path or "/"
    return validate.name("JUPYTERHUB_SERVICE_URL", path, "abspath", error=HubError)


def script(request: ServerRequest, cluster: Cluster, user: str, home: str,
           env: Mapping[str, str], command: Sequence[str], venv: str,
           comment: str | None = None) -> str:
    """The batch script: ``command`` (the singleuser server) started as ``user``'s job.
    ``comment``: the job's comment, by which the hub finds a submission slurmctld did not
    answer (:func:`pyhpc.slurm.as_user.submitted`)."""
    validate.name("user", user, "user", error=HubError)
    validate.name("venv", venv, "abspath", error=HubError)
    validate.name("command", command[0] if command else "", "abspath", error=HubError)
    values = {**asdict(request), "user": user, "home": home, "output": f"{home}/{LOG_NAME}",
              "venv": venv, "environment": passed(env), "prefix": prefix_of(env),
              "command": list(command), "comment": comment}
    return render.environment(cluster).get_template(TEMPLATE).render(values)
