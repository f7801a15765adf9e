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
#: Jobs whose accounting records ``pyhpc doctor --fix-runaway`` closed (root's, 0644,
#: JSON lines, only appended to): ``pyhpc status`` still calls them LOST.
RUNAWAY_LEDGER = Path("/var/lib/pyhpc/runaway-jobs.jsonl")


def cluster_file() -> Path:
    """$PYHPC_CLUSTER, else the deployed definition, else the lab default."""
    env = os.environ.get("PYHPC_CLUSTER")
    if env:
        return Path(env)
    return DEPLOYED_CLUSTER if DEPLOYED_CLUSTER.exists() else LAB_CLUSTER
