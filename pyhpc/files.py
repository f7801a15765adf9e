"""Writing files in users' directories: private by default, never through a planted link.

Run directories, submitit folders and rendered scripts may sit on shared storage where
another user can create files. Every write goes through here:

- a new file is written to a fresh temporary name in the same directory
  (``O_CREAT|O_EXCL|O_NOFOLLOW``) and renamed over the target with ``os.replace``, which
  replaces a planted symlink itself instead of writing where it points;
- appends open with ``O_NOFOLLOW`` and refuse anything but a regular file;
- modes are 0600 for files and 0700 for directories, or 0640/0750 when the user opts in
  to sharing with the group (``--group-readable``, or ``PYHPC_GROUP_READABLE=1``, which
  jobs inherit from the submitting shell);
- a directory pyhpc writes into or reads back from passes :func:`safe_dir`, the one
  check (the directory is yours, nobody else can write it or replace it from above);
- a file read back is opened without blocking and must be a regular file
  (:func:`open_regular`), so a planted FIFO or device never hangs a reader;
- a file of root's that one user, and no other, may read gets a POSIX ACL entry for that
  user (:func:`let_read`).
"""
from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import secrets
import stat
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from pyhpc.errors import PyhpcError

GROUP_ENV = "PYHPC_GROUP_READABLE"
#: Linux's POSIX ACL xattr (linux/posix_acl_xattr.h): version, then (tag, perm, id) entries.
ACL_XATTR = "system.posix_acl_access"
ACL_VERSION = 2
USER_OBJ, USER, GROUP_OBJ, MASK, OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
NO_ID = 0xFFFFFFFF


class FileError(PyhpcError):
    """A path pyhpc must write is unusable (a file where a directory belongs, a link...)."""


def group_readable() -> bool:
    return os.environ.get(GROUP_ENV, "") == "1"


def set_group_readable(on: bool) -> None:
    """Opt in (or out) of group-readable output for this process and the jobs it submits."""
    os.environ[GROUP_ENV] = "1" if on else "0"


def file_mode() -> int:
    return 0o640 if group_readable() else 0o600


def dir_mode() -> int:
    return 0o750 if group_readable() else 0o700


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _private_group(gid: int, uid: int) -> bool:
    """A user-private group: named as the user, with no other member listed."""
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(uid).pw_name
    except KeyError:
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


def unmapped_uid() -> int | None:
    """The uid every owner outside this user namespace shows as (a rootless container
    maps only its user: root's directories and other users' alike look like ``nobody``),
    or None in the host's namespace, where every owner shows as themself."""
    try:
        if Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]:
            return None
        return int(Path("/proc/sys/kernel/overflowuid").read_text())
    except (OSError, ValueError):
        return None


def _unsafe(path: Path, info: os.stat_result, target: bool) -> str | None:
    """Why directory ``path`` (the target, or one above it) lets someone else in, or None.

    Above the target, root's directories and the user's own are fine, and so is one that
    others can write if it has the sticky bit (``/tmp``: nobody can rename what is yours
    there). The target itself must be the user's, and only theirs to write. A group
    counts as nobody else when it is the user's private group (Debian's default). In a
    rootless container, a directory above the target whose owner the namespace does not
    show passes as root's would (it cannot tell root from another user there; the
    target must still be the user's, and outside containers real owners are checked).
    """
    me = os.geteuid()
    if info.st_uid != me and (target or info.st_uid not in (0, unmapped_uid())):
        return f"{path} belongs to {_name(info.st_uid)}, not to you"
    sticky = not target and info.st_mode & stat.S_ISVTX
    if info.st_mode & stat.S_IWOTH and not sticky:
        return f"{path} is writable by every user (mode {stat.S_IMODE(info.st_mode):04o})"
    if info.st_mode & stat.S_IWGRP and not sticky and not _private_group(info.st_gid, me):
        return (f"{path} is writable by group {_group(info.st_gid)} "
                f"(mode {stat.S_IMODE(info.st_mode):04o})")
    return None


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def safe_dir(path: str | os.PathLike[str], arg: str = "out", writable: bool = True) -> Path:
    """The one check for a directory pyhpc writes into or later loads from; creates nothing.

    Returns ``path`` resolved (links above it followed; use that path from then on). Refused
    with one :class:`FileError` line: the directory, or one above it, is someone else's or
    writable by others (see :func:`_unsafe`), it is a link or not a directory, or this user
    cannot write in it (or, when it does not exist yet, in the directory that would hold
    it; ``writable=False`` skips this last one, for a directory only read from).
    """
    given = Path(os.path.abspath(path))
    try:
        last = os.lstat(given)
    except FileNotFoundError:
        last = None
    except NotADirectoryError:
        raise FileError(f"{arg}: {path} is under a file, not a directory", arg) from None
    except OSError as exc:
        raise FileError(f"{arg}: cannot use {path} ({exc.strerror})", arg) from None
    if last is not None and stat.S_ISLNK(last.st_mode):
        raise FileError(f"{arg}: {path} is a symbolic link; name the directory itself", arg)
    real = Path(os.path.realpath(given))
    deepest = Path("/")
    for part in [*reversed(real.parents), real]:
        try:
            info = os.stat(part)
        except FileNotFoundError:
            break
        except OSError as exc:
            raise FileError(f"{arg}: cannot use {path} ({part}: {exc.strerror})", arg) from None
        if not stat.S_ISDIR(info.st_mode):
            what = "exists and is not" if part == real else "is under a file, not"
            raise FileError(f"{arg}: {path} {what} a directory", arg)
        why = _unsafe(part, info, target=part == real)
        if why:
            raise FileError(f"{arg}: refusing {given}: {why}; pyhpc writes and reads back "
                            "only in directories that nobody else can write", arg)
        deepest = part
    if writable and not os.access(deepest, os.W_OK | os.X_OK):
        what = "write in" if deepest == real else "create directory"
        raise FileError(f"{arg}: cannot {what} {given} (permission denied in {deepest})", arg)
    return real


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Within: files and directories this process (and a job it submits: Slurm carries the
    umask) creates get the private modes, or the group-readable ones when opted in."""
    old = os.umask(0o027 if group_readable() else 0o077)
    try:
        yield
    finally:
        os.umask(old)


def make_dir(path: str | Path, arg: str = "out", mode: int | None = None) -> Path:
    """Create ``path`` (and parents) with the private directory mode (or ``mode``, which
    it then has whatever the umask), after :func:`safe_dir` accepted it; returns the
    resolved path."""
    path = safe_dir(path, arg)
    try:
        path.mkdir(mode=mode or dir_mode(), parents=True, exist_ok=True)
    except FileExistsError:
        raise FileError(f"{arg}: {path} exists and is not a directory", arg) from None
    except NotADirectoryError:
        raise FileError(f"{arg}: {path} is under a file, not a directory", arg) from None
    except OSError as exc:
        raise FileError(f"{arg}: cannot create directory {path} ({exc.strerror})", arg) from None
    if path.is_symlink() or not path.is_dir():
        raise FileError(f"{arg}: {path} is not a directory", arg)
    if mode is not None and stat.S_IMODE(path.stat().st_mode) != mode:
        path.chmod(mode)
    return safe_dir(path, arg)


def write_with(path: str | Path, writer: Callable[[BinaryIO], object],
               arg: str = "out", mode: int | None = None) -> Path:
    """Write ``path`` atomically through ``writer(fh)``: a private temp file (``mode``, else
    :func:`file_mode`), then rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, mode or file_mode())
    except OSError as exc:
        raise FileError(f"{arg}: cannot write in {path.parent} ({exc.strerror})", arg) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            writer(fh)
        os.replace(tmp, path)
    except IsADirectoryError:
        raise FileError(f"{arg}: {path} is a directory", arg) from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_text(path: str | Path, text: str, arg: str = "out", mode: int | None = None) -> Path:
    """Atomically write ``text`` (UTF-8) to ``path`` (``mode``: see :func:`write_with`)."""
    data = text.encode()
    return write_with(path, lambda fh: fh.write(data), arg, mode)


def append_text(path: str | Path, text: str, arg: str = "out", mode: int | None = None) -> None:
    """Append ``text`` to ``path``, creating it privately; a link or non-file is refused.
    With ``mode`` the file must be this user's, and has exactly that mode afterwards
    (whatever the umask)."""
    # O_NONBLOCK: a FIFO planted at the path must not hang the open (it is refused below).
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags, mode or file_mode())
    except OSError as exc:
        raise FileError(f"{arg}: cannot append to {path} ({exc.strerror}; a symlink is "
                        "never followed)", arg) from None
    with os.fdopen(fd, "ab") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise FileError(f"{arg}: {path} is not a regular file", arg)
        if mode is not None:
            if info.st_uid != os.geteuid():
                raise FileError(f"{arg}: {path} belongs to {_name(info.st_uid)}, not to you", arg)
            if stat.S_IMODE(info.st_mode) != mode:
                os.fchmod(fh.fileno(), mode)
        fh.write(text.encode())


def try_open_regular(path: str | Path) -> tuple[BinaryIO | None, str]:
    """``(file, "")`` for the regular file ``path`` opened for reading, else ``(None, why)``.
    Opened without blocking (a planted FIFO answers at once) and without following a
    link, then checked; only a regular file is ever read."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        return None, f"cannot open it: {exc.strerror}; a symlink is never followed"
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None, "not a regular file"
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), ""


def open_regular(path: str | Path, arg: str = "file") -> BinaryIO:
    """:func:`try_open_regular`, or one :class:`FileError` line saying why not."""
    fh, why = try_open_regular(path)
    if fh is None:
        raise FileError(f"{arg}: cannot read {path} ({why})", arg)
    return fh


def read_owned(path: str | Path, limit: int, arg: str = "file", private: bool = True) -> bytes:
    """The contents of the regular file ``path`` (at most ``limit`` bytes, see
    :func:`read_bytes`) if it is this user's and nobody else can change it: with
    ``private`` nobody else may even read it (mode 0600 or less)."""
    with open_regular(path, arg) as fh:
        info = os.fstat(fh.fileno())
        if info.st_uid != os.geteuid():
            raise FileError(f"{arg}: refusing {path}: it belongs to {_name(info.st_uid)}, "
                            "not to you", arg)
        if stat.S_IMODE(info.st_mode) & (0o077 if private else 0o022):
            what = "private" if private else "writable only by you"
            raise FileError(f"{arg}: refusing {path}: mode {stat.S_IMODE(info.st_mode):04o} "
                            f"is not {what}", arg)
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileError(f"{arg}: {path} is larger than {limit} bytes", arg)
    return data


def read_bytes(path: str | Path, limit: int, arg: str = "file") -> bytes:
    """The contents of the regular file ``path`` (see :func:`open_regular`), at most
    ``limit`` bytes; a larger file is refused."""
    with open_regular(path, arg) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileError(f"{arg}: {path} is larger than {limit} bytes", arg)
    return data


def acl_reader(mode: int, uid: int) -> bytes:
    """An access ACL equal to ``mode`` plus read for user ``uid`` (mask r)."""
    entries = [(USER_OBJ, (mode >> 6) & 7, NO_ID), (USER, 4, uid),
               (GROUP_OBJ, (mode >> 3) & 7, NO_ID), (MASK, 4 | ((mode >> 3) & 7), NO_ID),
               (OTHER, mode & 7, NO_ID)]
    return struct.pack("<I", ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def let_read(path: str | Path, uid: int, arg: str = "store") -> bool:
    """Give ``uid`` read access to ``path`` by ACL; False where the filesystem has none."""
    try:
        os.setxattr(path, ACL_XATTR, acl_reader(os.stat(path).st_mode & 0o777, uid),
                    follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return False
        raise FileError(f"{arg}: cannot give uid {uid} read access to {path} "
                        f"({exc.strerror})", arg) from None
    return True
