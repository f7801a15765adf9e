"""The Slurm configuration templates (slurm/etc/*.j2) rendered to golden files.

Rendered with plain Jinja2 in the settings Ansible's template module uses
(trim_blocks on, trailing newline kept), from the role's defaults and the
normalised cluster definition, as the slurm role renders them on a host.
"""
from __future__ import annotations

from typing import Any

import jinja2
import pytest
import yaml

from pyhpc import cluster, paths

TEMPLATES = paths.ROOT / "slurm" / "etc"
DEFAULTS = paths.ROOT / "ansible" / "roles" / "slurm" / "defaults" / "main.yml"
INVENTORIES = paths.ROOT / "ansible" / "inventories"
FILES = ["slurm.conf", "gres.conf", "cgroup.conf", "slurmdbd.conf", "pyhpc-healthcheck"]
#: Host facts the role would take from the inventory, fixed here for determinism.
HOSTS = {
    "lab": {"slurm_controller_hostname": "labhost", "slurm_dbd_hostname": "labhost",
            "slurm_lab_hostname": "labhost", "slurm_version": "22.05.8"},
    "example": {"slurm_controller_hostname": "head1", "slurm_dbd_hostname": "db1",
                "slurm_lab_hostname": "unused", "slurm_version": "24.11.5"},
    "hostlab": {"slurm_controller_hostname": "ctl", "slurm_dbd_hostname": "db",
                "slurm_lab_hostname": "unused", "slurm_version": "24.11.5"},
}


def context(inventory: str) -> dict[str, Any]:
    defaults = yaml.safe_load(DEFAULTS.read_text())
    ctx = {k: v for k, v in defaults.items() if not (isinstance(v, str) and "{{" in v)}
    ctx.update(HOSTS[inventory])
    ctx["slurm_cluster"] = cluster.load(INVENTORIES / inventory / "cluster.yml").to_dict()
    ctx["slurm_dbd_db_password"] = "GOLDEN-PLACEHOLDER"
    return ctx


def render(name: str, ctx: dict[str, Any]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return env.get_template(f"{name}.j2").render(**ctx)


@pytest.mark.parametrize("inventory", sorted(HOSTS))
@pytest.mark.parametrize("name", FILES)
def test_template_matches_golden(golden, inventory: str, name: str) -> None:
    golden.check(f"slurm/{inventory}/{name}", render(name, context(inventory)))


@pytest.mark.parametrize("name", FILES)
def test_rendering_is_deterministic(name: str) -> None:
    assert render(name, context("lab")) == render(name, context("lab"))


def test_lab_runs_one_slurmd_per_node_on_its_own_port() -> None:
    conf = render("slurm.conf", context("lab"))
    for node in cluster.load(INVENTORIES / "lab" / "cluster.yml").nodes:
        assert f"NodeName={node.name} NodeHostname=labhost NodeAddr=127.0.0.1 Port={node.port} " in conf
    assert "SlurmdPidFile=/run/slurmd-%n.pid" in conf
    assert "SlurmdParameters=config_overrides" in conf


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
