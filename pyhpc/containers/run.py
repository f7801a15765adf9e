"""Start one task inside the framework image: the ``container`` template's launcher.

``python -P -m pyhpc.container_run [--probe] --runtime podman --image DIR [--src DIR]
[--bind PATH]... [--gpus N] -- COMMAND...`` builds the runtime's command line and
replaces itself with it, so the task is the container. The same module serves the
template's check step (``--probe``: start the image once per node before the tasks),
``pyhpc doctor``'s container check, and any researcher's own script.

podman runs each task under crun with ``--cgroups disabled``: the task stays in its
Slurm step's cgroup, so the job's memory, cpuset and device limits hold inside the
image (runc refuses that mode; podman's own cgroup would move the task out). The image's
rootfs is shared by every job, so it is mounted read-only, and its world-writable
``/var/tmp`` and ``/run/lock`` are the container's own tmpfs (podman's default set fails
for a rootless user with one uid mapped); ``/tmp`` is the host's, as in a bare job.
A researcher's podman is rootless (their uid is the container's root) and cannot make a
mount point in the root-owned rootfs: the submit directory and each bind are mounted,
at the same path, through the deepest directory above them that the image has
(``/home`` for ``/home/alice/run``; the spec's ``mount_points`` list them). podman runs
without ``XDG_RUNTIME_DIR``: sbatch carries the login session's ``/run/user/UID`` to
nodes where it does not exist.

Failures are one line (``pyhpc: ...``) and an exit status: 2 for a request that cannot
work (no image, a path the runtime's mount syntax would split), 3 when ``--probe``
could not start the image on this node.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

#: Exit statuses: a request that cannot work, and a runtime that cannot start.
BAD_REQUEST = 2
CANNOT_START = 3
#: The probe's own command, present in every Debian image.
PROBE_COMMAND = ("/bin/true",)
#: Seconds a probe may take before it counts as failed.
PROBE_TIMEOUT_S = 120
#: Characters that split a mount specification: podman's ``SRC:DST[:OPTS]``; apptainer's
#: ``--bind`` also takes a comma-separated list.
SEPARATORS = {"podman": ":", "apptainer": ":,"}
#: The job's environment that every task needs inside the image.
PODMAN_ENV = ("SLURM_*", "SLURMD_*", "MASTER_*", "PYHPC_*", "NCCL_*", "TORCH_*",
              "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
PODMAN = ("podman", "--storage-driver", "vfs", "--runtime", "crun", "--cgroup-manager", "cgroupfs",
          "--events-backend", "file")
PODMAN_RUN = ("run", "--rm", "--cgroups", "disabled", "--read-only", "--read-only-tmpfs=false",
              "--tmpfs", "/var/tmp:rw,mode=1777", "--tmpfs", "/run/lock:rw,mode=1777", "--log-driver", "none",
              "--network", "host", "--ipc", "host", "--ulimit", "nofile=4096:4096",
              "--ulimit", "nproc=4096:4096")


class LaunchError(Exception):
    """The request cannot work; the message is the one line a job log shows."""


def refuse_separators(runtime: str, paths: Sequence[str]) -> None:
    """A mount source with the runtime's list separator would mount something else."""
    for path in paths:
        bad = sorted({c for c in path if c in SEPARATORS[runtime]})
        if bad:
            raise LaunchError(f"{path!r} contains {' and '.join(repr(c) for c in bad)}, which "
                              f"{runtime}'s mount syntax splits on; use a path without it")


def mount_point(rootfs: Path, path: str) -> str:
    """The deepest directory at or above ``path`` that the image has (``/`` at most)."""
    here = Path(path)
    while here != here.parent and not (rootfs / here.relative_to("/")).is_dir():
        here = here.parent
    return str(here)


def podman_argv(image: Path, workdir: str, src: str, binds: Sequence[str], gpus: int,
                command: Sequence[str]) -> list[str]:
    """podman's command line for one task (see the module's docstring)."""
    rootfs, env_file = image / "rootfs", image / "env"
    if not rootfs.is_dir() or not env_file.is_file():
        raise LaunchError(f"image {image} has no rootfs/ and env (build it with `make containers` "
                          "or `pyhpc containers build`)")
    volumes = ["/tmp:/tmp", f"{src}:{src}:ro"]
    for path in (workdir, *binds):
        if path == "/":
            continue
        # Where the image lacks the directory, podman would have to create it in the
        # shared rootfs: mount the deepest one it has (as itself where that is /).
        point = mount_point(rootfs, path)
        point = path if point == "/" else point
        if f"{point}:{point}" not in volumes:
            volumes.append(f"{point}:{point}")
    argv = ["env", "-u", "XDG_RUNTIME_DIR", *PODMAN, *PODMAN_RUN]
    argv += ["--device", "nvidia.com/gpu=all"] if gpus > 0 else []
    argv += ["--env-file", str(env_file)]
    for name in PODMAN_ENV:
        argv += ["--env", name]
    argv += ["--env", f"PYTHONPATH={src}", "--workdir", workdir]
    for volume in volumes:
        argv += ["--volume", volume]
    return [*argv, "--rootfs", str(rootfs), *command]


def apptainer_argv(image: Path, workdir: str, src: str, binds: Sequence[str],
                   command: Sequence[str]) -> list[str]:
    """apptainer's command line for one task (``--nv`` binds the node's driver, if any)."""
    if not image.is_file():
        raise LaunchError(f"image {image} is not a file (build the .sif with apptainer build)")
    argv = ["apptainer", "exec", "--nv", "--env", f"PYTHONPATH={src}", "--bind", workdir,
            "--pwd", workdir, "--bind", f"{src}:{src}:ro"]
    for path in binds:
        argv += ["--bind", path]
    return [*argv, str(image), *command]


def build(args: argparse.Namespace) -> list[str]:
    """The runtime's command line for ``args``; :class:`LaunchError` if it cannot work."""
    workdir = args.workdir or os.environ.get("SLURM_SUBMIT_DIR") or os.getcwd()
    command = list(args.command or PROBE_COMMAND)
    if command[0] == "--":
        command = command[1:] or list(PROBE_COMMAND)
    refuse_separators(args.runtime, [workdir, args.src, *args.bind])
    if args.runtime == "podman":
        return podman_argv(Path(args.image), workdir, args.src, args.bind, args.gpus, command)
    return apptainer_argv(Path(args.image), workdir, args.src, args.bind, command)


def reason(stderr: str) -> str:
    """The runtime's own last word: its last line, without its ``Error:`` prefix."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "no message"
    return last.removeprefix("Error: ")[:400]


def probe(argv: Sequence[str]) -> int:
    """Start the image once (its output passes through); on failure print why in one line
    (stdout) and return 3."""
    where = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, errors="replace",
                              timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"{argv[0]}: {exc.strerror}" if isinstance(exc, OSError) else f"no start in {exc.timeout:.0f} s"
    else:
        if proc.returncode == 0:
            return 0
        why = reason(proc.stderr)
    print(f"pyhpc: the container runtime cannot start the image on {where}: {why}", flush=True)
    return CANNOT_START


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -P -m pyhpc.container_run", description=__doc__.split("\n")[0])
    p.add_argument("--runtime", choices=tuple(SEPARATORS), default="podman")
    p.add_argument("--image", required=True, help="podman: the exported image dir; apptainer: a .sif")
    p.add_argument("--src", default="/opt/pyhpc/src", help="pyhpc's source, mounted read-only")
    p.add_argument("--bind", action="append", default=[], help="a host path mounted at the same path")
    p.add_argument("--workdir", help="working directory (default: the submit directory), mounted")
    p.add_argument("--gpus", type=int, default=0, help="GPUs of this task's node (podman: CDI devices)")
    p.add_argument("--probe", action="store_true",
                   help="start the image once (COMMAND, default /bin/true); one line if it cannot")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        command = build(args)
    except LaunchError as exc:
        print(f"pyhpc: {exc}", flush=True)
        return BAD_REQUEST
    if args.probe:
        return probe(command)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"pyhpc: cannot run {command[0]}: {exc.strerror}", flush=True)
    return CANNOT_START

