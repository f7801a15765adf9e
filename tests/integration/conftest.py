"""Fixtures shared by the integration tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from pyhpc import paths

#: The code jobs run, from the deployed copy (pyhpc is installed editable from it): every
#: module a job imports or the CLI runs to submit it, and every job template.
JOB_CODE = [f"pyhpc/{m}.py" for m in ("__init__", "_submit", "bench", "bench_job", "cli",
                                      "cli_admin", "cli_jobs", "cluster", "cluster_users",
                                      "device", "directory", "directory_sync", "dist", "doctor",
                                      "errors", "files", "gpucheck", "jobspec", "metrics",
                                      "owner", "paths", "render", "report", "schema", "slurm",
                                      "startup", "sweep", "train", "trainconfig", "validate",
                                      "watch", "workshop", "workshop_sheet", "yamlio")] + [
    str(p.relative_to(paths.ROOT)) for p in sorted(paths.SLURM_JOBS.glob("*.j2"))]


@pytest.fixture(scope="module")
def deployed_copy_is_current() -> None:
    """Jobs import pyhpc from /opt/pyhpc/src: it must be this checkout's code
    (``pytest.mark.usefixtures("deployed_copy_is_current")`` in the modules that submit)."""
    src = paths.SHARED_SRC
    stale = [rel for rel in JOB_CODE if not (src / rel).exists()
             or (src / rel).read_bytes() != (paths.ROOT / rel).read_bytes()]
    assert not stale, f"/opt/pyhpc/src is older than this checkout ({stale}); run make deploy"


@pytest.fixture
def work(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A job directory every node can enter (Slurm runs the job from it)."""
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit("_", 1)[-1])
    path.chmod(0o755)
    return path
