"""pyhpc's authenticator: PAM (the directory password, through nslcd) and one allow rule.

JupyterHub 5 lets nobody in until an allow rule is set; pyhpc's rule is exactly "has a
Slurm association" (:func:`pyhpc.hub.choices.may_log_in`): checked at every login and
again every few minutes while a login lasts (``refresh_user``), so a user whose last
association went (a deleted workshop) is logged out. Loaded by the hub's
``jupyterhub_config.py``, in the hub's own virtualenv.
"""
from __future__ import annotations

import asyncio
from typing import Any

from jupyterhub.auth import PAMAuthenticator
from traitlets import List, Unicode

from pyhpc.hub import choices


class PyhpcAuthenticator(PAMAuthenticator):  # type: ignore[misc]  # jupyterhub ships no type information
    """The directory's users, with their directory password, if Slurm knows them."""

    local_users = List(Unicode(), default_value=["root"], help="The definition's "
                       "directory.local_users: never hub users").tag(config=True)

    async def check_allowed(self, username: str, authentication: Any = None) -> bool:
        return await asyncio.to_thread(choices.may_log_in, username, list(self.local_users))

    async def refresh_user(self, user: Any, handler: Any = None) -> bool:
        """False (log in again) once the user has no association left."""
        return await asyncio.to_thread(choices.may_log_in, user.name, list(self.local_users),
                                       True)
