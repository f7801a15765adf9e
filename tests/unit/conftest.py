"""Unit-test fixtures: fake Slurm tools on PATH (for submitit) plus pyhpc.slurm's fake runner."""
from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from pyhpc import paths
from pyhpc.admin import directory, directory_sync, homes
from pyhpc.hub import api as hub_api

SLURM_TOOLS = ("sbatch", "srun", "squeue", "sacct", "scancel", "scontrol", "salloc")
#: Slurm's commands, and where Debian installs them.
SLURM_COMMANDS = frozenset((*SLURM_TOOLS, "sinfo", "sacctmgr", "sdiag", "sprio", "sshare",
                            "sreport", "strigger", "sstat", "sattach", "scrontab"))
SLURM_BIN_DIRS = (Path("/usr/bin"), Path("/usr/sbin"))
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
    """An in-memory directory behind ldapsearch/ldapadd/ldapmodify/ldapdelete: subtree and
    base searches, adds that refuse an existing DN (68), modifies whose delete of a value
    that is not there fails (16), as slapd's do."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, list[str]]] = {}
        self.calls: list[list[str]] = []

    def _search(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        base = argv[argv.index("-b") + 1]
        scope = argv[argv.index("-s") + 1] if "-s" in argv else "sub"
        wanted = next(a for a in argv if a.startswith("(objectClass="))[13:-1]
        if base not in self.entries:
            return subprocess.CompletedProcess(argv, 32, "", "No such object")
        found = [(dn, e) for dn, e in self.entries.items()
                 if (dn == base if scope == "base" else dn.endswith("," + base))
                 and wanted in e.get("objectClass", [])]
        text = "".join(f"dn: {dn}\n" + "".join(f"{k}: {v}\n" for k, vs in e.items()
                                               for v in vs) + "\n" for dn, e in found)
        return subprocess.CompletedProcess(argv, 0, text, "")

    def _modify(self, argv: list[str], ldif: str) -> subprocess.CompletedProcess[str]:
        dn = ldif.splitlines()[0][4:]
        entry = self.entries[dn]
        changed = {k: list(v) for k, v in entry.items()}
        for op in ldif.split("\n-\n"):
            lines = [line for line in op.splitlines()
                     if line and not line.startswith(("dn: ", "changetype: "))]
            if not lines:
                continue
            verb, _, attr = lines[0].partition(": ")
            values = [line.split(": ", 1)[1] for line in lines[1:]]
            if verb == "replace":
                changed[attr] = values
            elif verb == "add":
                changed.setdefault(attr, []).extend(values)
            elif verb == "delete":
                if any(v not in changed.get(attr, []) for v in values):
                    return subprocess.CompletedProcess(argv, 16, "", "No such attribute")
                changed[attr] = [v for v in changed.get(attr, []) if values and v not in values]
        self.entries[dn] = changed
        return subprocess.CompletedProcess(argv, 0, "", "")

    def __call__(self, argv: Sequence[str], stdin: str | None, timeout_s: float,
                 ) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        tool = argv[0]
        if tool == "ldapsearch":
            return self._search(argv)
        if tool == "ldapadd":
            for block in (stdin or "").strip().split("\n\n"):
                attrs: dict[str, list[str]] = {}
                for line in block.splitlines():
                    key, _, value = line.partition(": ")
                    attrs.setdefault(key, []).append(value)
                dn = attrs.pop("dn")[0]
                if dn in self.entries:
                    return subprocess.CompletedProcess(argv, 68, "", "Already exists")
                self.entries[dn] = attrs
        elif tool == "ldapmodify":
            return self._modify(argv, stdin or "")
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
    # This machine's own accounts and homes are no part of the tests' directory.
    monkeypatch.setattr(directory_sync, "LOCAL_IDS", {})
    monkeypatch.setattr(directory_sync, "HOMES", paths.ROOT / "no-such-homes")
    return fake


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """No unit test runs this machine's Slurm: the unit suite runs on the machine that holds
    the lab, whose jobs a command could hold, cancel or resubmit (a queue test once left a
    reservation that blocked it). pyhpc.slurm's runner still runs a test's own stand-ins
    (a fake ``scontrol`` on PATH); ``fake_slurm`` replaces the runner altogether."""
    import shutil

    from pyhpc.slurm import slurm
    real = slurm.RUNNER

    def guarded(argv: Sequence[str], stdin: str | None,
                timeout_s: float) -> subprocess.CompletedProcess[str]:
        found = shutil.which(argv[0])
        if (Path(argv[0]).name in SLURM_COMMANDS and found
                and Path(found).resolve().parent in SLURM_BIN_DIRS):
            raise AssertionError(f"a unit test ran this machine's Slurm: {list(argv)}")
        return real(argv, stdin, timeout_s)
    monkeypatch.setattr(slurm, "RUNNER", guarded)


@pytest.fixture(autouse=True)
def free_master_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rendezvous port no one else holds: a test's ranks (and its spawned children, which
    inherit it) never meet another test run's on torch.distributed's default 29500."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(sock.getsockname()[1]))


class FakeHub:
    """The hub's REST API as pyhpc.hub.api reaches it: GET .../hub/api answers JupyterHub's
    version; DELETE .../users/NAME forgets a user it knows (204) or answers 404."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None, object]] = []
        self.users: set[str] = set()
        self.up = True

    def __call__(self, request, timeout_s, ca_file) -> tuple[int, bytes]:
        self.calls.append((request.get_method(), request.full_url,
                           request.get_header("Authorization"), ca_file))
        if not self.up:
            raise OSError("Connection refused")
        if request.get_method() == "GET" and request.full_url.endswith("/refresh.js"):
            return 200, f'headers.get("{hub_api.MY_JOBS_PART}")'.encode()
        if request.get_method() == "GET":
            return 200, b'{"version": "5.5.4"}'
        name = request.full_url.rsplit("/", 1)[1]
        if name in self.users:
            self.users.discard(name)
            return 204, b""
        return 404, b""


@pytest.fixture(autouse=True)
def fake_hub(monkeypatch, tmp_path_factory: pytest.TempPathFactory) -> FakeHub:
    """No unit test reaches a real hub or makes homes in /home: the hub is a FakeHub with
    its workshop token in a directory of its own (not the test's tmp_path), homes go there
    too and are handed over to nobody (CHOWN records)."""
    fake = FakeHub()
    base = tmp_path_factory.mktemp("fake-hub")
    monkeypatch.setattr(hub_api, "OPEN", fake)
    token = base / "hub-workshop-token"
    token.write_text("test-token\n")
    monkeypatch.setattr(hub_api, "WORKSHOP_TOKEN", token)
    (base / "homes").mkdir()
    monkeypatch.setattr(homes, "ROOT", base / "homes")
    fake.chowned = []  # type: ignore[attr-defined]
    monkeypatch.setattr(homes, "CHOWN", lambda path, uid, gid: fake.chowned.append(  # type: ignore[attr-defined]
        (str(path), uid, gid)))
    return fake
