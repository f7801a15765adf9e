"""The jobs running on this host and what they use, read from the cgroups Slurm made.

cgroup v1 (Slurm's ``cgroup/v1``): ``<controller>/slurm/uid_<uid>/job_<id>`` in the
``memory``, ``cpuacct`` and ``devices`` hierarchies. Several slurmd on one host (the lab's
``slurmd -N``) each have their own ``slurm_<node>`` directory instead of ``slurm``.
cgroup v2 (``cgroup/v2``): ``system.slice/slurmstepd.scope/job_<id>``, or
``<node>_slurmstepd.scope`` for one of several slurmd. Every file read here is
world-readable, so the exporter needs no privilege.

A figure the tree does not have is None, never 0: with ``JobAcctGatherType=
jobacct_gather/linux`` v1 has no ``cpuacct`` directory for jobs, and ``memory.peak``
came with Linux 5.19. The figures are those cgroup_exporter (Jobstats' fork) reads from the
same files, so :mod:`pyhpc.monitor.job_exporter` can give them its names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pyhpc import files

ROOT = Path("/sys/fs/cgroup")
#: NVIDIA's character-device major number; minors 254 and 255 are nvidia-modeset and
#: nvidiactl, which every GPU job opens and which are no GPU.
NVIDIA_MAJOR = 195
NOT_A_GPU = (254, 255)
#: Largest cgroup file read (devices.list of a job lists a few dozen lines).
READ_LIMIT = 64 << 10
#: A v1 memory limit at or above this is the kernel's "no limit" (PAGE_COUNTER_MAX).
NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class JobUsage:
    """One job on one node of this host, as its cgroup shows it now."""

    node: str
    job_id: str
    uid: int | None
    cpu_seconds: float | None
    memory_bytes: int | None
    memory_peak_bytes: int | None
    #: NVIDIA minors the job may open (v1 devices.list); None: not restricted, or not known.
    gpu_minors: frozenset[int] | None = None
    cpu_user_seconds: float | None = None
    cpu_system_seconds: float | None = None
    #: Anonymous memory (v1 ``total_rss``, v2 ``anon`` plus ``swapcached``) and page cache.
    memory_rss_bytes: int | None = None
    memory_cache_bytes: int | None = None
    #: Shared memory (tmpfs, /dev/shm): jobstats counts it as used beside the RSS.
    memory_shmem_bytes: int | None = None
    #: The job's memory limit; None where it has none.
    memory_limit_bytes: int | None = None


def read_text(path: Path) -> str | None:
    """A small cgroup file's text, or None if it is not there (a job that just ended)."""
    fh, _ = files.try_open_regular(path)
    if fh is None:
        return None
    try:
        with fh:
            return fh.read(READ_LIMIT).decode("ascii", "replace")
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    return int(text) if text is not None and text.strip().isdigit() else None


def stat_value(text: str | None, key: str) -> int | None:
    """One ``key value`` line of a ``cpu.stat`` or ``memory.stat``; None if absent."""
    match = re.search(rf"^{re.escape(key)} (\d+)$", text or "", re.M)
    return int(match.group(1)) if match else None


def cpu_stat_seconds(text: str | None, key: str = "usage_usec") -> float | None:
    """``usage_usec`` (or ``user_usec``, ``system_usec``) of a v2 ``cpu.stat``, in seconds."""
    value = stat_value(text, key)
    return value / 1e6 if value is not None else None


def _seconds_ns(value: int | None) -> float | None:
    return value / 1e9 if value is not None else None


def _limit(value: int | None) -> int | None:
    return value if value is not None and value < NO_LIMIT else None


def allowed_gpu_minors(devices_list: str | None) -> frozenset[int] | None:
    """The NVIDIA minors a v1 ``devices.list`` allows (``c 195:1 rwm``); None if it allows
    every device or every NVIDIA minor (``a *:* rwm``, ``c 195:* rwm``): no restriction
    says nothing about which GPUs a job holds."""
    if devices_list is None:
        return None
    minors: set[int] = set()
    for line in devices_list.splitlines():
        kind, _, rest = line.partition(" ")
        numbers = rest.split(" ")[0]
        major, _, minor = numbers.partition(":")
        if kind == "a" or (kind in ("c", "a") and major in ("*", str(NVIDIA_MAJOR))
                           and minor == "*"):
            return None
        if kind == "c" and major == str(NVIDIA_MAJOR) and minor.isdigit() \
                and int(minor) not in NOT_A_GPU:
            minors.add(int(minor))
    return frozenset(minors)


def _node(directory: str, suffix_form: bool, host_node: str) -> str:
    """The node a slurmd directory belongs to: ``slurm_<node>`` (v1) or
    ``<node>_slurmstepd.scope`` (v2), else this host's node."""
    if suffix_form:
        node = directory.removesuffix("slurmstepd.scope").removesuffix("_")
    else:
        node = directory.removeprefix("slurm").removeprefix("_")
    return node or host_node


def _job_dirs(base: Path, pattern: str) -> list[Path]:
    try:
        return sorted(p for p in base.glob(pattern) if p.is_dir())
    except OSError:
        return []


def read_v1(root: Path, host_node: str) -> list[JobUsage]:
    """Jobs under ``memory`` and ``cpuacct`` (``cpu,cpuacct`` where merged)."""
    cpu_root = root / "cpuacct" if (root / "cpuacct").is_dir() else root / "cpu,cpuacct"
    found: dict[tuple[str, str, str], None] = {}
    for hierarchy in (root / "memory", cpu_root):
        for job_dir in _job_dirs(hierarchy, "slurm*/uid_*/job_*"):
            found[(job_dir.parent.parent.name, job_dir.parent.name, job_dir.name)] = None
    out = []
    for slurm_dir, uid_dir, job_name in found:
        rel = Path(slurm_dir, uid_dir, job_name)
        cpu, memory = cpu_root / rel, root / "memory" / rel
        stat = read_text(memory / "memory.stat")
        uid = uid_dir.removeprefix("uid_")
        out.append(JobUsage(
            node=_node(slurm_dir, False, host_node), job_id=job_name.removeprefix("job_"),
            uid=int(uid) if uid.isdigit() else None,
            cpu_seconds=_seconds_ns(read_int(cpu / "cpuacct.usage")),
            memory_bytes=read_int(memory / "memory.usage_in_bytes"),
            memory_peak_bytes=read_int(memory / "memory.max_usage_in_bytes"),
            gpu_minors=allowed_gpu_minors(read_text(root / "devices" / rel / "devices.list")),
            cpu_user_seconds=_seconds_ns(read_int(cpu / "cpuacct.usage_user")),
            cpu_system_seconds=_seconds_ns(read_int(cpu / "cpuacct.usage_sys")),
            memory_rss_bytes=stat_value(stat, "total_rss"),
            memory_cache_bytes=stat_value(stat, "total_cache"),
            memory_shmem_bytes=stat_value(stat, "total_shmem"),
            memory_limit_bytes=_limit(read_int(memory / "memory.limit_in_bytes"))))
    return out


def read_v2(root: Path, host_node: str) -> list[JobUsage]:
    """Jobs under ``system.slice/*slurmstepd.scope`` (v2 has no device allow-list file:
    its device controller is an eBPF program; GPUs come from Slurm's GRES index)."""
    out = []
    for job_dir in _job_dirs(root / "system.slice", "*slurmstepd.scope/job_*"):
        cpu, stat = read_text(job_dir / "cpu.stat"), read_text(job_dir / "memory.stat")
        anon = stat_value(stat, "anon")
        out.append(JobUsage(
            node=_node(job_dir.parent.name, True, host_node),
            job_id=job_dir.name.removeprefix("job_"), uid=None,
            cpu_seconds=cpu_stat_seconds(cpu),
            memory_bytes=read_int(job_dir / "memory.current"),
            memory_peak_bytes=read_int(job_dir / "memory.peak"),
            cpu_user_seconds=cpu_stat_seconds(cpu, "user_usec"),
            cpu_system_seconds=cpu_stat_seconds(cpu, "system_usec"),
            memory_rss_bytes=anon + (stat_value(stat, "swapcached") or 0)
            if anon is not None else None,
            memory_cache_bytes=stat_value(stat, "file"),
            memory_shmem_bytes=stat_value(stat, "shmem"),
            memory_limit_bytes=read_int(job_dir / "memory.max")))  # "max": None, no limit
    return out


def version(root: Path = ROOT) -> int:
    """2 on a unified hierarchy (``cgroup.controllers`` at the root), else 1."""
    return 2 if (root / "cgroup.controllers").exists() else 1


def read_jobs(host_node: str, root: Path = ROOT) -> list[JobUsage]:
    """Every job with a cgroup on this host, whichever version the host runs, sorted by
    node and job id; only numeric job ids (``job_4242``) count."""
    jobs = read_v2(root, host_node) if version(root) == 2 else read_v1(root, host_node)
    return sorted((j for j in jobs if j.job_id.isdigit()),
                  key=lambda j: (j.node, int(j.job_id)))
