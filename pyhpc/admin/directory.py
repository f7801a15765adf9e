"""The user directory (LDAP): its entries, read and written with OpenLDAP's tools.

Every change goes through OpenLDAP's command-line tools (ldapsearch, ldapadd, ldapmodify,
ldapdelete from ldap-utils), run by :func:`ldap`; tests replace :data:`RUNNER`. Users are
``posixAccount`` entries under ``ou=people``, one ``posixGroup`` per Slurm account under
``ou=groups``; each entry's ``description`` is its :mod:`pyhpc.owner` marker
(``pyhpc: cluster.yml`` or ``pyhpc: workshop NAME``). :mod:`pyhpc.directory_sync` decides
what to add and remove; this module reads and writes entries.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyhpc.cluster import Directory
from pyhpc.errors import PyhpcError

Runner = Callable[[Sequence[str], "str | None", float], "subprocess.CompletedProcess[str]"]
#: The local slapd's socket: root on the directory host manages it without a password.
LDAPI = Path("/run/slapd/ldapi")
HOME = "/home"
SHELL = "/bin/bash"
#: The name service cache beside nslcd (the directory role installs it).
NSCD = "nscd"
#: ldap tools' exit status for "no such object", "no such attribute" (a value to delete
#: is not there) and "already exists".
NO_SUCH_OBJECT = 32
NO_SUCH_ATTRIBUTE = 16
ALREADY_EXISTS = 68
#: The entries (directly under the base) that hold the next uid and gid pyhpc gives.
COUNTER = {"uid": "pyhpc-next-uid", "gid": "pyhpc-next-gid"}
ID_RE = re.compile(r"[0-9]{1,10}")


class DirectoryError(PyhpcError):
    """An LDAP tool is missing or refused; the message names the tool."""


def run_command(argv: Sequence[str], stdin: str | None, timeout_s: float,
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                          timeout=timeout_s, check=False)


RUNNER: Runner = run_command


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


def _search(d: Directory, object_class: str, attrs: Sequence[str],
            ) -> list[dict[str, list[str]]]:
    """Entries of ``object_class`` anywhere under the base, as nslcd finds them."""
    proc = ldap("ldapsearch", d, ["-LLL", "-b", d.base_dn, f"(objectClass={object_class})",
                                  *attrs], ok=(0, NO_SUCH_OBJECT))
    return parse_ldif(proc.stdout)


def number(values: Sequence[str]) -> int:
    """A uid or gid number read from the directory; -1 where it is not one (missing, not
    digits, or beyond 2^32): hostile text is never parsed as a huge integer."""
    text = values[0] if values else ""
    return int(text) if ID_RE.fullmatch(text) and int(text) < 2**32 else -1


def users(d: Directory) -> dict[str, Entry]:
    """Every posixAccount in the directory, by uid."""
    found = _search(d, "posixAccount", ["uid", "uidNumber", "gidNumber", "description"])
    return {e["uid"][0]: Entry(e["uid"][0], number(e.get("uidNumber", [])),
                               e.get("description", [""])[0], number(e.get("gidNumber", [])))
            for e in found if e.get("uid")}


def groups(d: Directory) -> dict[str, Entry]:
    """Every posixGroup in the directory, by cn."""
    found = _search(d, "posixGroup", ["cn", "gidNumber", "memberUid", "description"])
    return {e["cn"][0]: Entry(e["cn"][0], number(e.get("gidNumber", [])),
                              e.get("description", [""])[0],
                              members=tuple(sorted(e.get("memberUid", []))))
            for e in found if e.get("cn")}


def counter_dn(d: Directory, which: str) -> str:
    return f"cn={COUNTER[which]},{d.base_dn}"


def read_counter(d: Directory, which: str) -> int | None:
    """The next uid (``which`` uid) or gid pyhpc gives (:data:`COUNTER`); None before the
    first."""
    proc = ldap("ldapsearch", d, ["-LLL", "-b", counter_dn(d, which), "-s", "base",
                                  "(objectClass=device)", "serialNumber"], ok=(0, NO_SUCH_OBJECT))
    found = [number(e.get("serialNumber", [])) for e in parse_ldif(proc.stdout)]
    if found and found[0] < 0:
        raise DirectoryError(f"directory: {counter_dn(d, which)} holds no number; it is "
                             f"pyhpc's record of the next {which}: set its serialNumber",
                             "directory")
    return found[0] if found else None


def write_counter(d: Directory, which: str, old: int | None, new: int) -> None:
    """Move the counter from ``old`` to ``new`` in one LDAP operation that fails if another
    pyhpc moved it meanwhile (delete of the old value + add of the new, or add of the entry)."""
    if old is None:
        ldif = (f"dn: {counter_dn(d, which)}\nobjectClass: device\ncn: {COUNTER[which]}\n"
                f"serialNumber: {new}\ndescription: pyhpc: the next {which} it gives; "
                "numbers are never given twice\n\n")
        proc = ldap("ldapadd", d, [], ldif, ok=(0, ALREADY_EXISTS))
    else:
        ldif = (f"dn: {counter_dn(d, which)}\nchangetype: modify\ndelete: serialNumber\n"
                f"serialNumber: {old}\n-\nadd: serialNumber\nserialNumber: {new}\n-\n\n")
        proc = ldap("ldapmodify", d, [], ldif, ok=(0, NO_SUCH_ATTRIBUTE))
    if proc.returncode != 0:
        raise DirectoryError("directory: another pyhpc gave out numbers at the same time; "
                             "run the command again", "directory")


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
