"""Writing files in users' directories: private by default, never through a planted link.

Run directories, submitit folders and rendered scripts may sit on shared storage where
another user can create files. Every write goes through here:

- a new file is written to a fresh temporary name in the same directory
  (``O_CREAT|O_EXCL|O_NOFOLLOW``) and renamed over the target with ``os.replace``, which
  replaces a planted symlink itself instead of writing where it points;
- appends open with ``O_NOFOLLOW`` and refuse anything but a regular file;
- modes are 0600 for files and 0700 for directories, or 0640/0750 when the user opts in
  to sharing with the group (``--group-readable``, or ``PYHPC_GROUP_READABLE=1``, which
  jobs inherit from the submitting shell).
"""
from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from pyhpc.errors import PyhpcError

GROUP_ENV = "PYHPC_GROUP_READABLE"


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


def make_dir(path: str | Path, arg: str = "out") -> Path:
    """Create ``path`` (and parents) with the private directory mode; refuse a non-directory."""
    path = Path(path)
    try:
        path.mkdir(mode=dir_mode(), parents=True, exist_ok=True)
    except FileExistsError:
        raise FileError(f"{arg}: {path} exists and is not a directory", arg) from None
    except NotADirectoryError:
        raise FileError(f"{arg}: {path} is under a file, not a directory", arg) from None
    except OSError as exc:
        raise FileError(f"{arg}: cannot create directory {path} ({exc.strerror})", arg) from None
    if path.is_symlink() or not path.is_dir():
        raise FileError(f"{arg}: {path} is not a directory", arg)
    return path


def write_with(path: str | Path, writer: Callable[[BinaryIO], object],
               arg: str = "out") -> Path:
    """Write ``path`` atomically through ``writer(fh)``: a private temp file, then rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, file_mode())
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


def write_text(path: str | Path, text: str, arg: str = "out") -> Path:
    """Atomically write ``text`` (UTF-8) to ``path``."""
    data = text.encode()
    return write_with(path, lambda fh: fh.write(data), arg)


def append_text(path: str | Path, text: str, arg: str = "out") -> None:
    """Append ``text`` to ``path``, creating it privately; a link or non-file is refused."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, file_mode())
    except OSError as exc:
        raise FileError(f"{arg}: cannot append to {path} ({exc.strerror}; a symlink is "
                        "never followed)", arg) from None
    with os.fdopen(fd, "ab") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise FileError(f"{arg}: {path} is not a regular file", arg)
        fh.write(text.encode())


def check_out(path: str | os.PathLike[str], arg: str = "out") -> Path:
    """``path`` if it is a run directory pyhpc can create or write in; creates nothing.

    Refused with a one-line :class:`~pyhpc.files.FileError`: a file (or a symbolic link)
    where the directory belongs, a path under a file, a directory this user cannot write in.
    """
    path = Path(path)
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise FileError(f"{arg}: {path} is under a file, not a directory", arg) from None
    except OSError as exc:
        raise FileError(f"{arg}: cannot use {path} ({exc.strerror})", arg) from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise FileError(f"{arg}: {path} is a symbolic link; name the directory itself", arg)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise FileError(f"{arg}: {path} exists and is not a directory", arg)
    # The directory, or the nearest one that exists and would hold it.
    where = path if st is not None else next(
        (p for p in path.absolute().parents if p.exists()), Path("/"))
    if not os.access(where, os.W_OK | os.X_OK):
        what = "write in" if where == path else "create directory"
        raise FileError(f"{arg}: cannot {what} {path} (permission denied in {where})", arg)
    return path
