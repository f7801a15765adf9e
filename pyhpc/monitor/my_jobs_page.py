"""``python -m pyhpc.monitor.my_jobs_page``: the hub's "my jobs" page, a JupyterHub service
(``my-jobs``, started by the hub as the hub's user) behind the hub's login.

A user who opens ``/services/my-jobs/`` from the hub is identified by the hub (OAuth: the
service never sees a password); the page shows that user's running and recent jobs with
their CPU, memory and GPU use from Prometheus (:mod:`pyhpc.monitor.my_jobs`), and its
script fetches the main part again while the page is open. The user is the hub's
identity, never an argument of the request: no URL shows another user's jobs.

Prometheus answers this service as its web user ``hub``, whose password the monitoring
role gives the hub's user alone; where and how is :data:`CONFIG`, the monitoring role's,
read at every request (the hub starts this service before that role's first deploy).
Listens on the loopback, on a privileged port (:data:`pyhpc.cluster.MY_JOBS_PORT`, bound
with the hub's one capability), so no other user of the login host can answer in its stead.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pyhpc import validate
from pyhpc.cluster import MY_JOBS_PORT
from pyhpc.cluster.monitoring import seconds
from pyhpc.errors import PyhpcError
from pyhpc.hub.api import MY_JOBS, MY_JOBS_PART
from pyhpc.monitor import my_jobs, my_jobs_html, prometheus

#: Where Prometheus is and how this service signs in (url, user, password_file, ca):
#: written by the monitoring role on the hub's host, the hub's user's to read.
CONFIG = Path("/etc/pyhpc/monitoring/hub.json")
#: What a browser may do with the page: its own script, its own fetches, inline styles.
CSP = ("default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
       "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class PageError(PyhpcError):
    """The page's configuration is missing or is not what the monitoring role writes."""


def prometheus_url(config: Path) -> str:
    """Prometheus' URL from ``config``, with this process' credentials set from it."""
    try:
        data = validate.read_json(str(config), config.read_text(encoding="utf-8"), PageError)
    except OSError as exc:
        raise PageError(f"my-jobs: {config} cannot be read ({exc.strerror}): the monitoring "
                        "role writes it on the hub's host (make deploy)") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in
                                             ("url", "user", "password_file", "ca")):
        raise PageError(f"my-jobs: {config} is not the monitoring role's file "
                        "(url, user, password_file, ca)")
    os.environ[prometheus.USER_ENV] = data["user"]
    os.environ[prometheus.PASSWORD_ENV] = data["password_file"]
    os.environ[prometheus.CA_ENV] = data["ca"]
    found = prometheus.url(data["url"])
    assert found is not None  # a non-empty string given
    return found


class Page:
    """The page's settings, and what one user is shown."""

    def __init__(self, config: Path, scrape_s: float, refresh_s: int, hours: int) -> None:
        self.config, self.scrape_s, self.refresh_s, self.hours = config, scrape_s, refresh_s, hours

    def overview(self, user: str) -> my_jobs.Overview:
        return my_jobs.overview(prometheus_url(self.config), user, self.scrape_s, self.hours)

    def part(self, user: str) -> tuple[str, my_jobs.Overview | None]:
        """The main part for ``user``, or one line saying why there is none."""
        try:
            found = self.overview(user)
        except PyhpcError as exc:
            return my_jobs_html.part(None, user, self.refresh_s, self.hours, str(exc)), None
        return my_jobs_html.part(found, user, self.refresh_s, self.hours), found


def application(page: Page, prefix: str) -> Any:
    """The service's tornado application: the page, its part, its JSON, its script and
    the OAuth callback, under ``prefix`` (the hub's ``/services/my-jobs/``)."""
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from tornado import web

    class Handler(HubOAuthenticated, web.RequestHandler):  # type: ignore[misc]  # untyped bases
        def set_default_headers(self) -> None:
            for header, value in (("Content-Security-Policy", CSP),
                                  ("X-Content-Type-Options", "nosniff"),
                                  ("Cache-Control", "no-store"),
                                  ("Referrer-Policy", "no-referrer")):
                self.set_header(header, value)

        def user(self) -> str:
            """The hub's user (never a service's token), by the one name rule."""
            model = self.current_user
            if not isinstance(model, dict) or model.get("kind") != "user":
                raise web.HTTPError(403, "my-jobs shows a user's own jobs only")
            return validate.name("user", model.get("name"), "user")

    class Full(Handler):
        @web.authenticated
        async def get(self) -> None:
            user = self.user()
            part, _ = await asyncio.to_thread(page.part, user)
            xsrf = self.xsrf_token  # the hub's token, which its services check on fetches
            self.write(my_jobs_html.page(user, part, page.refresh_s,
                                         xsrf.decode() if isinstance(xsrf, bytes) else str(xsrf)))

    class Part(Handler):
        @web.authenticated
        async def get(self) -> None:
            part, _ = await asyncio.to_thread(page.part, self.user())
            self.set_header(MY_JOBS_PART, "1")
            self.write(part)

    class Data(Handler):
        @web.authenticated
        async def get(self) -> None:
            user = self.user()
            try:
                found = await asyncio.to_thread(page.overview, user)
            except PyhpcError as exc:
                self.set_status(503)
                self.finish({"user": user, "error": str(exc)})
                return
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(asdict(found)))

    class Script(web.RequestHandler):
        def get(self) -> None:
            self.set_header("Content-Type", "text/javascript; charset=utf-8")
            self.set_header("X-Content-Type-Options", "nosniff")
            self.write(my_jobs_html.REFRESH_JS)

    return web.Application([
        (prefix, Full), (prefix + "part", Part), (prefix + "api/jobs", Data),
        (prefix + "refresh.js", Script), (prefix + "oauth_callback", HubOAuthCallbackHandler),
    ], cookie_secret=secrets.token_bytes(32), xsrf_cookies=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyhpc.monitor.my_jobs_page", description=__doc__)
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--scrape-interval", required=True,
                   help="the definition's monitoring.scrape_interval (5s, 1m)")
    p.add_argument("--refresh", default="30", help="seconds between refreshes (5 to 600)")
    p.add_argument("--hours", default=str(my_jobs.HOURS), help="recent: 1 to 168 hours")
    args = p.parse_args(argv)
    try:
        page = Page(args.config, seconds("monitoring.scrape_interval", args.scrape_interval),
                    validate.integer("--refresh", args.refresh, 5, 600),
                    validate.integer("--hours", args.hours, 1, 168))
    except PyhpcError as exc:
        print(exc, file=sys.stderr)
        return 2
    from tornado.ioloop import IOLoop

    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", f"/services/{MY_JOBS}/")
    application(page, prefix).listen(MY_JOBS_PORT, address="127.0.0.1")
    IOLoop.current().start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
