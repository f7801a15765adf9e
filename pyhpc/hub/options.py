"""A notebook server request, checked before anything reaches Slurm.

The form's fields (or a REST spawn's options) go through :func:`check`: resources through
the job spec's one check (:func:`pyhpc.slurm.jobspec.check`: the partition, its nodes,
GPUs and time limit), account, QOS and reservation against what Slurm told this user
(:class:`pyhpc.hub.choices.Choices`). A bad value is one line naming the field; nothing
is submitted.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pyhpc import validate
from pyhpc.cluster import Cluster
from pyhpc.errors import PyhpcError, echo
from pyhpc.hub.choices import Choices
from pyhpc.slurm import jobspec
from pyhpc.slurm.jobspec import JobSpec

#: The form's fields, in the order it shows them.
FIELDS = ("reservation", "account", "qos", "partition", "nodes", "gpus_per_node", "time")
#: Time limits the form offers (any Slurm time limit the partition allows is accepted).
TIMES = ("00:30:00", "01:00:00", "02:00:00", "04:00:00", "08:00:00")
DEFAULT_TIME = "01:00:00"
#: Longest value a field may have (names are at most 64 characters).
MAX_VALUE = 64
#: Form fields JupyterHub itself may send along.
IGNORED = ("_xsrf",)


class HubError(PyhpcError):
    """A notebook server request the hub refuses; the message names the field."""


@dataclass(frozen=True)
class ServerRequest:
    """A checked request: every value ready for sbatch. Empty qos or reservation: none."""

    partition: str
    nodes: int
    gpus_per_node: int
    time: str
    account: str
    qos: str = ""
    reservation: str = ""

    def as_options(self) -> dict[str, Any]:
        """JupyterHub's user_options (JSON-able, checked again at spawn)."""
        return asdict(self)


def from_form(formdata: Mapping[str, Any]) -> dict[str, str]:
    """The form's fields: each a list of one string (a POSTed form) or a string (a spawn
    URL's query), as JupyterHub hands them over."""
    values: dict[str, str] = {}
    for key, given in formdata.items():
        if key in IGNORED:
            continue
        if key not in FIELDS:
            raise HubError(f"{echo(key)}: not a field of the form; fields: {', '.join(FIELDS)}",
                           "form")
        if isinstance(given, list) and len(given) == 1:
            given = given[0]
        if not isinstance(given, str):
            raise HubError(f"{key}: give exactly one value", key)
        values[key] = given
    return values


def _text(values: Mapping[str, Any], key: str, default: str = "") -> str:
    value = values.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or len(value) > MAX_VALUE:
        raise HubError(f"{key}: {echo(value)} is not allowed; at most {MAX_VALUE} characters",
                       key)
    return value.strip()


def check(values: Mapping[str, Any], choices: Choices, cluster: Cluster) -> ServerRequest:
    """The request in ``values`` (form fields or user_options), or :class:`HubError`."""
    unknown = sorted(str(k) for k in values if k not in FIELDS)
    if unknown:
        raise HubError(f"{echo(unknown[0])}: not an option of the hub; options: "
                       f"{', '.join(FIELDS)}", "options")
    text = {k: _text(values, k) for k in FIELDS}
    spec = jobspec.check(JobSpec(
        nodes=jobspec.check_value("nodes", text["nodes"] or "1"),
        tasks_per_node=1,
        gpus_per_node=jobspec.check_value("gpus_per_node", text["gpus_per_node"] or "0"),
        partition=jobspec.check_value("partition", text["partition"] or None),
        time=text["time"] or DEFAULT_TIME), cluster)
    assert spec.partition is not None  # check fills it in
    account = _account(text["account"], spec.partition, choices)
    qos = _qos(text["qos"], account, choices)
    reservation = _reservation(text["reservation"], spec.partition, account, choices)
    return ServerRequest(spec.partition, spec.nodes, spec.gpus_per_node, spec.time, account,
                         qos, reservation)


def _account(name: str, partition: str, choices: Choices) -> str:
    yours = choices.accounts
    if not yours:
        raise HubError(f"account: user {choices.user} has no Slurm association; an admin adds "
                       "one (accounts in cluster.yml, or a workshop)", "account")
    if name not in yours:
        raise HubError(f"account: {echo(name)} is not yours; yours: {', '.join(yours)}",
                       "account")
    places = {a.partition for a in choices.associations if a.account == name}
    if "" not in places and partition not in places:
        raise HubError(f"account: {name} is yours on partition {', '.join(sorted(places))} only, "
                       f"not {partition}", "account")
    return name


def _qos(name: str, account: str, choices: Choices) -> str:
    allowed = choices.qos_of(account)
    if name and name not in allowed:
        shown = ", ".join(allowed) if allowed else "none (leave it empty)"
        raise HubError(f"qos: {echo(name)} is not one of account {account}'s; allowed: {shown}",
                       "qos")
    return validate.name("qos", name, "slurm", error=HubError) if name else ""


def _reservation(name: str, partition: str, account: str, choices: Choices) -> str:
    if not name:
        return ""
    found = choices.reservation(name)
    if found is None:
        yours = ", ".join(r.name for r in choices.reservations) or "none"
        raise HubError(f"reservation: {echo(name)} does not admit you; yours: {yours}",
                       "reservation")
    if found.partition and found.partition != partition:
        raise HubError(f"reservation: {name} holds nodes of partition {found.partition}; "
                       f"choose that partition, not {partition}", "reservation")
    if choices.user not in found.users and account not in found.accounts:
        raise HubError(f"reservation: {name} admits account {', '.join(found.accounts)}, "
                       f"not {account}", "reservation")
    return name
