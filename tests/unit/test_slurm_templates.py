"""The Slurm configuration templates (slurm/etc/*.j2) rendered to golden files.

Rendered with plain Jinja2 in the settings Ansible's template module uses
(trim_blocks on, trailing newline kept), from the role's defaults and the
normalised cluster definition, as the slurm role renders them on a host.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from pyhpc import cluster, paths

ROLE = paths.ROOT / "ansible" / "roles" / "slurm"
DEFAULTS = ROLE / "defaults" / "main.yml"


def role_source(key: str) -> Path:
    """A path default of the slurm role that names a file of the repository, resolved as
    Ansible does in the role (role_path: the role's directory)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["dirname"] = os.path.dirname
    text = yaml.safe_load(DEFAULTS.read_text())[key]
    return Path(env.from_string(text).render(role_path=str(ROLE)))


#: The role's templates, as it finds them: slurm/etc.
TEMPLATES = role_source("slurm_templates_dir")
INVENTORIES = paths.ROOT / "ansible" / "inventories"
FILES = ["slurm.conf", "gres.conf", "cgroup.conf", "slurmdbd.conf", "pyhpc-healthcheck.json"]
#: Host facts the role would take from the inventory, fixed here for determinism.
HOSTS = {
    "lab": {"slurm_controller_hostname": "labhost", "slurm_dbd_hostname": "labhost",
            "slurm_lab_hostname": "labhost", "slurm_version": "22.05.8"},
    "example": {"slurm_controller_hostname": "head1", "slurm_dbd_hostname": "db1",
                "slurm_lab_hostname": "unused", "slurm_version": "24.11.5"},
    "hostlab": {"slurm_controller_hostname": "ctl", "slurm_dbd_hostname": "db",
                "slurm_lab_hostname": "unused", "slurm_version": "24.11.5"},
}
#: Golden directory (tests/golden/slurm/<case>) -> inventory, definition file, keys replaced.
#: tuning: high_throughput is golden on both Slurm versions: ddl256 (lab, 22.05) and the
#: example cluster with the tuning switched on (24.11).
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "lab": ("lab", "cluster.yml", {}),
    "example": ("example", "cluster.yml", {}),
    "hostlab": ("hostlab", "cluster.yml", {}),
    "ddl256": ("lab", "ddl256.yml", {}),
    "example-high-throughput": ("example", "cluster.yml", {"tuning": "high_throughput"}),
    # A backup controller (db) beside the primary, their state on a share, a short takeover.
    "hostlab-backup-controller": ("hostlab", "cluster.yml", {
        "controller": {"state_save_location": "/srv/slurmctld", "timeout": 10}}),
}
#: Host facts of a case beyond its inventory's: the controller group's hostnames.
CASE_HOSTS: dict[str, dict[str, Any]] = {
    "hostlab-backup-controller": {"slurm_controller_hostnames": ["ctl", "db"]},
}
#: The RAM a lab definition is checked against here: the lab machine's 24 GiB, so goldens
#: do not depend on the machine the tests run on.
RAM_MB = 24 * 1024


def definition(case: str) -> dict[str, Any]:
    inventory, file, changes = CASES[case]
    return {**yaml.safe_load((INVENTORIES / inventory / file).read_text()), **changes}


def context(case: str) -> dict[str, Any]:
    defaults = yaml.safe_load(DEFAULTS.read_text())
    ctx = {k: v for k, v in defaults.items() if not (isinstance(v, str) and "{{" in v)}
    ctx.update(HOSTS[CASES[case][0]], **CASE_HOSTS.get(case, {}))
    ctx["slurm_cluster"] = cluster.parse(definition(case), RAM_MB).to_dict()
    # The role's default: the definition's controller.state_save_location.
    ctx["slurm_state_dir"] = ctx["slurm_cluster"]["controller"]["state_save_location"]
    ctx["slurm_dbd_db_password"] = "GOLDEN-PLACEHOLDER"
    return ctx


def render(name: str, ctx: dict[str, Any]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return env.get_template(f"{name}.j2").render(**ctx)


def test_the_role_renders_the_repositorys_slurm_etc_through_no_link() -> None:
    assert TEMPLATES == paths.ROOT / "slurm" / "etc" == paths.SLURM_ETC
    assert sorted(p.name for p in TEMPLATES.iterdir()) == sorted(f"{name}.j2" for name in FILES)
    links = [str(p) for p in ROLE.rglob("*") if p.is_symlink()]
    assert links == []


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", FILES)
def test_template_matches_golden(golden, case: str, name: str) -> None:
    golden.check(f"slurm/{case}/{name}", render(name, context(case)))


@pytest.mark.parametrize("name", FILES)
def test_rendering_is_deterministic(name: str) -> None:
    assert render(name, context("lab")) == render(name, context("lab"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_slurmdbd_keeps_the_same_data_private_as_slurmctld(case: str) -> None:
    """sacct, sacctmgr and sreport ask slurmdbd, squeue and scontrol slurmctld: one privacy."""
    def private(name: str) -> list[str]:
        return [line for line in render(name, context(case)).splitlines()
                if line.startswith("PrivateData=")]
    assert private("slurmdbd.conf") == private("slurm.conf") == [
        "PrivateData=accounts,jobs,reservations,usage,users"]


def test_lab_runs_one_slurmd_per_node_on_its_own_port() -> None:
    conf = render("slurm.conf", context("lab"))
    for node in cluster.load(INVENTORIES / "lab" / "cluster.yml").nodes:
        assert f"NodeName={node.name} NodeHostname=labhost NodeAddr=127.0.0.1 Port={node.port} " in conf
    assert "SlurmdPidFile=/run/slurmd-%n.pid" in conf
    assert "SlurmdParameters=config_overrides" in conf


def test_lab_confines_jobs_with_the_cgroup_plugins_of_real_hosts() -> None:
    """The lab tracks and confines jobs as hosts do (cgroup v1, one tree per slurmd -N)."""
    for case in ("lab", "hostlab"):
        conf = render("slurm.conf", context(case))
        assert "ProctrackType=proctrack/cgroup" in conf and "linuxproc" not in conf
        assert "TaskPlugin=task/cgroup,task/affinity" in conf
    lab, hosts = (render("cgroup.conf", context(case)).splitlines()[2:] for case in ("lab", "hostlab"))
    assert lab == hosts and "ConstrainDevices=yes" in lab and "ConstrainRAMSpace=yes" in lab


def test_lab_accounts_jobs_by_cgroup_as_hosts_do() -> None:
    """jobacct_gather/cgroup gives each job the cpuacct cgroup whose CPU time the job
    exporter reads; jobacct_gather/linux made none in the lab."""
    for case in ("lab", "hostlab"):
        assert "JobAcctGatherType=jobacct_gather/cgroup\n" in render("slurm.conf", context(case))


@pytest.mark.parametrize(("changes", "deployed", "runs"), [
    ({}, True, True),
    ({"monitoring": {"enabled": False}}, True, False),
    ({"monitoring": {"listen": "10.0.0.0/16", "job_records": False}}, True, False),
    ({}, False, False),  # pyhpc_deploy_monitoring false: the role installs no record program
])
def test_the_job_end_record_runs_only_where_the_monitoring_role_installs_it(
        changes: dict[str, Any], deployed: bool, runs: bool) -> None:
    ctx = context("example")
    ctx["slurm_cluster"] = cluster.parse({**definition("example"), **changes}, RAM_MB).to_dict()
    ctx["slurm_jobstats_record"] = deployed
    lines = [line for line in render("slurm.conf", ctx).splitlines()
             if line.startswith("EpilogSlurmctld=")]
    assert lines == (["EpilogSlurmctld=/usr/local/sbin/pyhpc-jobstats-record"] if runs else [])


def test_gpu_nodes_use_nvml_or_explicit_files() -> None:
    assert "NodeName=gn1 AutoDetect=nvml Name=gpu Type=h100 Count=4" in render(
        "gres.conf", context("example"))
    assert "NodeName=gpu1 Name=gpu Type=lab File=/dev/pyhpc-lab/gpu1/nvidia[0-1]" in render(
        "gres.conf", context("lab"))


@pytest.mark.parametrize(("version", "crypto", "ctld_pid", "dbd_pid"), [
    ("22.05.8", True, "/run/slurmctld.pid", "/run/slurmdbd.pid"),
    ("24.11.5", False, "/run/slurmctld/slurmctld.pid", "/run/slurmdbd/slurmdbd.pid"),
])
def test_templates_follow_the_installed_slurm_version(version: str, crypto: bool, ctld_pid: str,
                                                      dbd_pid: str) -> None:
    """Debian 12's Slurm 22.05 needs CryptoType; 23.11+ dropped it and runs its daemons
    as slurm with pid files in their units' RuntimeDirectory."""
    ctx = {**context("example"), "slurm_version": version}
    conf = render("slurm.conf", ctx)
    assert ("CryptoType=crypto/munge" in conf) is crypto
    assert f"SlurmctldPidFile={ctld_pid}\n" in conf
    assert f"PidFile={dbd_pid}\n" in render("slurmdbd.conf", ctx)


#: What tuning: high_throughput sets; tuning: default sets none of it.
TUNED = ("MaxJobCount=", "MinJobAge=", "MessageTimeout=", "PriorityType=",
         "JobAcctGatherType=jobacct_gather/none", "SlurmctldDebug=", "SlurmdDebug=",
         "SchedulerParameters=", "CommitDelay=")


@pytest.mark.parametrize("inventory", sorted(HOSTS))
def test_default_tuning_renders_what_it_did_before_tuning_existed(golden, inventory: str) -> None:
    """tuning: default, written out or left out, is byte for byte the golden of before."""
    for changes in ({}, {"tuning": "default"}):
        ctx = context(inventory)
        ctx["slurm_cluster"] = cluster.parse({**definition(inventory), **changes},
                                             RAM_MB).to_dict()
        for name in ("slurm.conf", "slurmdbd.conf"):
            text = render(name, ctx)
            golden.check(f"slurm/{inventory}/{name}", text)
            assert not [line for line in text.splitlines() if line.startswith(TUNED)]


@pytest.mark.parametrize("inventory", sorted(HOSTS))
def test_high_throughput_only_adds_settings(inventory: str) -> None:
    """Every line of the default slurm.conf stays, except the job accounting plugin it
    replaces; each added setting has a comment line above it."""
    default = render("slurm.conf", context(inventory)).splitlines()
    ctx = context(inventory)
    ctx["slurm_cluster"] = {**ctx["slurm_cluster"], "tuning": "high_throughput"}
    tuned = render("slurm.conf", ctx).splitlines()
    kept = [line for line in default if not line.startswith("JobAcctGatherType=")]
    rest = iter(tuned)
    assert all(line in rest for line in kept)  # in the same order
    added = [line for line in tuned if line not in default and not line.startswith("#")]
    assert sorted(line.split("=", 1)[0] for line in added) == sorted(
        t.split("=", 1)[0] for t in TUNED if t != "CommitDelay=")
    for line in added:
        assert tuned[tuned.index(line) - 1].startswith("#"), line


@pytest.mark.parametrize(("version", "defer"), [("22.05.8", None), ("23.11.1", "defer_batch"),
                                                ("24.11.5", "defer_batch")])
def test_high_throughput_defers_only_batch_jobs(version: str, defer: str | None) -> None:
    """defer_batch (23.02+) batches sbatch jobs and leaves srun immediate; 22.05 has only
    defer, which would delay srun too, so it gets neither."""
    ctx = {**context("ddl256"), "slurm_version": version}
    params = next(line for line in render("slurm.conf", ctx).splitlines()
                  if line.startswith("SchedulerParameters="))
    options = params.split("=", 1)[1].split(",")
    assert "defer" not in options
    assert ("defer_batch" in options) is (defer is not None)
    assert "default_queue_depth=272" in options  # ddl256: 68 nodes x 4 CPUs
