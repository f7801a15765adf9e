"""Issue 51 item 5: an image exported for jobs keeps nothing on the host that another
user could use: no setuid or setgid file, no directory or file others can write, no
device or FIFO, every entry root's (the builder's) (pyhpc.containers.build.export)."""
from __future__ import annotations

import io
import os
import stat
import sys
import tarfile
from pathlib import Path

import pytest

from pyhpc.containers import build as container_build
from pyhpc.containers import spec as containers

#: The image's entries: (name, tar type, mode, uid, gid), as an image's layers have them.
ENTRIES = [
    ("./", tarfile.DIRTYPE, 0o755, 0, 0),
    ("usr/bin/su", tarfile.REGTYPE, 0o4755, 0, 0),
    ("usr/bin/wall", tarfile.REGTYPE, 0o2755, 0, 5),          # setgid tty
    ("tmp", tarfile.DIRTYPE, 0o1777, 0, 0),
    ("var/tmp", tarfile.DIRTYPE, 0o1777, 0, 0),
    ("var/local", tarfile.DIRTYPE, 0o2775, 0, 50),            # root:staff, setgid
    ("var/cache/apt/archives/partial", tarfile.DIRTYPE, 0o700, 42, 0),  # _apt's
    ("etc/motd", tarfile.REGTYPE, 0o666, 0, 0),
    ("dev/initctl", tarfile.FIFOTYPE, 0o600, 0, 0),
]
#: Mode bits that let a user other than root use or change an entry.
UNSAFE = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH


def image_tar(outside: Path) -> bytes:
    """A tar as ``podman export`` writes it, with a link to ``outside`` among its entries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, mode, uid, gid in ENTRIES:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid = kind, mode, uid, gid
            data = f"#!/bin/sh\n# {name}\n".encode() if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("etc/outside")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
    return buf.getvalue()


@pytest.fixture
def fake_podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """podman whose ``export`` writes the image tar; the outside file the tar links to."""
    outside = tmp_path / "outside"
    outside.write_text("not the image's\n")
    outside.chmod(0o666)
    (tmp_path / "image.tar").write_bytes(image_tar(outside))
    script = tmp_path / "podman.py"
    script.write_text(
        "import shutil, sys\n"
        "args = sys.argv[1:]\n"
        "if args[0] == 'create':\n    print('cid')\n"
        "elif args[0] == 'export':\n"
        f"    shutil.copyfileobj(open({str(tmp_path / 'image.tar')!r}, 'rb'), sys.stdout.buffer)\n")
    monkeypatch.setattr(container_build, "PODMAN", [sys.executable, str(script)])
    return outside


def entries(root: Path) -> dict[str, os.stat_result]:
    out = {}
    for top, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(top, name)
            out[str(path.relative_to(root))] = path.lstat()
    return out


def test_an_exported_rootfs_has_no_setuid_file_nothing_others_can_write_and_no_device(
        fake_podman: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modes_before_harden: list[int] = []
    harden = container_build.harden

    def watched(rootfs: Path) -> None:
        modes_before_harden.append(stat.S_IMODE(rootfs.stat().st_mode))
        harden(rootfs)

    monkeypatch.setattr(container_build, "harden", watched)
    new = container_build.export(containers.variant("cpu"), "localhost/pyhpc-cpu:x",
                                 tmp_path / "images" / "pyhpc-cpu")
    # Unpacked where only its builder can enter (the tar's own "./" 0755 not applied).
    assert modes_before_harden == [0o700]
    found = entries(new)
    assert {"usr/bin/su", "tmp", "var/tmp", "var/local", "etc/motd", "run/.containerenv",
            "etc/outside"} <= set(found)
    unsafe = {name: oct(stat.S_IMODE(info.st_mode)) for name, info in found.items()
              if not stat.S_ISLNK(info.st_mode) and info.st_mode & UNSAFE}
    assert unsafe == {}
    assert {name for name, info in found.items()
            if (info.st_uid, info.st_gid) != (os.geteuid(), os.getegid())} == set()
    assert "dev/initctl" not in found and "dev" in found
    for name in ("tmp", "var/tmp", "var/local", "usr/bin/su", "usr/bin/wall"):
        assert stat.S_IMODE(found[name].st_mode) == 0o755, name
    assert stat.S_IMODE(found["etc/motd"].st_mode) == 0o644
    assert (new / "usr/bin/su").read_text() == "#!/bin/sh\n# usr/bin/su\n"
    assert stat.S_IMODE(new.stat().st_mode) == 0o755
    # A link is kept as a link, and what it points to outside the tree is left alone.
    assert os.readlink(new / "etc/outside") == str(fake_podman)
    assert stat.S_IMODE(fake_podman.stat().st_mode) == 0o666


def test_harden_strips_a_tree_it_did_not_unpack_itself(tmp_path: Path) -> None:
    """Bits the builder's own tar would never restore (as a user other than root) go too."""
    root = tmp_path / "rootfs"
    (root / "tmp").mkdir(parents=True)
    (root / "tmp").chmod(0o1777)
    tool = root / "mount"
    tool.write_text("")
    tool.chmod(0o6755)
    os.mkfifo(root / "fifo")
    container_build.harden(root)
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o755
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755
    assert not (root / "fifo").exists() and stat.S_IMODE(root.stat().st_mode) == 0o755
