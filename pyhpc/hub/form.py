"""The hub's spawn form: one select per field, every option a choice Slurm or the
definition gave (no free text), preselected for the user's workshop when a reservation
admits them. Rendered deterministically (a golden test holds it); every text escaped.
"""
from __future__ import annotations

import html

from pyhpc import validate
from pyhpc.cluster import Cluster
from pyhpc.hub.choices import Choices
from pyhpc.hub.options import DEFAULT_TIME, TIMES
from pyhpc.slurm.reservations import Reservation


def _current(choices: Choices) -> Reservation | None:
    """The reservation to preselect: the first active one, else the first to come."""
    active = [r for r in choices.reservations if r.state == "ACTIVE"]
    found = active or list(choices.reservations)
    return found[0] if found else None


def _seconds(limit: str) -> int | None:
    return validate.time_limit("max_time", limit, unlimited=True)


def times(cluster: Cluster) -> list[str]:
    """The form's time limits: those the longest partition allows (at least the shortest)."""
    limits = [_seconds(p.max_time) for p in cluster.partitions]
    longest = None if any(s is None for s in limits) else max(s for s in limits if s is not None)
    fits = [t for t in TIMES if longest is None or (_seconds(t) or 0) <= longest]
    return fits or [TIMES[0]]


def preselected(choices: Choices, cluster: Cluster) -> dict[str, str]:
    """What the form starts with: the reservation that admits the user (a workshop's), its
    account and partition; the account's default QOS; one node, no GPU, an hour."""
    res = _current(choices)
    accounts = choices.accounts
    via = [a for a in (res.accounts if res else ()) if a in accounts]
    account = (via or accounts or [""])[0]
    names = [p.name for p in cluster.partitions]
    partition = res.partition if res and res.partition in names else cluster.default_partition.name
    offered = times(cluster)
    return {"reservation": res.name if res else "", "account": account,
            "qos": choices.default_qos(account) or (choices.qos_of(account) or [""])[0],
            "partition": partition, "nodes": "1", "gpus_per_node": "0",
            "time": DEFAULT_TIME if DEFAULT_TIME in offered else offered[-1]}


def _select(name: str, label: str, options: list[tuple[str, str]], chosen: str,
            help_text: str = "") -> str:
    rows = "".join(
        f'      <option value="{html.escape(value)}"'
        f'{" selected" if value == chosen else ""}>{html.escape(text)}</option>\n'
        for value, text in options)
    helper = (f'    <div class="form-text">{html.escape(help_text)}</div>\n'
              if help_text else "")
    return (f'  <div class="mb-3">\n'
            f'    <label class="form-label" for="pyhpc-{name}">{html.escape(label)}</label>\n'
            f'    <select class="form-select" id="pyhpc-{name}" name="{name}">\n{rows}'
            f'    </select>\n{helper}  </div>\n')


def render(choices: Choices, cluster: Cluster, idle_minutes: int) -> str:
    """The form's HTML for ``choices`` (JupyterHub puts it inside its spawn page's form)."""
    chosen = preselected(choices, cluster)
    res = [("", "none")] + [
        (r.name, f"{r.name}: partition {r.partition or 'any'}, {r.start} to {r.end}"
                 f"{'' if r.state == 'ACTIVE' else ' (not started yet)'}")
        for r in choices.reservations]
    accounts = [(a, a) for a in choices.accounts]
    qos = [("", "the account's default")] + sorted(
        {(q, q) for a in choices.accounts for q in choices.qos_of(a)})
    parts = [(p.name, f"{p.name}: {len(p.nodes)} nodes, "
                      f"{cluster.partition_gpus(p.name)} GPUs per node, up to {p.max_time}")
             for p in cluster.partitions]
    most_nodes = max(len(p.nodes) for p in cluster.partitions)
    most_gpus = max(cluster.partition_gpus(p.name) for p in cluster.partitions)
    return (
        '<div class="pyhpc-hub-form">\n'
        + _select("reservation", "Reservation", res, chosen["reservation"],
                  "A workshop's reservation is chosen for you; your notebooks' jobs go "
                  "there too.")
        + _select("account", "Account", accounts, chosen["account"],
                  "" if accounts else f"User {choices.user} has no Slurm account: ask an admin.")
        + _select("qos", "QOS", qos, chosen["qos"])
        + _select("partition", "Partition", parts, chosen["partition"])
        + _select("nodes", "Nodes", [(str(n), str(n)) for n in range(1, most_nodes + 1)],
                  chosen["nodes"], "The server runs on the first; the others are for the "
                  "job's own steps.")
        + _select("gpus_per_node", "GPUs per node",
                  [(str(g), str(g)) for g in range(0, most_gpus + 1)], chosen["gpus_per_node"])
        + _select("time", "Time limit", [(t, t) for t in times(cluster)], chosen["time"])
        + f'  <p class="form-text">Your server is a Slurm job of yours (job name pyhpc-hub); '
          f"it stops at its time limit, when you stop it (File &gt; Hub Control Panel), or "
          f"after {idle_minutes} idle minutes. Its log: ~/pyhpc-hub-JOBID.log.</p>\n"
        + "</div>\n")
