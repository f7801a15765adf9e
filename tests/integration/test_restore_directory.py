"""The directory's restore on the lab (issue 47 item 2): a backup of the lab's slapd, a
participant added after it, then the lab's slapd made a new host's (its database set
aside, a new one holding what slapd's package and the deploy's ``pyhpc directory sync``
make) and ``pyhpc admin restore --only directory``: the definition's users resolve and log
in, a participant's password binds again, the one added after the backup is lost. Refused
in one line where the directory holds users, and for a corrupt backup, nothing changed.

The lab's directory is left as this module found it, byte for byte, whatever happens: its
database is copied before the first change and put back at the end, slapd started on it.
The backups go to a directory of their own, removed at the end, and the backup metric's
file is put back.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_backup import cli, refusal
from test_directory import LAB, as_user, sh

from pyhpc import paths
from pyhpc.admin import backup, backup_store, directory, directory_sync, restore
from pyhpc.admin import restore_directory as rd

# Not alone: slapd stops, but only the lab's worker logs in to the lab (hostlab's hosts have
# their own directory), and this module is the lab's worker's one test at a time.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

assert LAB.directory is not None and LAB.directory.managed, "the lab runs pyhpc's slapd"
D = LAB.directory
ROOT = Path("/var/backups/pyhpc-it-restore")
GROUP, KEPT, LOST = "pyhpcrst", "pyhpcrst-01", "pyhpcrst-02"
MARK = "pyhpc: integration test restore"
PASSWORD = "restored-horse-battery"
METRICS = backup.TEXTFILE_DIR / backup.METRICS_FILE
#: Beside the database directory: the lost host's database, kept until the end to compare.
LOST_HOST = ".pyhpc-it-lost"


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc: subprocess.CompletedProcess[str] = sh(*argv, check=check)
    return proc


def slapcat() -> str:
    return run(backup.tool("slapcat"), "-F", str(backup.SLAPD_CONFIG), "-b", D.base_dn,
              "-o", "ldif-wrap=no").stdout


def dns(text: str) -> list[str]:
    return [e["dn"][0] for e in directory.parse_ldif(text)]


def answers() -> bool:
    return run("ldapsearch", "-Q", "-Y", "EXTERNAL", "-H", "ldapi:///", "-LLL", "-s", "base",
              "-b", D.base_dn, "1.1", check=False).returncode == 0


def binds(user: str, password: str) -> subprocess.CompletedProcess[str]:
    return run("ldapwhoami", "-x", "-H", "ldapi:///", "-D", directory.user_dn(D, user),
              "-w", password, check=False)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The lab's directory as found (copied aside, slapd stopped for the copy), a definition
    whose backups go to :data:`ROOT`; everything put back afterwards."""
    db = rd.served(D)
    assert db is not None, "the lab's slapd serves base_dn"
    original = db.directory.with_name(db.directory.name + ".pyhpc-it-original")
    assert not os.path.lexists(original) and not ROOT.exists(), \
        f"{original} or {ROOT} is there: an earlier run of this module did not finish"
    found = slapcat()
    logins = {u: run("getent", "passwd", u).stdout for u in D.users(LAB.accounts)}
    metrics = METRICS.read_bytes() if METRICS.exists() else None
    data = yaml.safe_load(paths.LAB_CLUSTER.read_text())
    data["backup"]["path"] = str(ROOT)
    spec = tmp_path_factory.mktemp("restore") / "cluster.yml"
    spec.write_text(yaml.safe_dump(data))
    restore.service("slapd", "stop")
    try:
        run("cp", "-a", str(db.directory), str(original))
    finally:
        restore.service("slapd", "start")
    try:
        yield {"db": db, "found": found, "logins": logins, "env": {"PYHPC_CLUSTER": str(spec)}}
    finally:
        try:
            restore.service("slapd", "stop")
            for left in ("", rd.ASIDE, LOST_HOST):
                shutil.rmtree(db.directory.with_name(db.directory.name + left),
                              ignore_errors=True)
            os.rename(original, db.directory)
        finally:
            restore.service("slapd", "start")
            directory.forget_cached()
            shutil.rmtree(ROOT, ignore_errors=True)
            if metrics is not None:
                METRICS.write_bytes(metrics)
            else:
                METRICS.unlink(missing_ok=True)
        assert slapcat() == found, "the lab's directory is not as this module found it"


@pytest.fixture(scope="module")
def taken(lab: dict[str, Any]) -> dict[str, Any]:
    """A participant with a password, a backup, then a participant added after it."""
    directory_sync.add_members(D, GROUP, [KEPT], MARK, {KEPT: PASSWORD})
    assert binds(KEPT, PASSWORD).returncode == 0
    done: dict[str, Any] = json.loads(cli("admin", "backup", "now", "--json",
                                          env=lab["env"]).stdout)
    directory_sync.add_members(D, GROUP, [KEPT, LOST], MARK, {LOST: PASSWORD})
    assert run("getent", "passwd", LOST, check=False).returncode == 0
    with gzip.open(ROOT / done["name"] / rd.PART, "rt") as fh:
        done["dns"] = dns(fh.read())
    return done


def test_restore_onto_a_directory_that_holds_users_is_refusal(lab: dict[str, Any],
                                                              taken: dict[str, Any]) -> None:
    before = slapcat()
    line = refusal(cli("admin", "restore", "--only", "directory", env=lab["env"], check=False))
    base = D.base_dn
    assert line == (f"pyhpc: error: restore: the directory {base} already holds 3 entries a "
                    f"deploy does not make (cn={GROUP},ou=groups,{base}, uid={KEPT},ou=people,"
                    f"{base}, uid={LOST},ou=people,{base}); restore only onto a new host's "
                    "directory (nothing was changed)")
    assert slapcat() == before and answers()


@pytest.fixture(scope="module")
def new_host(lab: dict[str, Any], taken: dict[str, Any]) -> list[str]:
    """The lab's slapd as a new host's after its deploy: the lost database set aside, a new
    one with the base slapd's package makes, then the deploy's ``pyhpc directory sync``."""
    db: rd.Database = lab["db"]
    package = directory.parse_ldif(lab["found"])[0]
    assert rd.norm_dn(package["dn"][0]) == rd.norm_dn(D.base_dn)
    base = lab["found"].split("\n\n", 1)[0] + "\n\n"
    like = db.directory.stat()
    restore.service("slapd", "stop")
    try:
        os.rename(db.directory, db.directory.with_name(db.directory.name + LOST_HOST))
        db.directory.mkdir(mode=0o700)
        subprocess.run([backup.tool("slapadd"), "-q", "-F", str(backup.SLAPD_CONFIG), "-b",
                        D.base_dn], input=base, text=True, check=True, capture_output=True)
        for path in [db.directory, *db.directory.iterdir()]:
            os.chown(path, like.st_uid, like.st_gid)
        db.directory.chmod(like.st_mode & 0o7777)
    finally:
        restore.service("slapd", "start")
    cli("directory", "sync", "--json", env=lab["env"])
    directory.forget_cached()
    now = slapcat()
    assert rd.foreign(D, directory.parse_ldif(now)) == [], now
    assert run("getent", "passwd", KEPT, check=False).returncode == 2
    return dns(now)


def copy_of(taken: dict[str, Any], days: int) -> Path:
    host, when = backup_store.parse_name(taken["name"]) or ("", None)
    assert when is not None
    copy = ROOT / backup_store.backup_name(host, when - timedelta(days=days))
    shutil.copytree(ROOT / taken["name"], copy)
    return copy


def test_a_corrupt_or_truncated_backup_is_refused_and_slapd_keeps_its_data(
        lab: dict[str, Any], taken: dict[str, Any], new_host: list[str]) -> None:
    before = slapcat()
    cut = copy_of(taken, 400)
    ldif = cut / rd.PART
    ldif.write_bytes(ldif.read_bytes()[:-200])
    line = refusal(cli("admin", "restore", "--only", "directory", cut.name, env=lab["env"],
                       check=False))
    assert line == (f"pyhpc: error: backup: {cut.name}: {rd.PART} does not match its "
                    "checksum (corrupt or truncated)")
    # Bad when it was taken (its checksums hold): an entry slapd's schema refuses.
    bad = copy_of(taken, 401)
    with gzip.open(bad / rd.PART, "wt") as fh:
        fh.write(lab["found"].split("\n\n", 1)[0] + f"\n\ndn: ou=people,{D.base_dn}\nou: pe\n\n")
    (bad / backup_store.MANIFEST).write_text(backup_store.manifest_text(
        bad, sorted(p.name for p in bad.iterdir() if p.name != backup_store.MANIFEST)))
    line = refusal(cli("admin", "restore", "--only", "directory", bad.name, env=lab["env"],
                       check=False))
    assert line.startswith(f"pyhpc: error: backup: slapadd refused {rd.PART}: "), line
    assert slapcat() == before and answers()
    shutil.rmtree(cut)
    shutil.rmtree(bad)


def test_on_a_new_host_the_restore_brings_the_directory_back(
        lab: dict[str, Any], taken: dict[str, Any], new_host: list[str]) -> None:
    done = json.loads(cli("admin", "restore", "--only", "directory", "--json",
                          env=lab["env"]).stdout)
    part = done["directory"]
    print(f"slapd stopped for {part['seconds']} s; {part['entries']} entries")
    assert done["name"] == taken["name"] and done["parts"] == ["directory"]
    assert part["entries"] == len(taken["dns"]) and part["not_in_backup"] == []
    assert dns(slapcat()) == taken["dns"]
    for user, line in lab["logins"].items():
        assert run("getent", "passwd", user).stdout == line
    uid = lab["logins"]["user1"].split(":")[2]
    assert f"uid={uid}(user1)" in as_user("user1", "id").stdout
    whoami = binds(KEPT, PASSWORD)
    assert whoami.returncode == 0, whoami.stderr
    assert whoami.stdout.strip() == f"dn:{directory.user_dn(D, KEPT)}"
    assert binds(KEPT, PASSWORD + "x").returncode == 49  # invalid credentials
    # Added after the backup: lost.
    assert run("getent", "passwd", LOST, check=False).returncode == 2
    # The admin's password is slapd's configuration's (cn=config, not restored): it binds.
    admin = run("ldapwhoami", "-x", "-H", "ldapi:///", "-D", D.bind_dn, "-y",
               D.bind_password_file)
    assert admin.stdout.strip() == f"dn:{D.bind_dn}"
