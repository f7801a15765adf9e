"""benchmarks/hostlab.py's pure parts: the generated inventories, the RECAP and step parsing,
the ratios and the target, the plot. Runs no hostlab command."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import hostlab as bench
from pyhpc import cluster

PNG = b"\x89PNG\r\n\x1a\n"



def _recap_line(host: str, ok: int, changed: int) -> str:
    """A host's PLAY RECAP line as ansible-playbook prints it (trailing spaces too)."""
    return (f"{host:<27}: ok={ok:<4} changed={changed:<4} unreachable=0    failed=0    "
            f"skipped=18   rescued=0    ignored=0   ")


RERUN = "\n".join([
    "TASK [slurm : Write slurm.conf] " + "*" * 48,
    "ok: [ctl]",
    "ok: [cpu1]",
    "",
    "TASK [munge : Start munge] " + "*" * 53,
    "changed: [cpu2]",
    "",
    "PLAY RECAP " + "*" * 69,
    _recap_line("cpu1", 25, 0),
    _recap_line("cpu2", 25, 1),
    _recap_line("ctl", 33, 0),
    _recap_line("localhost", 3, 0),
    "",
    "=" * 79,
    "slurm " + "-" * 66 + " 12.34s",
    "munge " + "-" * 67 + " 1.50s",
    "",
])


def _run(n: int, fresh: float, rerun: float) -> dict[str, Any]:
    return {"compute_hosts": n, "fresh_deploy_s": fresh, "rerun_s": rerun}


# -- inventories ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_inventory_has_the_service_hosts_and_n_cpu_hosts_and_a_valid_definition(
        tmp_path: Path, n: int) -> None:
    where = bench.write_inventory(n, tmp_path)
    assert where == tmp_path / f"hosts-{n}"
    hosts = yaml.safe_load((where / "hosts.yml").read_text())
    children = hosts["all"]["children"]
    names = [f"cpu{k}" for k in range(1, n + 1)]
    assert list(children["compute"]["hosts"]) == names
    assert {g: list(children[g]["hosts"]) for g in ("controller", "dbd", "login")} == \
        {"controller": ["ctl"], "dbd": ["db"], "login": ["login"]}
    assert "--root /var/lib/pyhpc/hostlab/storage" in hosts["all"]["vars"]["hostlab_podman_args"]

    definition = cluster.load(where / "cluster.yml")
    assert [node.name for node in definition.nodes] == names
    assert [(p.name, list(p.nodes), p.default) for p in definition.partitions] == [("cpu", names, True)]
    stock = cluster.load(bench.STOCK / "cluster.yml")  # its accounts and directory, as they are
    assert (definition.accounts, definition.directory) == (stock.accounts, stock.directory)
    assert (definition.name, definition.mode, definition.accounting) == ("hostlab", "hosts", True)
    assert all(node.gpus == 0 for node in definition.nodes)


def test_inventory_copies_group_vars_and_leaves_the_stock_one_alone(tmp_path: Path) -> None:
    stock = bench.STOCK
    before = {p.name: p.read_bytes() for p in (stock / "hosts.yml", stock / "cluster.yml")}
    where = bench.write_inventory(2, tmp_path)
    assert (where / "group_vars" / "all.yml").read_bytes() == \
        (stock / "group_vars" / "all.yml").read_bytes()
    assert {p.name: p.read_bytes() for p in (stock / "hosts.yml", stock / "cluster.yml")} == before


def test_cluster_doc_keeps_the_cpu_group_shape_and_drops_gpus() -> None:
    stock = yaml.safe_load((bench.STOCK / "cluster.yml").read_text())
    doc = bench.cluster_doc(stock, 4)
    memory = stock["nodes"][0]["memory_mb"]
    assert doc["nodes"] == [{"name": "cpu", "cpus": 2, "memory_mb": memory, "count": 4}]
    assert doc["partitions"] == [{"name": "cpu", "nodes": ["cpu1", "cpu2", "cpu3", "cpu4"],
                                  "default": True, "max_time": "1-00:00:00"}]
    assert doc["accounts"] == stock["accounts"] and doc["container_runtime"] == "podman"
    assert stock["nodes"][0]["count"] == 1  # the input is not changed


# -- parsing -------------------------------------------------------------------------


def test_recap_reads_every_host_of_the_last_recap() -> None:
    earlier = "PLAY RECAP ***\nold  : ok=1   changed=9    unreachable=0    failed=0\n"
    counts = bench.recap(earlier + RERUN)
    assert counts == {
        "cpu1": {"ok": 25, "changed": 0, "unreachable": 0, "failed": 0},
        "cpu2": {"ok": 25, "changed": 1, "unreachable": 0, "failed": 0},
        "ctl": {"ok": 33, "changed": 0, "unreachable": 0, "failed": 0},
        "localhost": {"ok": 3, "changed": 0, "unreachable": 0, "failed": 0},
    }
    assert bench.recap("no recap here") == {}


def test_changed_tasks_and_role_times() -> None:
    assert bench.changed_tasks(RERUN) == ["munge : Start munge"]
    assert dict(bench.ROLE_TIME.findall(RERUN)) == {"slurm": "12.34", "munge": "1.50"}


def test_image_and_up_lines() -> None:
    assert bench.image_step("hostlab: building ...\nhostlab: image built in 93.4 s\n") == \
        {"built": True, "reported_s": 93.4}
    assert bench.image_step("hostlab: image cached in 0.2 s") == {"built": False, "reported_s": 0.2}
    assert bench.image_step("") == {}
    up = ("hostlab: started ctl, db, login, cpu1; 4 hosts up in 21.5 s "
          "(containers 6.0 s, then systemd 15.5 s)")
    assert bench.up_step(up) == {"reported_s": 21.5, "containers_s": 6.0, "systemd_s": 15.5}
    assert bench.up_step("hostlab: all 4 hosts were already running (0.4 s)") == {}


def test_memory_per_host_and_compute_mean() -> None:
    rows = [{"host": "ctl", "state": "running", "usage_bytes": 300 * 2**20, "rss_bytes": 100 * 2**20},
            {"host": "cpu1", "state": "running", "usage_bytes": 200 * 2**20, "rss_bytes": 50 * 2**20},
            {"host": "cpu2", "state": "running", "usage_bytes": 100 * 2**20, "rss_bytes": 30 * 2**20},
            {"host": "db", "state": "exited"}]
    mem = bench.memory(rows)
    assert mem["per_host"] == {"ctl": {"usage_mib": 300.0, "rss_mib": 100.0},
                               "cpu1": {"usage_mib": 200.0, "rss_mib": 50.0},
                               "cpu2": {"usage_mib": 100.0, "rss_mib": 30.0}}
    assert (mem["compute_usage_mib_mean"], mem["compute_rss_mib_mean"]) == (150.0, 40.0)
    assert bench.memory([{"host": "cpu1", "state": "running"}])["compute_rss_mib_mean"] is None


# -- figures -------------------------------------------------------------------------


def test_ratios_are_over_the_smallest_host_count_side_by_side() -> None:
    runs = [_run(4, 300.0, 30.0), _run(1, 200.0, 20.0), _run(8, 500.0, 36.0)]
    assert bench.ratios(runs) == [
        {"compute_hosts": 1, "over_compute_hosts": 1, "rerun_ratio": 1.0, "fresh_ratio": 1.0},
        {"compute_hosts": 4, "over_compute_hosts": 1, "rerun_ratio": 1.5, "fresh_ratio": 1.5},
        {"compute_hosts": 8, "over_compute_hosts": 1, "rerun_ratio": 1.8, "fresh_ratio": 2.5},
    ]
    assert bench.ratios([_run(2, 100.0, 10.0), _run(4, 150.0, 12.0)])[1]["over_compute_hosts"] == 2


@pytest.mark.parametrize(("rerun_8", "ratio", "met"), [(30.0, 1.5, True), (30.2, 1.51, False),
                                                         (16.0, 0.8, True)])
def test_target_is_rerun_on_8_at_most_1_5_times_rerun_on_1(rerun_8: float, ratio: float,
                                                            met: bool) -> None:
    assert bench.target([_run(1, 200.0, 20.0), _run(8, 400.0, rerun_8)]) == \
        {"rerun_8_over_1": ratio, "rerun_8_over_1_max": 1.5, "met": met}


def test_target_is_unknown_without_both_ends() -> None:
    assert bench.target([_run(1, 200.0, 20.0), _run(2, 210.0, 21.0)]) == \
        {"rerun_8_over_1": None, "rerun_8_over_1_max": 1.5, "met": None}


def test_host_counts_option() -> None:
    assert bench.host_counts("4,1,2,2") == (1, 2, 4)
    for bad, message in (("0,1", "at least 1"), ("a,b", "expected numbers"), ("", "at least 1")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            bench.host_counts(bad)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    result = {"runs": [_run(1, 200.0, 20.0), _run(2, 210.0, 22.0), _run(8, 400.0, 33.0)]}
    path = bench.plot(result, tmp_path / "docs" / "hostlab-deploy.png")
    assert path.read_bytes().startswith(PNG) and path.stat().st_size > 5000


def test_steps_time_down_up_and_two_deploys_then_read_memory() -> None:
    keys = [key for key, _ in bench.steps()]
    assert keys == ["down_s", "up_s", "fresh_deploy_s", "rerun_s", "status"]
    argv = dict(bench.steps())
    assert argv["fresh_deploy_s"] == argv["rerun_s"] == ["make", "--no-print-directory", "hostlab-deploy"]
    assert argv["status"][-2:] == ["status", "--json"]
    assert bench.env_for(Path("/tmp/inv"))["HOSTLAB_INVENTORY"] == "/tmp/inv"
    assert "HOSTLAB_INVENTORY" not in bench.env_for(None)
