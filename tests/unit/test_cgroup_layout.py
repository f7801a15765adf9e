"""The containers role's cgroup layout program on each layout, with the host's files faked.

pure v2, pure v1, and hybrid with or without controllers left in cgroup2 (the layout
crun refuses); the refusals are one line and change nothing.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from by_path import load

layout = load("pyhpc_cgroup_layout", "ansible/roles/containers/files/pyhpc_cgroup_layout.py")

V1 = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids")
PROC_CGROUPS = "#subsys_name\thierarchy\tnum_cgroups\tenabled\n" + "".join(
    f"{name}\t{i}\t1\t1\n" for i, name in enumerate(V1, 1)) + "hugetlb\t0\t1\t1\nmisc\t0\t1\t1\n"


def mountinfo_line(i: int, point: str, fstype: str, options: str, mount_options: str = "rw") -> str:
    return (f"{30 + i} 25 0:{30 + i} / {point} {mount_options},nosuid,nodev,noexec - "
            f"{fstype} {fstype} {options}\n")


def fake_host(root: Path, mode: str, cgroup2: str = "", subtree: str = "", cmdline: str = "quiet",
              base_options: str = "rw", v1: Sequence[str] = V1) -> Path:
    """A host's /proc and /sys/fs/cgroup files for ``mode``: v2, v1 or hybrid."""
    lines = [mountinfo_line(0, "/", "ext4", "rw")]
    if mode == "v2":
        lines.append(mountinfo_line(1, "/sys/fs/cgroup", "cgroup2", "rw,nsdelegate"))
    else:
        lines.append(mountinfo_line(1, "/sys/fs/cgroup", "tmpfs", "rw,mode=755", base_options))
        lines += [mountinfo_line(i, f"/sys/fs/cgroup/{name}", "cgroup", f"rw,{name}")
                  for i, name in enumerate(v1, 2)]
        lines.append(mountinfo_line(20, "/sys/fs/cgroup/systemd", "cgroup", "rw,xattr,name=systemd"))
    if mode == "hybrid":
        lines.append(mountinfo_line(21, "/sys/fs/cgroup/unified", "cgroup2", "rw,nsdelegate"))
        unified = root / "sys/fs/cgroup/unified"
        unified.mkdir(parents=True)
        (unified / "cgroup.controllers").write_text(cgroup2 + "\n" if cgroup2 else "")
        (unified / "cgroup.subtree_control").write_text(subtree + "\n" if subtree else "")
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text("".join(lines))
    (root / "proc/cgroups").write_text(PROC_CGROUPS)
    (root / "proc/cmdline").write_text(cmdline + "\n")
    return root


class Mounts:
    """Records the mount commands ``bind`` and ``unbind`` would run."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> None:
        self.calls.append(list(argv))


def test_pure_v2_needs_nothing(tmp_path: Path) -> None:
    found = layout.read_layout(fake_host(tmp_path, "v2"))
    assert (found.mode, found.bind, found.refused) == ("v2", [], None)


def test_pure_v1_needs_nothing(tmp_path: Path) -> None:
    found = layout.read_layout(fake_host(tmp_path, "v1"))
    assert (found.mode, found.bind, found.refused) == ("v1", [], None)
    assert found.v1["memory"] == "/sys/fs/cgroup/memory"


def test_hybrid_with_an_empty_cgroup2_needs_nothing(tmp_path: Path) -> None:
    found = layout.read_layout(fake_host(tmp_path, "hybrid"))
    assert (found.mode, found.leftover, found.bind, found.refused) == ("hybrid", [], [], None)


def test_hybrid_with_hugetlb_left_in_cgroup2_binds_it_to_v1(tmp_path: Path) -> None:
    """The fresh machine of issue 20: hugetlb alone in cgroup2, and crun refused."""
    root = fake_host(tmp_path, "hybrid", cgroup2="hugetlb")
    found = layout.read_layout(root)
    assert (found.mode, found.leftover, found.bind, found.refused) == ("hybrid", ["hugetlb"],
                                                                      ["hugetlb"], None)
    mounts = Mounts()
    assert layout.bind(found, root, mounts) == ["hugetlb"]
    assert mounts.calls == [["mount", "-t", "cgroup", "-o", "rw,nosuid,nodev,noexec,relatime,hugetlb",
                             "cgroup", "/sys/fs/cgroup/hugetlb"]]
    assert (root / "sys/fs/cgroup/hugetlb").is_dir()
    assert (root / "var/lib/pyhpc/cgroup-v1-bound").read_text() == "hugetlb\n"


def test_io_is_bound_under_its_v1_name_blkio(tmp_path: Path) -> None:
    root = fake_host(tmp_path, "hybrid", cgroup2="io misc", v1=[n for n in V1 if n != "blkio"])
    assert layout.read_layout(root).bind == ["blkio", "misc"]


def test_a_read_only_cgroup_tmpfs_is_opened_for_the_mount_point_and_closed_again(tmp_path: Path) -> None:
    """systemd mounts /sys/fs/cgroup read-only once its own hierarchies are in."""
    root = fake_host(tmp_path, "hybrid", cgroup2="misc", base_options="ro")
    mounts = Mounts()
    layout.bind(layout.read_layout(root), root, mounts)
    assert [c[:3] for c in mounts.calls] == [["mount", "-o", "remount,rw"], ["mount", "-t", "cgroup"],
                                             ["mount", "-o", "remount,ro"]]


@pytest.mark.parametrize(("host", "why"), [
    ({"cgroup2": "hugetlb memory", "subtree": "memory"},
     "cgroup2 at /sys/fs/cgroup/unified enables the memory controller for its cgroups"),
    ({"cgroup2": "hugetlb", "cmdline": "quiet cgroup_no_v1=hugetlb,net_cls"},
     "the kernel keeps hugetlb out of cgroup v1 (cgroup_no_v1= in /proc/cmdline)"),
    ({"cgroup2": "hugetlb", "cmdline": "cgroup_no_v1=all"},
     "the kernel keeps hugetlb out of cgroup v1"),
    ({"cgroup2": "rdma"}, "cgroup2 at /sys/fs/cgroup/unified holds rdma, which /proc/cgroups does not list"),
])
def test_a_layout_no_binding_can_fix_is_refused_in_one_line_before_any_change(
        tmp_path: Path, host: dict[str, str], why: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = fake_host(tmp_path, "hybrid", **host)
    found = layout.read_layout(root)
    assert found.bind == [] and found.refused.startswith(why)
    assert "\n" not in found.refused
    mounts = Mounts()
    with pytest.raises(layout.Refused):
        layout.bind(found, root, mounts)
    assert mounts.calls == [] and not (root / "var/lib/pyhpc").exists()
    # check reports it for the role's assert; bind refuses with exit 2 and one line.
    assert layout.main(["check", "--root", str(root)]) == 0
    assert json.loads(capsys.readouterr().out)["refused"] == found.refused
    assert layout.main(["bind", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pyhpc-cgroup-layout: " + why)


def test_a_mount_point_taken_by_something_else_is_refused(tmp_path: Path) -> None:
    root = fake_host(tmp_path, "hybrid", cgroup2="hugetlb")
    with (root / "proc/self/mountinfo").open("a") as out:
        out.write(mountinfo_line(40, "/sys/fs/cgroup/hugetlb", "tmpfs", "rw"))
    assert layout.read_layout(root).refused.startswith("/sys/fs/cgroup/hugetlb is already a mount point")


def test_no_cgroup_filesystem_at_all_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(mountinfo_line(0, "/", "ext4", "rw"))
    assert layout.main(["check", "--root", str(root)]) == 0
    assert json.loads(capsys.readouterr().out)["refused"].startswith("no cgroup filesystem is mounted")


def test_unbind_undoes_only_what_bind_recorded(tmp_path: Path) -> None:
    root = fake_host(tmp_path, "hybrid", cgroup2="hugetlb")
    layout.bind(layout.read_layout(root), root, Mounts())
    # Now mounted, as the kernel would show it; and a hierarchy pyhpc did not bind.
    with (root / "proc/self/mountinfo").open("a") as out:
        out.write(mountinfo_line(41, "/sys/fs/cgroup/hugetlb", "cgroup", "rw,hugetlb"))
    mounts = Mounts()
    assert layout.unbind(root, mounts) == ["hugetlb"]
    assert mounts.calls == [["umount", "/sys/fs/cgroup/hugetlb"]]
    assert not (root / "var/lib/pyhpc/cgroup-v1-bound").exists()
    assert not (root / "sys/fs/cgroup/hugetlb").exists()
    assert layout.unbind(root, mounts) == [] and len(mounts.calls) == 1


def test_the_state_file_cannot_smuggle_a_path_into_unbind(tmp_path: Path) -> None:
    root = fake_host(tmp_path, "hybrid")
    state = root / "var/lib/pyhpc/cgroup-v1-bound"
    state.parent.mkdir(parents=True)
    state.write_text("../../../../etc\n/sys/fs/cgroup/memory\n")
    mounts = Mounts()
    assert layout.unbind(root, mounts) == []
    assert mounts.calls == []
