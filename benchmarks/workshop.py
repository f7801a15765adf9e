"""A day-one workshop's size: ``pyhpc workshop create`` and ``delete`` of ``--participants``
participants (200 by default; Virginia Tech's had 770 attendees), on the lab as it is, the
directory (slapd) and accounting (slurmdbd) real. Prints figures, writes
benchmarks/results/workshop.json.

Timed, each as the admin runs it (the deployed CLI, as root): the first create (directory
entries, homes with the notebooks and README, the QOS, account, associations and the
reservation, the sheet), a second create (it finds everything there and changes nothing),
and the delete with ``--homes``. Between them it checks that the directory resolves the
last participant, that accounting holds every association and the reservation admits
every participant, and after the delete that none of it is left.

    python -m benchmarks.workshop                      # ~2 min
    python -m benchmarks.workshop --participants 50
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import record

PYHPC = "/opt/pyhpc/venv/bin/pyhpc"
NAME = "benchws"


def sh(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800)
    if check and proc.returncode != 0:
        raise SystemExit(f"benchmarks.workshop: {' '.join(argv[:4])}: "
                         f"{proc.stderr.strip()[-400:]}")
    return proc


def timed(argv: list[str]) -> tuple[float, dict[str, Any]]:
    """Seconds ``argv`` took, and what it printed (``--json``)."""
    start = time.monotonic()
    proc = sh(argv)
    return round(time.monotonic() - start, 2), json.loads(proc.stdout)


def associations() -> int:
    rows = sh(["sacctmgr", "-n", "-P", "show", "associations", f"account={NAME}",
               "format=user"]).stdout.split()
    return len([r for r in rows if r])


def reserved_users() -> int:
    text = sh(["scontrol", "-o", "show", "reservation", NAME], check=False).stdout
    users = next((f.split("=", 1)[1] for f in text.split() if f.startswith("Users=")), "")
    return len([u for u in users.split(",") if u and u != "(null)"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.workshop", description=__doc__)
    parser.add_argument("--participants", type=int, default=200)
    args = parser.parse_args(argv)
    count = args.participants
    last = f"{NAME}-{count:0{2 if count < 100 else 3}d}"
    sh([PYHPC, "workshop", "delete", NAME, "--homes"], check=False)  # an earlier run's
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "sheet"
        create_s, created = timed([PYHPC, "workshop", "create", NAME, "--participants",
                                   str(count), "--start", "now", "--hours", "1", "--nodes", "1",
                                   "--out", str(out), "--json"])
        resolved = sh(["getent", "passwd", last], check=False).returncode == 0
        assoc, reserved = associations(), reserved_users()
        readme = Path(f"/home/{last}/workshop/README").is_file()
        again_s, again = timed([PYHPC, "workshop", "create", NAME, "--participants", str(count),
                                "--start", "now", "--hours", "1", "--nodes", "1",
                                "--out", str(Path(work) / "again"), "--json"])
    delete_s, deleted = timed([PYHPC, "workshop", "delete", NAME, "--homes", "--json"])
    figures = {
        "participants": count,
        "create_s": create_s, "create_again_s": again_s, "delete_s": delete_s,
        "create_per_participant_ms": round(1000 * create_s / count, 1),
        "delete_per_participant_ms": round(1000 * delete_s / count, 1),
        "users_added": len(created["users_added"]), "homes_made": len(created["homes_made"]),
        "last_participant_resolves": resolved, "associations": assoc,
        "reservation_users": reserved, "readme_in_home": readme,
        "create_again_changed": again["changed"],
        "users_deleted": len(deleted["users_deleted"]),
        "homes_deleted": len(deleted["homes_deleted"]),
        "left_after_delete": {"associations": associations(),
                              "reservation_users": reserved_users(),
                              "last_participant_resolves":
                                  sh(["getent", "passwd", last], check=False).returncode == 0},
    }
    print(json.dumps(figures, indent=2))
    print(f"wrote {record.write('workshop', figures)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
