"""The user directory (LDAP): the definition's users and workshop participants as entries.

Every change goes through OpenLDAP's command-line tools (ldapsearch, ldapadd, ldapmodify,
ldapdelete from ldap-utils), run by :func:`ldap`; tests replace :data:`RUNNER`. Users are
``posixAccount`` entries under ``ou=people``, one ``posixGroup`` per Slurm account under
``ou=groups``; each entry's ``description`` says who manages it (``pyhpc: cluster.yml`` or
``pyhpc: workshop NAME``), so a sync never touches entries it did not make.
"""
from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyhpc.cluster import Account, Directory
from pyhpc.errors import PyhpcError

Runner = Callable[[Sequence[str], "str | None", float], "subprocess.CompletedProcess[str]"]
#: The local slapd's socket: root on the directory host manages it without a password.
LDAPI = Path("/run/slapd/ldapi")
DEFINITION = "pyhpc: cluster.yml"
HOME = "/home"
SHELL = "/bin/bash"
#: The name service cache beside nslcd (the directory role installs it).
NSCD = "nscd"
#: ldap tools' exit status for "no such object".
NO_SUCH_OBJECT = 32


class DirectoryError(PyhpcError):
    """An LDAP tool is missing or refused; the message names the tool."""


def run_command(argv: Sequence[str], stdin: str | None, timeout_s: float,
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                          timeout=timeout_s, check=False)


RUNNER: Runner = run_command


def workshop_tag(name: str) -> str:
    return f"pyhpc: workshop {name}"


def _connection(d: Directory) -> list[str]:
    """How this host reaches the directory: pyhpc's own on this host through its socket
    (root only); pyhpc's own on another host at /etc/ldap/ldap.conf's URI with StartTLS
    required (it refuses connections without TLS), as its admin; an existing one at its URI."""
    local = LDAPI.exists()
    if d.managed and local and os.geteuid() == 0:
        return ["-Q", "-Y", "EXTERNAL", "-H", "ldapi:///"]
    argv = ["-x", "-D", d.bind_dn, "-y", d.bind_password_file]
    if d.uri:
        argv += ["-H", d.uri, *(["-ZZ"] if d.start_tls else [])]
    elif not local:
        argv += ["-ZZ"]
    return argv


def ldap(tool: str, d: Directory, args: Sequence[str] = (), ldif: str | None = None,
         ok: Iterable[int] = (0,)) -> subprocess.CompletedProcess[str]:
    """Run one LDAP tool against the directory; an exit status outside ``ok`` raises."""
    argv = [tool, *_connection(d), *args]  # TLS_CACERT: /etc/ldap/ldap.conf (the role)
    try:
        proc = RUNNER(argv, ldif, 60.0)
    except FileNotFoundError:
        raise DirectoryError(f"{tool}: command not found; install ldap-utils", tool) from None
    except subprocess.TimeoutExpired:
        raise DirectoryError(f"{tool}: no answer from the directory within 60 s", tool) from None
    if proc.returncode not in ok:
        lines = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise DirectoryError(f"{tool}: {lines[-1] if lines else proc.returncode}", tool)
    if tool != "ldapsearch":
        forget_cached()
    return proc


def parse_ldif(text: str) -> list[dict[str, list[str]]]:
    """``ldapsearch -LLL`` output as entries of attribute -> values (base64 decoded)."""
    entries: list[dict[str, list[str]]] = []
    for block in text.replace("\n ", "").split("\n\n"):
        entry: dict[str, list[str]] = {}
        for line in block.splitlines():
            if ":" not in line or line.startswith("#"):
                continue
            key, _, value = line.partition(":")
            if value.startswith(":"):
                value = base64.b64decode(value[1:].strip()).decode(errors="replace")
            entry.setdefault(key, []).append(value.strip())
        if entry:
            entries.append(entry)
    return entries


@dataclass(frozen=True)
class Entry:
    """A user or group entry: its name, uid/gid number, manager tag and group members."""

    name: str
    number: int
    tag: str = ""
    gid: int = 0
    members: tuple[str, ...] = ()


def _search(d: Directory, ou: str, object_class: str, attrs: Sequence[str],
            ) -> list[dict[str, list[str]]]:
    proc = ldap("ldapsearch", d, ["-LLL", "-b", f"ou={ou},{d.base_dn}",
                                  f"(objectClass={object_class})", *attrs],
                ok=(0, NO_SUCH_OBJECT))
    return parse_ldif(proc.stdout)


def users(d: Directory) -> dict[str, Entry]:
    """Every posixAccount under ou=people, by uid."""
    found = _search(d, "people", "posixAccount", ["uid", "uidNumber", "gidNumber", "description"])
    return {e["uid"][0]: Entry(e["uid"][0], int(e["uidNumber"][0]), e.get("description", [""])[0],
                               int(e["gidNumber"][0])) for e in found if "uid" in e}


def groups(d: Directory) -> dict[str, Entry]:
    """Every posixGroup under ou=groups, by cn."""
    found = _search(d, "groups", "posixGroup", ["cn", "gidNumber", "memberUid", "description"])
    return {e["cn"][0]: Entry(e["cn"][0], int(e["gidNumber"][0]), e.get("description", [""])[0],
                              members=tuple(sorted(e.get("memberUid", []))))
            for e in found if "cn" in e}


def free_numbers(used: Iterable[int], low: int, high: int, count: int) -> list[int]:
    """The first ``count`` numbers of ``[low, high]`` not in ``used``."""
    taken, found = set(used), list[int]()
    for number in range(low, high + 1):
        if len(found) == count:
            break
        if number not in taken:
            found.append(number)
    if len(found) < count:
        raise DirectoryError(f"directory.uid_max: no {count} free numbers left in "
                             f"{low}-{high}", "directory.uid_max")
    return found


def ssha(password: str) -> str:
    """``{SSHA}`` hash of ``password``, as slapd checks it."""
    salt = secrets.token_bytes(8)
    digest = hashlib.sha1(password.encode() + salt).digest()  # noqa: S324  # slapd's SSHA
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


def user_ldif(d: Directory, name: str, uid: int, gid: int, tag: str,
              password_hash: str | None = None) -> str:
    lines = [f"dn: uid={name},ou=people,{d.base_dn}",
             "objectClass: inetOrgPerson", "objectClass: posixAccount",
             f"uid: {name}", f"cn: {name}", f"sn: {name}", f"uidNumber: {uid}",
             f"gidNumber: {gid}", f"homeDirectory: {HOME}/{name}", f"loginShell: {SHELL}",
             f"description: {tag}"]
    if password_hash:
        lines.append(f"userPassword: {password_hash}")
    return "\n".join(lines) + "\n\n"


def group_ldif(d: Directory, name: str, gid: int, members: Sequence[str], tag: str) -> str:
    lines = [f"dn: cn={name},ou=groups,{d.base_dn}", "objectClass: posixGroup",
             f"cn: {name}", f"gidNumber: {gid}", f"description: {tag}"]
    lines += [f"memberUid: {m}" for m in sorted(members)]
    return "\n".join(lines) + "\n\n"


def members_ldif(d: Directory, name: str, members: Sequence[str]) -> str:
    lines = [f"dn: cn={name},ou=groups,{d.base_dn}", "changetype: modify", "replace: memberUid"]
    lines += [f"memberUid: {m}" for m in sorted(members)]
    return "\n".join(lines) + "\n-\n\n"


def ensure_base(d: Directory) -> bool:
    """Create ``ou=people`` and ``ou=groups`` where missing; True if it added one."""
    proc = ldap("ldapsearch", d, ["-LLL", "-b", d.base_dn, "-s", "one",
                                  "(objectClass=organizationalUnit)", "ou"], ok=(0, NO_SUCH_OBJECT))
    present = {v for e in parse_ldif(proc.stdout) for v in e.get("ou", [])}
    ldif = "".join(f"dn: ou={ou},{d.base_dn}\nobjectClass: organizationalUnit\nou: {ou}\n\n"
                   for ou in ("people", "groups") if ou not in present)
    if ldif:
        ldap("ldapadd", d, [], ldif)
    return bool(ldif)


def add(d: Directory, ldif: str) -> None:
    if ldif:
        ldap("ldapadd", d, [], ldif)


def delete(d: Directory, dns: Sequence[str]) -> None:
    """Delete entries; one already gone is not an error."""
    if dns:
        ldap("ldapdelete", d, ["-c"], "\n".join(dns) + "\n", ok=(0, NO_SUCH_OBJECT))


def forget_cached() -> None:
    """After a change: empty this host's nscd of users and groups (root only), so what was
    added or removed resolves so here at once (other hosts: within their nscd's time to
    live, the role's directory_nscd_ttl_s). No nscd here, or none running: nothing."""
    if shutil.which(NSCD) is None:
        return
    for table in ("passwd", "group"):
        try:
            RUNNER([NSCD, "-i", table], None, 10.0)
        except (OSError, subprocess.TimeoutExpired):
            return


def user_dn(d: Directory, name: str) -> str:
    return f"uid={name},ou=people,{d.base_dn}"


def group_dn(d: Directory, name: str) -> str:
    return f"cn={name},ou=groups,{d.base_dn}"


@dataclass(frozen=True)
class SyncPlan:
    """What :func:`sync` changes: users and groups to add, update or remove."""

    add_users: tuple[str, ...] = ()
    remove_users: tuple[str, ...] = ()
    add_groups: tuple[str, ...] = ()
    update_groups: tuple[str, ...] = ()
    remove_groups: tuple[str, ...] = ()
    added_base: bool = False

    @property
    def changed(self) -> bool:
        return any((self.add_users, self.remove_users, self.add_groups, self.update_groups,
                    self.remove_groups, self.added_base))


def sync(d: Directory, accounts: tuple[Account, ...]) -> SyncPlan:
    """Make the directory hold the definition's users and one group per account.

    Entries tagged ``pyhpc: cluster.yml`` that the definition no longer names are removed;
    entries with another tag (workshops, an admin's own) are never touched.
    """
    changed_base = ensure_base(d)
    have_users, have_groups = users(d), groups(d)
    wanted = d.users(accounts)
    members = {a.name: sorted(set(a.users) - set(d.local_users)) for a in accounts}
    new_groups = [a for a in members if a not in have_groups]
    gids = dict(zip(new_groups, free_numbers([g.number for g in have_groups.values()],
                                             d.uid_min, d.uid_max, len(new_groups)), strict=True))
    gids.update({g: e.number for g, e in have_groups.items()})
    add_groups_ldif = "".join(group_ldif(d, g, gids[g], members[g], DEFINITION)
                              for g in new_groups)
    update = [g for g in members if g in have_groups and have_groups[g].tag == DEFINITION
              and list(have_groups[g].members) != members[g]]
    new_users = [u for u in wanted if u not in have_users]
    uids = free_numbers([u.number for u in have_users.values()], d.uid_min, d.uid_max,
                        len(new_users))
    primary = {u: gids[next(a.name for a in accounts if u in a.users)] for u in new_users}
    add(d, add_groups_ldif + "".join(user_ldif(d, u, n, primary[u], DEFINITION)
                                     for u, n in zip(new_users, uids, strict=True)))
    for g in update:
        ldap("ldapmodify", d, [], members_ldif(d, g, members[g]))
    gone_users = sorted(u for u, e in have_users.items() if e.tag == DEFINITION and u not in wanted)
    gone_groups = sorted(g for g, e in have_groups.items()
                         if e.tag == DEFINITION and g not in members)
    delete(d, [user_dn(d, u) for u in gone_users] + [group_dn(d, g) for g in gone_groups])
    return SyncPlan(tuple(new_users), tuple(gone_users), tuple(new_groups), tuple(update),
                    tuple(gone_groups), changed_base)


def add_members(d: Directory, group: str, names: Sequence[str], tag: str,
                passwords: dict[str, str]) -> list[str]:
    """Add a group and users ``names`` (missing ones only) with these passwords; the added."""
    ensure_base(d)
    have_users, have_groups = users(d), groups(d)
    ldif = ""
    if group in have_groups:
        gid = have_groups[group].number
    else:
        gid = free_numbers([g.number for g in have_groups.values()], d.uid_min, d.uid_max, 1)[0]
        ldif += group_ldif(d, group, gid, names, tag)
    new = [n for n in names if n not in have_users]
    uids = free_numbers([u.number for u in have_users.values()], d.uid_min, d.uid_max, len(new))
    ldif += "".join(user_ldif(d, n, u, gid, tag, ssha(passwords[n]))
                    for n, u in zip(new, uids, strict=True))
    add(d, ldif)
    return new


def tagged(d: Directory, tag: str) -> tuple[list[str], list[str]]:
    """Users and groups carrying ``tag``."""
    return (sorted(u for u, e in users(d).items() if e.tag == tag),
            sorted(g for g, e in groups(d).items() if e.tag == tag))
