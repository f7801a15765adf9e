#!/usr/bin/python3
"""Make a host's cgroup layout one that crun accepts (the containers role; also run at boot).

crun, which runs the container template's tasks, tells the layouts apart as
``libcrun_get_cgroup_mode`` does: ``/sys/fs/cgroup`` is cgroup2 (unified, "v2"), or a
tmpfs holding v1 hierarchies, with cgroup2 mounted at ``/sys/fs/cgroup/unified``
("hybrid") or not ("v1"). In hybrid mode crun refuses every container, whatever its
cgroup manager (``--cgroups disabled`` too), while ``unified/cgroup.controllers`` is not
empty: "cgroups in hybrid mode not supported, drop all controllers from cgroupv2".
A controller is left in cgroup2 when no v1 hierarchy binds it (``hugetlb`` on a host
whose init mounts the others; ``misc`` under a systemd older than the kernel).

The fix is the one systemd applies to every controller it knows in hybrid mode: bind
each left-over controller to a v1 hierarchy of its own at ``/sys/fs/cgroup/<name>``.
The kernel moves a controller out of cgroup2 only while no cgroup below cgroup2's root
uses it and the kernel allows it in v1, so those cases are refused, in one line,
before any change. ``check`` only reads; ``bind`` binds and records what it bound in
the state file; ``unbind`` undoes exactly that (the role's teardown). Standard library
only: it runs on a host before anything of pyhpc is installed there.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

CGROUP = "/sys/fs/cgroup"
UNIFIED = CGROUP + "/unified"
STATE_FILE = "/var/lib/pyhpc/cgroup-v1-bound"
#: cgroup2 names whose v1 hierarchy has another name.
V1_NAME = {"io": "blkio"}
#: Mount options of the hierarchies pyhpc binds, as systemd mounts its own.
MOUNT_OPTIONS = "rw,nosuid,nodev,noexec,relatime"
#: How to run the other layouts, for the refusal's last words.
ADVICE = ("boot with systemd.unified_cgroup_hierarchy=1 (cgroup v2 only) or "
          "with cgroup_no_v1= unset and nothing using the controller in cgroup2")

Runner = Callable[[Sequence[str]], None]


class Refused(Exception):
    """The layout cannot be made one that crun accepts; the message is one line."""


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: where, which filesystem, its options."""

    point: str
    fstype: str
    options: frozenset[str]


@dataclass
class Layout:
    """What crun sees: the mode, and in hybrid mode what cgroup2 still holds."""

    mode: str
    leftover: list[str] = field(default_factory=list)
    v1: dict[str, str] = field(default_factory=dict)
    bind: list[str] = field(default_factory=list)
    refused: str | None = None


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def mounts(root: Path) -> list[Mount]:
    """The mount table of ``root``/proc/self/mountinfo."""
    out = []
    for line in (root / "proc/self/mountinfo").read_text().splitlines():
        left, sep, right = line.partition(" - ")
        head, tail = left.split(), right.split()
        if not sep or len(head) < 6 or len(tail) < 3:
            continue
        options = frozenset(head[5].split(",")) | frozenset(tail[2].split(","))
        out.append(Mount(_unescape(head[4]), tail[0], options))
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def no_v1(cmdline: str) -> set[str]:
    """Controllers the kernel keeps out of v1 (``cgroup_no_v1=all`` or a list)."""
    out: set[str] = set()
    for word in cmdline.split():
        if word.startswith("cgroup_no_v1="):
            out |= set(word.split("=", 1)[1].split(","))
    return out


def enabled_v1(proc_cgroups: str) -> set[str]:
    """Controllers /proc/cgroups lists as enabled."""
    names = set()
    for line in proc_cgroups.splitlines():
        fields = line.split()
        if len(fields) == 4 and not line.startswith("#") and fields[3] == "1":
            names.add(fields[0])
    return names


def read_layout(root: Path = Path("/")) -> Layout:
    """The layout under ``root`` (``/`` on a host; a directory of faked files in tests)."""
    table = mounts(root)
    # The last mount on a path is the one that shows.
    top = {m.point: m for m in table}
    base = top.get(CGROUP)
    if base is None:
        raise Refused(f"no cgroup filesystem is mounted on {CGROUP}; the container runtime needs one")
    if base.fstype == "cgroup2":
        return Layout("v2")
    known = enabled_v1(_read(root / "proc/cgroups"))
    v1 = {name: m.point for m in table if m.fstype == "cgroup" for name in sorted(m.options & known)}
    unified = top.get(UNIFIED)
    if unified is None or unified.fstype != "cgroup2":
        return Layout("v1", v1=v1)
    leftover = _read(root / UNIFIED.lstrip("/") / "cgroup.controllers").split()
    layout = Layout("hybrid", leftover=leftover, v1=v1)
    if not leftover:
        return layout
    used = set(_read(root / UNIFIED.lstrip("/") / "cgroup.subtree_control").split())
    kept_out = no_v1(_read(root / "proc/cmdline"))
    for name in leftover:
        v1_name = V1_NAME.get(name, name)
        point = f"{CGROUP}/{v1_name}"
        if name in used:
            layout.refused = (f"cgroup2 at {UNIFIED} enables the {name} controller for its cgroups "
                              f"(cgroup.subtree_control), so it cannot move to v1 and crun refuses "
                              f"every container on this hybrid host; {ADVICE}")
        elif "all" in kept_out or v1_name in kept_out:
            layout.refused = (f"the kernel keeps {v1_name} out of cgroup v1 (cgroup_no_v1= in "
                              f"/proc/cmdline), so it stays in cgroup2 at {UNIFIED} and crun refuses "
                              f"every container on this hybrid host; {ADVICE}")
        elif v1_name not in known:
            layout.refused = (f"cgroup2 at {UNIFIED} holds {name}, which /proc/cgroups does not list "
                              f"as a v1 controller, so it cannot move to v1 and crun refuses every "
                              f"container on this hybrid host; {ADVICE}")
        elif point in top:
            layout.refused = (f"{point} is already a mount point ({top[point].fstype}), so the "
                              f"{v1_name} controller cannot be bound there; {ADVICE}")
        else:
            layout.bind.append(v1_name)
        if layout.refused:
            layout.bind = []
            break
    return layout


def _run(argv: Sequence[str]) -> None:
    subprocess.run(list(argv), check=True, stdout=subprocess.DEVNULL)


def bind(layout: Layout, root: Path = Path("/"), run: Runner = _run,
         state_file: str = STATE_FILE) -> list[str]:
    """Bind each left-over controller to its own v1 hierarchy; the names bound."""
    if layout.refused:
        raise Refused(layout.refused)
    if not layout.bind:
        return []
    base = next(m for m in reversed(mounts(root)) if m.point == CGROUP)
    # systemd mounts the tmpfs read-only once its hierarchies are in: open it for the
    # mount points, then close it again.
    if "ro" in base.options:
        run(["mount", "-o", "remount,rw", CGROUP])
    try:
        for name in layout.bind:
            (root / CGROUP.lstrip("/") / name).mkdir(mode=0o555, exist_ok=True)
            run(["mount", "-t", "cgroup", "-o", f"{MOUNT_OPTIONS},{name}", "cgroup", f"{CGROUP}/{name}"])
            _record(root / state_file.lstrip("/"), name)
    finally:
        if "ro" in base.options:
            run(["mount", "-o", "remount,ro", CGROUP])
    return list(layout.bind)


def _record(path: Path, name: str) -> None:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    names = recorded(path)
    if name not in names:
        path.write_text("".join(f"{n}\n" for n in [*names, name]))
        path.chmod(0o644)


def recorded(path: Path) -> list[str]:
    """The controllers a ``bind`` recorded (and only valid controller names)."""
    return [w for w in _read(path).split() if w.isascii() and w.isalnum() and w.islower()]


def unbind(root: Path = Path("/"), run: Runner = _run, state_file: str = STATE_FILE) -> list[str]:
    """Undo what ``bind`` recorded: unmount those hierarchies only; the names unbound."""
    path = root / state_file.lstrip("/")
    names = recorded(path)
    top = {m.point: m for m in mounts(root)}
    done = []
    for name in names:
        point = f"{CGROUP}/{name}"
        mount = top.get(point)
        if mount is not None and mount.fstype == "cgroup" and name in mount.options:
            run(["umount", point])
            done.append(name)
        try:
            (root / point.lstrip("/")).rmdir()
        except OSError:
            pass
    path.unlink(missing_ok=True)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyhpc-cgroup-layout", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("check", "bind", "unbind"))
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = Path(args.root)
    try:
        if args.action == "unbind":
            result: dict[str, object] = {"unbound": unbind(root)}
        else:
            try:
                layout = read_layout(root)
            except Refused as exc:
                if args.action == "bind":
                    raise
                layout = Layout("none", refused=str(exc))
            result = asdict(layout)
            if args.action == "bind":
                result["bound"] = bind(layout, root)
    except Refused as exc:
        print(f"pyhpc-cgroup-layout: {exc}", file=sys.stderr)
        return 2
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"pyhpc-cgroup-layout: {args.action} failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
