"""hostlab on Debian 12 hosts: pyhpc from the login host across hosts, and the life
cycle: add and remove a compute host, restart a compute host and the controller host
mid-job.

Debian 12 (Slurm 22.05, Python 3.11), while test_hostlab.py runs Debian 13 (Slurm
24.11): the same roles on both, and only on Debian 12 do the hosts get the pyhpc
environment (this machine's CPU torch wheel is for Python 3.11). The same commands an
admin runs on a real cluster: edit the definition and the inventory, `make hostlab-up`
(the new host's machine) and `make hostlab-deploy`. The changed topology lives in a
copy of the hostlab inventory ($HOSTLAB_INVENTORY), so the repository's stays as it is.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

# pytest puts this directory on sys.path (rootdir-relative, no package).
from test_hostlab import COMPUTE, HOSTLAB, SKIP, _run, on, release_hosts, run_on, sacct_state

from pyhpc import paths

pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

INVENTORY_DIR = paths.ROOT / "ansible" / "inventories" / "hostlab"
NEW_HOST = "cpu2"
RELEASE = "bookworm"


def make_with(target: str, inventory: Path | None = None, timeout: int = 1800) -> tuple[str, float]:
    """`make TARGET` for Debian 12 hosts, with HOSTLAB_INVENTORY=inventory where given."""
    env = dict(os.environ, HOSTLAB_INVENTORY=str(inventory or INVENTORY_DIR), HOSTLAB_RELEASE=RELEASE)
    start = time.monotonic()
    proc = subprocess.run(["make", "--no-print-directory", target], cwd=paths.ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - start
    print(f"$ HOSTLAB_INVENTORY={env['HOSTLAB_INVENTORY']} make {target}  ({took:.1f} s)\n"
          f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return proc.stdout, took


def node_states() -> dict[str, str]:
    """Each node's state; {} while slurmctld does not answer (busy with a host going away)."""
    proc = run_on("login", "sinfo", "--noheader", "--Node", "--format=%N %t")
    if proc.returncode != 0:
        return {}
    return dict(line.split() for line in sorted(set(proc.stdout.splitlines())))


def wait_for(what: str, check: Any, timeout: float = 180, every: float = 2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(every)


def submit(*args: str) -> str:
    """sbatch on login as a user does; the job id."""
    out: str = on("login", "sbatch", "--parsable", *args)
    return out.split(";")[0]


def job_state(job: str) -> str:
    state: str = on("login", "squeue", "--noheader", f"--jobs={job}", "--format=%T")
    return state or "GONE"


def invocations(units: dict[str, str]) -> dict[str, str]:
    """systemd's InvocationID of each host's unit: it changes when the unit is restarted,
    not when Slurm 24.11 reconfigures a daemon in place (it re-executes itself, a new pid)."""
    return {host: on(host, "systemctl", "show", "--property=InvocationID", "--value", f"{unit}.service")
            for host, unit in units.items()}


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    """The repository's hostlab on Debian 12 hosts, converged."""
    release_hosts(RELEASE)
    _, image = make_with("hostlab-image")
    _, up = make_with("hostlab-up")
    _, deploy = make_with("hostlab-deploy")
    print(f"hostlab ({RELEASE}): image {image:.1f} s, up {up:.1f} s, deploy {deploy:.1f} s")
    on("login", "scancel", "--user=root")  # what an earlier, failed run of these tests left
    wait_for("every compute host idle", lambda: set(node_states().values()) == {"idle"})
    return {}


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of the hostlab inventory with one more CPU host, NEW_HOST."""
    where = tmp_path_factory.mktemp("inventory") / "hostlab"
    shutil.copytree(INVENTORY_DIR, where)
    hosts = yaml.safe_load((where / "hosts.yml").read_text())
    hosts["all"]["children"]["compute"]["hosts"][NEW_HOST] = None
    (where / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    definition = yaml.safe_load((where / "cluster.yml").read_text())
    next(n for n in definition["nodes"] if n["name"] == "cpu")["count"] = 2
    for part in definition["partitions"]:
        if part["name"] in ("cpu", "all"):
            part["nodes"].append(NEW_HOST)
    (where / "cluster.yml").write_text(yaml.safe_dump(definition, sort_keys=False))
    yield where
    # Whatever the tests left: the repository's topology again, without the extra host.
    _run([*HOSTLAB, "podman", "rm", "--force", "--ignore", NEW_HOST])


def test_adding_a_compute_host_brings_it_in_and_touches_no_running_job(
        cluster: dict[str, Any], grown: Path) -> None:
    running = submit("--partition=gpu", "--nodes=1", "--wrap=sleep 1200")
    wait_for("a job running on a GPU host", lambda: job_state(running) == "RUNNING")
    units = {**{host: "slurmd" for host in COMPUTE}, "ctl": "slurmctld"}
    before = invocations(units)
    assert all(before.values()), before
    make_with("hostlab-up", grown)
    out, took = make_with("hostlab-deploy", grown)
    print(f"hostlab: deploy adding {NEW_HOST}: {took:.1f} s")
    wait_for(f"{NEW_HOST} idle", lambda: node_states().get(NEW_HOST) == "idle", timeout=120)
    version = tuple(int(n) for n in on("login", "sinfo", "--version").split()[1].split(".")[:2])
    if version >= (24, 5):  # slurmctld takes new nodes with `scontrol reconfigure`
        assert invocations(units) == before
        assert "scontrol reconfigure" in out or "Apply a changed slurm.conf" in out
    else:  # Slurm 22.05 must restart its daemons for a new node; the job is not touched
        assert "RUNNING HANDLER [slurm : Restart slurmctld]" in out, out
    assert job_state(running) == "RUNNING"
    assert on("login", "srun", f"--nodelist={NEW_HOST}", "hostname") == NEW_HOST
    on("login", "scancel", running)


def test_removing_a_compute_host_drains_it_first_and_kills_no_job(
        cluster: dict[str, Any], grown: Path) -> None:
    assert NEW_HOST in node_states(), "the host added by the previous test"
    # Longer than the deploy takes to reach the drain, so that it must wait for the job.
    job = submit(f"--nodelist={NEW_HOST}", "--partition=cpu", "--wrap=sleep 150")
    wait_for("the job running on the host to remove", lambda: job_state(job) == "RUNNING")
    out, took = make_with("hostlab-deploy")  # the repository's inventory: without NEW_HOST
    print(f"hostlab: deploy removing {NEW_HOST} while a job runs on it: {took:.1f} s")
    assert re.search(rf"Drain the nodes the definition no longer lists.*\n.*item={NEW_HOST}", out), out
    assert "RETRYING: [ctl]: Wait for the jobs on the drained nodes to end" in out, out
    assert sacct_state(job) == "COMPLETED"
    assert NEW_HOST not in node_states()
    _run([*HOSTLAB, "podman", "rm", "--force", NEW_HOST])


def pyhpc_on_login(workdir: str, *args: str) -> str:
    """pyhpc on the login host, run from workdir (created first); its stdout."""
    command = f"mkdir -p {shlex.quote(workdir)} && cd {shlex.quote(workdir)} && pyhpc {shlex.join(args)}"
    return on("login", "sh", "-c", command)


def history(run: str) -> list[dict[str, Any]]:
    proc = run_on("login", "cat", f"{run}/history.json")
    try:
        return json.loads(proc.stdout) if proc.returncode == 0 else []
    except ValueError:  # between the epoch's write and rename only a reader of .tmp sees half
        return []


def test_pyhpc_train_runs_across_two_hosts_from_login(cluster: dict[str, Any]) -> None:
    work = "/home/hostlab-train"
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
    assert on("login", "stat", "--format=%a", f"{work}/run") == "700"


#: hostlab's shared /opt/pyhpc on this machine (hostlab.py: STATE_DIR/shared/opt-pyhpc).
SHARED_IMAGES = Path("/var/lib/pyhpc/hostlab/shared/opt-pyhpc/images")
PROBE = """import json, os
cgroup = [line for line in open("/proc/self/cgroup") if ":memory:" in line][0].strip()
print("PROBE", json.dumps({"rank": os.environ["RANK"], "node": os.environ["SLURMD_NODENAME"],
                           "containerenv": os.path.exists("/run/.containerenv"), "cgroup": cgroup}))
"""


def test_the_container_template_runs_across_hosts_from_login(cluster: dict[str, Any]) -> None:
    """`pyhpc submit container` from login: each task inside the framework image on its
    host (podman from the containers role), still in its job's cgroup."""
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
    result = json.loads(pyhpc_on_login(work, "submit", "container", "--nodes", "2", "--partition", "all",
                                       "--set", f"script={work}/probe.py", "--wait", "--json"))
    print(f"hostlab: container template on 2 hosts: {time.monotonic() - start:.1f} s")
    assert result["state"] == "COMPLETED", result
    log = on("login", "sh", "-c", f"cat {work}/*-{result['job_id']}.out")
    rows = [json.loads(line.split(" ", 1)[1]) for line in log.splitlines() if line.startswith("PROBE ")]
    assert sorted(r["rank"] for r in rows) == ["0", "1"], log
    assert len({r["node"] for r in rows}) == 2 and {r["node"] for r in rows} <= set(COMPUTE), rows
    assert all(r["containerenv"] for r in rows), rows
    assert all(f"/job_{result['job_id']}/step_0" in r["cgroup"] for r in rows), rows


def test_a_run_directory_only_login_has_fails_with_one_hint(cluster: dict[str, Any]) -> None:
    """/tmp is the login host's own: the compute host cannot write the run there."""
    proc = run_on("login", "sh", "-c", "cd /tmp && pyhpc train --nodes 1 --epochs 1 --out /tmp/run --wait")
    assert proc.returncode == 1
    assert re.search(r"^job (\d+) FAILED: /tmp/run$", proc.stdout, re.M), proc.stdout
    assert "no epoch reached /tmp/run: it must be on storage the compute nodes share" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_compute_host_restarted_mid_job_returns_and_its_training_resumes(
        cluster: dict[str, Any]) -> None:
    """A reboot of the host a `pyhpc train` job runs on: the host comes back into service at
    the address it had, Slurm requeues the job, and it resumes from its checkpoint: every
    epoch once, the later ones from the second attempt."""
    host, work, epochs = "gpu1", "/home/hostlab-reboot", 8
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
    def requeued() -> str | None:
        shown = run_on("login", "scontrol", "show", "job", job).stdout
        restarts, state = re.search(r"Restarts=(\d+)", shown), re.search(r"JobState=(\w+)", shown)
        return state[1] if restarts and state and int(restarts[1]) >= 1 else None

    if wait_for("the job requeued", requeued, timeout=300) == "PENDING":
        run_on("login", "scontrol", "update", f"JobId={job}", "StartTime=now+5")
    assert sacct_state(job, wait=400) == "COMPLETED"
    print(f"hostlab: {host} restarted mid-job: training done {time.monotonic() - start:.0f} s later")
    assert on("login", "getent", "hosts", host).split()[0] == before
    done = history(f"{work}/run")
    assert [h["epoch"] for h in done] == list(range(epochs)), done
    attempts = [h["attempt"] for h in done]
    assert attempts[0] == 0 and attempts[-1] >= 1, attempts
    log = on("login", "sh", "-c", f"cat {work}/pyhpc-jobs/{job}/*_log.out")
    assert "pyhpc.train: resuming from checkpoint after epoch" in log, log


def test_restarting_the_controller_host_keeps_the_queue(cluster: dict[str, Any]) -> None:
    held = submit("--hold", "--partition=cpu", "--wrap=true")
    running = submit("--partition=gpu", "--wrap=sleep 60")
    wait_for("a job running", lambda: job_state(running) == "RUNNING")
    _run([*HOSTLAB, "podman", "restart", "ctl"], timeout=180)
    wait_for("slurmctld answering again",
             lambda: run_on("login", "squeue", "--noheader").returncode == 0, timeout=120)
    assert job_state(held) == "PENDING"
    assert job_state(running) == "RUNNING"
    on("login", "scancel", held, running)
