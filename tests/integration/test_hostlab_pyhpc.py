"""pyhpc from the login host of a hostlab on Debian 12 hosts (Slurm 22.05, Python 3.11),
as a researcher: the directory user `user1` (pyhpc's own OpenLDAP on ctl, nslcd with
StartTLS on every host), from their home on the shared /home: `pyhpc train --nodes 2`
across hosts, and a compute host restarted mid-job under a `pyhpc train` job. The
`container` template runs as root here: a researcher's rootless podman (test_containers.py
on the lab) cannot mount /proc inside hostlab's hosts, whose /proc podman masks in parts;
the kernel refuses a new proc mount in a user namespace where one is partly hidden.

Debian 12 because only there do the hosts get the pyhpc environment: this machine's
CPU torch wheel is for Python 3.11 (test_hostlab.py and test_hostlab_life.py run
Debian 13).
"""
from __future__ import annotations

import csv
import io
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# pytest puts this directory on sys.path (rootdir-relative, no package).
from test_hostlab import COMPUTE, HOSTLAB, SKIP, _run, on, run_on, sacct_state
from test_hostlab_life import converge, node_states, wait_for

from pyhpc import paths

pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]


#: The definition's researcher (ansible/inventories/hostlab/cluster.yml), a directory user.
RESEARCHER = "user1"
HOME = f"/home/{RESEARCHER}"
HOSTS = ("ctl", "db", "login", *COMPUTE)
BASE_DN = "dc=hostlab,dc=pyhpc"


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    """The repository's hostlab on Debian 12 hosts, converged."""
    converge("bookworm")
    on("login", "scancel", f"--user={RESEARCHER}")  # what an earlier, failed run left
    return {}


def as_researcher(command: str) -> subprocess.CompletedProcess[str]:
    """A shell command as the researcher logged in on the login host (su -: their home,
    their PATH), whatever its exit status."""
    return run_on("login", "su", "-", RESEARCHER, "-c", command, timeout=300)


def pyhpc_on_login(workdir: str, *args: str) -> str:
    """pyhpc as the researcher on the login host, run from workdir (created first); its stdout."""
    proc = as_researcher(f"mkdir -p {shlex.quote(workdir)} && cd {shlex.quote(workdir)} && "
                         f"pyhpc {shlex.join(args)}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def test_every_host_resolves_the_researcher_from_the_directory_alike(cluster: dict[str, Any]) -> None:
    entries = {host: on(host, "getent", "passwd", RESEARCHER) for host in HOSTS}
    assert set(entries.values()) == {f"{RESEARCHER}:*:20000:20000:{RESEARCHER}:{HOME}:/bin/bash"}, entries
    # Not a local account anywhere: nslcd answers it.
    assert all(run_on(host, "grep", "-q", f"^{RESEARCHER}:", "/etc/passwd").returncode == 1 for host in HOSTS)


def test_the_directory_refuses_plaintext_and_answers_starttls_with_its_ca(cluster: dict[str, Any]) -> None:
    search = f"ldapsearch -x -LLL -H ldap://ctl/ -b {BASE_DN} uid={RESEARCHER} uid"
    plain = as_researcher(search)
    assert plain.returncode == 13 and "Confidentiality required" in plain.stdout + plain.stderr, plain
    tls = as_researcher(f"{search} -ZZ")
    assert tls.returncode == 0 and f"uid: {RESEARCHER}" in tls.stdout, tls
    # The CA the deploy generated is what the hosts trust: with another bundle TLS fails.
    other = as_researcher(f"LDAPTLS_CACERT=/etc/ssl/certs/ca-certificates.crt {search} -ZZ")
    assert other.returncode != 0 and f"uid: {RESEARCHER}" not in other.stdout, other
    for host in ("db", *COMPUTE):
        conf = on(host, "grep", "-E", "^(uri|ssl|tls_reqcert|bindpw)", "/etc/nslcd.conf").splitlines()
        assert conf == ["uri ldap://ctl/", "ssl start_tls", "tls_reqcert demand"], (host, conf)


def test_the_directory_secrets_stay_where_they_are_used(cluster: dict[str, Any]) -> None:
    """The CA key on ctl only; the admin password on ctl and the login host (pyhpc
    directory sync, pyhpc workshop), 0600 root."""
    ca_key, admin = "/etc/pyhpc/secrets/directory-ca.key", "/etc/pyhpc/secrets/ldap_admin_password"
    for host in HOSTS:
        keys = [path for path in (ca_key, admin) if run_on(host, "test", "-e", path).returncode == 0]
        want = {"ctl": [ca_key, admin], "login": [admin]}.get(host, [])
        assert keys == want, (host, keys)
        for path in keys:
            assert on(host, "stat", "--format=%a %U", path) == "600 root", (host, path)
    slapd_key = on("ctl", "stat", "--format=%a %U %G", "/etc/ldap/pyhpc-tls/slapd.key")
    assert slapd_key == "640 root openldap"


def test_the_researchers_home_is_made_private_at_login_on_the_shared_home(cluster: dict[str, Any]) -> None:
    assert as_researcher("pwd").stdout.strip() == HOME
    assert on("login", "stat", "--format=%a %U", HOME) == f"700 {RESEARCHER}"
    for host in COMPUTE:  # the shared /home: the same directory on every host
        assert on(host, "stat", "--format=%a %U", HOME) == f"700 {RESEARCHER}", host


def history(run: str) -> list[dict[str, Any]]:
    proc = run_on("login", "cat", f"{run}/history.json")
    try:
        return json.loads(proc.stdout) if proc.returncode == 0 else []
    except ValueError:  # between the epoch's write and rename only a reader of .tmp sees half
        return []


def test_pyhpc_train_runs_across_two_hosts_from_login(cluster: dict[str, Any]) -> None:
    work = f"{HOME}/hostlab-train"
    on("login", "rm", "-rf", work)
    start = time.monotonic()
    text = pyhpc_on_login(work, "train", "--nodes", "2", "--partition", "all", "--epochs", "2",
                          "--out", f"{work}/run", "--wait")
    print(f"hostlab: pyhpc train --nodes 2 from login: {time.monotonic() - start:.1f} s\n{text}")
    assert re.search(r"^job \d+ COMPLETED: ", text, re.M), text
    assert re.search(r"throughput\s+[\d.]+ samples/s on 2 workers", text), text
    ranks = [json.loads(line) for line in on("login", "cat", f"{work}/run/ranks.jsonl").splitlines()]
    hosts = [r["host"] for r in ranks]
    assert len(set(hosts)) == 2 and set(hosts) <= set(COMPUTE), ranks
    assert on("login", "stat", "--format=%a %U", f"{work}/run") == f"700 {RESEARCHER}"
    job = re.search(r"^job (\d+) COMPLETED", text, re.M)[1]  # type: ignore[index]
    # The job ran as the researcher on both hosts (slurmd resolved them through nslcd).
    assert sacct_state(job) == "COMPLETED"  # waits for the accounting record
    assert on("login", "sacct", "-X", "-n", "-P", f"--jobs={job}", "--format=user") == RESEARCHER
    owners = on("login", "sh", "-c", f"stat --format=%U {work}/run/*").split()
    assert owners and set(owners) == {RESEARCHER}, owners


#: hostlab's shared /opt/pyhpc on this machine (hostlab.py: STATE_DIR/shared/opt-pyhpc).
SHARED_IMAGES = Path("/var/lib/pyhpc/hostlab/shared/opt-pyhpc/images")
PROBE = """import json, os
cgroup = [line for line in open("/proc/self/cgroup") if ":memory:" in line][0].strip()
print("PROBE", json.dumps({"rank": os.environ["RANK"], "node": os.environ["SLURMD_NODENAME"],
                           "containerenv": os.path.exists("/run/.containerenv"), "cgroup": cgroup}))
"""


def test_the_container_template_runs_across_hosts_from_login(cluster: dict[str, Any]) -> None:
    """`pyhpc submit container` from login (as root, see above): each task inside the
    framework image on its host (podman from the containers role), still in its job's cgroup."""
    # The image is built once (`make containers` here, cached when unchanged; its build is
    # test_containers.py's) and put on the cluster's shared /opt/pyhpc/images, as an admin does.
    subprocess.run([sys.executable, "-m", "pyhpc", "containers", "build", "--variant", "cpu"],
                   cwd=paths.ROOT, check=True, capture_output=True, timeout=1800)
    SHARED_IMAGES.mkdir(parents=True, exist_ok=True)
    subprocess.run(["rsync", "-a", "--delete", "/opt/pyhpc/images/pyhpc-cpu/",
                    f"{SHARED_IMAGES}/pyhpc-cpu/"], check=True, timeout=600)
    work = "/home/hostlab-container"
    on("login", "sh", "-c",
       f"rm -rf {work} && mkdir -p {work} && printf %s {shlex.quote(PROBE)} > {work}/probe.py")
    start = time.monotonic()
    result = json.loads(on("login", "sh", "-c", f"cd {work} && pyhpc submit container --nodes 2 "
                           f"--partition all --set script={work}/probe.py --wait --json"))
    print(f"hostlab: container template on 2 hosts: {time.monotonic() - start:.1f} s")
    assert result["state"] == "COMPLETED", result
    log = on("login", "sh", "-c", f"cat {work}/*-{result['job_id']}.out")
    rows = [json.loads(line.split(" ", 1)[1]) for line in log.splitlines() if line.startswith("PROBE ")]
    assert sorted(r["rank"] for r in rows) == ["0", "1"], log
    assert len({r["node"] for r in rows}) == 2 and {r["node"] for r in rows} <= set(COMPUTE), rows
    assert all(r["containerenv"] for r in rows), rows
    # step_0 is the template's check that the image starts on every node; the tasks are step_1.
    assert all(f"/job_{result['job_id']}/step_1/task_" in r["cgroup"] for r in rows), rows


def test_a_run_directory_only_login_has_fails_with_one_hint(cluster: dict[str, Any]) -> None:
    """/tmp is the login host's own: the compute host cannot write the run there."""
    on("login", "rm", "-rf", "/tmp/run")
    proc = as_researcher("cd /tmp && pyhpc train --nodes 1 --epochs 1 --out /tmp/run --wait")
    assert proc.returncode == 1
    assert re.search(r"^job (\d+) FAILED: /tmp/run$", proc.stdout, re.M), proc.stdout
    assert "no epoch reached /tmp/run: it must be on storage the compute nodes share" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_compute_host_restarted_mid_job_returns_and_its_training_resumes(
        cluster: dict[str, Any]) -> None:
    """A reboot of the host a `pyhpc train` job runs on: the host comes back into service at
    the address it had, Slurm requeues the job, and it resumes from its checkpoint: every
    epoch once, the later ones from the second attempt."""
    host, work, epochs = "gpu1", f"{HOME}/hostlab-reboot", 8
    on("login", "rm", "-rf", work)
    out = pyhpc_on_login(work, "train", "--nodes", "2", "--partition", "gpu", "--mode", "synthetic",
                         "--synthetic-samples", "8192", "--epochs", str(epochs), "--out", f"{work}/run",
                         "--json")
    job = json.loads(out)["job_id"]
    wait_for("two epochs checkpointed", lambda: len(history(f"{work}/run")) >= 2, timeout=240, every=1)
    assert on("login", "squeue", "--noheader", f"--jobs={job}", "--format=%B") == host  # the batch host
    before = on("login", "getent", "hosts", host).split()[0]
    start = time.monotonic()
    _run([*HOSTLAB, "podman", "restart", host], timeout=180)
    wait_for(f"{host} back in service", lambda: node_states().get(host) in ("idle", "mix", "alloc"),
             timeout=400, every=5)
    # Slurm holds a requeued job a while (its old launch credential must expire); let it
    # go a few seconds after it is pending again, as test_jobs.py's requeue test does.
    def shown() -> tuple[int, str]:
        """slurmctld's restart count and state of the job (sacct may still hold the first
        attempt's NODE_FAIL as the job's latest record)."""
        text = run_on("login", "scontrol", "show", "job", job).stdout
        restarts, state = re.search(r"Restarts=(\d+)", text), re.search(r"JobState=(\w+)", text)
        return (int(restarts[1]) if restarts else 0), (state[1] if state else "")

    def requeued() -> str | None:
        restarts, state = shown()
        return state if restarts >= 1 and state != "REQUEUED" else None

    if wait_for("the job requeued", requeued, timeout=300) == "PENDING":
        run_on("login", "scontrol", "update", f"JobId={job}", "StartTime=now+5")

    def ended() -> str | None:
        _, state = shown()
        return state if state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED") \
            else None

    assert wait_for("the requeued job's end", ended, timeout=400, every=3) == "COMPLETED"
    print(f"hostlab: {host} restarted mid-job: training done {time.monotonic() - start:.0f} s later")
    assert on("login", "getent", "hosts", host).split()[0] == before
    done = history(f"{work}/run")
    assert [h["epoch"] for h in done] == list(range(epochs)), done
    attempts = [h["attempt"] for h in done]
    assert attempts[0] == 0 and attempts[-1] >= 1, attempts
    log = on("login", "sh", "-c", f"cat {work}/pyhpc-jobs/{job}/*_log.out")
    assert "pyhpc.train: resuming from checkpoint after epoch" in log, log


def test_a_workshop_made_on_login_reaches_every_host_and_its_reservation_admits_only_it(
        cluster: dict[str, Any]) -> None:
    """An instructor (root on login) makes a workshop: its participants are directory
    entries every host resolves, their jobs run as them in the reservation, which refuses
    the researcher; deleting it leaves nothing of them and the researcher as they were."""
    name, sheet = "hlws", "/root/pyhpc-workshops-hostlab"
    run_on("login", "pyhpc", "workshop", "delete", name, "--homes")  # an earlier failed run's
    on("login", "pyhpc", "workshop", "create", name, "--participants", "2", "--start", "now", "--hours", "1",
       "--nodes", "2", "--partition", "all", "--out", sheet)
    rows = list(csv.DictReader(io.StringIO(on("login", "cat", f"{sheet}/{name}.csv"))))
    assert [r["user"] for r in rows] == [f"{name}-01", f"{name}-02"], rows
    user, reservation = rows[0]["user"], rows[0]["reservation"]
    assert len({on(host, "getent", "passwd", user) for host in HOSTS}) == 1
    ran = run_on("login", "su", "-", user, "-c",
                 f"srun --reservation={reservation} --partition=all --nodes=2 id -un", timeout=120)
    assert ran.returncode == 0 and ran.stdout.split() == [user, user], ran
    refused = as_researcher(f"srun --reservation={reservation} --partition=all --nodes=1 true")
    assert refused.returncode != 0 and "reservation" in refused.stderr.lower(), refused
    before = on("ctl", "getent", "passwd", RESEARCHER)
    on("login", "pyhpc", "workshop", "delete", name, "--homes")
    # At once on login (the delete empties its nscd), within nscd's 60 s elsewhere.
    assert run_on("login", "getent", "passwd", user).returncode == 2
    start = time.monotonic()
    wait_for(f"{user} unknown on every host",
             lambda: all(run_on(host, "getent", "passwd", user).returncode == 2 for host in HOSTS),
             timeout=180, every=5)
    print(f"hostlab: {user} gone from every host {time.monotonic() - start:.0f} s after the delete")
    assert on("ctl", "getent", "passwd", RESEARCHER) == before
    assert run_on("login", "test", "-e", f"/home/{user}").returncode == 1
