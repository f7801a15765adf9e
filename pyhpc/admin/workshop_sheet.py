"""The instructor's sheet of a workshop: one row per participant (CSV) and a printable page
per participant, both 0600 whatever ``--group-readable`` says (they hold passwords)."""
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


def page(p: Plan, rows: list[dict[str, str]]) -> str:
    """One cut-out block per participant."""
    cut = "-" * 64
    where = (f"only in the reservation {p.name}: every job names it" if not p.outside else
             f"in the reservation {p.name}, or outside it in partition {p.partition}")
    return "".join(
        f"{cut}\nWorkshop {p.name}: your account on cluster {p.cluster}\n\n"
        f"  login:     {r['login']}   (or su - {r['user']})\n  password:  {r['password']}\n"
        + (f"  notebooks: {r['notebooks']}  (the same user and password; Start My Server\n"
           f"             starts yours in the reservation, notebooks in ~/{WORKSHOP_DIR})\n"
           if r["notebooks"] else "")
        + f"  jobs:      srun --reservation={p.name} ... / sbatch --reservation={p.name} ...\n"
        f"             or, for every job of your session (pyhpc, the notebooks):\n"
        f"             export SBATCH_RESERVATION={p.name} SLURM_RESERVATION={p.name}\n"
        f"  where:     {where}\n"
        f"  limits:    {limits_text(p)}\n"
        f"  starts:    {p.start}, for {p.minutes} minutes\n"
        for r in rows) + cut + "\n"


def write_sheet(p: Plan, passwords: dict[str, str], out: Path,
                hub: str | None = None) -> list[Path]:
    """The instructor's sheet, 0600 whatever --group-readable says: CSV and a printable page
    (``hub``: the hub's URL, where the cluster runs one)."""
    rows = sheet_rows(p, passwords, socket.getfqdn(), hub)
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
