"""The nvidia role: preflight stops on a host without an NVIDIA GPU; the install path runs in --check.

Each test applies the role to this machine (connection local), so no cluster is needed.
Preflight reads ``nvidia_pci_devices_path``: the real sysfs (this machine has no NVIDIA GPU)
or a fake tree built here, laid out like sysfs (links into a devices directory). Nothing is
installed: the runs that pass preflight use ``--check``.
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

REAL_PCI = Path("/sys/bus/pci/devices")
NO_GPU = "has no NVIDIA GPU (no PCI device of vendor 0x10de with a display or 3D class in"
# What the role would write: none of it may exist after a run that stops or checks.
WRITES = [Path("/etc/apt/sources.list.d/pyhpc-nvidia-debian.sources"),
          Path("/etc/apt/sources.list.d/pyhpc-nvidia.list"), Path("/var/cache/pyhpc/nvidia")]
PLAYBOOK = """\
- name: Apply the nvidia role
  hosts: localhost
  gather_facts: true
  roles:
    - nvidia
"""
# PCI functions as sysfs shows them: (address, vendor, class).
GPU = ("0000:65:00.0", "0x10de", "0x030200")           # an NVIDIA 3D controller (H100)
GPU_AUDIO = ("0000:65:00.1", "0x10de", "0x040300")     # its HDMI audio function
INTEL_VGA = ("0000:00:02.0", "0x8086", "0x030000")
HOST_BRIDGE = ("0000:00:00.0", "0x8086", "0x060000")


def has_nvidia_gpu(pci: Path) -> bool:
    return any((dev / "vendor").read_text().strip() == "0x10de"
               and (dev / "class").read_text().startswith("0x03")
               for dev in pci.glob("*") if (dev / "vendor").exists())


def fake_pci(root: Path, *devices: tuple[str, str, str]) -> Path:
    """A sysfs-like tree: bus/pci/devices/<address> links to devices/pci0000:00/<address>."""
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for address, vendor, cls in devices:
        dev = root / "devices" / "pci0000:00" / address
        dev.mkdir(parents=True)
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "class").write_text(cls + "\n")
        (bus / address).symlink_to(Path("../../../devices/pci0000:00") / address)
    return bus


def play(tmp_path: Path, *args: str, playbook: Path | None = None,
         inventory: Path | None = None) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run a playbook on this machine; return the process and ansible.posix.json's report."""
    if playbook is None:
        playbook = tmp_path / "play.yml"
        playbook.write_text(PLAYBOOK)
    if inventory is None:
        inventory = tmp_path / "hosts"
        inventory.write_text("localhost ansible_connection=local"
                             " ansible_python_interpreter=/usr/bin/python3\n")
    return run_playbook(inventory, playbook, *args)


@pytest.fixture(autouse=True)
def nothing_written_before() -> None:
    skip_if_present(WRITES)


def test_host_without_nvidia_gpu_stops_with_one_message_and_installs_nothing(tmp_path: Path) -> None:
    if has_nvidia_gpu(REAL_PCI):
        pytest.skip("this machine has an NVIDIA GPU")
    proc, report = play(tmp_path)
    assert proc.returncode != 0
    stats = report["stats"]["localhost"]
    assert (stats["failures"], stats["changed"]) == (1, 0), stats
    failed = [(name, r["msg"]) for name, r in results(report).items() if r.get("failed")]
    assert failed == [("Stop on a host without an NVIDIA GPU",
                       f"nvidia: localhost {NO_GPU} /sys/bus/pci/devices); nothing was installed. "
                       "Run this role only on nodes with gpu_detect: nvml.")]
    assert subprocess.run(["dpkg", "-s", "nvidia-driver"], capture_output=True).returncode != 0
    assert not any(p.exists() for p in WRITES)


def test_nvidia_function_that_is_not_a_display_controller_is_no_gpu(tmp_path: Path) -> None:
    pci = fake_pci(tmp_path / "sys", HOST_BRIDGE, INTEL_VGA, GPU_AUDIO)
    proc, report = play(tmp_path, "--check", *extra(nvidia_pci_devices_path=str(pci)))
    assert proc.returncode != 0
    assert report["stats"]["localhost"]["changed"] == 0
    assert NO_GPU in results(report)["Stop on a host without an NVIDIA GPU"]["msg"]


def test_check_mode_debian_source_would_enable_non_free_and_install_the_driver(tmp_path: Path) -> None:
    pci = fake_pci(tmp_path / "sys", HOST_BRIDGE, GPU, GPU_AUDIO)
    proc, report = play(tmp_path, "--check", *extra(nvidia_pci_devices_path=str(pci), nvidia_source="debian"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert report["stats"]["localhost"]["failures"] == 0
    tasks = results(report)
    assert tasks["Stop on a host without an NVIDIA GPU"].get("skipped")
    assert tasks["Enable Debian's contrib, non-free and non-free-firmware components"]["changed"]
    would = tasks["Report what a real run would do next (check mode)"]
    assert would["changed"]
    kernel = os.uname().release
    for package in ("nvidia-driver", "firmware-misc-nonfree", "nvidia-smi", "nvidia-persistenced",
                    "nvidia-cuda-toolkit", f"linux-headers-{kernel}"):
        assert package in would["msg"]
    assert "starts nvidia-persistenced" in would["msg"]
    assert not any(p.exists() for p in WRITES)


def test_check_mode_debs_source_would_copy_and_install_the_debs(tmp_path: Path) -> None:
    pci = fake_pci(tmp_path / "sys", GPU)
    debs = tmp_path / "debs"
    debs.mkdir()
    names = ["nvidia-driver_535.216.01-1~deb12u1_amd64.deb", "nvidia-smi_535.216.01-1~deb12u1_amd64.deb"]
    for name in names:
        (debs / name).write_bytes(b"!<arch>\n")
    # This machine's kernel has no Debian headers package: leave them out of the check.
    proc, report = play(tmp_path, "--check", *extra(
        nvidia_pci_devices_path=str(pci), nvidia_source="debs", nvidia_deb_dir=str(debs),
        nvidia_kernel_packages=[]))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert report["stats"]["localhost"]["failures"] == 0
    tasks = results(report)
    copied = tasks["Copy the .deb files to the host"]
    assert sorted(Path(r["item"]).name for r in copied["results"] if r["changed"]) == names
    assert tasks["Install the .deb files in one apt transaction"].get("skipped")  # never runs in --check
    would = tasks["Report what a real run would do next (check mode)"]["msg"]
    assert "nvidia-driver_535.216.01-1~deb12u1, nvidia-smi_535.216.01-1~deb12u1" in would
    assert not any(p.exists() for p in WRITES)


def test_repo_source_without_signed_by_is_refused_before_any_change(tmp_path: Path) -> None:
    pci = fake_pci(tmp_path / "sys", GPU)
    proc, report = play(tmp_path, "--check", *extra(
        nvidia_pci_devices_path=str(pci), nvidia_source="repo",
        nvidia_apt_repo="deb http://mirror.example.org/cuda/debian12/x86_64 /"))
    assert proc.returncode != 0
    assert report["stats"]["localhost"]["changed"] == 0
    msg = results(report)["Check the apt line of the repo source"]["msg"]
    assert msg.startswith("nvidia_apt_repo: nvidia_source repo needs one apt line with an absolute keyring")


@pytest.mark.parametrize("gpu_detect", ["files", "nvml"])
def test_site_runs_the_role_only_on_nodes_with_gpu_detect_nvml(tmp_path: Path, gpu_detect: str) -> None:
    """site.yml (every other play switched off, --check) on a one-node definition of this machine."""
    definition = {
        "name": "gpuhost", "mode": "hosts", "accounting": False, "container_runtime": "podman",
        "nodes": [{"name": "localhost", "cpus": 1, "memory_mb": 1024, "gpus": 1, "gpu_type": "h100",
                   "gpu_detect": gpu_detect}],
        "partitions": [{"name": "gpu", "nodes": ["localhost"], "default": True}],
        # mode hosts names its cluster network (monitoring is off here all the same).
        "monitoring": {"listen": "10.0.0.0/16"},
    }
    (tmp_path / "cluster.yml").write_text(yaml.safe_dump(definition))
    inventory = tmp_path / "hosts.yml"
    local = {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}}
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"pyhpc_cluster_file": str(tmp_path / "cluster.yml")},
        "hosts": local,
        "children": {"controller": {"hosts": {"localhost": None}}, "login": {"hosts": {"localhost": None}},
                     "compute": {"hosts": {"localhost": None}}}}}))
    pci = fake_pci(tmp_path / "sys", GPU)
    proc, report = play(tmp_path, "--check", *extra(
        **other_plays_off("nvidia"), nvidia_pci_devices_path=str(pci)),
        playbook=ANSIBLE / "site.yml", inventory=inventory)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    tasks = results(report)
    if gpu_detect == "files":
        assert tasks["Deploy the NVIDIA driver"].get("skipped")
        assert "Find NVIDIA devices on the PCI bus" not in tasks
    else:
        assert tasks["Find NVIDIA devices on the PCI bus"]["files"]
        assert tasks["Report what a real run would do next (check mode)"]["changed"]
    assert not any(p.exists() for p in WRITES)


@pytest.mark.parametrize("purge", [False, True])
def test_absent_on_a_host_without_gpu_stops_the_daemons_and_skips_preflight(tmp_path: Path,
                                                                            purge: bool) -> None:
    """absent needs no GPU (it runs where a driver is being removed); it removes only what
    the chosen source installed, and only with nvidia_purge."""
    debs = tmp_path / "debs"
    debs.mkdir()
    (debs / "nvidia-driver_550.54.15-1_amd64.deb").write_bytes(b"")
    proc, report = play(tmp_path, "--check", *extra(
        nvidia_state="absent", nvidia_purge=purge, nvidia_source="debs", nvidia_deb_dir=str(debs),
        nvidia_dcgm_debs=[str(debs / "datacenter-gpu-manager_3.3.5_amd64.deb")],
        nvidia_pci_devices_path=str(fake_pci(tmp_path / "sys"))))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    tasks = results(report)
    stop = tasks["Stop DCGM and the persistence daemon"]["results"]
    assert [r["item"] for r in stop] == ["nvidia-dcgm", "nvidia-persistenced"]
    assert "Stop on a host without an NVIDIA GPU" not in tasks
    purged = tasks["Purge the driver, CUDA and DCGM packages"]
    if purge:
        assert purged["invocation"]["module_args"]["name"] == ["nvidia-driver", "datacenter-gpu-manager"]
        removed = tasks["Remove the apt sources, the keyring and the .deb caches the role added"]
        assert [r["item"] for r in removed["results"]] == [
            "/etc/apt/sources.list.d/pyhpc-nvidia-debian.sources",
            "/etc/apt/sources.list.d/pyhpc-nvidia.list", "/var/cache/pyhpc/nvidia"]
    else:
        assert purged.get("skipped")
    assert report["stats"]["localhost"]["changed"] == 0
    assert not any(p.exists() for p in WRITES)
