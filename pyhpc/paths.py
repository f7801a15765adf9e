"""Where pyhpc finds what it ships (job templates, the container spec, workshop notebooks)
and the cluster definition.

The repository's top-level slurm/, containers/ and workshops/ are the one source. A wheel
carries them as pyhpc/_data/ (setup.py copies them at build time); a checkout, an editable
install of it (``make venv``, the lab's /opt/pyhpc/src) and ``python -m pyhpc`` from it
read the checkout's own folders.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

#: The package's parent: the repository root in a checkout (on a login node, the shared
#: copy /opt/pyhpc/src); site-packages for an installed wheel, which holds no repository.
ROOT = Path(__file__).resolve().parent.parent


def _shipped() -> Path:
    """The folder that holds slurm/, containers/ and workshops/: the installed package's
    _data/ where a wheel put it, else the checkout's top level."""
    packaged = resources.files("pyhpc") / "_data"
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return ROOT


#: The folder of the shipped data (see the module's docstring).
SHIPPED = _shipped()
#: slurm.conf and the other Slurm configuration templates (the slurm role renders them).
SLURM_ETC = SHIPPED / "slurm" / "etc"
#: The batch-job templates (``pyhpc render``, ``pyhpc submit``).
SLURM_JOBS = SHIPPED / "slurm" / "jobs"
#: containers/spec.yml and the image templates (``pyhpc containers``).
CONTAINERS = SHIPPED / "containers"
#: The notebooks a workshop participant gets in ~/workshop.
WORKSHOPS = SHIPPED / "workshops"
#: The shared install on every node (the login role): the runtime venv and this source.
SHARED_VENV = Path("/opt/pyhpc/venv")
SHARED_SRC = Path("/opt/pyhpc/src")
#: Where `make containers` exports images (the containers role creates it on every node).
IMAGES = Path("/opt/pyhpc/images")
#: Written by the login role on every deployed cluster.
DEPLOYED_CLUSTER = Path("/etc/pyhpc/cluster.yml")
LAB_CLUSTER = ROOT / "ansible" / "inventories" / "lab" / "cluster.yml"
#: Jobs whose accounting records ``pyhpc doctor --fix-runaway`` closed, so that
#: ``pyhpc status`` still calls them LOST: one ledger per job owner, ``UID.jsonl`` (JSON
#: lines, only appended to; root's, 0600, and its owner's to read by an ACL entry), in a
#: folder of root's that nobody else can list (0711).
RUNAWAY_LEDGERS = Path("/var/lib/pyhpc/runaway-jobs")
#: The queue record of ``pyhpc admin upgrade queue save`` (root's, 0700; files 0600): each
#: held, requeued or cancelled job, and what restore resubmitted.
UPGRADE_QUEUE = Path("/var/lib/pyhpc/upgrade-queue")
#: The one ledger of every user's rows (0644) from before: --fix-runaway moves them.
RUNAWAY_LEDGER_SHARED = Path("/var/lib/pyhpc/runaway-jobs.jsonl")


def cluster_file() -> Path:
    """$PYHPC_CLUSTER, else the deployed definition, else the lab default."""
    env = os.environ.get("PYHPC_CLUSTER")
    if env:
        return Path(env)
    return DEPLOYED_CLUSTER if DEPLOYED_CLUSTER.exists() else LAB_CLUSTER
