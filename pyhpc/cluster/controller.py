"""Where slurmctld keeps its state and how long a backup controller waits: the
``controller`` section.

Parsed here, validated before any host changes, re-exported by :mod:`pyhpc.cluster`. The
inventory's ``controller`` group names the hosts: one, or two (a primary and a backup,
SchedMD's ``SlurmctldHost`` pair). Two controllers read and write one
``StateSaveLocation``, so it must be storage both mount (the nfs role's export, or a share
the admin mounts); the slurm role checks on both hosts that it is one directory before
either slurmctld starts with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyhpc.cluster.backup import directory_path
from pyhpc.cluster.schema import check_keys, integer

#: slurmctld's state on the controller's own disk: the one place while there is one controller.
LOCAL_STATE = "/var/lib/slurm/slurmctld"
CONTROLLER_KEYS = {
    "state_save_location": "absolute directory of slurmctld's state (Slurm's "
                           f"StateSaveLocation; default {LOCAL_STATE}). With two controllers "
                           "it must be shared storage both hosts mount, e.g. /srv/slurmctld",
    "timeout": "seconds the backup controller waits for the primary before it takes over "
               "(Slurm's SlurmctldTimeout), 5 to 65533 (default 120)",
}
BOUNDS: dict[str, tuple[int, int]] = {"timeout": (5, 65533)}


@dataclass(frozen=True)
class Controller:
    """The ``controller`` section, normalised (every default filled in)."""

    state_save_location: str = LOCAL_STATE
    timeout: int = 120


def parse_controller(data: Any) -> Controller:
    """``controller``: absent (the defaults) or a mapping of :data:`CONTROLLER_KEYS`."""
    if data is None:
        return Controller()
    check_keys("controller", data, CONTROLLER_KEYS, ())
    return Controller(
        state_save_location=directory_path("controller.state_save_location",
                                           data.get("state_save_location", LOCAL_STATE),
                                           example="/srv/slurmctld"),
        timeout=integer("controller.timeout", data.get("timeout", 120), BOUNDS))
