"""pyhpc's spawner: batchspawner's SlurmSpawner with pyhpc's form, checks and batch script.

batchspawner keeps what it does well: the start, poll and stop of a batch job, the wait
for its node and port, ``batchspawner-singleuser``. What reaches Slurm is pyhpc's: the
form offers what Slurm says this user has (:mod:`pyhpc.hub.choices`), every spawn, from
the form or the REST API, is checked (:mod:`pyhpc.hub.options`) before anything is
submitted, the script is pyhpc's (:mod:`pyhpc.hub.script`), and sbatch, squeue and
scancel run through :mod:`pyhpc.slurm.as_user` (``sudo -n -u USER``, the forms the hub's
sudo rule allows, no shell), never through batchspawner's shell commands.

A server that reported its port gets no traffic until what answers there proves it knows
the server's own token (:mod:`pyhpc.hub.proof`): batchspawner's server reports the port
before it binds it, and another user may bind it in the gap.

Importing this module also narrows batchspawner's callback (:class:`PortHandler`).
Loaded by the hub's ``jupyterhub_config.py``, in the hub's own virtualenv.
"""
from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from batchspawner import JobStatus, SlurmSpawner
from jupyterhub.apihandlers import APIHandler, default_handlers
from tornado import web
from traitlets import Integer, Unicode, default

from pyhpc import cluster, paths
from pyhpc.errors import PyhpcError
from pyhpc.hub import choices, form, options, proof, script
from pyhpc.hub.options import ServerRequest
from pyhpc.slurm import as_user, slurm

#: The callback's route (batchspawner registers it when imported).
CALLBACK = r"/api/batchspawner"
PORTS = (1024, 65535)
#: The server's own options, before the hub's: a port another process holds ends the server
#: (never a quiet move to another port), and the extension that answers the hub's proof.
#: The singleuser extension is named again: a dict on the command line replaces the
#: server's own (the others, JupyterLab's, are found in the environment's config).
SERVER_ARGS = ("--ServerApp.port_retries=0",
               "--ServerApp.jpserver_extensions=jupyterhub.singleuser.extension=True",
               f"--ServerApp.jpserver_extensions={proof.EXTENSION}=True")


def port_of(data: object) -> int | None:
    """The port in a callback's body, if the body is exactly ``{"port": N}``."""
    if not isinstance(data, dict) or set(data) != {"port"}:
        return None
    port = data["port"]
    if not isinstance(port, int) or isinstance(port, bool) or not PORTS[0] <= port <= PORTS[1]:
        return None
    return port


class PortHandler(APIHandler):  # type: ignore[misc]  # jupyterhub ships no type information
    """batchspawner's callback, narrowed: a server's job tells the hub the one thing the hub
    cannot know, the port it found free, with that server's own token. batchspawner's own
    handler sets any attribute the job names on the spawner, its commands among them."""

    @web.authenticated
    def post(self) -> None:
        token = self.get_auth_token()
        owner = getattr(self.current_user, "spawners", {})
        spawner = next((s for s in owner.values() if token and s.api_token == token), None)
        port = port_of(self.get_json_body())
        if spawner is None or port is None:
            raise web.HTTPError(400, f'only {{"port": {PORTS[0]} to {PORTS[1]}}}, with the '
                                "server's own token")
        spawner.port = port
        self.set_status(201)
        self.finish(json.dumps({"message": "port set"}))


class Refused(web.HTTPError):
    """A spawn refused in one line: the hub logs it without a traceback (an HTTPError) and
    the spawn page shows ``jupyterhub_message``."""

    def __init__(self, message: str) -> None:
        super().__init__(500, message.replace("%", "%%"))
        self.jupyterhub_message = message


def narrow_callback(handlers: list[tuple[Any, ...]]) -> None:
    """Serve the callback's route with :class:`PortHandler` instead of batchspawner's."""
    for i, entry in enumerate(handlers):
        if entry[0] == CALLBACK:
            handlers[i] = (CALLBACK, PortHandler)


narrow_callback(default_handlers)


class PyhpcSlurmSpawner(SlurmSpawner):  # type: ignore[misc]  # batchspawner ships no type information
    """A user's notebook server as a Slurm job of theirs, in the account, QOS and
    reservation they chose from what Slurm says they have."""

    venv = Unicode(str(paths.SHARED_VENV), help="The environment the server runs in on "
                   "every node (jupyterhub-singleuser, batchspawner-singleuser, the "
                   "job runtime)").tag(config=True)
    cluster_file = Unicode(str(paths.DEPLOYED_CLUSTER), help="The cluster definition "
                           "(partitions, their nodes, GPUs and time limits)").tag(config=True)
    idle_minutes = Integer(60, help="The idle culler's timeout, as the form tells "
                           "it").tag(config=True)

    @default("env_keep")
    def _no_env_of_the_hub(self) -> list[str]:
        return []  # the hub's PATH or VIRTUAL_ENV have no business in a user's job

    @default("options_form")
    def _pyhpc_form(self) -> Any:
        return self.form_for

    @default("options_from_form")
    def _pyhpc_from_form(self) -> Any:
        return self.from_form

    def definition(self) -> cluster.Cluster:
        return cluster.load(self.cluster_file)

    async def form_for(self, spawner: Any) -> str:
        """The form: choices from Slurm, read as the user."""
        found = await asyncio.to_thread(choices.read, self.user.name)
        return form.render(found, self.definition(), self.idle_minutes)

    async def from_form(self, formdata: dict[str, Any]) -> dict[str, Any]:
        """The form's answer, checked now so that a bad one is shown on the form."""
        return (await self.checked(options.from_form(formdata))).as_options()

    async def checked(self, values: dict[str, Any]) -> ServerRequest:
        """``values`` over the form's preselection, checked against the user's choices."""
        found = await asyncio.to_thread(choices.read, self.user.name)
        the_cluster = self.definition()
        merged = {**form.preselected(found, the_cluster), **values}
        return options.check(merged, found, the_cluster)

    async def submit_batch_script(self) -> str:
        """Check the options again (a REST spawn never saw the form) and submit as the user."""
        user = self.user.name
        request = await self.checked(dict(self.user_options or {}))
        home = await asyncio.to_thread(script.home_of, user)
        command = [f"{self.venv}/bin/batchspawner-singleuser",
                   f"{self.venv}/bin/jupyterhub-singleuser", *SERVER_ARGS, *self.get_args()]
        # Unique to this submission: where slurmctld does not answer sbatch in time, the
        # job it may have accepted all the same is found by it, not left running unseen.
        comment = f"pyhpc-hub-{secrets.token_hex(8)}"
        text = script.script(request, self.definition(), user, home, self.get_env(), command,
                             self.venv, comment)
        try:
            self.job_id = await asyncio.to_thread(as_user.submit, user, text)
        except slurm.AmbiguousSubmit as exc:
            self.log.warning("%s's notebook server: %s; looking for the job by its comment %s",
                             user, exc, comment)
            found = await asyncio.to_thread(as_user.submitted, user, comment)
            if found is None:
                raise
            self.job_id = found
            self.log.warning("%s's notebook server: slurmctld accepted it: job %s", user, found)
        self.log.info("%s's notebook server is job %s (%s)", user, self.job_id, request)
        return str(self.job_id)

    async def start(self) -> tuple[str, int]:
        """batchspawner's start (the job runs, its server reported a port), then the proof
        that what answers at that port is this server: only then does the proxy route
        this user's requests there. A wrong answer cancels the job, in one line."""
        ip, port = await super().start()
        prefix = self.server.base_url if self.server else f"/user/{self.user.name}/"
        try:
            await asyncio.to_thread(proof.check, ip, port, self.user.name, prefix,
                                    self.api_token, float(self.http_timeout))
        except proof.ProofError as exc:  # the hub logs it, in one line (an HTTPError)
            await self.cancel_batch_job()
            raise Refused(str(exc)) from None
        return ip, port

    async def query_job_status(self) -> JobStatus:
        if not self.job_id:
            self.job_status = ""
            return JobStatus.NOTFOUND
        try:
            self.job_status = await asyncio.to_thread(as_user.query, self.user.name,
                                                      self.job_id)
        except PyhpcError as exc:  # Slurm did not answer: the job may well be running
            self.log.warning("job %s of %s: %s", self.job_id, self.user.name, exc)
            return JobStatus.UNKNOWN
        if self.state_isrunning():
            return JobStatus.RUNNING
        if self.state_ispending():
            return JobStatus.PENDING
        if self.state_isunknown():
            return JobStatus.UNKNOWN
        return JobStatus.NOTFOUND

    async def cancel_batch_job(self) -> None:
        if self.job_id:
            self.log.info("cancelling job %s of %s", self.job_id, self.user.name)
            await asyncio.to_thread(as_user.cancel, self.user.name, self.job_id)

    async def run_command(self, cmd: str, input: str | None = None,
                          env: dict[str, str] | None = None) -> str:
        raise RuntimeError("pyhpc's spawner runs Slurm through pyhpc.slurm.as_user, "
                           "never a shell command")
