"""The instructor's sheet of a workshop: one row per participant (CSV) and a printable page
per participant, both 0600 whatever ``--group-readable`` says (they hold passwords); and
the participants' ``~/workshop/README``: the same first steps, from a terminal and from
the hub, without the password."""
from __future__ import annotations

import csv
import io
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from pyhpc import files
from pyhpc.admin.homes import WORKSHOP_DIR

if TYPE_CHECKING:
    from pyhpc.admin.workshop import Plan


def sheet_rows(p: Plan, passwords: dict[str, str], host: str,
               hub: str | None = None) -> list[dict[str, str]]:
    """One row per participant; ``notebooks``: the hub's URL, empty without a hub."""
    return [{"user": n, "password": passwords.get(n, "(unchanged)"), "login": f"ssh {n}@{host}",
             "notebooks": hub or "", "reservation": p.name, "start": p.start,
             "minutes": str(p.minutes)}
            for n in p.participants]


def limits_text(p: Plan) -> str:
    """The participant's limits in words, as the sheet prints them."""
    gpus = f", {p.gpus_per_user} GPUs" if p.gpus_per_node else ""
    return (f"{p.jobs_per_user} jobs running and {p.submitted_per_user} queued at once, "
            f"{p.nodes_per_user} distinct nodes{gpus} in use together; each job at most {p.nodes} "
            f"nodes for {p.minutes} minutes")


#: The first run of the steps: one node, one epoch, in the participant's home (shared
#: with the compute nodes), waited for.
RUN = "run1"


def terminal_steps(p: Plan, login: str) -> list[str]:
    """The three terminal steps: log in, train (pyhpc finds the reservation), report."""
    partition = "" if p.default_partition else f" --partition {p.partition}"
    return [login, f"pyhpc train{partition} --nodes 1 --epochs 1 --out {RUN} --wait",
            f"pyhpc report {RUN}"]


def hub_steps(hub: str) -> list[str]:
    return [f"open {hub} and log in (the same user and password)",
            "Start My Server (it starts in the reservation)",
            f"open {WORKSHOP_DIR}/01-hello-cluster.ipynb and run it"]


def _steps(p: Plan, login: str, hub: str, indent: str) -> str:
    """Both ways in, numbered, side by side in a column each: terminal, then hub."""
    lines = [f"{indent}from a terminal:"] + [
        f"{indent}  {i}. {step}" for i, step in enumerate(terminal_steps(p, login), 1)]
    if hub:
        lines += [f"{indent}from the hub:"] + [
            f"{indent}  {i}. {step}" for i, step in enumerate(hub_steps(hub), 1)]
    return "\n".join(lines) + "\n"


def _where(p: Plan) -> str:
    return (f"only in the reservation {p.name}; pyhpc runs every job in it for you" if not
            p.outside else f"in the reservation {p.name} (pyhpc's default while it is active), "
            f"or outside it in partition {p.partition}")


def page(p: Plan, rows: list[dict[str, str]]) -> str:
    """One cut-out block per participant."""
    cut = "-" * 64
    return "".join(
        f"{cut}\nWorkshop {p.name}: your account on cluster {p.cluster}\n\n"
        f"  login:     {r['login']}   (or su - {r['user']})\n  password:  {r['password']}\n"
        + (f"  notebooks: {r['notebooks']}  (the same user and password; Start My Server\n"
           f"             starts yours in the reservation, notebooks in ~/{WORKSHOP_DIR})\n"
           if r["notebooks"] else "")
        + f"  first steps:\n{_steps(p, r['login'], r['notebooks'], '    ')}"
        f"  jobs:      pyhpc names the reservation {p.name} for you; srun and sbatch need\n"
        f"             --reservation={p.name}\n"
        f"  where:     {_where(p)}\n"
        f"  limits:    {limits_text(p)}\n"
        f"  starts:    {p.start}, for {p.minutes} minutes\n"
        for r in rows) + cut + "\n"


def readme(p: Plan, user: str, host: str, hub: str | None = None) -> str:
    """Participant ``user``'s ``~/workshop/README``: where to start, both ways in."""
    starts = ("It began when the workshop was made" if p.start == "now" else
              f"It starts at {p.start}")
    return (f"Workshop {p.name} on cluster {p.cluster}: you are {user}\n\n"
            f"First steps (your password is on the sheet you were given):\n"
            f"{_steps(p, f'ssh {user}@{host}', hub or '', '  ')}\n"
            f"Your jobs run {_where(p)}.\n"
            f"{starts} and lasts {p.minutes} minutes; outside that window pyhpc says\n"
            f"when it starts or that it ended. srun and sbatch need --reservation={p.name}.\n"
            f"Limits: {limits_text(p)}.\n"
            f"The notebooks here are yours to change; pyhpc status shows your jobs.\n")


def host() -> str:
    """The login host's name, as participants reach it."""
    return socket.getfqdn()


def write_sheet(p: Plan, passwords: dict[str, str], out: Path,
                hub: str | None = None) -> list[Path]:
    """The instructor's sheet, 0600 whatever --group-readable says: CSV and a printable page
    (``hub``: the hub's URL, where the cluster runs one)."""
    rows = sheet_rows(p, passwords, host(), hub)
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    directory_path = files.make_dir(out, "out")
    os.chmod(directory_path, 0o700)
    written = []
    for fname, text in ((f"{p.name}.csv", table.getvalue()), (f"{p.name}.txt", page(p, rows))):
        path = files.write_text(directory_path / fname, text, "out")
        os.chmod(path, 0o600)
        written.append(path)
    return written
