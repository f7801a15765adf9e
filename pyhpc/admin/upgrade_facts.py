"""What each host runs now, read without changing anything: its Debian release, the
packages' versions (``dpkg-query``), and the sizes of what the upgrade backs up.

Hosts and their roles come from the Ansible inventory the cluster was deployed from (read
with ``ansible-inventory``, so its host ranges and groups mean what they mean to the
deploy). A host with ``ansible_connection: local`` (the lab) is read here; any other over
ssh as the deploy reaches it (``ansible_user``, ``ansible_ssh_common_args``), with
BatchMode, so a host that would ask for a password counts as unreachable.
"""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyhpc.admin import backup
from pyhpc.admin.upgrade_releases import PACKAGES, UpgradeError

#: Roles in SchedMD's upgrade order; an empty dbd, directory or monitor group means the
#: controller holds that role (as the deploy reads them).
ROLES = ("dbd", "directory", "monitor", "controller", "compute", "login")
ON_CONTROLLER = ("dbd", "directory", "monitor")
SSH_TIMEOUT_S = 15
PROBE_TIMEOUT_S = 120

#: The files the probe reads, where pyhpc's backup takes them from (one home: backup.py).
PATHS = {"SLURM_CONF": "/etc/slurm/slurm.conf", "SLURMDBD_CONF": str(backup.SLURMDBD_CONF),
         "SLAPD_CONFIG": str(backup.SLAPD_CONFIG), "MUNGE_KEY": str(backup.FILES[0]),
         "SECRETS": str(backup.FILES[1])}

#: Read-only. Prints ``key=value`` lines; sizes in bytes (``du -sb``); ``-`` where a thing
#: is not on this host. The accounting size is MariaDB's own count of its tables' bytes.
PROBE = r"""
set -u
. /etc/os-release
echo "codename=${VERSION_CODENAME:-}"
echo "debian_version=$(cat /etc/debian_version 2>/dev/null)"
dpkg-query -W -f 'package=${Package} ${Version} ${db:Status-Abbrev}\n' $PACKAGES 2>/dev/null
size() { if [ -e "$1" ]; then du -sb "$1" | cut -f1; else echo -; fi; }
conf() { [ -r "$1" ] && awk -F= -v k="$2" 'tolower($1)==tolower(k) {print $2; exit}' "$1"; }
state=$(conf "$SLURM_CONF" StateSaveLocation || true)
if [ -n "$state" ] && [ -x /usr/sbin/slurmctld ]; then
  echo "state_dir=$state"; echo "size_state=$(size "$state")"
fi
echo "size_munge_key=$(size "$MUNGE_KEY")"
echo "size_secrets=$(size "$SECRETS")"
db=$(conf "$SLURMDBD_CONF" StorageLoc || true)
if [ -n "$db" ] && command -v mysql >/dev/null; then
  tables="SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables"
  echo "size_accounting=$(mysql -N -B -e "$tables WHERE table_schema = '$db'")"
  jobs="SELECT COUNT(*) FROM \`${CLUSTER}_job_table\`"
  echo "job_records=$(mysql -N -B -e "$jobs" "$db" 2>/dev/null || echo -)"
fi
if [ -n "$BASE_DN" ] && [ -d "$SLAPD_CONFIG" ] && command -v slapcat >/dev/null; then
  ldif=$(slapcat -F "$SLAPD_CONFIG" -b "$BASE_DN" -o ldif-wrap=no 2>/dev/null | wc -c)
  echo "size_directory=$ldif"
fi
if [ -n "$BACKUP" ]; then
  p=$BACKUP; while [ ! -e "$p" ]; do p=$(dirname "$p"); done
  echo "backup_free=$(df -B1 --output=avail "$p" | tail -1 | tr -d ' ')"
fi
if [ -x /usr/sbin/slurmctld ] && command -v squeue >/dev/null; then
  echo "jobs_pending=$(squeue -h -t PENDING -o %i 2>/dev/null | wc -l)"
  echo "jobs_running=$(squeue -h -t RUNNING,COMPLETING -o %i 2>/dev/null | wc -l)"
fi
"""


@dataclass(frozen=True)
class Host:
    """One inventory host: how to reach it and what it runs."""

    name: str
    roles: tuple[str, ...]
    local: bool = False
    user: str = "root"
    ssh_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Facts:
    host: Host
    codename: str
    debian_version: str
    packages: dict[str, str]  # installed package -> its Debian version
    values: dict[str, str] = field(default_factory=dict)

    def size(self, key: str) -> int | None:
        value = self.values.get(f"size_{key}", "-")
        return int(value) if value.isdigit() else None

    def number(self, key: str) -> int | None:
        value = self.values.get(key, "-")
        return int(value) if value.isdigit() else None


def hosts(inventory: Path) -> list[Host]:
    """The inventory's hosts with their roles (``ansible-inventory --list``)."""
    beside = Path(sys.executable).parent / "ansible-inventory"  # the venv's own Ansible
    tool = str(beside) if beside.exists() else shutil.which("ansible-inventory")
    if tool is None:
        raise UpgradeError("--inventory: ansible-inventory is not installed here (plan from "
                           "where you deploy: make venv installs Ansible)")
    proc = subprocess.run([tool, "-i", str(inventory), "--list"], capture_output=True,
                          text=True, check=False, timeout=120)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise UpgradeError(f"--inventory: ansible-inventory cannot read {inventory}: {last}")
    return from_listing(json.loads(proc.stdout))


def from_listing(data: dict[str, Any]) -> list[Host]:
    """Hosts from ``ansible-inventory --list``'s JSON; the controller takes the empty roles."""
    group = {role: list(data.get(role, {}).get("hosts", [])) for role in ROLES}
    if not group["controller"]:
        raise UpgradeError("--inventory: its controller group is empty (the deploy's "
                           "inventory names the controller)")
    for role in ON_CONTROLLER:
        group[role] = group[role] or group["controller"][:1]
    hostvars = data.get("_meta", {}).get("hostvars", {})
    names = sorted({h for members in group.values() for h in members},
                   key=lambda h: (min(ROLES.index(r) for r in ROLES if h in group[r]), h))
    found = []
    for name in names:
        hv = hostvars.get(name, {})
        found.append(Host(name, tuple(r for r in ROLES if name in group[r]),
                          local=hv.get("ansible_connection") == "local",
                          user=str(hv.get("ansible_user", "root")),
                          ssh_args=tuple(shlex.split(str(hv.get("ansible_ssh_common_args",
                                                                ""))))))
    return found


def shell_argv(host: Host) -> list[str]:
    """A root shell on ``host`` that reads its script on stdin (ssh as the deploy reaches
    it, or here for a local host)."""
    shell = ["bash", "-s"] if host.user == "root" else ["sudo", "-n", "bash", "-s"]
    if host.local:
        return shell
    return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_S}",
            *host.ssh_args, f"{host.user}@{host.name}", shlex.join(shell)]


def parse(host: Host, text: str) -> Facts:
    values: dict[str, str] = {}
    packages: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "package":
            words = value.split()
            if len(words) >= 3 and words[2].startswith("ii"):
                packages[words[0]] = words[1]
        elif key:
            values[key] = value.strip()
    return Facts(host, values.pop("codename", ""), values.pop("debian_version", ""),
                 packages, values)


def probe(host: Host, cluster: str, base_dn: str, backup: str) -> Facts:
    """Run :data:`PROBE` on ``host``; :class:`UpgradeError` where it cannot be reached."""
    given = {"PACKAGES": " ".join(PACKAGES), "CLUSTER": cluster, "BASE_DN": base_dn,
             "BACKUP": backup, **PATHS}
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in given.items()) + "\n"
    try:
        proc = subprocess.run(shell_argv(host), input=env + PROBE, capture_output=True,
                              text=True, check=False, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UpgradeError(f"host {host.name}: down or unreachable (no answer in "
                           f"{PROBE_TIMEOUT_S} s)") from None
    if proc.returncode != 0 or "codename=" not in proc.stdout:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise UpgradeError(f"host {host.name}: down or unreachable ({last})")
    return parse(host, proc.stdout)


def gather(found: list[Host], cluster: str, base_dn: str, backup: str) -> list[Facts]:
    """Every host's facts, read in parallel; the first host that fails names itself."""
    with ThreadPoolExecutor(max_workers=min(16, len(found) or 1)) as pool:
        futures = [pool.submit(probe, h, cluster, base_dn, backup) for h in found]
        return [f.result() for f in futures]
