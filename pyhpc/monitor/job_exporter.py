"""``python -m pyhpc.monitor.job_exporter --listen ADDR:PORT``: the jobs on this compute
host as Prometheus metrics, one exporter per host.

Which jobs run here comes from the cgroup tree (:mod:`pyhpc.monitor.cgroups`): CPU time
and memory, current and peak, per job. Each job's user and account come from ONE
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

GPUs (:mod:`pyhpc.monitor.gpus`): utilization and memory from NVML, only where a driver
answers; ``pyhpc_node_gpus_seen`` counts what NVML sees, or, without a driver, the node's
gres.conf device files that exist as NVIDIA character devices (the lab's stand-ins).
"""
from __future__ import annotations

import os
import pwd
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pyhpc import validate
from pyhpc.monitor import cgroups, gpus, serve
from pyhpc.slurm import rows, slurm

GRES_CONF = Path("/etc/slurm/gres.conf")
JOB_LABELS = ["node", "jobid", "user", "account"]
GPU_LABELS = ["node", "gpu", "uuid", "model", "jobid", "user", "account"]


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

    def _labels(self, job: cgroups.JobUsage, details: dict[str, rows.JobView]) -> list[str]:
        info = details.get(job.job_id)
        user = info.user if info else user_name(job.uid)
        return [job.node, job.job_id, user, info.account if info else ""]

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


def job_metrics(jobs: list[cgroups.JobUsage],
                labels: dict[tuple[str, str], list[str]]) -> Iterator[Metric]:
    cpu = CounterMetricFamily("pyhpc_job_cpu_seconds", "CPU time the job's processes used "
                              "(its cgroup's)", labels=JOB_LABELS)
    mem = GaugeMetricFamily("pyhpc_job_memory_bytes", "Memory the job's cgroup holds now",
                            labels=JOB_LABELS)
    peak = GaugeMetricFamily("pyhpc_job_memory_peak_bytes", "Most memory the job's cgroup "
                             "has held", labels=JOB_LABELS)
    for job in jobs:
        key = labels[(job.node, job.job_id)]
        for family, value in ((cpu, job.cpu_seconds), (mem, job.memory_bytes),
                              (peak, job.memory_peak_bytes)):
            if value is not None:
                family.add_metric(key, value)
    yield from (cpu, mem, peak)


def held_metrics(jobs: list[cgroups.JobUsage], details: dict[str, rows.JobView],
                 labels: dict[tuple[str, str], list[str]]) -> Iterator[Metric]:
    """What each job holds on its node, the measure of its use: CPUs (as many as CPU_IDs)
    and GPUs (the NVIDIA devices its v1 cgroup may open, else its GRES indices). Counts of
    an allocation, so the lab's stand-ins count too; absent where neither source says."""
    cpus = GaugeMetricFamily("pyhpc_job_cpus", "CPUs the job holds on the node (Slurm's "
                             "CPU_IDs)", labels=JOB_LABELS)
    held = GaugeMetricFamily("pyhpc_job_gpus", "GPUs the job holds on the node (its device "
                             "cgroup, else Slurm's GRES indices)", labels=JOB_LABELS)
    for job in jobs:
        info = details.get(job.job_id)
        key = labels[(job.node, job.job_id)]
        if info is not None and job.node in info.cpus:
            cpus.add_metric(key, info.cpus[job.node])
        if job.gpu_minors is not None:
            held.add_metric(key, len(job.gpu_minors))
        elif info is not None and job.node in info.gpu_index:
            held.add_metric(key, len(info.gpu_index[job.node]))
    yield from (cpus, held)


def gpu_metrics(samples: list[gpus.GpuSample], holders: dict[int, tuple[str, str]],
                labels: dict[tuple[str, str], list[str]], node: str) -> Iterator[Metric]:
    """Per GPU, labelled with the job holding it (empty job labels for a free GPU)."""
    util = GaugeMetricFamily("pyhpc_gpu_utilization_ratio", "Share of the last sample period "
                             "a kernel ran on the GPU (NVML), 0 to 1", labels=GPU_LABELS)
    used = GaugeMetricFamily("pyhpc_gpu_memory_used_bytes", "GPU memory in use (NVML)",
                             labels=GPU_LABELS)
    total = GaugeMetricFamily("pyhpc_gpu_memory_total_bytes", "GPU memory (NVML)",
                              labels=GPU_LABELS)
    for gpu in samples:
        holder = holders.get(gpu.minor)
        _, job, user, account = labels[holder] if holder else [node, "", "", ""]
        key = [holder[0] if holder else node, str(gpu.minor), gpu.uuid, gpu.name, job, user,
               account]
        util.add_metric(key, gpu.utilization)
        used.add_metric(key, gpu.memory_used_bytes)
        total.add_metric(key, gpu.memory_total_bytes)
    yield from (util, used, total)


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
