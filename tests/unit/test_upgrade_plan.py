"""The upgrade plan's rule and decisions (issue 46 item 1), from hosts' facts as the probe
parses them; the lab's integration test runs the real probe."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from pyhpc import cluster, paths
from pyhpc.admin import upgrade as plan
from pyhpc.admin import upgrade_facts as facts
from pyhpc.admin import upgrade_releases as releases
from pyhpc.admin.upgrade_releases import UpgradeError, chain, supported

LAB = cluster.parse(yaml.safe_load(paths.LAB_CLUSTER.read_text()), ram_mb=1 << 20)
BOOKWORM = {"slurmctld": "22.05.8-4+deb12u3", "slurmdbd": "22.05.8-4+deb12u3",
            "mariadb-server": "1:10.11.19-0+deb12u1", "slapd": "2.5.13+dfsg-5",
            "munge": "0.5.15-2+deb12u1", "prometheus": "2.42.0+ds-5+deb12u1"}


def host_facts(name: str = "localhost", roles: tuple[str, ...] = facts.ROLES,
               codename: str = "bookworm", packages: dict[str, str] | None = None,
               **values: str) -> facts.Facts:
    text = "\n".join([f"codename={codename}", "debian_version=12.11",
                      *(f"package={p} {v} ii " for p, v in
                        (BOOKWORM if packages is None else packages).items()),
                      *(f"{k}={v}" for k, v in {"size_accounting": "1000", "size_state": "200",
                                                "size_munge_key": "128", "size_secrets": "50",
                                                "size_directory": "300", "job_records": "4000",
                                                "backup_free": "10000000", "jobs_pending": "3",
                                                "jobs_running": "1", **values}.items())])
    return facts.parse(facts.Host(name, roles), text)


def test_schedmd_upgrades_across_two_releases_before_24_11_and_three_from_it() -> None:
    assert supported("22.05", "23.11") and not supported("22.05", "24.05")
    assert all(supported(old, "24.11") for old in ("23.02", "23.11", "24.05"))
    assert not supported("22.05", "24.11")
    assert supported("23.11", "25.05") and not supported("23.02", "25.05")


def test_the_shortest_supported_path_from_22_05_to_24_11_has_one_release_between() -> None:
    path = chain("22.05", "24.11")
    assert len(path) == 3 and path[0] == "22.05" and path[-1] == "24.11"
    assert all(supported(a, b) for a, b in zip(path, path[1:], strict=False))
    assert chain("24.11", "22.05") == ()


def test_debian_versions_lose_epoch_and_revision() -> None:
    assert releases.upstream("1:10.11.19-0+deb12u1") == "10.11.19"
    assert releases.upstream("2.5.13+dfsg-5") == "2.5.13"


@pytest.mark.parametrize("version", ["19.05.1", "26.11.0", "22.5", "slurm"])
def test_an_unknown_slurm_version_is_refused_with_the_known_ones(version: str) -> None:
    with pytest.raises(UpgradeError, match=f"host x: unknown Slurm version '{version}'.*22.05"):
        releases.slurm_major(version, "host x")


def test_the_plan_from_22_05_holds_pending_jobs_and_does_not_carry_the_state_over() -> None:
    p = plan.build(LAB, [host_facts()])
    s = p["slurm"]
    assert (s["now"], s["after"], s["supported"]) == ("22.05", "24.11", False)
    assert s["state"].startswith("not carried over") and "held" in s["pending"]
    assert s["chain"][0] == "22.05" and "Database schema is too old" in s["accounting"]
    assert p["hosts"][0]["versions"]["slurm"] == {"now": "22.05.8", "after": "24.11.5"}
    assert p["hosts"][0]["versions"]["mariadb"] == {"now": "10.11.19", "after": "11.8"}
    assert p["backup_bytes"] == 1000 + 200 + 128 + 50 + 300
    assert {b["what"] for b in p["backups"]} == set(plan.BACKUPS)
    assert p["no_job_can_start"]["source"].startswith("measured on hostlab's container hosts")


def test_the_estimate_takes_the_benchmarks_figures_and_says_what_is_assumed(
        tmp_path: Path) -> None:
    inputs, source = plan.estimate_inputs()
    hosts = json.loads((plan.RESULTS / "upgrade-hosts.json").read_text())["figures"]["moves"]
    assert inputs["host_upgrade_min"] == max(m["move_s"] for m in hosts) / 60
    assert inputs["restart_min"] == plan.ESTIMATE["restart_min"]
    for name in ("upgrade-hosts.json", "backup.json", "upgrade-dbd.json"):
        assert name in source
    assert source.endswith("assumed: restart_min (pyhpc/admin/upgrade.py ESTIMATE)")
    # Without the results (or with one unreadable): the assumptions, and the line says so.
    (tmp_path / "backup.json").write_text("{not json")
    assert plan.estimate_inputs(tmp_path) == (plan.ESTIMATE, "assumed: host_upgrade_min, "
                                              "backup_bytes_per_s, conversion_s_per_1000_jobs, "
                                              "restart_min (pyhpc/admin/upgrade.py ESTIMATE)")


def test_a_supported_jump_keeps_the_queue() -> None:
    newer = {k: v.replace("22.05.8", "23.11.10") for k, v in BOOKWORM.items()}
    s = plan.build(LAB, [host_facts(packages=newer)])["slurm"]
    assert s["supported"] and s["state"].startswith("carried over") and "chain" not in s


def test_phases_follow_schedmds_order_and_each_host_moves_once() -> None:
    found = [host_facts("ctl", ("directory", "monitor", "controller")),
             host_facts("db", ("dbd",)), host_facts("login", ("login",)),
             host_facts("cpu1", ("compute",)), host_facts("gpu1", ("compute",))]
    p = plan.build(LAB, found)
    assert [(ph["phase"], ph["hosts"]) for ph in p["phases"][1:]] == [
        ("dbd", ["db"]), ("controller", ["ctl"]), ("compute", ["cpu1", "gpu1"]),
        ("login", ["login"])]
    # the deploy that starts Slurm again follows the login hosts' move
    assert "login" in p["no_job_can_start"]["phases"]


@pytest.mark.parametrize(("found", "line"), [
    ([host_facts(codename="trixie")], "nothing to upgrade: every host is on Debian 13"),
    ([host_facts("a"), host_facts("b", codename="trixie")],
     "mixed cluster: bookworm on a; trixie on b"),
    ([host_facts("a"), host_facts("b", packages={"slurmd": "23.02.1-1"})],
     "mixed cluster: Slurm 22.05.8 on a; Slurm 23.02.1 on b"),
    ([host_facts(packages={"slurmd": "21.05.2-1"})], "unknown Slurm version '21.05.2'"),
    ([host_facts(codename="bullseye")], "Debian release 'bullseye' is not one"),
    ([host_facts(backup_free="100")], "backup.path: /var/backups/pyhpc on host localhost "
                                      "has 100 bytes free; the upgrade's backups need 1678"),
    ([host_facts(packages={})], "no host has a Slurm package"),
])
def test_what_blocks_a_plan_is_one_line(found: list[facts.Facts], line: str) -> None:
    with pytest.raises(UpgradeError, match=line) as caught:
        plan.build(LAB, found)
    assert "\n" not in str(caught.value)


def test_without_a_backup_section_there_is_no_plan() -> None:
    with pytest.raises(UpgradeError, match="backup: the cluster definition has no backup"):
        plan.build(replace(LAB, backup=None), [host_facts()])


def test_inventory_roles_default_to_the_controller_and_local_hosts_are_read_here() -> None:
    listing = {"controller": {"hosts": ["ctl"]}, "compute": {"hosts": ["cn1", "cn2"]},
               "login": {"hosts": ["login"]}, "dbd": {"hosts": []},
               "_meta": {"hostvars": {"ctl": {"ansible_connection": "local"},
                                      "cn1": {"ansible_user": "admin",
                                              "ansible_ssh_common_args": "-F cfg"}}}}
    hosts = {h.name: h for h in facts.from_listing(listing)}
    assert list(hosts) == ["ctl", "cn1", "cn2", "login"]
    assert hosts["ctl"].roles == ("dbd", "directory", "monitor", "controller")
    assert hosts["ctl"].local and not hosts["cn1"].local
    assert facts.shell_argv(hosts["cn1"])[-2:] == ["admin@cn1", "sudo -n bash -s"]
    assert "BatchMode=yes" in facts.shell_argv(hosts["cn1"])
    with pytest.raises(UpgradeError, match="controller group is empty"):
        facts.from_listing({"compute": {"hosts": ["cn1"]}})


def test_the_text_plan_names_every_section() -> None:
    out = plan.text(plan.build(LAB, [host_facts()]))
    for word in ("22.05.8 -> 24.11.5", "NOT supported", "Drained:", "Backups into",
                 "Phases, in order:", "No job can start for about"):
        assert word in out


def test_the_22_05_database_goes_to_24_11_by_23_02s_step_replayed_as_measured() -> None:
    s = plan.build(LAB, [host_facts()])["slurm"]
    assert f"'{releases.TOO_OLD}'" in s["accounting"]
    assert "no release both accept (23.02, 23.11)" in s["accounting"]
    assert "SchedMD does not support this" in s["accounting"]
    assert s["route"] == ["22.05 (schema 12)", "23.02's step by SQL (schema 13)",
                          "24.11 (schema 16)"]
    assert all(r not in releases.SHIPPED.values() for r in ("23.02", "23.11", "24.05"))


def test_a_jump_without_a_replayed_step_has_no_route() -> None:
    text, route = plan._accounting("21.08", "24.11", chain("21.08", "24.11"))
    assert route == [] and "no route pyhpc knows" in text and releases.TOO_OLD in text


def test_a_chain_through_releases_debian_ships_converts_through_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(releases.SHIPPED, "bookworm-backports", "23.02")
    text, route = plan._accounting("22.05", "24.11", ("22.05", "23.02", "24.11"))
    assert route == ["22.05", "23.02", "24.11"] and text.startswith("converted through")
