"""Who is in the directory: the definition's users and groups (:func:`sync`), a workshop's
participants (:func:`add_members`), and the uid/gid numbers they get.

Both refuse, before any change, a name that exists without their marker
(:func:`pyhpc.owner.claim`), and remove only entries that carry it. Numbers are never
given twice: the directory keeps the next one (:func:`pyhpc.directory.read_counter`), so a
new user never gets a former user's uid, whose jobs sacct would show them and whose
files (in /tmp, in the accounting, on every node) would be theirs.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyhpc.admin import owner
from pyhpc.admin.directory import (
    DirectoryError,
    Entry,
    add,
    delete,
    ensure_base,
    group_dn,
    group_ldif,
    groups,
    ldap,
    members_ldif,
    read_counter,
    ssha,
    user_dn,
    user_ldif,
    users,
    write_counter,
)
from pyhpc.cluster import Account, Directory

#: Local account databases, per kind of number: their numbers are never given to entries.
LOCAL_IDS = {"uid": Path("/etc/passwd"), "gid": Path("/etc/group")}
#: Homes: a number that owns one (a former user's, kept) is never given either.
HOMES = Path("/home")


def local_numbers(which: str) -> set[int]:
    """Every uid (``which`` uid) or gid of the local files: the third field of each line."""
    found: set[int] = set()
    path = LOCAL_IDS.get(which)
    try:
        text = path.read_text(errors="replace") if path else ""
    except OSError:
        return found
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].isdigit() and len(fields[2]) <= 10:
            found.add(int(fields[2]))
    return found


def home_owners(which: str) -> set[int]:
    """The uids (``which`` uid) or gids owning an entry of :data:`HOMES` (never through a
    link)."""
    found: set[int] = set()
    try:
        entries = list(os.scandir(HOMES))
    except OSError:
        return found
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        found.add(info.st_uid if which == "uid" else info.st_gid)
    return found


def kept_homes(d: Directory, names: Iterable[str], used: Iterable[int]) -> dict[str, os.stat_result]:
    """Users of ``names`` whose own home (HOMES/name: a directory, never through a link)
    is there from before, owned by a uid in the directory's range that no entry and no
    local account uses (``used``, the directory's): a directory rebuilt over kept homes,
    the same definition's users. Each is given their home's numbers back, else their home
    would be another uid's and shut to them."""
    taken = set(used) | local_numbers("uid")
    found: dict[str, os.stat_result] = {}
    for name in names:
        try:
            info = (HOMES / name).lstat()
        except OSError:
            continue
        if (stat.S_ISDIR(info.st_mode) and d.uid_min <= info.st_uid <= d.uid_max
                and info.st_uid not in taken
                and info.st_uid not in {f.st_uid for f in found.values()}):
            found[name] = info
    return found


def allocate(d: Directory, which: str, count: int, used: Iterable[int],
             given: Iterable[int] = ()) -> list[int]:
    """``count`` uids or gids (``which``) never given before: from the directory's counter
    up, skipping numbers in use (``used``, local accounts); the counter moves past them
    first. Before the first, the counter starts above every number pyhpc gave that is still
    known: ``given`` (entries carrying a pyhpc marker) and the owners of homes that no
    other entry uses (a former user's, kept). An admin's own entries high in the range are
    skipped, not started above."""
    if count == 0:
        return []
    in_range = range(d.uid_min, d.uid_max + 1)
    used = set(used)
    taken = used | local_numbers(which)
    current = read_counter(d, which)
    start = current if current is not None else max(
        [d.uid_min, *(n + 1 for n in set(given) | (home_owners(which) - used) if n in in_range)])
    numbers: list[int] = []
    candidate = start
    while len(numbers) < count:
        if candidate > d.uid_max:
            raise DirectoryError(f"directory.uid_max: no {count} {which}s left in "
                                 f"{d.uid_min}-{d.uid_max} that were never given (the next is "
                                 f"{start}); raise directory.uid_max", "directory.uid_max")
        if candidate not in taken:
            numbers.append(candidate)
        candidate += 1
    write_counter(d, which, current, candidate)
    return numbers


def _gids(have_users: dict[str, Entry], have_groups: dict[str, Entry],
          marked: bool = False) -> list[int]:
    """Gids in use: the groups' and the users' primary ones (``marked``: only of entries
    carrying a pyhpc marker, the numbers pyhpc gave)."""
    return ([e.number for e in have_groups.values() if not marked or owner.is_pyhpcs(e.tag)]
            + [e.gid for e in have_users.values() if not marked or owner.is_pyhpcs(e.tag)])


def _uids(have_users: dict[str, Entry], marked: bool = False) -> list[int]:
    return [e.number for e in have_users.values() if not marked or owner.is_pyhpcs(e.tag)]


def _found(kind: str, entries: dict[str, Entry], names: Iterable[str]) -> list[owner.Found]:
    return [owner.Found(kind, n, entries[n].tag) for n in names if n in entries]


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

    A user or group of the definition that exists without its marker stops the sync
    before any change. Marked entries the definition no longer names are removed;
    entries with another marker (workshops, an admin's own) are never touched.
    """
    mark = owner.DEFINITION
    have_users, have_groups = users(d), groups(d)
    wanted = d.users(accounts)
    members = {a.name: sorted(set(a.users) - set(d.local_users)) for a in accounts}
    owner.claim("accounts", mark, _found("directory group", have_groups, members)
                + _found("directory user", have_users, wanted))
    changed_base = ensure_base(d)
    new_groups = [a for a in members if a not in have_groups]
    new_users = [u for u in wanted if u not in have_users]
    kept = kept_homes(d, new_users, _uids(have_users))
    # A new account's group gets the gid its members' kept homes carry, where they agree
    # and no group or local group has it.
    used_gids = set(_gids(have_users, have_groups)) | local_numbers("gid")
    gids: dict[str, int] = {}
    for g in new_groups:
        carried = {kept[u].st_gid for u in members[g] if u in kept}
        gid = carried.pop() if len(carried) == 1 else None
        if gid is not None and d.uid_min <= gid <= d.uid_max and gid not in used_gids:
            gids[g] = gid
            used_gids.add(gid)
    rest = [g for g in new_groups if g not in gids]
    gids.update(zip(rest, allocate(d, "gid", len(rest), used_gids,
                                   _gids(have_users, have_groups, marked=True)), strict=True))
    gids.update({g: e.number for g, e in have_groups.items()})
    fresh = [u for u in new_users if u not in kept]
    numbers = {u: kept[u].st_uid for u in kept}
    numbers.update(zip(fresh, allocate(d, "uid", len(fresh), [*_uids(have_users), *numbers.values()],
                                       _uids(have_users, marked=True)), strict=True))
    uids = [numbers[u] for u in new_users]
    primary = {u: gids[next(a.name for a in accounts if u in a.users)] for u in new_users}
    add(d, "".join(group_ldif(d, g, gids[g], members[g], mark) for g in new_groups)
        + "".join(user_ldif(d, u, n, primary[u], mark)
                  for u, n in zip(new_users, uids, strict=True)))
    update = [g for g in members if g in have_groups and list(have_groups[g].members) != members[g]]
    for g in update:
        ldap("ldapmodify", d, [], members_ldif(d, g, members[g]))
    gone_users = sorted(u for u, e in have_users.items() if e.tag == mark and u not in wanted)
    gone_groups = sorted(g for g, e in have_groups.items() if e.tag == mark and g not in members)
    delete(d, [user_dn(d, u) for u in gone_users] + [group_dn(d, g) for g in gone_groups])
    return SyncPlan(tuple(new_users), tuple(gone_users), tuple(new_groups), tuple(update),
                    tuple(gone_groups), changed_base)


def claim_members(d: Directory, group: str, names: Sequence[str], tag: str, arg: str) -> None:
    """Refuse (``arg``: one line, nothing changed) if ``group`` or any of ``names`` exists
    in the directory without ``tag``."""
    owner.claim(arg, tag, _found("directory group", groups(d), [group])
                + _found("directory user", users(d), names))


def add_members(d: Directory, group: str, names: Sequence[str], tag: str,
                passwords: dict[str, str]) -> list[str]:
    """Add a group and users ``names`` (missing ones only) with these passwords; the added.
    The group and users that exist must carry ``tag`` (else nothing is changed)."""
    have_users, have_groups = users(d), groups(d)
    owner.claim("name", tag, _found("directory group", have_groups, [group])
                + _found("directory user", have_users, names))
    ensure_base(d)
    new = [n for n in names if n not in have_users]
    ldif = ""
    if group in have_groups:
        gid = have_groups[group].number
    else:
        gid = allocate(d, "gid", 1, _gids(have_users, have_groups),
                       _gids(have_users, have_groups, marked=True))[0]
        ldif += group_ldif(d, group, gid, names, tag)
    uids = allocate(d, "uid", len(new), _uids(have_users), _uids(have_users, marked=True))
    ldif += "".join(user_ldif(d, n, u, gid, tag, ssha(passwords[n]))
                    for n, u in zip(new, uids, strict=True))
    add(d, ldif)
    return new


def tagged(d: Directory, tag: str) -> tuple[list[str], list[str]]:
    """Users and groups carrying ``tag``."""
    return (sorted(u for u, e in users(d).items() if e.tag == tag),
            sorted(g for g, e in groups(d).items() if e.tag == tag))
