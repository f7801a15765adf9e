"""``python -m pyhpc.monitor.job_exporter --listen ADDR:PORT``: the jobs on this compute
host as Prometheus metrics, one exporter per host.

Which jobs run here comes from the cgroup tree (:mod:`pyhpc.monitor.cgroups`): CPU time
and memory, current and peak, per job, under cgroup_exporter's names (``cgroup_*``, as
Princeton's jobstats and its Grafana dashboard query them; docs/admin/monitoring.md has the
table). Each job's user and account come from ONE
``squeue --json`` a scrape (none while the host runs no job), which also carries the
job's GPU indices and CPUs per node (squeue's text has no GRES index). Its JSON is some
4 KB a job, where ``scontrol -d -o show job`` is a third of that, but scontrol's text
lets a job's name or comment forge another job's user, account and GPUs
(:mod:`pyhpc.slurm.rows`).
Not from the job's environment: Slurm keeps no world-readable copy of it, and reading
``/proc/PID/environ`` of another user's process needs root; the exporter reads only
world-readable files. Under ``PrivateData=jobs`` slurmctld shows every job only to an
admin, so the exporter runs as SlurmUser (no root). A job slurmctld no longer lists keeps
its figures with the user its v1 cgroup path names and an empty account.

GPUs (:mod:`pyhpc.monitor.gpus`): utilization, memory, power and temperature from NVML
under the Jobstats GPU exporter's names (``nvidia_gpu_*``), only where a driver answers;
``pyhpc_node_gpus_seen`` counts what NVML sees, or, without a driver, the node's gres.conf
device files that exist as NVIDIA character devices (the lab's stand-ins).
"""
from __future__ import annotations

import os
import pwd
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

from pyhpc import validate
from pyhpc.monitor import cgroups, gpus, serve
from pyhpc.slurm import rows, slurm

GRES_CONF = Path("/etc/slurm/gres.conf")
#: cgroup_exporter's labels (Jobstats' fork: ``jobid``, ``step``, ``task``), then pyhpc's:
#: the Slurm node, and the owner and account that pyhpc-jobstats-query selects by.
JOB_LABELS = ["jobid", "step", "task", "node", "user", "account"]
#: The Jobstats GPU exporter's labels (``userid``: the owner's uid), then pyhpc's job labels.
GPU_LABELS = ["ordinal", "minor_number", "uuid", "name", "userid", *JOB_LABELS]


@dataclass(frozen=True)
class JobLabels:
    """One job's labels: from slurmctld's view of it, never from its name or comment."""

    jobid: str
    node: str
    user: str
    account: str
    uid: str

    def values(self) -> list[str]:
        """In :data:`JOB_LABELS`' order: the job's own cgroup has no step and no task."""
        return [self.jobid, "", "", self.node, self.user, self.account]


def user_name(uid: int | None) -> str:
    if uid is None:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def stand_ins(node: str, gres_conf: Path) -> int:
    """The node's gres.conf GPU files that exist as NVIDIA character devices."""
    text = cgroups.read_text(gres_conf) or ""
    count = 0
    for path in rows.gres_gpu_files(node, text):
        try:
            info = os.stat(path)
        except OSError:
            continue
        count += stat.S_ISCHR(info.st_mode) and os.major(info.st_rdev) == cgroups.NVIDIA_MAJOR
    return count


class JobCollector:
    """One scrape: the cgroup tree, one squeue call, NVML where a driver answers."""

    def __init__(self, nodes: list[str], root: Path = cgroups.ROOT,
                 gres_conf: Path = GRES_CONF, nvml: gpus.Nvml | None = None) -> None:
        self.nodes = nodes
        self.root = root
        self.gres_conf = gres_conf
        self.nvml = nvml if nvml is not None else gpus.Nvml()
        self.count = serve.CommandCount()

    def collect(self) -> Iterator[Metric]:
        self.count.start()
        jobs = cgroups.read_jobs(self.nodes[0], self.root)
        ok = GaugeMetricFamily("pyhpc_exporter_command_ok", "1 if the command answered in "
                               "this scrape", labels=["command"])
        details: dict[str, rows.JobView] = {}
        if jobs:  # an idle host asks slurmctld nothing
            try:
                details = slurm.job_details()
                ok.add_metric(["squeue"], 1)
            except slurm.SlurmError:
                ok.add_metric(["squeue"], 0)
        labels = {(j.node, j.job_id): self._labels(j, details) for j in jobs}
        yield from job_metrics(jobs, labels)
        yield from held_metrics(jobs, details, labels)
        samples = self.nvml.samples()
        yield self._seen(samples)
        if samples is not None:
            yield from gpu_metrics(samples, self._holders(jobs, details, samples), labels,
                                   self.nodes[0])
        yield ok
        yield from self.count.metrics(("squeue",))

    def _labels(self, job: cgroups.JobUsage, details: dict[str, rows.JobView]) -> JobLabels:
        info = details.get(job.job_id)
        user = info.user if info else user_name(job.uid)
        uid = info.uid if info and info.uid is not None else job.uid
        return JobLabels(job.job_id, job.node, user, info.account if info else "",
                         str(uid) if uid is not None else "")

    def _seen(self, samples: list[gpus.GpuSample] | None) -> GaugeMetricFamily:
        seen = GaugeMetricFamily("pyhpc_node_gpus_seen", "GPUs this node has: those NVML "
                                 "answers for (source nvml), or without a driver the node's "
                                 "gres.conf device files present (source devices)",
                                 labels=["node", "source"])
        if samples is not None:  # NVML sees the host's GPUs: one node per GPU host
            seen.add_metric([self.nodes[0], "nvml"], len(samples))
        else:
            for node in self.nodes:
                seen.add_metric([node, "devices"], stand_ins(node, self.gres_conf))
        return seen

    def _holders(self, jobs: list[cgroups.JobUsage], details: dict[str, rows.JobView],
                 samples: list[gpus.GpuSample]) -> dict[int, tuple[str, str]]:
        """GPU minor -> (node, job id) of the job holding it."""
        minors = [s.minor for s in samples]
        out: dict[int, tuple[str, str]] = {}
        for job in jobs:
            held = job.gpu_minors
            info = details.get(job.job_id)
            if held is None and info is not None and job.node in info.gpu_index:
                held = gpus.minors_by_index(info.gpu_index[job.node], minors)
            for minor in held or ():
                out[minor] = (job.node, job.job_id)
        return out


def _family(name: str, doc: str, labels: list[str] = JOB_LABELS) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def job_metrics(jobs: list[cgroups.JobUsage],
                labels: dict[tuple[str, str], JobLabels]) -> Iterator[Metric]:
    """cgroup_exporter's per-job figures, under its names (gauges, as it exports them;
    ``step`` and ``task`` empty: the job's own cgroup, as Jobstats queries it), and the
    peak, which it has no name for."""
    figures = [
        ("cgroup_cpu_total_seconds", "Cumulative CPU seconds of the job's cgroup",
         "cpu_seconds"),
        ("cgroup_cpu_user_seconds", "Cumulative CPU user seconds of the job's cgroup",
         "cpu_user_seconds"),
        ("cgroup_cpu_system_seconds", "Cumulative CPU system seconds of the job's cgroup",
         "cpu_system_seconds"),
        ("cgroup_memory_used_bytes", "Memory the job's cgroup holds now, page cache "
         "included", "memory_bytes"),
        ("cgroup_memory_rss_bytes", "Anonymous memory (RSS) of the job's cgroup",
         "memory_rss_bytes"),
        ("cgroup_memory_cache_bytes", "Page cache of the job's cgroup",
         "memory_cache_bytes"),
        ("cgroup_memory_shmem_bytes", "Shared memory of the job's cgroup",
         "memory_shmem_bytes"),
        ("cgroup_memory_total_bytes", "The job's memory limit (absent where it has none)",
         "memory_limit_bytes"),
        ("pyhpc_job_memory_peak_bytes", "Most memory the job's cgroup has held",
         "memory_peak_bytes")]
    for name, doc, field in figures:
        family = _family(name, doc)
        for job in jobs:
            value = getattr(job, field)
            if value is not None:
                family.add_metric(labels[(job.node, job.job_id)].values(), value)
        yield family


def held_metrics(jobs: list[cgroups.JobUsage], details: dict[str, rows.JobView],
                 labels: dict[tuple[str, str], JobLabels]) -> Iterator[Metric]:
    """What each job holds on its node, the measure of its use: CPUs (as many as CPU_IDs)
    and GPUs (the NVIDIA devices its v1 cgroup may open, else its GRES indices). Counts of
    an allocation, so the lab's stand-ins count too; absent where neither source says.
    The job's owner's uid as the Jobstats cgroup_exporter gives it (``cgroup_uid``)."""
    cpus = _family("cgroup_cpus", "CPUs the job holds on the node (Slurm's CPU_IDs)")
    held = _family("pyhpc_job_gpus", "GPUs the job holds on the node (its device cgroup, "
                   "else Slurm's GRES indices)")
    uid = _family("cgroup_uid", "uid of the job's owner")
    for job in jobs:
        info = details.get(job.job_id)
        key = labels[(job.node, job.job_id)]
        if info is not None and job.node in info.cpus:
            cpus.add_metric(key.values(), info.cpus[job.node])
        if job.gpu_minors is not None:
            held.add_metric(key.values(), len(job.gpu_minors))
        elif info is not None and job.node in info.gpu_index:
            held.add_metric(key.values(), len(info.gpu_index[job.node]))
        if key.uid:
            uid.add_metric(key.values(), int(key.uid))
    yield from (cpus, held, uid)


def gpu_metrics(samples: list[gpus.GpuSample], holders: dict[int, tuple[str, str]],
                labels: dict[tuple[str, str], JobLabels], node: str) -> Iterator[Metric]:
    """Per GPU, the Jobstats GPU exporter's names and labels, labelled with the job holding
    it (empty job labels for a free GPU). ``nvidia_gpu_duty_cycle`` is a percentage, as
    there."""
    figures = [
        ("nvidia_gpu_duty_cycle", "Percent of the last sample period a kernel ran on the "
         "GPU (NVML)", "duty_cycle"),
        ("nvidia_gpu_memory_used_bytes", "GPU memory in use (NVML)",
         "memory_used_bytes"),
        ("nvidia_gpu_memory_total_bytes", "GPU memory (NVML)", "memory_total_bytes"),
        ("nvidia_gpu_power_usage_milliwatts", "Power the GPU draws (NVML)",
         "power_milliwatts"),
        ("nvidia_gpu_temperature_celsius", "GPU temperature (NVML)",
         "temperature_celsius")]
    for name, doc, field in figures:
        family = _family(name, doc, GPU_LABELS)
        for gpu in samples:
            holder = holders.get(gpu.minor)
            job = labels[holder] if holder else JobLabels("", node, "", "", "")
            value = getattr(gpu, field)
            if value is not None:
                family.add_metric([str(gpu.index), str(gpu.minor), gpu.uuid, gpu.name,
                                   job.uid, *job.values()], value)
        yield family
    yield GaugeMetricFamily("nvidia_gpu_num_devices", "GPUs NVML answers for",
                            value=len(samples))


def local_nodes(names: list[str], nodes_file: str | None) -> list[str]:
    """The Slurm nodes this host runs: ``--node`` names, the lab's node list file, or the
    short host name."""
    found = list(names)
    if nodes_file:
        found += (cgroups.read_text(Path(nodes_file)) or "").split()
    found = found or [socket.gethostname().split(".")[0]]
    return [validate.name("--node", n, "host") for n in found]


def main(argv: list[str] | None = None) -> int:
    p = serve.parser("python -m pyhpc.monitor.job_exporter", __doc__ or "")
    p.add_argument("--node", action="append", default=[], help="a Slurm node this host runs "
                   "(repeatable; default: the short host name)")
    p.add_argument("--nodes-file", help="a file of node names (the lab's /etc/slurm/lab-nodes)")
    p.add_argument("--gres-conf", default=str(GRES_CONF), help="gres.conf, for the device files "
                   "counted where no driver answers")
    args = p.parse_args(argv)

    def body() -> None:
        nodes = local_nodes(args.node, args.nodes_file)
        collector = JobCollector(nodes, gres_conf=Path(args.gres_conf))
        serve.serve(serve.Serialised(collector.collect), args.listen, serve.tls_files(args))

    return serve.run_main("pyhpc.monitor.job_exporter", body)


if __name__ == "__main__":
    raise SystemExit(main())
