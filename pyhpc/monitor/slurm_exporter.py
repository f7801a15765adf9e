"""``python -m pyhpc.monitor.slurm_exporter --listen ADDR:PORT``: the cluster as Prometheus
metrics, one exporter per cluster (on the controller).

A scrape runs exactly one of each Slurm command, whatever the number of jobs or nodes:
``squeue`` (jobs by state, partition, account and user; pending reasons), ``scontrol show
node`` (nodes by state with the admin's reason; GPUs declared and allocated), ``sdiag``
(scheduler statistics) and ``sacct`` (slurmdbd answering; runaway jobs, against the
scrape's own squeue). ``pyhpc_exporter_scrape_slurm_commands`` shows the count.
Figures prometheus-slurm-exporter (vpenso's) has carry its names (``slurm_nodes_idle``,
``slurm_cpus_total``, ``slurm_queue_pending``, ``slurm_scheduler_*`` ...), so its Grafana
dashboards read them; the rest are pyhpc's (``pyhpc_slurm_*``; docs/admin/monitoring.md). A command
that fails leaves its metrics out of that scrape (never a stale or made-up figure) and
sets ``pyhpc_exporter_command_ok{command}`` to 0.

Under ``PrivateData=jobs`` only an admin sees every user's jobs: run it as SlurmUser.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from pyhpc.monitor import serve, slurm_state
from pyhpc.slurm import slurm

#: The commands a scrape runs, once each.
COMMANDS = ("squeue", "scontrol", "sdiag", "sacct")


def _gauge(name: str, doc: str, labels: list[str] | None = None,
           value: float | None = None) -> GaugeMetricFamily:
    if value is not None:
        return GaugeMetricFamily(name, doc, value=value)
    return GaugeMetricFamily(name, doc, labels=labels or [])


#: prometheus-slurm-exporter's node buckets (``slurm_nodes_<bucket>``) by sinfo's long
#: state names; a state in none (future, unknown, powered_down ...) counts in no bucket.
NODE_BUCKETS = {"alloc": ("allocated",), "comp": ("completing",), "down": ("down",),
                "drain": ("drained", "draining"), "err": (), "fail": ("fail", "failing"),
                "idle": ("idle",), "maint": ("maint",), "mix": ("mixed",),
                "resv": ("reserved",)}
#: Its ``slurm_queue_<state>`` gauges, by squeue's state (pending by dependency apart too).
QUEUE_STATES = ("pending", "running", "suspended", "cancelled", "completing", "completed",
                "configuring", "failed", "timeout", "preempted", "node_fail")


def node_metrics(states: list[slurm_state.NodeState]) -> Iterator[Metric]:
    """prometheus-slurm-exporter's node, CPU and GPU figures under its names, then pyhpc's
    per node: its state with the admin's reason, GPUs declared and allocated."""
    counts = Counter(n.state for n in states)
    for bucket, names in NODE_BUCKETS.items():
        yield _gauge(f"slurm_nodes_{bucket}", f"Nodes {'/'.join(names) or 'in error'}",
                     value=sum(counts[n] for n in names))
    alloc = sum(n.cpus_allocated for n in states)
    other = sum(n.cpus - n.cpus_allocated for n in states if not n.available)
    total = sum(n.cpus for n in states)
    for name, value in (("alloc", alloc), ("idle", total - alloc - other), ("other", other),
                        ("total", total)):
        yield _gauge(f"slurm_cpus_{name}", f"CPUs {name} (sinfo's A/I/O/T)", value=value)
    gpus_total = sum(n.gpus for n in states)
    gpus_alloc = sum(n.gpus_allocated for n in states)
    for name, value in (("alloc", gpus_alloc), ("idle", gpus_total - gpus_alloc),
                        ("total", gpus_total)):
        yield _gauge(f"slurm_gpus_{name}", f"GPUs {name} (GRES gres/gpu)", value=value)
    per_node = {name: _gauge(f"slurm_node_cpu_{name}", f"CPUs {name} per node",
                             ["node", "status"]) for name in ("alloc", "idle", "other", "total")}
    one = _gauge("pyhpc_slurm_node_state", "1 for each node, labelled with its state and the "
                 "reason an admin or Slurm gave (empty when none)", ["node", "state", "reason"])
    gpus = _gauge("pyhpc_slurm_node_gpus", "GPUs the node's GRES declares (CfgTRES gres/gpu)",
                  ["node"])
    used = _gauge("pyhpc_slurm_node_gpus_allocated", "GPUs of the node allocated to jobs "
                  "(AllocTRES gres/gpu)", ["node"])
    for node in states:
        free = node.cpus - node.cpus_allocated
        for name, value in (("alloc", node.cpus_allocated),
                            ("idle", free if node.available else 0),
                            ("other", 0 if node.available else free), ("total", node.cpus)):
            per_node[name].add_metric([node.node, node.state], value)
        one.add_metric([node.node, node.state, node.reason], 1)
        if node.gpus:
            gpus.add_metric([node.node], node.gpus)
            used.add_metric([node.node], node.gpus_allocated)
    yield from (*per_node.values(), one, gpus, used)


def queue_metrics(queue: slurm_state.Queue) -> Iterator[Metric]:
    """prometheus-slurm-exporter's queue, partition, account and user counts, then pyhpc's
    by all four at once and pending by reason."""
    by_state: Counter[str] = Counter()
    per: dict[str, Counter[tuple[str, str]]] = {"partition": Counter(), "account": Counter(),
                                                "user": Counter()}
    for key, count in queue.jobs.items():
        by_state[key.state] += count
        for label in per:
            per[label][(getattr(key, label), key.state)] += count
    for state in QUEUE_STATES:
        yield _gauge(f"slurm_queue_{state}", f"Jobs {state} (each array task one)",
                     value=by_state[state])
    yield _gauge("slurm_queue_pending_dependency", "Jobs pending for a dependency",
                 value=sum(n for (_, reason), n in queue.pending.items()
                           if reason == "Dependency"))
    wanted = {"partition": ("pending",), "account": ("pending", "running", "suspended"),
              "user": ("pending", "running", "suspended")}
    for label, states in wanted.items():
        for state in states:
            family = _gauge(f"slurm_{label}_jobs_{state}", f"Jobs {state} per {label}",
                            [label])
            for (name, job_state), count in sorted(per[label].items()):
                if job_state == state:
                    family.add_metric([name], count)
            yield family
    jobs = _gauge("pyhpc_slurm_jobs", "Jobs (each array task one) by state, partition, "
                  "account and user", ["state", "partition", "account", "user"])
    for key, count in sorted(queue.jobs.items(), key=lambda kv: tuple(vars(kv[0]).values())):
        jobs.add_metric([key.state, key.partition, key.account, key.user], count)
    pending = _gauge("pyhpc_slurm_jobs_pending", "Pending jobs by partition and reason",
                     ["partition", "reason"])
    for (partition, reason), count in sorted(queue.pending.items()):
        pending.add_metric([partition, reason], count)
    yield from (jobs, pending)


def scheduler_metrics(sched: slurm_state.Scheduler) -> Iterator[Metric]:
    labels = {name: label for (_, label), (name, _) in slurm_state.SDIAG.items()}
    for name, value in sorted(sched.stats.items()):
        unit = " (microseconds)" if name.endswith("cycle") else ""
        yield GaugeMetricFamily(name, f"sdiag: {labels[name]}{unit} (since sdiag's last "
                                "reset)", value=value)
    calls = _gauge("pyhpc_slurm_rpc_calls", "sdiag: RPCs slurmctld served, by message type",
                   ["type"])
    seconds = _gauge("pyhpc_slurm_rpc_seconds", "sdiag: seconds slurmctld spent on RPCs, by "
                     "message type", ["type"])
    for kind in sorted(sched.rpc_calls):
        calls.add_metric([kind], sched.rpc_calls[kind])
        seconds.add_metric([kind], sched.rpc_seconds[kind])
    yield from (calls, seconds)


class SlurmCollector:
    """One scrape: one call of each of :data:`COMMANDS`, every figure from their answers."""

    def __init__(self) -> None:
        self.count = serve.CommandCount()

    def collect(self) -> Iterator[Metric]:
        self.count.start()
        ok = _gauge("pyhpc_exporter_command_ok", "1 if the command answered in this scrape",
                    ["command"])
        queue: slurm_state.Queue | None = None
        try:
            queue = slurm_state.queue(slurm.all_jobs())
        except slurm.SlurmError:
            pass
        else:
            yield from queue_metrics(queue)
        ok.add_metric(["squeue"], queue is not None)
        try:
            states = slurm_state.nodes(slurm.node_info(slurm.MONITOR_TIMEOUT_S))
        except slurm.SlurmError:
            ok.add_metric(["scontrol"], 0)
        else:
            ok.add_metric(["scontrol"], 1)
            yield from node_metrics(states)
        try:
            sched = slurm_state.scheduler(slurm.scheduler_stats())
        except slurm.SlurmError:
            ok.add_metric(["sdiag"], 0)
        else:
            ok.add_metric(["sdiag"], 1)
            yield from scheduler_metrics(sched)
        yield from self._accounting(queue, ok)
        yield ok
        yield from self.count.metrics(COMMANDS)

    def _accounting(self, queue: slurm_state.Queue | None,
                    ok: GaugeMetricFamily) -> Iterator[Metric]:
        """slurmdbd's answer to one sacct call: whether it answered, and the runaways."""
        try:
            proc = slurm.running_in_accounting()
            up = proc.returncode == 0
        except slurm.NoAnswer:  # sacct asks slurmdbd itself: a hung or cut-off slurmdbd
            proc, up = None, False
        except slurm.SlurmError:  # sacct missing: slurmdbd's state unknown
            ok.add_metric(["sacct"], 0)
            return
        ok.add_metric(["sacct"], up)
        yield GaugeMetricFamily("pyhpc_slurmdbd_up", "1 if slurmdbd answered this scrape's "
                                "sacct query, 0 if it did not", value=up)
        if up and proc is not None and queue is not None:
            yield GaugeMetricFamily(
                "pyhpc_slurm_runaway_jobs", "Jobs accounting holds as running that slurmctld does "
                "not run (sacctmgr show runawayjobs' definition)",
                value=slurm_state.runaways(proc.stdout, queue))


def main(argv: list[str] | None = None) -> int:
    args = serve.parser("python -m pyhpc.monitor.slurm_exporter", __doc__ or "").parse_args(argv)
    collector = serve.Serialised(SlurmCollector().collect)
    return serve.run_main("pyhpc.monitor.slurm_exporter",
                          lambda: serve.serve(collector, args.listen, serve.tls_files(args)))


if __name__ == "__main__":
    raise SystemExit(main())
