"""The directory's restore (pyhpc.admin.restore_directory) on real OpenLDAP databases: a
slapd configuration of its own in a temporary directory, filled and read with slapadd and
slapcat as the lab's is. Only slapd's start and stop are this test's (no daemon runs)."""
from __future__ import annotations

import base64
import gzip
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pyhpc.admin import directory, owner
from pyhpc.admin import restore_directory as rd
from pyhpc.cluster import Directory

SBIN = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
SCHEMA = Path("/etc/ldap/schema")
pytestmark = pytest.mark.skipif(
    shutil.which("slapadd", path=SBIN) is None or not (SCHEMA / "nis.ldif").exists(),
    reason="slapadd and /etc/ldap/schema (Debian's slapd package) are not installed: these "
           "tests load real databases")

BASE = "dc=t,dc=pyhpc"
D = Directory(managed=True, base_dn=BASE, bind_dn=f"cn=admin,{BASE}", bind_password_file="/x")


def directory_of(base_dn: str, managed: bool = True) -> Directory:
    return Directory(managed, base_dn, f"cn=admin,{base_dn}", "/x",
                     uri=None if managed else "ldaps://x")
CONFIG = """dn: cn=config
objectClass: olcGlobal
cn: config

dn: cn=schema,cn=config
objectClass: olcSchemaConfig
cn: schema

include: file://{schema}/core.ldif
include: file://{schema}/cosine.ldif
include: file://{schema}/nis.ldif
include: file://{schema}/inetorgperson.ldif

dn: cn=module{{0}},cn=config
objectClass: olcModuleList
cn: module{{0}}
olcModulePath: /usr/lib/ldap
olcModuleLoad: back_mdb

dn: olcDatabase={{1}}mdb,cn=config
objectClass: olcDatabaseConfig
objectClass: olcMdbConfig
olcDatabase: {{1}}mdb
olcSuffix: {base}
olcDbDirectory: {db}
"""
#: What slapd's package makes (the base), then what the deploy's `pyhpc directory sync` adds.
PACKAGE = f"dn: {BASE}\nobjectClass: top\nobjectClass: dcObject\nobjectClass: organization\n" \
          "o: t.pyhpc\ndc: t\n\n"
SYNC = "".join(f"dn: ou={ou},{BASE}\nobjectClass: organizationalUnit\nou: {ou}\n\n"
               for ou in ("people", "groups")) + "".join(
    f"dn: cn={name},{BASE}\nobjectClass: device\ncn: {name}\nserialNumber: 20002\n"
    f"description: pyhpc: the next {which} it gives; numbers are never given twice\n\n"
    for which, name in directory.COUNTER.items()) \
    + directory.group_ldif(D, "lab", 20000, ["user1", "user2"], owner.DEFINITION) \
    + "".join(directory.user_ldif(D, u, 20000 + i, 20000, owner.DEFINITION)
              for i, u in enumerate(["user1", "user2"]))
WORKSHOP = directory.group_ldif(D, "ws", 20010, ["ws-01"], owner.workshop("ws")) \
    + directory.user_ldif(D, "ws-01", 20010, 20010, owner.workshop("ws"),
                          directory.ssha("correct-horse"))


def slap(tool: str, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run([shutil.which(tool, path=SBIN) or tool, *args], input=stdin,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@dataclass
class Slapd:
    """A slapd configuration and its (initially empty) database, and the calls that would
    stop and start its daemon."""

    config: Path
    db: Path
    calls: list[str] = field(default_factory=list)

    def add(self, ldif: str) -> None:
        slap("slapadd", "-q", "-F", str(self.config), "-b", BASE, stdin=ldif)

    def dump(self) -> str:
        return slap("slapcat", "-F", str(self.config), "-b", BASE, "-o", "ldif-wrap=no")

    def service(self, verb: str) -> None:
        self.calls.append(verb)

    def files(self) -> str:
        """The database's data (lock.mdb holds the readers of the moment)."""
        return hashlib.sha256((self.db / "data.mdb").read_bytes()).hexdigest()


@pytest.fixture
def slapd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Slapd:
    config, db = tmp_path / "slapd.d", tmp_path / "ldap"
    config.mkdir()
    db.mkdir(mode=0o750)
    slap("slapadd", "-n", "0", "-F", str(config),
         stdin=CONFIG.format(schema=SCHEMA, base=BASE, db=db))

    def cleared(argv: Sequence[str], stdin: str | None, timeout_s: float,
                ) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, "", "")

    # After a load pyhpc empties nscd's cache (nscd -i): not this machine's here.
    monkeypatch.setattr(directory, "RUNNER", cleared)
    return Slapd(config, db)


def packed(tmp_path: Path, text: str) -> Path:
    path = tmp_path / rd.PART
    with gzip.open(path, "wt") as fh:
        fh.write(text)
    return path


def test_the_database_of_base_dn_is_read_from_slapds_configuration(slapd: Slapd) -> None:
    assert rd.served(directory_of("DC=t, dc=PYHPC"), slapd.config) == rd.Database(BASE, slapd.db)
    assert rd.served(directory_of("dc=other"), slapd.config) is None
    assert rd.served(directory_of(BASE, managed=False), slapd.config) is None
    assert rd.served(D, slapd.config.parent / "absent") is None


def test_a_new_hosts_directory_passes_the_check(slapd: Slapd) -> None:
    assert rd.check(D, slapd.config) == (rd.Database(BASE, slapd.db), [])  # empty
    slapd.add(PACKAGE + SYNC)
    db, now = rd.check(D, slapd.config)
    assert db.directory == slapd.db
    assert rd.norm_dn(now[0]) == BASE and f"uid=user2,ou=people,{BASE}" in now
    assert len(now) == 8


@pytest.mark.parametrize(("extra", "named"), [
    (WORKSHOP, [f"cn=ws,ou=groups,{BASE}", f"uid=ws-01,ou=people,{BASE}"]),
    # The definition's marker with a password: someone set it, after the deploy.
    (f"dn: uid=user3,ou=people,{BASE}\nchangetype: add\n" + directory.user_ldif(
        D, "user3", 20003, 20000, owner.DEFINITION, directory.ssha("x")).split("\n", 1)[1],
     [f"uid=user3,ou=people,{BASE}"]),
    (f"dn: cn=admin,{BASE}\nobjectClass: organizationalRole\ncn: admin\n\n",
     [f"cn=admin,{BASE}"]),
    (directory.user_ldif(D, "hand", 20004, 20000, "made by hand"),
     [f"uid=hand,ou=people,{BASE}"]),
], ids=["workshop", "password", "admin-entry", "by-hand"])
def test_a_directory_holding_what_a_deploy_does_not_make_is_refused(
        slapd: Slapd, extra: str, named: list[str]) -> None:
    slapd.add(PACKAGE + SYNC + extra.replace("changetype: add\n", ""))
    before = slapd.files()
    with pytest.raises(rd.DirectoryRestoreError) as exc:
        rd.check(D, slapd.config)
    assert str(exc.value) == (
        f"restore: the directory {BASE} already holds {len(named)} entries a deploy does "
        f"not make ({', '.join(named)}); restore only onto a new host's directory (nothing "
        "was changed)")
    assert slapd.files() == before


def test_the_refusal_names_three_entries_and_counts_the_rest(slapd: Slapd) -> None:
    slapd.add(PACKAGE + SYNC + "".join(
        directory.user_ldif(D, f"p{i}", 20100 + i, 20000, owner.workshop("w"))
        for i in range(5)))
    with pytest.raises(rd.DirectoryRestoreError, match=r"already holds 5 entries .*"
                       r"uid=p2,ou=people,dc=t,dc=pyhpc and 2 more\); restore only"):
        rd.check(D, slapd.config)


def test_the_load_replaces_the_deploys_entries_by_the_backups(slapd: Slapd,
                                                              tmp_path: Path) -> None:
    slapd.add(PACKAGE + SYNC + WORKSHOP)  # the lost host's: the deploy's and a workshop's
    text = slapd.dump()
    backed_up = tmp_path / "backup"
    backed_up.mkdir()
    ldif = packed(backed_up, text)
    shutil.rmtree(slapd.db)
    slapd.db.mkdir(mode=0o700)
    slapd.add(PACKAGE + SYNC)  # the new host's deploy
    db, now = rd.check(D, slapd.config)
    seconds = rd.load(db, ldif, BASE, slapd.service, slapd.config,
                      answers=lambda base: rd.norm_dn(base) in slapd.dump().lower())
    assert seconds >= 0 and slapd.calls == ["stop", "start"]
    assert slapd.dump() == text
    assert directory.parse_ldif(slapd.dump())[-1]["uid"] == ["ws-01"]
    assert rd.backup_dns(ldif) == [e["dn"][0] for e in directory.parse_ldif(text)]
    info = slapd.db.stat()
    assert oct(info.st_mode & 0o777) == oct(0o700) and info.st_uid == os.geteuid()
    assert not slapd.db.with_name(slapd.db.name + rd.ASIDE).exists()
    assert {p.name for p in slapd.db.iterdir()} == {"data.mdb", "lock.mdb"}
    assert now and set(now) <= set(rd.backup_dns(ldif))


@pytest.mark.parametrize(("ldif", "why"), [
    # An entry slapd's schema refuses (truncated mid-entry: no objectClass).
    (PACKAGE + f"dn: ou=people,{BASE}\nou: peo", "slapadd refused directory.ldif.gz: "),
    # A gzip cut short.
    (None, "directory.ldif.gz is truncated or corrupt"),
], ids=["refused-entry", "cut-gzip"])
def test_a_load_that_fails_puts_the_old_database_back(slapd: Slapd, tmp_path: Path,
                                                     ldif: str | None, why: str) -> None:
    slapd.add(PACKAGE + SYNC)
    before, text = slapd.files(), slapd.dump()
    path = packed(tmp_path, ldif or PACKAGE + SYNC)
    if ldif is None:
        path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(rd.DirectoryRestoreError) as exc:
        rd.load(rd.Database(BASE, slapd.db), path, BASE, slapd.service, slapd.config)
    line = str(exc.value)
    assert line.startswith(f"restore: {why}") and "\n" not in line, line
    assert line.endswith("; the directory's database is back as it was")
    assert slapd.calls == ["stop", "start"]
    assert slapd.files() == before and slapd.dump() == text


def test_slapd_that_does_not_answer_after_the_load_gets_the_old_database(
        slapd: Slapd, tmp_path: Path) -> None:
    slapd.add(PACKAGE)
    before = slapd.files()
    with pytest.raises(rd.DirectoryRestoreError, match=r"^restore: slapd does not answer for "
                       r"dc=t,dc=pyhpc after the load; the directory's database is back"):
        rd.load(rd.Database(BASE, slapd.db), packed(tmp_path, PACKAGE + SYNC), BASE,
                slapd.service, slapd.config, answers=lambda base: False)
    assert slapd.calls == ["stop", "start", "stop", "start"]
    assert slapd.files() == before


def test_a_database_set_aside_already_stops_the_load_before_slapd(slapd: Slapd,
                                                                 tmp_path: Path) -> None:
    aside = slapd.db.with_name(slapd.db.name + rd.ASIDE)
    aside.mkdir()
    with pytest.raises(rd.DirectoryRestoreError, match=r"ldap\.pyhpc-replaced is there .*"
                       r"\(nothing was changed\)$"):
        rd.load(rd.Database(BASE, slapd.db), packed(tmp_path, PACKAGE), BASE,
                slapd.service, slapd.config)
    assert slapd.calls == [] and aside.is_dir()


def test_base64_dns_are_read_back_decoded(tmp_path: Path) -> None:
    name = "uid=Zoë,ou=people," + BASE
    text = f"dn:: {base64.b64encode(name.encode()).decode()}\nobjectClass: account\n\n" \
           f"dn: {BASE}\no: t\n\n"
    assert rd.backup_dns(packed(tmp_path, text)) == [name, BASE]


def test_dns_compare_without_case_or_spaces() -> None:
    assert rd.norm_dn("UID=a, OU=People ,dc = t") == "uid=a,ou=people,dc=t"
