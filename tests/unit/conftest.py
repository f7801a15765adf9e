"""Unit-test fixtures: fake Slurm tools on PATH (for submitit) plus pyhpc.slurm's fake runner."""
from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from pyhpc import paths
from pyhpc.admin import directory

SLURM_TOOLS = ("sbatch", "srun", "squeue", "sacct", "scancel", "scontrol", "salloc")
FAKE_TOOL = """#!/bin/bash
echo "$(basename "$0") $*" >> "{log}"
[ "$(basename "$0")" = sbatch ] && echo "Submitted batch job 4243"
exit 0
"""


class Recorder:
    """pyhpc.slurm's commands (the fake RUNNER) and Slurm's tools on PATH (for submitit)."""

    def __init__(self, fake, log: Path) -> None:
        self.fake = fake
        self.log = log

    @property
    def calls(self) -> list[list[str]]:
        return self.fake.calls

    @property
    def tool_calls(self) -> list[str]:
        """Commands that reached a (fake) Slurm executable, e.g. through submitit's Popen."""
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def slurm(monkeypatch, tmp_path: Path, fake_slurm) -> Recorder:
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    rec = Recorder(fake_slurm, tmp_path / "slurm-calls.log")
    for tool in SLURM_TOOLS:
        (bin_dir / tool).write_text(FAKE_TOOL.format(log=rec.log))
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("PYHPC_CLUSTER", str(paths.LAB_CLUSTER))
    monkeypatch.chdir(tmp_path)
    return rec




class FakeLdap:
    """An in-memory directory behind ldapsearch/ldapadd/ldapmodify/ldapdelete."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, list[str]]] = {}
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], stdin: str | None, timeout_s: float,
                 ) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        tool = argv[0]
        if tool == "ldapsearch":
            base = argv[argv.index("-b") + 1]
            wanted = next(a for a in argv if a.startswith("(objectClass="))[13:-1]
            found = [(dn, e) for dn, e in self.entries.items()
                     if dn.endswith("," + base) and wanted in e.get("objectClass", [])]
            if not found and not any(dn == base or dn.endswith("," + base) for dn in self.entries):
                return subprocess.CompletedProcess(argv, 32, "", "No such object")
            text = "".join(f"dn: {dn}\n" + "".join(f"{k}: {v}\n" for k, vs in e.items()
                                                   for v in vs) + "\n" for dn, e in found)
            return subprocess.CompletedProcess(argv, 0, text, "")
        if tool == "ldapadd":
            for block in (stdin or "").strip().split("\n\n"):
                attrs: dict[str, list[str]] = {}
                for line in block.splitlines():
                    key, _, value = line.partition(": ")
                    attrs.setdefault(key, []).append(value)
                self.entries[attrs.pop("dn")[0]] = attrs
        elif tool == "ldapmodify":
            dn = (stdin or "").splitlines()[0][4:]
            self.entries[dn]["memberUid"] = [line[11:] for line in (stdin or "").splitlines()
                                             if line.startswith("memberUid: ")]
        elif tool == "ldapdelete":
            for dn in (stdin or "").split("\n"):
                self.entries.pop(dn, None)
        return subprocess.CompletedProcess(argv, 0, "", "")


@pytest.fixture
def fake_ldap(monkeypatch) -> FakeLdap:
    fake = FakeLdap()
    fake.entries["dc=lab,dc=pyhpc"] = {"objectClass": ["dcObject"]}
    monkeypatch.setattr(directory, "RUNNER", fake)
    monkeypatch.setattr(directory, "LDAPI", paths.ROOT / "no-such-socket")
    return fake
