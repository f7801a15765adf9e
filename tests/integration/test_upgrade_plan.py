"""``pyhpc admin upgrade plan`` on the lab (issue 46 item 1): the real probe on Debian 12.

The plan's versions are dpkg-query's; the 22.05 -> 24.11 jump is named unsupported, so the
queue is held and resubmitted, never carried over in silence; the plan changes nothing. The
bad input the lab can really make: a host that does not resolve, a backup disk too small (a
tmpfs). A mixed cluster, one on Debian 13 and an unknown Slurm version need hosts the lab
does not have: the unit tests give the plan those facts (tests/unit/test_upgrade_plan.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from pyhpc import cluster, paths
from pyhpc.admin.upgrade_releases import COMPONENTS, upstream

pytestmark = pytest.mark.integration

LAB = cluster.load(paths.LAB_CLUSTER)
#: The admin plans from the checkout they deploy from (--inventory needs its Ansible).
PLAN = [sys.executable, "-m", "pyhpc", "admin", "upgrade", "plan"]


def plan(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PLAN, *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=paths.ROOT, env={**os.environ, **(env or {})})


def dpkg() -> dict[str, str]:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n",
                          *(p for names in COMPONENTS.values() for p in names)],
                         capture_output=True, text=True, check=False).stdout
    return {w[0]: w[1] for w in (line.split() for line in out.splitlines())
            if len(w) >= 3 and w[2].startswith("ii")}


def snapshot() -> dict[str, object]:
    """What a read-only plan must leave as it was: the backups, the held jobs."""
    assert LAB.backup is not None
    root = Path(LAB.backup.path)
    held = subprocess.run(["squeue", "-h", "-t", "PENDING", "-o", "%i %r"], capture_output=True,
                          text=True, check=True).stdout
    return {"backups": sorted(p.name for p in root.iterdir()) if root.exists() else [],
            "held": sorted(line for line in held.splitlines() if "Held" in line)}


def test_the_plan_reads_debian_12_and_refuses_to_carry_22_05_state_into_24_11() -> None:
    before = snapshot()
    proc = plan("--json")
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    installed = dpkg()
    (host,) = p["hosts"]
    assert host["debian"] == {"now": Path("/etc/debian_version").read_text().strip(),
                              "after": "13"}
    for component, names in COMPONENTS.items():
        now = next((upstream(installed[n]) for n in names if n in installed), None)
        assert host["versions"].get(component, {}).get("now") == now, component
    s = p["slurm"]
    assert (s["now"], s["after"], s["supported"]) == ("22.05", "24.11", False)
    assert s["state"].startswith("not carried over")
    assert "held" in s["pending"] and "resubmitted" in s["pending"]
    assert s["chain"][0] == "22.05" and s["chain"][-1] == "24.11" and len(s["chain"]) == 3
    sizes = {b["what"]: b["bytes"] for b in p["backups"]}
    assert sizes["munge key"] == Path("/etc/munge/munge.key").stat().st_size
    assert sizes["accounting"] > 0 and sizes["directory"] > 0
    assert [ph["phase"] for ph in p["phases"]] == ["backup", "dbd", "controller", "compute",
                                                   "login"]
    assert p["no_job_can_start"]["minutes"] > 0
    assert snapshot() == before
    text = plan()
    assert text.returncode == 0 and "NOT supported" in text.stdout


def test_a_host_that_does_not_resolve_blocks_the_plan_in_one_line(tmp_path: Path) -> None:
    inventory = yaml.safe_load((paths.ROOT / "ansible/inventories/lab/hosts.yml").read_text())
    inventory["all"]["children"]["compute"]["hosts"]["gone1.invalid"] = None
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    before = snapshot()
    proc = plan("--inventory", str(tmp_path / "hosts.yml"))
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.count("\n") == 1
    assert "host gone1.invalid: down or unreachable" in proc.stderr
    assert snapshot() == before


def test_a_backup_disk_too_small_blocks_the_plan_in_one_line(tmp_path: Path) -> None:
    # Not under /tmp: a backup path there is refused before the plan looks at its disk.
    small = Path(tempfile.mkdtemp(prefix="pyhpc-upgrade-plan-", dir="/var/backups"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(small)],
                   check=True)
    try:
        definition = yaml.safe_load(paths.LAB_CLUSTER.read_text())
        definition["backup"] = {**definition.get("backup", {}), "path": str(small / "b")}
        (tmp_path / "cluster.yml").write_text(yaml.safe_dump(definition))
        proc = plan(env={"PYHPC_CLUSTER": str(tmp_path / "cluster.yml")})
        assert proc.returncode == 2, proc.stdout
        assert proc.stderr.count("\n") == 1
        assert f"backup.path: {small / 'b'} on host localhost has " in proc.stderr
        assert "bytes free; the upgrade's backups need" in proc.stderr
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)
        small.rmdir()
