"""The user directory: the definition's `directory` key, and syncs through a fake LDAP."""
from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import yaml

from pyhpc import cluster, paths
from pyhpc.admin import directory, directory_sync, owner
from pyhpc.cluster import ConfigError

EXTERNAL = {"uri": "ldaps://ldap.uni.example:636", "base_dn": "dc=uni,dc=example",
            "bind_dn": "cn=pyhpc,ou=services,dc=uni,dc=example",
            "bind_password_file": "/etc/pyhpc/secrets/ldap_bind", "ca_file": "/etc/ssl/uni-ca.pem"}


def with_directory(value: Any) -> dict[str, Any]:
    data = copy.deepcopy(yaml.safe_load(paths.LAB_CLUSTER.read_text()))
    data["directory"] = value
    return data


def test_lab_runs_its_own_directory_and_keeps_root_local() -> None:
    d = cluster.load(paths.LAB_CLUSTER).directory
    assert d is not None and d.managed
    assert (d.base_dn, d.bind_dn) == ("dc=lab,dc=pyhpc", "cn=admin,dc=lab,dc=pyhpc")
    assert d.bind_password_file == "/etc/pyhpc/secrets/ldap_admin_password"
    assert d.users(cluster.load(paths.LAB_CLUSTER).accounts) == ["user1", "user2"]


def test_no_directory_key_means_no_directory() -> None:
    data = with_directory(None)
    del data["directory"]
    data.pop("jupyterhub", None)  # a hub needs a directory (tests/unit/test_hub_form.py)
    assert cluster.parse(data).directory is None


def test_existing_directory_over_ldaps_is_accepted() -> None:
    d = cluster.parse(with_directory(EXTERNAL)).directory
    assert d is not None and not d.managed and d.uri == EXTERNAL["uri"]


def test_start_tls_on_ldap_uri_is_accepted() -> None:
    d = cluster.parse(with_directory({**EXTERNAL, "uri": "ldap://ldap.uni.example",
                                      "start_tls": True})).directory
    assert d is not None and d.start_tls


BAD = [
    ({**EXTERNAL, "uri": "ldap://ldap.uni.example"},
     "directory.uri: 'ldap://ldap.uni.example' sends binds and passwords in plaintext"),
    ({k: v for k, v in EXTERNAL.items() if k != "ca_file"},
     "directory.ca_file: required for TLS to the directory"),
    ({k: v for k, v in EXTERNAL.items() if k != "bind_dn"},
     "directory.bind_dn: required with directory.uri"),
    ({**EXTERNAL, "uri": "http://ldap.uni.example"}, "directory.uri: 'http://ldap.uni.example'"),
    ({**EXTERNAL, "base_dn": "dc=uni;rm"}, "directory.base_dn: 'dc=uni;rm' is not allowed"),
    ({**EXTERNAL, "bind_password_file": "secret"}, "directory.bind_password_file: 'secret'"),
    ({"bind_dn": "cn=admin,dc=x"}, "directory.bind_dn: only with directory.uri"),
    ({"base_dn": "o=uni"}, "directory.base_dn: 'o=uni': pyhpc's own directory takes"),
    ({"uid_min": 30000, "uid_max": 29000}, "directory.uid_max: 29000 is below directory.uid_min"),
    ({"uid_min": 0}, "directory.uid_min: must be an integer from 1000"),
    ({"colour": 1}, "directory.colour: unknown key; allowed: base_dn, bind_dn"),
    ("yes", "directory: expected a mapping, got str"),
]


@pytest.mark.parametrize(("value", "message"), BAD, ids=[b[1][:40] for b in BAD])
def test_invalid_directory_names_the_key(value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        cluster.parse(with_directory(value))
    assert message in str(err.value)


def test_plaintext_ldap_to_this_machine_is_accepted() -> None:
    d = cluster.parse(with_directory({**EXTERNAL, "uri": "ldap://127.0.0.1/"})).directory
    assert d is not None and d.uri == "ldap://127.0.0.1/"


def lab_directory() -> cluster.Directory:
    d = cluster.load(paths.LAB_CLUSTER).directory
    assert d is not None
    return d


def test_sync_adds_users_and_a_group_per_account_then_changes_nothing(fake_ldap) -> None:
    accounts = cluster.load(paths.LAB_CLUSTER).accounts
    plan = directory_sync.sync(lab_directory(), accounts)
    assert plan.add_users == ("user1", "user2") and plan.add_groups == ("lab", "teaching")
    users = directory.users(lab_directory())
    assert [(u.name, u.number, u.gid) for u in users.values()] == [
        ("user1", 20000, 20000), ("user2", 20001, 20000)]
    assert "uid=root,ou=people,dc=lab,dc=pyhpc" not in fake_ldap.entries
    assert not directory_sync.sync(lab_directory(), accounts).changed


def test_sync_removes_a_user_the_definition_dropped_and_keeps_workshop_users(fake_ldap) -> None:
    d = lab_directory()
    directory_sync.sync(d, (cluster.Account("lab", ("root", "user1", "user2")),))
    directory_sync.add_members(d, "ws", ["ws-01"], owner.workshop("ws"), {"ws-01": "pw"})
    plan = directory_sync.sync(d, (cluster.Account("lab", ("root", "user1")),))
    assert plan.remove_users == ("user2",) and plan.update_groups == ("lab",)
    assert sorted(directory.users(d)) == ["user1", "ws-01"]
    assert directory.groups(d)["lab"].members == ("user1",)
    assert directory.users(d)["ws-01"].number == 20002


def test_a_removed_users_uid_and_gid_are_never_given_again(fake_ldap) -> None:
    d = lab_directory()
    tag = owner.workshop("ws")
    directory_sync.add_members(d, "ws", ["ws-01"], tag, {"ws-01": "pw"})
    first = directory.users(d)["ws-01"]
    directory.delete(d, [directory.user_dn(d, "ws-01"), directory.group_dn(d, "ws")])
    directory_sync.add_members(d, "ws", ["ws-01"], tag, {"ws-01": "pw"})
    again = directory.users(d)["ws-01"]
    assert (first.number, first.gid) == (20000, 20000)
    assert (again.number, again.gid) == (20001, 20001)
    assert directory.read_counter(d, "uid") == 20002 == directory.read_counter(d, "gid")


def test_numbers_skip_local_accounts_and_start_above_kept_homes(fake_ldap, tmp_path,
                                                                 monkeypatch) -> None:
    passwd, group, homes = tmp_path / "passwd", tmp_path / "group", tmp_path / "home"
    passwd.write_text("root:x:0:0::/root:/bin/sh\nlocal:x:20000:20000::/x:/bin/sh\n")
    group.write_text("root:x:0:\nlocal:x:20000:\n")
    (homes / "gone-01").mkdir(parents=True)
    os.chown(homes / "gone-01", 20005, 20003)  # a former user's home, kept
    monkeypatch.setattr(directory_sync, "LOCAL_IDS", {"uid": passwd, "gid": group})
    monkeypatch.setattr(directory_sync, "HOMES", homes)
    d = lab_directory()
    # An admin's own entry high in the range, with its home: skipped, never started above.
    directory.add(d, directory.user_ldif(d, "admins", 29000, 29000, "the admin's"))
    (homes / "admins").mkdir()
    os.chown(homes / "admins", 29000, 29000)
    directory_sync.add_members(d, "ws", ["ws-01", "ws-02"], owner.workshop("ws"),
                               {"ws-01": "a", "ws-02": "b"})
    users = directory.users(d)
    assert [users[n].number for n in ("ws-01", "ws-02")] == [20006, 20007]
    assert directory.groups(d)["ws"].number == 20004
    monkeypatch.setattr(directory_sync, "HOMES", tmp_path / "none")
    passwd.write_text("local:x:20008:20000::/x:/bin/sh\n")
    directory_sync.add_members(d, "ws", ["ws-03"], owner.workshop("ws"), {"ws-03": "c"})
    assert directory.users(d)["ws-03"].number == 20009  # the counter, past a local uid


def test_a_directory_rebuilt_over_kept_homes_gives_their_users_their_numbers_back(
        fake_ldap, tmp_path, monkeypatch) -> None:
    """A new directory (its host rebuilt) and the shared /home as it was: user1 finds their
    home theirs again; a home a local account owns, or one reached through a link, is no
    one's to adopt; numbers for new users start above every kept home."""
    passwd, group, homes = tmp_path / "passwd", tmp_path / "group", tmp_path / "home"
    passwd.write_text("root:x:0:0::/root:/bin/sh\nlocal:x:20003:20003::/x:/bin/sh\n")
    group.write_text("root:x:0:\nlocal:x:20003:\n")
    homes.mkdir()
    for name, uid in (("user1", 20000), ("user2", 20003), ("elsewhere", 20006)):
        (homes / name).mkdir()
        os.chown(homes / name, uid, 20000)
    (homes / "user3").symlink_to(homes / "elsewhere")
    monkeypatch.setattr(directory_sync, "LOCAL_IDS", {"uid": passwd, "gid": group})
    monkeypatch.setattr(directory_sync, "HOMES", homes)
    d = lab_directory()
    directory_sync.sync(d, (cluster.Account("lab", ("root", "user1", "user2", "user3")),))
    users = directory.users(d)
    assert (users["user1"].number, users["user1"].gid) == (20000, 20000)
    assert directory.groups(d)["lab"].number == 20000
    assert [users[n].number for n in ("user2", "user3")] == [20007, 20008]


def test_a_full_range_and_a_counter_moved_meanwhile_are_one_line_each(fake_ldap,
                                                                      monkeypatch) -> None:
    d = cluster.Directory(True, "dc=lab,dc=pyhpc", "cn=admin,dc=lab,dc=pyhpc", "/x",
                          uid_min=20000, uid_max=20001)
    with pytest.raises(directory.DirectoryError,
                       match=r"^directory.uid_max: no 3 uids left in 20000-20001"):
        directory_sync.add_members(d, "ws", ["a", "b", "c"], owner.workshop("ws"),
                                   dict.fromkeys("abc", "pw"))
    directory.write_counter(d, "uid", None, 20000)
    real = directory.read_counter
    monkeypatch.setattr(directory, "read_counter", lambda d, which: 19999)
    monkeypatch.setattr(directory_sync, "read_counter", lambda d, which: 19999)
    with pytest.raises(directory.DirectoryError, match="another pyhpc gave out numbers"):
        directory_sync.allocate(d, "uid", 1, [])
    assert real(d, "uid") == 20000


def test_external_directory_binds_with_the_admins_credentials(fake_ldap) -> None:
    d = cluster.parse(with_directory(EXTERNAL)).directory
    assert d is not None
    directory.users(d)
    assert fake_ldap.calls[-1][:8] == ["ldapsearch", "-x", "-D", EXTERNAL["bind_dn"], "-y",
                                       EXTERNAL["bind_password_file"], "-H", EXTERNAL["uri"]]


def test_pyhpcs_own_directory_on_another_host_is_reached_with_starttls(fake_ldap) -> None:
    """No slapd socket here: the directory's host is another (its URI: ldap.conf), and it
    refuses connections without TLS."""
    d = cluster.parse(with_directory({})).directory
    assert d is not None and d.managed
    directory.users(d)
    assert fake_ldap.calls[-1][:7] == ["ldapsearch", "-x", "-D", "cn=admin,dc=lab,dc=pyhpc", "-y",
                                       "/etc/pyhpc/secrets/ldap_admin_password", "-ZZ"]


def test_a_change_empties_this_hosts_name_service_cache(fake_ldap, monkeypatch) -> None:
    monkeypatch.setattr(directory.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    d = cluster.parse(with_directory({})).directory
    assert d is not None
    directory.delete(d, [directory.user_dn(d, "gone")])
    assert fake_ldap.calls[-2:] == [["nscd", "-i", "passwd"], ["nscd", "-i", "group"]]
    directory.users(d)  # a search changes nothing: no call
    assert fake_ldap.calls[-1][0] == "ldapsearch"
    monkeypatch.setattr(directory.shutil, "which", lambda tool: None)  # no nscd: no call
    directory.delete(d, [directory.user_dn(d, "gone")])
    assert fake_ldap.calls[-1][0] == "ldapdelete"


def test_ssha_is_salted_sha1() -> None:
    one, two = directory.ssha("pw"), directory.ssha("pw")
    assert one.startswith("{SSHA}") and one != two
