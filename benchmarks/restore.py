"""The recovery point of losing the db host (issue 47 item 2), measured on hostlab's Debian
12 hosts as they are up and deployed (HOSTLAB_RELEASE=bookworm); writes
benchmarks/results/restore-hostlab.json.

1. ``--before`` jobs of user1 end and are recorded; db takes a backup
   (``pyhpc admin backup now``) onto the share.
2. ``--between`` jobs end and are recorded: after the backup, before the loss.
3. The loss: db is removed with its volumes (``podman rm``: MariaDB's data goes with it).
4. ``--outage`` jobs end while slurmdbd is gone: slurmctld queues their records.
5. db comes back empty (``make hostlab-up``, ``make hostlab-deploy``), then
   ``pyhpc admin restore`` on it; slurmctld sends what it queued.
6. Per job: in accounting or not. Kept: every job of 1 (the backup) and, where they really
   arrive, those of 4; lost: those of 2 (the recovery point, in jobs and seconds).
   Logins: user1's ``su -`` on login, and sacctmgr still holds user1's association.

    python -m benchmarks.restore                 # 5 jobs before and between, none in the outage
    python -m benchmarks.restore --before 3 --between 4 --outage 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from typing import Any

from benchmarks import record

HOSTLAB = ["python3", "hostlab/hostlab.py"]
PYHPC = "/opt/pyhpc/venv/bin/pyhpc"
DB = "db"


def on(host: str, command: str, check: bool = True, timeout: int = 600) -> str:
    proc = subprocess.run([*HOSTLAB, "run", host, "--", "bash", "-c", command], cwd=record.ROOT,
                          capture_output=True, text=True, check=False, timeout=timeout)
    if check and proc.returncode != 0:
        raise SystemExit(f"benchmarks.restore: [{host}] {command[:80]}: "
                         f"{(proc.stderr or proc.stdout).strip()[-400:]}")
    return proc.stdout


def make(target: str) -> float:
    start = time.monotonic()
    env = dict(os.environ, HOSTLAB_RELEASE="bookworm")
    proc = subprocess.run(["make", "--no-print-directory", target], cwd=record.ROOT, env=env,
                          capture_output=True, text=True, check=False, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.restore: make {target}: {proc.stdout[-800:]}"
                         f"{proc.stderr[-800:]}")
    return round(time.monotonic() - start, 1)


def jobs(count: int, tag: str) -> list[str]:
    """``count`` jobs of user1, each waited for (sbatch --wait: ended when it returns)."""
    return [on("login", f"su - user1 -c 'sbatch --parsable --wait -J {tag} --time=1 "
                        "-o /dev/null --wrap true'").strip() for _ in range(count)]


def recorded(ids: list[str]) -> set[str]:
    """The jobs accounting holds as ended."""
    if not ids:
        return set()
    out = on("login", f"sacct -n -X -P -j {','.join(ids)} -o JobID,State", check=False)
    return {line.split("|")[0] for line in out.splitlines() if "|COMPLETED" in line}


def wait_recorded(ids: list[str], timeout: float = 300) -> float:
    start = time.monotonic()
    while recorded(ids) != set(ids):
        if time.monotonic() - start > timeout:
            raise SystemExit(f"benchmarks.restore: {sorted(set(ids) - recorded(ids))} not "
                             f"recorded in {timeout:.0f} s")
        time.sleep(2)
    return time.monotonic() - start


def remove_db() -> None:
    """db lost with its disks: the container (MariaDB's data is in it) and its volumes."""
    out = subprocess.run([*HOSTLAB, "podman", "volume", "ls", "--format", "{{.Name}}"],
                         cwd=record.ROOT, capture_output=True, text=True, check=True).stdout
    subprocess.run([*HOSTLAB, "podman", "rm", "--force", DB], cwd=record.ROOT, check=True,
                   capture_output=True)
    for volume in out.split():
        if f"-{DB}-" in volume:
            subprocess.run([*HOSTLAB, "podman", "volume", "rm", volume], cwd=record.ROOT,
                           check=True, capture_output=True)


def run(before: int, between: int, outage: int) -> dict[str, Any]:
    first = jobs(before, "before")
    wait_recorded(first)
    taken = json.loads(on(DB, f"{PYHPC} admin backup now --json"))
    backup_at = time.time()
    second = jobs(between, "between")
    wait_recorded(second)
    remove_db()
    lost_at = time.time()
    third = jobs(outage, "outage")
    up_s = make("hostlab-up")
    deploy_s = make("hostlab-deploy")
    restored = json.loads(on(DB, f"{PYHPC} admin restore --json"))
    # slurmctld sends its queued records once slurmdbd answers: wait for them a while.
    deadline = time.monotonic() + 180
    while recorded(third) != set(third) and time.monotonic() < deadline:
        time.sleep(3)
    kept = recorded(first + second + third)
    login = subprocess.run([*HOSTLAB, "run", "login", "--", "su", "-", "user1", "-c", "id -un"],
                           cwd=record.ROOT, capture_output=True, text=True, check=False)
    assoc = on("login", "sacctmgr -n -P show assoc user=user1 format=account", check=False)
    return {
        "release": "bookworm",
        "backup": {"name": taken["name"], "size_bytes": taken["size"],
                   "seconds": taken["seconds"]},
        "jobs": {"before_backup": len(first), "between_backup_and_loss": len(second),
                 "during_outage": len(third)},
        "kept": {"before_backup": len(kept & set(first)),
                 "between_backup_and_loss": len(kept & set(second)),
                 "during_outage": len(kept & set(third))},
        "recovery_point": {"jobs_lost": len(set(second) - kept),
                           "seconds_between_backup_and_loss": round(lost_at - backup_at, 1)},
        "restore": {"seconds_slurmdbd_stopped": restored["accounting"]["seconds"],
                    "jobs": restored["accounting"]["jobs"],
                    "host_up_s": up_s, "redeploy_s": deploy_s},
        "logins": {"user1_su_login": login.returncode == 0 and login.stdout.strip() == "user1",
                   "user1_associations": sorted(set(assoc.split()))},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=int, default=5)
    parser.add_argument("--between", type=int, default=5)
    # 0, as recorded: before the deploy held a new db host's slurmdbd, slurmctld sent what it
    # queued into the empty database, which dropped it. Held now, until the restore
    # (tests/integration/test_hostlab_pyhpc_restore.py runs jobs in the outage).
    parser.add_argument("--outage", type=int, default=0)
    args = parser.parse_args()
    figures = run(args.before, args.between, args.outage)
    print(json.dumps(figures, indent=2))
    print(record.write("restore-hostlab", figures))


if __name__ == "__main__":
    main()
