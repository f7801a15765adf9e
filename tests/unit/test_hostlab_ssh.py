"""How Ansible reaches hostlab's hosts: over SSH, with the config and known_hosts `up` writes.

The files are read back by the real OpenSSH client (`ssh -G` resolves a config without
connecting; `ssh-keygen -F` looks a host up in a known_hosts file)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from by_path import load

hostlab = load("hostlab_cli", "hostlab/hostlab.py")

pytestmark = pytest.mark.skipif(
    shutil.which("ssh") is None,
    reason="OpenSSH's client (ssh, ssh-keygen) is not installed: `make test-debs` installs it")

CTL_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0bLmJ1k0mXrRKo0d8Wf0n3Wq1ZlQ4t3Xb7m9hX2q1c root@ctl"
DB_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC9qk1yS6m0a3f0YbH3p9wQk2Zr3c5J1l7nV8tW0s4eX"
HOSTS = {"ctl": ("10.89.77.152", CTL_KEY), "db": ("10.89.77.106", DB_KEY)}


def resolved(config: Path, host: str) -> dict[str, str]:
    """What ssh would use for host under config, key -> value (first value of each key)."""
    out = subprocess.run(["ssh", "-G", "-F", str(config), host], capture_output=True, text=True,
                         check=True).stdout
    answer: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        answer.setdefault(key, value)
    return answer


def test_the_config_sends_each_host_to_its_address_as_root_with_hostlabs_key_only(tmp_path: Path) -> None:
    config, _ = hostlab.ssh_files(HOSTS)
    (tmp_path / "config").write_text(config)
    for host, (address, _) in HOSTS.items():
        got = resolved(tmp_path / "config", host)
        assert (got["hostname"], got["user"], got["identityfile"]) == (address, "root", str(hostlab.SSH_KEY))
        assert got["identitiesonly"] == "yes"
        assert got["stricthostkeychecking"] == "true"  # an unknown or changed key is refused
        assert got["userknownhostsfile"] == str(hostlab.KNOWN_HOSTS)
        assert got["globalknownhostsfile"] == "/dev/null"
        assert got["passwordauthentication"] == "no"
        assert (got["serveraliveinterval"], got["serveralivecountmax"]) == ("5", "2")
    assert resolved(tmp_path / "config", "gpu9")["hostname"] == "gpu9"  # no host it was not given


def test_known_hosts_holds_each_hosts_own_key_under_its_name_and_address(tmp_path: Path) -> None:
    _, known = hostlab.ssh_files(HOSTS)
    (tmp_path / "known_hosts").write_text(known)
    for host, (address, key) in HOSTS.items():
        for name in (host, address):
            found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(tmp_path / "known_hosts")],
                                   capture_output=True, text=True)
            assert found.returncode == 0, (name, found.stderr)
            assert " ".join(key.split()[:2]) in found.stdout
    assert "root@ctl" not in known  # the key's comment is not the host's to write here
    assert hostlab.ssh_files({})[1] == "\n"  # no host running: none trusted


def test_the_files_are_private_and_a_planted_link_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("theirs\n")
    (tmp_path / "config").symlink_to(target)
    hostlab.write_private(tmp_path / "config", "Host ctl\n")
    assert target.read_text() == "theirs\n"
    assert not (tmp_path / "config").is_symlink()
    assert (tmp_path / "config").read_text() == "Host ctl\n"
    assert (tmp_path / "config").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config", "elsewhere"]


def test_the_inventory_points_ssh_at_the_config_up_writes() -> None:
    vars_ = yaml.safe_load(hostlab.INVENTORY.read_text())["all"]["vars"]
    assert vars_["ansible_connection"] == "ssh"
    assert vars_["ansible_ssh_common_args"].split() == ["-F", str(hostlab.SSH_CONFIG)]
    assert hostlab.SSH_CONFIG.parent == hostlab.SSH_KEY.parent == hostlab.KNOWN_HOSTS.parent
    assert os.path.isabs(hostlab.SSH_CONFIG)


def test_the_image_has_no_host_key_and_each_host_makes_its_own_before_sshd() -> None:
    assert "openssh-server" in hostlab.PACKAGES
    assert 'rm -f "$1"/etc/ssh/ssh_host_*' in hostlab.hooks()
    unit = (hostlab.IMAGE_FILES / "etc/systemd/system/pyhpc-ssh-hostkey.service").read_text()
    assert "Before=ssh.service" in unit and "RequiredBy=ssh.service" in unit
    assert f"ConditionPathExists=!{hostlab.HOST_KEY.removesuffix('.pub')}" in unit
    assert any("pyhpc-ssh-hostkey.service" in hook for hook in hostlab.hooks())
