"""A new workshop participant's home, made at ``workshop create`` as pam_mkhomedir would
make it at a first ssh login (from /etc/skel, private), with the workshop's notebooks in
``~/workshop``.

A participant who only ever uses the hub never logs in through PAM's session (the hub
is no root and opens none), so nothing else would make their home; and made here, the
notebooks are there whichever door the participant comes through. Made by root before
the participant can log in; every path is created by root first and handed over last,
links are copied as links and never followed.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyhpc import paths
from pyhpc.admin import directory

#: Where homes are (tests point it elsewhere).
ROOT = Path(directory.HOME)
SKEL = Path("/etc/skel")
#: The notebooks a participant gets, and where in their home.
NOTEBOOKS = paths.WORKSHOPS
WORKSHOP_DIR = "workshop"
#: How a path is handed over (never through a link). Tests replace it.
CHOWN = os.lchown


def notebooks(source: Path = NOTEBOOKS) -> list[Path]:
    """The workshop's notebooks: the regular ``*.ipynb`` files of ``source``, sorted."""
    return sorted(p for p in source.glob("*.ipynb") if p.is_file() and not p.is_symlink())


def _private(path: Path, uid: int, gid: int) -> None:
    """Hand ``path`` (never a link's target) to uid:gid, for them alone (umask 077)."""
    info = path.lstat()
    if not path.is_symlink():
        os.chmod(path, info.st_mode & 0o700)
    CHOWN(path, uid, gid)


def make(user: str, uid: int, gid: int, files: Sequence[Path], skel: Path = SKEL,
         texts: Mapping[str, str] | None = None) -> Path | None:
    """Make ``user``'s home with /etc/skel's files, and ``files`` and ``texts`` (name ->
    text: the README) in ~/workshop, all theirs and private; None when the home exists
    already (it is left as it is)."""
    home = ROOT / user
    try:
        os.mkdir(home, 0o700)
    except FileExistsError:
        return None
    if skel.is_dir():
        shutil.copytree(skel, home, symlinks=True, dirs_exist_ok=True)
    target = home / WORKSHOP_DIR
    target.mkdir(mode=0o700, exist_ok=True)
    for source in files:
        shutil.copyfile(source, target / source.name, follow_symlinks=False)
    for name, text in (texts or {}).items():
        (target / name).write_text(text)  # in a directory only root can enter yet
    for top, dirs, names in os.walk(home, topdown=False):
        for name in names + dirs:
            _private(Path(top) / name, uid, gid)
    _private(home, uid, gid)  # last: until now, only root could enter it
    return home
