"""pyhpc.pins: the deploy's cheap "nothing to install" check, against real dist-info
directories (what pip leaves in site-packages) in a temporary path."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pyhpc import paths, pins


def dist(site: Path, name: str, version: str, *requires: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    dist(site, "jupyterhub", "5.4.2", "tornado>=5.1", "pamela; sys_platform != 'win32'",
         "pywin32; sys_platform == 'win32'", "pytest; extra == 'test'")
    dist(site, "tornado", "6.5.1")
    dist(site, "pamela", "1.2.0")
    dist(site, "torch", "2.13.0+cpu", "filelock")
    dist(site, "filelock", "3.20.0")
    return site


def check(site: Path, tmp_path: Path, *lines: str, base: str = "") -> str | None:
    (tmp_path / "base.txt").write_text(base)
    req = tmp_path / "req.txt"
    req.write_text("\n".join(lines) + "\n")
    return pins.missing([req], [str(site)])


def test_pins_installed_with_their_requirements_need_nothing(site: Path, tmp_path: Path) -> None:
    # A comment, a -r include, a constraint file and a pip option are read as pip does.
    assert check(site, tmp_path, "# the hub", "-r base.txt", "-c other.txt", "--no-binary :all:",
                 "jupyterhub==5.4.2  # pinned", base="tornado==6.5.1\n") is None


def test_a_pin_without_a_local_label_matches_the_cpu_wheel(site: Path, tmp_path: Path) -> None:
    assert check(site, tmp_path, "torch==2.13.0") is None
    assert check(site, tmp_path, "torch==2.13.0+cu130") == "torch==2.13.0+cu130 (installed: 2.13.0+cpu)"


@pytest.mark.parametrize("line, gap", [
    ("jupyterhub==5.4.1", "jupyterhub==5.4.1 (installed: 5.4.2)"),
    ("batchspawner==1.3.0", "batchspawner==1.3.0 (installed: none)"),
    ("Tornado==6.5.1", None),  # names compare as pip's canonical names
])
def test_a_pin_at_another_version_or_absent_is_missing(site: Path, tmp_path: Path, line: str,
                                                       gap: str | None) -> None:
    assert check(site, tmp_path, line) == gap


def test_a_requirement_of_a_pinned_distribution_removed_by_hand_is_missing(
        site: Path, tmp_path: Path) -> None:
    for info in site.glob("filelock-*.dist-info"):
        (info / "METADATA").unlink()
        info.rmdir()
    assert check(site, tmp_path, "torch==2.13.0") == "filelock (required by torch)"
    # Only what the files pin, and what that requires, is looked at.
    assert check(site, tmp_path, "jupyterhub==5.4.2") is None


def test_a_line_that_is_not_a_pin_says_no(site: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a pin: jupyterhub>=5"):
        check(site, tmp_path, "jupyterhub>=5")


def test_the_command_names_the_gap_and_exits_1(tmp_path: Path) -> None:
    req = tmp_path / "req.txt"
    req.write_text("no-such-distribution-here==1.0\n")
    proc = subprocess.run([sys.executable, "-I", "-m", "pyhpc.pins", str(req)], cwd=paths.ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (
        1, "pins: missing no-such-distribution-here==1.0 (installed: none)\n")
    runtime = paths.ROOT / "requirements" / "runtime.txt"
    proc = subprocess.run([sys.executable, "-I", "-m", "pyhpc.pins", str(runtime)],
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, ""), "make venv installs runtime.txt's pins"
