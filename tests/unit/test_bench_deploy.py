"""benchmarks/deploy.py's pure part: reading a profiled deploy's output (profile_roles,
profile_tasks and the PLAY RECAP)."""
from __future__ import annotations

from benchmarks import deploy

OUTPUT = """\
PLAY RECAP *********************************************************************
localhost : ok=188  changed=0    unreachable=0    failed=0    skipped=68   rescued=0    ignored=0

Thursday 26 November 2026  02:40:01 +0000 (0:00:00.412)       0:00:31.020 *****
===============================================================================
slurm ------------------------------------------------------------------ 12.34s
pyhpc_login ------------------------------------------------------------- 8.50s
total ------------------------------------------------------------------ 20.84s
Thursday 26 November 2026  02:40:01 +0000 (0:00:00.412)       0:00:31.020 *****
===============================================================================
pyhpc_login : Check the job environment imports pyhpc from the copy ----- 2.34s
slurm : Install Slurm's packages (apt: one task) ------------------------ 1.05s
Gathering Facts --------------------------------------------------------- 0.90s
"""


def test_a_profiled_deploy_gives_roles_slowest_tasks_and_task_counts() -> None:
    got = deploy.profile(OUTPUT)
    assert got["roles_s"] == {"slurm": 12.34, "pyhpc_login": 8.5, "total": 20.84}
    assert got["slowest_tasks_s"] == [
        ["pyhpc_login : Check the job environment imports pyhpc from the copy", 2.34],
        ["slurm : Install Slurm's packages (apt: one task)", 1.05],
        ["Gathering Facts", 0.9]]
    assert got["tasks"] == {"localhost": {"ok": 188, "skipped": 68}}


def test_an_unprofiled_output_gives_empty_profiles() -> None:
    assert deploy.profile("no recap here") == {"roles_s": {}, "slowest_tasks_s": [], "tasks": {}}


def test_the_plain_install_covers_every_roles_packages_and_no_purge_list() -> None:
    names = deploy.packages()
    assert len(names) == len(set(names))
    for role_has in ("munge", "slurmctld", "slurmdbd", "mariadb-server", "rsync", "slapd", "nslcd",
                     "prometheus", "prometheus-node-exporter", "node-configurable-http-proxy",
                     "podman", "crun"):
        assert role_has in names
    # containers_runtime_packages names what a runtime's .deb must provide; apptainer is
    # not in Debian, and no role installs it from apt.
    assert "apptainer" not in names and "enroot" not in names


def test_the_plain_install_pips_every_requirements_file_the_deploy_installs() -> None:
    files = {f for _, group, _ in deploy.PIP_SETS for f in group}
    assert files == {"deploy.txt", "runtime.txt", "singleuser.txt", "hub.txt"}
    assert all((deploy.ROOT / "requirements" / f).is_file() for f in files)
