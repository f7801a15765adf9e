"""The job templates' launcher: standard library only, so it runs in any Python (a
researcher's own venv with only torch in it, or pyhpc's), and the job script carries it
(``python -P -c "$PYHPC_LAUNCH" ...``): nothing of pyhpc needs to be installed where the
tasks run.

``--store``: host the job's rendezvous store (a torch ``TCPStore``) on a port the kernel
picks, print the port, and hold it until killed. The batch script runs this on the job's
first node before it starts any task, so the port is the job's own before anyone learns
it: no other user's process can have bound it first, which a port derived from the job
id could not promise (anyone can read job ids; a squatter's store would be the one the
ranks joined, and torch's rendezvous unpickles what its store holds).

``SCRIPT|-m MODULE [ARGS]``: export torch.distributed's variables from Slurm's (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; MASTER_ADDR/PORT as the batch script set them,
every rank a client of the job's store), then run the program, so a script written for
torchrun also runs under plain srun. Under torchrun its agent has set them already. The
program's own directory goes first on the import path, as ``python SCRIPT`` does; for
``-m`` the working directory only when nobody else can write it or a directory above it.
"""
from __future__ import annotations

import os
import re
import runpy
import signal
import socket
import stat
import sys
from collections.abc import Mapping, MutableMapping

#: What the templates wait for the store's port (s): torch's import on a cold node.
STORE_START_S = 120


class LaunchError(Exception):
    """One line for the job's output: what is wrong and what to do."""


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """The task count of node ``node_id`` in Slurm's ``SLURM_TASKS_PER_NODE`` form
    (``2(x3),1``: three nodes of 2 tasks, then one of 1)."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise LaunchError(f"pyhpc: cannot read SLURM_TASKS_PER_NODE={tasks_per_node!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if not 0 <= node_id < len(counts):
        raise LaunchError(f"pyhpc: SLURM_NODEID={node_id} is not in "
                          f"SLURM_TASKS_PER_NODE={tasks_per_node!r}")
    return counts[node_id]


def distributed_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables torch.distributed's ``env://`` reads, for this task.

    Under torchrun (``TORCHELASTIC_RUN_ID``) none: its agent set them. Outside Slurm, or
    a job's only task with no store, one process on its own (port 0: its store binds a
    free port, as nobody joins it). In a
    Slurm task, the rank layout from Slurm, and MASTER_ADDR/PORT from the batch script,
    whose ``--store`` holds the port: every rank joins it as a client
    (``TORCHELASTIC_USE_AGENT_STORE``), so no rank ever binds a port another user could
    have taken first.
    """
    if "TORCHELASTIC_RUN_ID" in environ:
        return {}
    if "SLURM_JOB_ID" not in environ or "SLURM_PROCID" not in environ:
        return {key: environ.get(key, default) for key, default in (
            ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "0"))}
    missing = [key for key in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(key)]
    if missing and environ.get("SLURM_NTASKS", "1") == "1":
        return distributed_env({k: v for k, v in environ.items() if not k.startswith("SLURM_")})
    if missing:
        raise LaunchError(
            f"pyhpc: {' and '.join(missing)} not set in job {environ['SLURM_JOB_ID']}: start "
            "the tasks from a pyhpc job script, whose first node holds the job's rendezvous store")
    node_id = int(environ.get("SLURM_NODEID", "0"))
    local = environ.get("SLURM_TASKS_PER_NODE")
    return {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": environ.get("SLURM_NTASKS", "1"),
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(tasks_on_node(local, node_id)) if local else "1",
        "MASTER_ADDR": environ["MASTER_ADDR"],
        "MASTER_PORT": environ["MASTER_PORT"],
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def export_env(environ: MutableMapping[str, str] = os.environ) -> None:
    """Export :func:`distributed_env` into ``environ``, Slurm's layout over what was there."""
    environ.update(distributed_env(environ))


def _unsafe(path: str, info: os.stat_result, target: bool, me: int, others: int | None) -> bool:
    """Whether directory ``path`` lets someone else in: the target must be this user's and
    writable by nobody else; a directory above it may also be root's (or, in a rootless
    container, the namespace's overflow owner), and others' to write only if sticky."""
    if info.st_uid != me and (target or info.st_uid not in (0, others)):
        return True
    sticky = not target and bool(info.st_mode & stat.S_ISVTX)
    return bool(info.st_mode & (stat.S_IWOTH | stat.S_IWGRP)) and not sticky


def _overflow_uid() -> int | None:
    """The owner every uid outside a rootless container's namespace shows as, or None."""
    try:
        with open("/proc/self/uid_map") as f:
            if f.read().split() == ["0", "0", "4294967295"]:
                return None
        with open("/proc/sys/kernel/overflowuid") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def private_dir(path: str) -> bool:
    """Whether ``path`` and every directory above it are safe to import from: nobody else
    can plant a module there (group-writable counts as others: a stricter rule than
    pyhpc's own checks, which this launcher cannot import)."""
    real = os.path.realpath(path)
    me, others = os.geteuid(), _overflow_uid()
    parts = [real]
    while parts[-1] != os.path.dirname(parts[-1]):
        parts.append(os.path.dirname(parts[-1]))
    for part in parts:
        try:
            info = os.stat(part)
        except OSError:
            return False
        if not stat.S_ISDIR(info.st_mode) or _unsafe(part, info, part == real, me, others):
            return False
    return True


def import_path(argv: list[str], cwd: str) -> list[str]:
    """What goes first on the import path for ``argv``: a script's own directory; for
    ``-m MODULE`` the working directory, only when :func:`private_dir` says so."""
    if argv[0] != "-m":
        return [os.path.dirname(os.path.abspath(argv[0]))]
    return [str(cwd)] if private_dir(cwd) else []


def run(argv: list[str]) -> None:
    """Run a script or ``-m module`` as ``python`` would, with :func:`export_env` done."""
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise LaunchError("pyhpc: usage: python -P -c \"$PYHPC_LAUNCH\" SCRIPT|-m MODULE [ARGS...]")
    sys.path[:0] = import_path(argv, os.getcwd())
    export_env()
    if argv[0] != "-m":
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
        return
    import importlib.util

    top = argv[1].split(".")[0]
    if importlib.util.find_spec(top) is None:
        raise LaunchError(
            f"pyhpc: no module named {top!r} on the import path; the working directory "
            f"{os.getcwd()} is on it only when nobody else can write it: install your code "
            "or set PYTHONPATH")
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


def host_store() -> None:
    """Bind the job's store on a port the kernel chooses, print it, hold it until killed."""
    from datetime import timedelta

    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported from C
    except ImportError as exc:
        raise LaunchError(f"pyhpc: {sys.executable} cannot host the job's rendezvous store: "
                          f"{exc}; use a Python that has torch") from None
    addr = os.environ.get("MASTER_ADDR") or socket.gethostname()
    try:
        socket.getaddrinfo(addr, None)  # the store's own client would retry for minutes
    except OSError as exc:
        raise LaunchError(f"pyhpc: cannot host the job's rendezvous store on {addr}: "
                          f"{exc.strerror}") from None
    try:
        store = TCPStore(addr, 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=STORE_START_S))
    except (RuntimeError, ValueError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LaunchError(f"pyhpc: cannot host the job's rendezvous store on {addr}: "
                          f"{first}") from None
    # Before the port is told: whoever reads it may stop the store at once.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(store.port, flush=True)
    while True:
        signal.pause()


def main(argv: list[str]) -> None:
    try:
        if argv[:1] == ["--store"]:
            host_store()
        else:
            run(argv)
    except LaunchError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
