"""Researchers as real users: directory accounts, isolation, workshops (issue 8).

Runs on the lab as root, and as the definition's directory users (user1, user2) and
workshop participants through `su - USER -c ...`, the way a participant logs in.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyhpc import cluster, paths
from pyhpc.admin import directory, directory_sync
from tests.unit.roleplay import ANSIBLE, extra, other_plays_off, results, run_playbook

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

LAB = cluster.load(paths.LAB_CLUSTER)
PYHPC = str(paths.SHARED_VENV / "bin" / "pyhpc")
WORKSHOP = "citest"


def sh(*argv: str, check: bool = True, timeout: int = 180) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def as_user(user: str, command: str, check: bool = True,
            timeout: int = 180) -> subprocess.CompletedProcess[str]:
    return sh("su", "-", user, "-c", command, check=check, timeout=timeout)


def lab_directory() -> cluster.Directory:
    assert LAB.directory is not None
    return LAB.directory


def held_job(user: str, options: str = "") -> str:
    return as_user(user, f"sbatch --parsable --hold --time=1 {options} --wrap true").stdout.strip()


def node_state(node: str) -> str:
    return sh("sinfo", "-h", "-N", "-n", node, "-o", "%t").stdout.split()[0]


def test_definition_users_resolve_from_the_directory() -> None:
    d = lab_directory()
    for user in d.users(LAB.accounts):
        fields = sh("getent", "passwd", user).stdout.strip().split(":")
        assert fields[0] == user and d.uid_min <= int(fields[2]) <= d.uid_max
        assert fields[5] == f"/home/{user}"
    assert sh("getent", "group", "lab").stdout.strip().split(":")[3].split(",") == ["user1", "user2"]
    assert "root:x:0:0" in sh("getent", "passwd", "root").stdout  # root stays local


def test_a_users_job_runs_as_that_user_and_its_files_are_theirs() -> None:
    proc = as_user("user1", f"{PYHPC} submit single --set command=id --wait --json")
    result = json.loads(proc.stdout)
    assert result["state"] == "COMPLETED"
    logs = as_user("user1", f"{PYHPC} logs {result['job_id']}").stdout
    uid = int(sh("id", "-u", "user1").stdout)
    assert f"uid={uid}(user1)" in logs
    home = Path("/home/user1")
    assert home.stat().st_uid == uid and home.stat().st_mode & 0o077 == 0
    written = [p for p in home.rglob("*") if result["job_id"] in str(p) and p.is_file()]
    assert written and all(p.stat().st_uid == uid for p in written)


def test_a_user_cannot_read_secrets_cancel_others_jobs_or_change_nodes() -> None:
    for path in ("/etc/pyhpc/secrets/ldap_admin_password", "/etc/munge/munge.key",
                 "/etc/slurm/slurmdbd.conf"):
        assert as_user("user1", f"cat {path}", check=False).returncode != 0, path
    job = held_job("user2")
    try:
        refused = as_user("user1", f"scancel {job}", check=False)
        assert refused.returncode != 0 or "denied" in refused.stderr.lower()
        assert sh("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "PENDING"
        before = node_state("cpu1")
        changed = as_user("user1", "scontrol update NodeName=cpu1 State=DRAIN Reason=mine",
                          check=False)
        assert changed.returncode != 0 and node_state("cpu1") == before
        # PrivateData=jobs: user1 sees only their own jobs, and pyhpc status still works.
        assert job not in as_user("user1", "squeue -h -o %i").stdout
        mine = held_job("user1")
        status = as_user("user1", f"{PYHPC} status --json --source squeue {mine}")
        sh("scancel", mine)
        assert json.loads(status.stdout) == {mine: "PENDING"}
    finally:
        sh("scancel", job, check=False)


def test_a_directory_user_with_no_association_gets_one_line_exit_2() -> None:
    d = lab_directory()
    tag, name = "pyhpc: integration test", "noassoc1"
    directory_sync.add_members(d, "noassoc", [name], tag, {name: "x" * 16})
    try:
        proc = as_user(name, f"{PYHPC} submit single --set command=id", check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"pyhpc: error: user {name} has no account on cluster {LAB.name}; an admin adds "
            "it to accounts in cluster.yml"]
    finally:
        directory.delete(d, [directory.user_dn(d, name), directory.group_dn(d, "noassoc")])
        sh("rm", "-rf", f"/home/{name}")


def workshop(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh(PYHPC, "workshop", *args, check=check)


@pytest.fixture(scope="module")
def created(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    workshop("delete", WORKSHOP, "--homes")
    out = tmp_path_factory.mktemp("sheet") / WORKSHOP
    done = json.loads(workshop("create", WORKSHOP, "--participants", "2", "--start", "now",
                               "--hours", "1", "--nodes", "1", "--out", str(out),
                               "--json").stdout)
    yield {**done, "out": out}
    workshop("delete", WORKSHOP, "--homes", check=False)


def test_workshop_create_writes_a_private_sheet(created: dict[str, object]) -> None:
    assert created["users_added"] == [f"{WORKSHOP}-01", f"{WORKSHOP}-02"]
    for path in created["sheet"]:  # type: ignore[attr-defined]  # a list from JSON
        assert os.stat(path).st_mode & 0o777 == 0o600
    listed = json.loads(workshop("list", "--json").stdout)
    assert [(w["name"], w["participants"]) for w in listed] == [(WORKSHOP, 2)]


def test_the_reservation_admits_a_participant_and_refuses_others(created: dict[str, object]) -> None:
    srun = f"srun --reservation={WORKSHOP} --nodes=1 --time=1 id -un"
    assert as_user(f"{WORKSHOP}-01", srun).stdout.strip() == f"{WORKSHOP}-01"
    refused = as_user("user1", srun, check=False)
    assert refused.returncode != 0 and "denied" in refused.stderr.lower(), refused.stderr


def test_a_second_create_changes_nothing(created: dict[str, object]) -> None:
    again = json.loads(workshop("create", WORKSHOP, "--participants", "2", "--start", "now",
                                "--hours", "1", "--nodes", "1", "--out",
                                str(created["out"]) + "-again", "--json").stdout)
    assert again["changed"] is False and "sheet" not in again


def test_workshop_delete_leaves_other_users_untouched(created: dict[str, object]) -> None:
    other = held_job("user2")
    participant = held_job(f"{WORKSHOP}-02", f"--reservation={WORKSHOP}")
    assocs = sh("sacctmgr", "-n", "-P", "show", "assoc", "account=lab", "format=user").stdout
    try:
        done = json.loads(workshop("delete", WORKSHOP, "--homes", "--json").stdout)
        assert participant in done["jobs_cancelled"] and other not in done["jobs_cancelled"]
        assert sh("squeue", "-h", "-j", other, "-o", "%T").stdout.strip() == "PENDING"
        assert sh("sacctmgr", "-n", "-P", "show", "assoc", "account=lab",
                  "format=user").stdout == assocs
        assert sh("getent", "passwd", f"{WORKSHOP}-01", check=False).returncode != 0
        assert not Path(f"/home/{WORKSHOP}-01").exists()
        assert sh("scontrol", "show", "reservation", WORKSHOP, check=False).returncode != 0
        again = json.loads(workshop("delete", WORKSHOP, "--json").stdout)
        assert again["changed"] is False
        assert sh("getent", "passwd", "user2").stdout.startswith("user2:")
    finally:
        sh("scancel", other, participant, check=False)


def test_the_directory_secret_is_private_and_never_logged() -> None:
    path = Path("/etc/pyhpc/secrets/ldap_admin_password")
    info = path.stat()
    assert (info.st_mode & 0o777, info.st_uid) == (0o600, 0)
    secret = path.read_text()
    assert len(secret) >= 16
    for text in (paths.ROOT / ".deploy" / "deploy.log",
                 Path("/var/cache/debconf/passwords.dat"), Path("/var/cache/debconf/config.dat")):
        if text.exists():
            assert secret not in text.read_text(errors="replace"), text
    # Users bind as themselves only: the admin password opens nothing for them.
    assert as_user("user1", "ldapsearch -x -LLL uid=user1 userPassword").stdout.count(
        "userPassword") == 0


def files_state(*roots: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every file and directory under ``roots``: mode, owner, mtime and content hash."""
    state = {}
    for root in roots:
        for path in [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]:
            info = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            state[str(path)] = (info.st_mode, info.st_uid, info.st_mtime_ns, digest)
    return state


def directory_play(cluster_file: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """site.yml on the lab with CLUSTER_FILE and only the directory's play on (and ARGS)."""
    return run_playbook(ANSIBLE / "inventories" / "lab" / "hosts.yml", ANSIBLE / "site.yml",
                        *extra(pyhpc_cluster_file=str(cluster_file), **other_plays_off("directory")),
                        *args, timeout=300)


def test_a_slapd_without_the_definitions_base_dn_stops_the_deploy_with_one_line(
        tmp_path: Path) -> None:
    """The case of a slapd pyhpc did not install (Debian's default database) and of a
    base_dn changed after the first deploy: slapd serves no database for the definition's
    base_dn. The lab's slapd serves dc=lab,dc=pyhpc; a definition that asks for another
    stops the directory play before it changes anything."""
    text = paths.LAB_CLUSTER.read_text()
    assert text.count("\ndirectory: {}\n") == 1
    elsewhere = tmp_path / "cluster.yml"
    elsewhere.write_text(text.replace("\ndirectory: {}\n",
                                      "\ndirectory: {base_dn: 'dc=elsewhere,dc=pyhpc'}\n"))
    watched = (Path("/etc/ldap/slapd.d"), Path("/etc/default/slapd"), Path("/etc/pyhpc/secrets"))
    before, slapd = files_state(*watched), Path("/run/slapd/slapd.pid").read_text()
    proc, report = directory_play(elsewhere)
    assert proc.returncode == 2, proc.stderr
    ran = results(report)
    check = ran["Check that slapd serves the definition's base_dn"]
    assert check["failed"] and check["msg"] == (
        "directory.base_dn: slapd on localhost serves dc=lab,dc=pyhpc, not dc=elsewhere,dc=pyhpc; "
        "pyhpc builds slapd's database only when it installs slapd: set directory.base_dn to one "
        "it serves, or remove that slapd (apt-get purge slapd; make purge removes only a slapd "
        "pyhpc installed) and deploy again")
    assert not any(result.get("changed") for result in ran.values())
    assert "Create the directory for the secrets" not in ran
    assert files_state(*watched) == before
    assert Path("/run/slapd/slapd.pid").read_text() == slapd
    assert sh("ldapsearch", "-x", "-LLL", "-H", "ldapi:///", "-b", lab_directory().base_dn,
              "-s", "base", "dn").stdout.startswith(f"dn: {lab_directory().base_dn}")


SLAPD_RECORD = Path("/etc/ldap/pyhpc-slapd")


def purge_check() -> dict[str, dict[str, Any]]:
    """`make purge`'s directory pass in check mode: what it would stop and remove, nothing done."""
    proc, report = directory_play(paths.LAB_CLUSTER, "--check",
                                  *extra(pyhpc_state="absent", pyhpc_purging=True))
    assert proc.returncode == 0, proc.stdout[-3000:]
    return results(report)


def items(result: dict[str, Any]) -> list[Any]:
    """The items a looped task ran for (not those its condition skipped)."""
    return [r["item"] for r in result["results"] if not r.get("skipped")]


def test_undeploy_and_purge_touch_only_the_slapd_pyhpc_installed(tmp_path: Path) -> None:
    """pyhpc records the slapd it installs (SLAPD_RECORD). This lab's slapd predates the
    record: a deploy without it asks slapd, and finds pyhpc's secret is its admin's password.
    `make undeploy` stops, and `make purge` removes, that slapd with its database; a slapd
    without the record (another's, with the definition's base_dn) they leave alone."""
    watched = (Path("/etc/ldap/slapd.d"), Path("/etc/default/slapd"), Path("/etc/pyhpc/secrets"))
    slapd = Path("/run/slapd/slapd.pid").read_text()
    hidden = tmp_path / "record"
    shutil.move(SLAPD_RECORD, hidden)
    try:
        proc, report = directory_play(paths.LAB_CLUSTER)
        assert proc.returncode == 0, proc.stdout[-3000:]
        ran = results(report)
        assert ran["Ask slapd whether pyhpc built its database, where no record says"]["rc"] == 0
        assert ran["Record that pyhpc installed this host's slapd (undeploy and purge touch no other)"][
            "changed"]
        info = SLAPD_RECORD.lstat()
        assert (info.st_uid, info.st_mode & 0o7777) == (0, 0o644)
        before = files_state(*watched)
        ours = purge_check()
        shutil.move(SLAPD_RECORD, hidden)
        foreign = purge_check()
    finally:
        if not SLAPD_RECORD.exists():
            shutil.move(hidden, SLAPD_RECORD)
    assert files_state(*watched) == before
    assert Path("/run/slapd/slapd.pid").read_text() == slapd
    stop, purge = "Stop nslcd, nscd and the slapd pyhpc installed", "Purge the directory's packages"
    remove = "Remove the secrets, the TLS files and the database and configuration of pyhpc's slapd"
    slapds = ["/var/lib/ldap", "/etc/ldap/slapd.d", "/etc/ldap/pyhpc-tls", str(SLAPD_RECORD)]
    assert items(ours[stop]) == ["nslcd", "slapd"] and ours[stop]["changed"]
    assert "slapd" in ours[purge]["invocation"]["module_args"]["name"]
    assert set(slapds) <= set(items(ours[remove])) and items(ours[remove])[-1] == str(SLAPD_RECORD)
    assert ours["Leave alone a slapd that pyhpc did not install"].get("skipped")
    assert items(foreign[stop]) == ["nslcd"]
    assert "slapd" not in foreign[purge]["invocation"]["module_args"]["name"]
    assert not set(slapds) & set(items(foreign[remove])), items(foreign[remove])
    assert "/etc/pyhpc/secrets/directory-ca.key" in items(foreign[remove])
    assert foreign["Leave alone a slapd that pyhpc did not install"]["msg"] == (
        "slapd on localhost was not installed by pyhpc (no /etc/ldap/pyhpc-slapd): left running, "
        "with its package, database, configuration and TLS files")


@pytest.fixture
def foreign_nscd() -> Iterator[int]:
    """nscd's program in pid and mount namespaces of its own (its socket, pid file and cache
    its own): another host's nscd on this one, as in hostlab's containers or any container."""
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
                             "sh", "-c", "mount -t tmpfs pyhpc-test /run/nscd && "
                             "mount -t tmpfs pyhpc-test /var/cache/nscd && "
                             "exec /usr/sbin/nscd --foreground"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    found: list[str] = []
    try:
        for _ in range(100):
            found = sh("pgrep", "-P", str(proc.pid), "-x", "nscd", check=False).stdout.split()
            if found or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert found, "the foreign nscd did not start"
        yield int(found[0])
    finally:
        # The namespace's first process: the kernel ends the namespace with it.
        for pid in found:
            sh("kill", "-KILL", pid, check=False)
        proc.kill()
        proc.wait(timeout=30)


def test_a_changed_nscd_setting_restarts_this_hosts_nscd_and_leaves_others_running(
        foreign_nscd: int) -> None:
    """Debian's nscd script stops every process of nscd's program, in any pid namespace,
    after waiting 30 s for them; the role restarts this host's nscd by its pid file only."""
    conf = Path("/etc/nscd.conf")
    text = conf.read_text()
    drifted = re.sub(r"(?m)^(\tpositive-time-to-live\tpasswd\t+)\d+$", r"\g<1>3600", text)
    assert drifted != text
    conf.write_text(drifted)
    ours = Path("/run/nscd/nscd.pid").read_text().strip()
    proc, report = directory_play(paths.LAB_CLUSTER)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert results(report)["Restart nscd"]["changed"]
    assert conf.read_text() == text
    restarted = Path("/run/nscd/nscd.pid").read_text().strip()
    assert restarted != ours and os.readlink(f"/proc/{restarted}/exe") == "/usr/sbin/nscd"
    assert os.readlink(f"/proc/{foreign_nscd}/exe") == "/usr/sbin/nscd"  # still running
    assert sh("getent", "passwd", "user1").stdout.startswith("user1:")
