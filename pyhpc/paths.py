"""Where pyhpc finds its templates and the cluster definition."""
from __future__ import annotations

import os
from pathlib import Path

#: Repository root (or the shared install on a login node: /opt/pyhpc/src).
ROOT = Path(__file__).resolve().parent.parent
SLURM_ETC = ROOT / "slurm" / "etc"
SLURM_JOBS = ROOT / "slurm" / "jobs"
CONTAINERS = ROOT / "containers"
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
#: The one ledger of every user's rows (0644) from before: --fix-runaway moves them.
RUNAWAY_LEDGER_SHARED = Path("/var/lib/pyhpc/runaway-jobs.jsonl")


def cluster_file() -> Path:
    """$PYHPC_CLUSTER, else the deployed definition, else the lab default."""
    env = os.environ.get("PYHPC_CLUSTER")
    if env:
        return Path(env)
    return DEPLOYED_CLUSTER if DEPLOYED_CLUSTER.exists() else LAB_CLUSTER
