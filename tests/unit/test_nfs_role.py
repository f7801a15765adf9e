"""The nfs role in --check: the server's exports, the clients' mounts, bad input, no nfs_server group.

This kernel has no NFS, so nothing is installed or mounted: every run applies the role to this
machine (connection local) with ``--check --diff``; the diff carries the exports file as a real run
would write it. The inventory makes this machine the server, a client of a host ``storage``, or
neither.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

# pytest puts tests/unit on sys.path (no package).
from roleplay import ANSIBLE, extra, other_plays_off, results, run_playbook, skip_if_present

FSTAB = Path("/etc/fstab")
# What a real server run would write: none of it may exist after a check.
WRITES = [Path("/etc/exports.d/pyhpc.exports"), Path("/etc/exports.d")]
PLAYBOOK = """\
- name: Apply the nfs role
  hosts: localhost
  gather_facts: true
  roles:
    - nfs
"""
# The deploy user is root: its home, /root, lies under no default export.
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3",
         "ansible_user": "root"}
THIS = {"hosts": {"localhost": None}}
SERVER = {"nfs_server": THIS}
CLIENT = {"nfs_server": {"hosts": {"storage": {"ansible_host": "10.0.0.5"}}}, "compute": THIS}
NO_NFS = {"login": THIS, "compute": THIS}
NETWORK = {"nfs_network": "10.0.0.0/16"}
ARG_SPEC = "Validating arguments against arg spec 'main'"
CHECK_EXPORTS = "Check the paths, options and networks of the exports"
CIDR = "must be the network allowed to mount, in CIDR notation (e.g. 10.0.0.0/16), got"


def inventory(tmp_path: Path, groups: dict[str, Any], **host_vars: Any) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {**LOCAL, **host_vars}},
                                            "children": groups}}))
    return path


def play(tmp_path: Path, inventory: Path, *args: str,
         playbook: Path | None = None) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run a playbook on this machine in --check --diff; return the process and the JSON report."""
    if playbook is None:
        playbook = tmp_path / "play.yml"
        playbook.write_text(PLAYBOOK)
    return run_playbook(inventory, playbook, "--check", "--diff", *args, timeout=180)


def failed(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(name, r["msg"]) for name, r in results(report).items() if r.get("failed")]


@pytest.fixture(autouse=True)
def nothing_written_before() -> None:
    skip_if_present(WRITES)


@pytest.fixture
def fstab() -> bytes:
    """/etc/fstab before the run; the tests assert it is unchanged after."""
    return FSTAB.read_bytes()


def test_check_mode_server_would_export_home_and_opt_pyhpc_to_the_network(tmp_path: Path,
                                                                          fstab: bytes) -> None:
    proc, report = play(tmp_path, inventory(tmp_path, SERVER), *extra(**NETWORK))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    tasks = results(report)
    assert tasks["Install the NFS server"]["changed"]
    assert "nfs-kernel-server" in tasks["Install the NFS server"]["diff"]["prepared"]
    [exports] = tasks["Write the exports"]["diff"]
    assert exports["after"] == (
        "# Ansible managed: the cluster's shared directories (nfs role); `exportfs -ra` reloads them.\n"
        "/home 10.0.0.0/16(rw,sync,no_subtree_check,no_root_squash)\n"
        "/opt/pyhpc 10.0.0.0/16(rw,sync,no_subtree_check,no_root_squash)\n")
    assert tasks["Start the NFS server"].get("skipped")  # no service before a real install
    assert tasks["Mount the exports"].get("skipped")     # the server mounts nothing
    assert FSTAB.read_bytes() == fstab
    assert not any(p.exists() for p in WRITES)


def test_check_mode_client_would_mount_each_export_from_the_storage_host(tmp_path: Path,
                                                                         fstab: bytes) -> None:
    exports = [{"path": "/home", "options": ["rw", "sync"]},
               {"path": "/opt/pyhpc", "options": ["ro", "sync"], "mount_options": ["ro", "soft"]}]
    proc, report = play(tmp_path, inventory(tmp_path, CLIENT), *extra(nfs_exports=exports))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    tasks = results(report)
    assert tasks["Export the directories"].get("skipped")
    assert tasks["Install the NFS client"]["changed"]
    mounts = tasks["Mount the exports"]["results"]
    assert [r["changed"] for r in mounts] == [True, True]
    # The fstab lines a real run writes, from the fields the mount module plans.
    assert [" ".join(r[k] for k in ("src", "name", "fstype", "opts", "dump", "passno")) for r in mounts] == [
        "10.0.0.5:/home /home nfs rw,hard,_netdev 0 0",
        "10.0.0.5:/opt/pyhpc /opt/pyhpc nfs ro,soft 0 0"]
    assert {r["boot"] for r in mounts} == {"yes"}
    assert FSTAB.read_bytes() == fstab


def test_a_controller_mounts_only_the_exports_that_name_its_group(tmp_path: Path, fstab: bytes) -> None:
    """A backup controller's shared StateSaveLocation: exported to [controller]; the controller
    mounts it and not the users' shares, a compute host the reverse."""
    exports = [{"path": "/home", "options": ["rw", "sync"]},
               {"path": "/srv/slurmctld", "options": ["rw", "sync", "no_root_squash"],
                "groups": ["controller"]}]
    storage = {"hosts": {"storage": {"ansible_host": "10.0.0.5"}}}
    for group, mounted in (("controller", ["/srv/slurmctld"]), ("compute", ["/home"])):
        proc, report = play(tmp_path, inventory(tmp_path, {"nfs_server": storage, group: THIS}),
                            *extra(nfs_exports=exports))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
        assert [r["name"] for r in results(report)["Mount the exports"]["results"]] == mounted, group
    # A host of no export's groups (the db host) is no client: nothing to install.
    proc, report = play(tmp_path, inventory(tmp_path, {"nfs_server": storage, "dbd": THIS}),
                        *extra(nfs_exports=exports))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert results(report)["Load the OS-specific variables"].get("skipped")
    assert FSTAB.read_bytes() == fstab


@pytest.mark.parametrize(("values", "task", "message"), [
    ({**NETWORK, "nfs_exports": [{"path": "home", "options": ["rw"]}]}, CHECK_EXPORTS,
     "nfs_exports[0].path: must be an absolute path without '.', '..' or whitespace and no trailing '/',"
     ' got "home"'),
    ({**NETWORK, "nfs_exports": [{"path": "/home", "options": ["rw", "no_root_sqash"]}]}, ARG_SPEC,
     "Got no match for: no_root_sqash found in nfs_exports"),
    ({"nfs_network": "10.0.0.0/33"}, CHECK_EXPORTS, f'nfs_network: {CIDR} "10.0.0.0/33"'),
    ({"nfs_exports": [{"path": "/home", "options": ["rw"], "network": "10.0.0.1/16"}]}, CHECK_EXPORTS,
     f'nfs_exports[0].network: {CIDR} "10.0.0.1/16" (10.0.0.1/16 has host bits set)'),
], ids=["relative-path", "unknown-option", "bad-cidr", "cidr-with-host-bits"])
def test_bad_export_is_refused_with_its_key_before_any_change(tmp_path: Path, fstab: bytes,
                                                              values: dict[str, Any], task: str,
                                                              message: str) -> None:
    proc, report = play(tmp_path, inventory(tmp_path, SERVER), *extra(**values))
    assert proc.returncode != 0
    stats = report["stats"]["localhost"]
    assert (stats["failures"], stats["changed"]) == (1, 0), stats
    [(name, msg)] = failed(report)
    assert name.startswith(task)
    assert message in msg
    assert "Install the NFS server" not in results(report)
    assert FSTAB.read_bytes() == fstab
    assert not any(p.exists() for p in WRITES)


def test_client_stops_before_mounting_over_the_deploy_users_home(tmp_path: Path, fstab: bytes) -> None:
    if os.path.ismount("/root"):
        pytest.skip("/root is a mount point here, which the role takes for the share")
    proc, report = play(tmp_path, inventory(tmp_path, CLIENT),
                        *extra(nfs_exports=[{"path": "/root", "options": ["rw"]}]))
    assert proc.returncode != 0
    assert report["stats"]["localhost"]["changed"] == 0
    [(name, msg)] = failed(report)
    assert name == "Stop before mounting an export over that home"
    assert msg.startswith("nfs_check_deploy_home: on localhost the home /root of the deploy user root lies"
                          " under /root, which this role would mount from 10.0.0.5")
    assert "Install the NFS client" not in results(report)
    assert FSTAB.read_bytes() == fstab


def test_without_an_nfs_server_group_the_role_plans_nothing(tmp_path: Path, fstab: bytes) -> None:
    proc, report = play(tmp_path, inventory(tmp_path, NO_NFS), *extra(**NETWORK))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    stats = report["stats"]["localhost"]
    assert (stats["changed"], stats["failures"]) == (0, 0), stats
    ran = [name for name, r in results(report).items() if not r.get("skipped")]
    assert len(ran) == 2 and ran[0] == "Gathering Facts" and ran[1].startswith(ARG_SPEC), ran
    assert FSTAB.read_bytes() == fstab


@pytest.mark.parametrize("with_server", [True, False])
def test_site_runs_the_role_only_with_an_nfs_server_group(tmp_path: Path, fstab: bytes,
                                                          with_server: bool) -> None:
    """site.yml (every other play switched off) on a one-node definition of this machine."""
    definition = {
        "name": "nfshost", "mode": "hosts", "accounting": False, "container_runtime": "podman",
        "nodes": [{"name": "localhost", "cpus": 1, "memory_mb": 1024}],
        "partitions": [{"name": "cpu", "nodes": ["localhost"], "default": True}],
        # mode hosts names its cluster network (monitoring is off here all the same).
        "monitoring": {"listen": "10.0.0.0/16"},
    }
    (tmp_path / "cluster.yml").write_text(yaml.safe_dump(definition))
    groups = {"controller": THIS, "login": THIS, "compute": THIS, **(SERVER if with_server else {})}
    hosts = inventory(tmp_path, groups, pyhpc_cluster_file=str(tmp_path / "cluster.yml"))
    proc, report = play(tmp_path, hosts, *extra(
        **other_plays_off("nfs"), **NETWORK),
        playbook=ANSIBLE / "site.yml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    tasks = results(report)
    if with_server:
        [exports] = tasks["Write the exports"]["diff"]
        assert "/home 10.0.0.0/16(" in exports["after"]
    else:
        # The role decides (no nfs_server_host: neither server nor client): none of its tasks runs.
        assert tasks["Load the OS-specific variables"].get("skipped")
        assert "Write the exports" not in tasks and "Install the NFS client" not in tasks
        assert report["stats"]["localhost"]["changed"] == 0
    assert FSTAB.read_bytes() == fstab
    assert not any(p.exists() for p in WRITES)


@pytest.mark.parametrize("purge", [False, True])
def test_absent_client_unmounts_and_forgets_the_exports_installing_nothing(tmp_path: Path, fstab: bytes,
                                                                          purge: bool) -> None:
    proc, report = play(tmp_path, inventory(tmp_path, CLIENT), "--check",
                        *extra(nfs_state="absent", nfs_purge=purge, **NETWORK))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    tasks = results(report)
    for name in ("Unmount the exports", "Remove the exports from fstab"):
        assert [r["item"]["path"] for r in tasks[name]["results"]] == ["/home", "/opt/pyhpc"]
    assert bool(tasks["Purge the NFS packages"].get("skipped")) is (not purge)
    for name in ("Install the NFS client", "Mount the exports", CHECK_EXPORTS):
        assert name not in tasks or tasks[name].get("skipped"), name
    assert tasks["Remove the exports file"].get("skipped")
    assert report["stats"]["localhost"]["changed"] == 0
    assert FSTAB.read_bytes() == fstab


def test_absent_server_removes_only_its_exports_file(tmp_path: Path, fstab: bytes) -> None:
    proc, report = play(tmp_path, inventory(tmp_path, SERVER), "--check",
                        *extra(nfs_state="absent", **NETWORK))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    tasks = results(report)
    assert tasks["Remove the exports file"]["path"] == "/etc/exports.d/pyhpc.exports"
    assert tasks["Unmount the exports"]["results"] == []
    for name in ("Install the NFS server", "Create the exported directories", "Export the directories"):
        assert name not in tasks or tasks[name].get("skipped"), name
    assert tasks["Purge the NFS packages"].get("skipped")
    assert FSTAB.read_bytes() == fstab
