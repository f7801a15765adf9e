"""``python -m pyhpc.monitor.slurm_exporter --listen ADDR:PORT``: the cluster as Prometheus
metrics, one exporter per cluster (on the controller).

A scrape runs exactly one of each Slurm command, whatever the number of jobs or nodes:
``squeue`` (jobs by state, partition, account and user; pending reasons), ``scontrol show
node`` (nodes by state with the admin's reason; GPUs declared and allocated), ``sdiag``
(scheduler statistics) and ``sacct`` (slurmdbd answering; runaway jobs, against the
scrape's own squeue). ``pyhpc_exporter_scrape_slurm_commands`` shows the count. A command
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


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels or [])


def node_metrics(states: list[slurm_state.NodeState]) -> Iterator[Metric]:
    by_state = _gauge("slurm_nodes", "Nodes by state (sinfo's long state names)", ["state"])
    for state, count in sorted(Counter(n.state for n in states).items()):
        by_state.add_metric([state], count)
    one = _gauge("slurm_node_state", "1 for each node, labelled with its state and the "
                 "reason an admin or Slurm gave (empty when none)", ["node", "state", "reason"])
    gpus = _gauge("slurm_node_gpus", "GPUs the node's GRES declares (CfgTRES gres/gpu)", ["node"])
    used = _gauge("slurm_node_gpus_allocated", "GPUs of the node allocated to jobs "
                  "(AllocTRES gres/gpu)", ["node"])
    for node in states:
        one.add_metric([node.node, node.state, node.reason], 1)
        if node.gpus:
            gpus.add_metric([node.node], node.gpus)
            used.add_metric([node.node], node.gpus_allocated)
    yield from (by_state, one, gpus, used)


def queue_metrics(queue: slurm_state.Queue) -> Iterator[Metric]:
    jobs = _gauge("slurm_jobs", "Jobs (each array task one) by state, partition, account and "
                  "user", ["state", "partition", "account", "user"])
    for key, count in sorted(queue.jobs.items(), key=lambda kv: tuple(vars(kv[0]).values())):
        jobs.add_metric([key.state, key.partition, key.account, key.user], count)
    pending = _gauge("slurm_jobs_pending", "Pending jobs by partition and reason",
                     ["partition", "reason"])
    for (partition, reason), count in sorted(queue.pending.items()):
        pending.add_metric([partition, reason], count)
    yield from (jobs, pending)


def scheduler_metrics(sched: slurm_state.Scheduler) -> Iterator[Metric]:
    for name, value in sorted(sched.stats.items()):
        yield GaugeMetricFamily(f"slurm_scheduler_{name}", f"sdiag: {name.replace('_', ' ')} "
                                "(counts since sdiag's last reset)", value=value)
    calls = _gauge("slurm_rpc_calls", "sdiag: RPCs slurmctld served, by message type", ["type"])
    seconds = _gauge("slurm_rpc_seconds", "sdiag: seconds slurmctld spent on RPCs, by "
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
        except slurm.SlurmError:  # sacct missing or timed out: slurmdbd's state unknown
            ok.add_metric(["sacct"], 0)
            return
        up = proc.returncode == 0
        ok.add_metric(["sacct"], up)
        yield GaugeMetricFamily("slurm_dbd_up", "1 if slurmdbd answered this scrape's sacct "
                                "query, 0 if it did not", value=up)
        if up and queue is not None:
            yield GaugeMetricFamily(
                "slurm_runaway_jobs", "Jobs accounting holds as running that slurmctld does "
                "not run (sacctmgr show runawayjobs' definition)",
                value=slurm_state.runaways(proc.stdout, queue))


def main(argv: list[str] | None = None) -> int:
    args = serve.parser("python -m pyhpc.monitor.slurm_exporter", __doc__ or "").parse_args(argv)
    collector = serve.Serialised(SlurmCollector().collect)
    return serve.run_main("pyhpc.monitor.slurm_exporter",
                          lambda: serve.serve(collector, args.listen, serve.tls_files(args)))


if __name__ == "__main__":
    raise SystemExit(main())
