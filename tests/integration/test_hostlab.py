"""hostlab: one podman container per inventory host, systemd as PID 1, brought up with make.

Real podman, mmdebstrap, OpenSSH and Ansible (over SSH, as to real hosts). Brings the hosts
up through `make hostlab-image` and `make hostlab-up` (twice: the second restarts
nothing) and leaves them up; `make hostlab-down` removes them. Prints the image build
time, the time for the hosts to come up and each host's memory (run pytest with -s).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyhpc import paths
from tests.share import Unavailable
from tests.unit import roleplay

INVENTORY = paths.ROOT / "ansible" / "inventories" / "hostlab" / "hosts.yml"
HOSTLAB = (sys.executable, str(paths.ROOT / "hostlab" / "hostlab.py"))
BIN = Path(sys.executable).parent


def _skip_reason() -> str | None:
    for tool in ("podman", "mmdebstrap", "ssh"):
        if shutil.which(tool) is None:
            return (f"hostlab needs {tool}, which is missing "
                    "(apt-get install -y podman netavark aardvark-dns mmdebstrap openssh-client)")
    if os.geteuid() != 0:
        return "hostlab needs root (rootful podman)"
    return None


SKIP = _skip_reason()
pytestmark = [pytest.mark.integration, pytest.mark.hostlab,
              pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]


def _hosts() -> list[str]:
    data = yaml.safe_load(INVENTORY.read_text())["all"]["children"]
    return list(dict.fromkeys(h for group in data.values() for h in (group.get("hosts") or {})))


HOSTS = _hosts()
COMPUTE = list(yaml.safe_load(INVENTORY.read_text())["all"]["children"]["compute"]["hosts"])


def _run(argv: list[str] | tuple[str, ...], timeout: int = 600) -> tuple[subprocess.CompletedProcess[str],
                                                                         float]:
    start = time.monotonic()
    proc = subprocess.run(list(argv), cwd=paths.ROOT, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - start
    print(f"$ {' '.join(argv)}  ({took:.1f} s)\n{proc.stdout}{proc.stderr}")
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stdout}\n{proc.stderr}"
    return proc, took


def _make(target: str, timeout: int = 900) -> tuple[str, float]:
    proc, took = _run(["make", "--no-print-directory", target], timeout=timeout)
    return proc.stdout, took


def bring_up(target: str, env: dict[str, str] | None = None, timeout: int = 1800) -> tuple[str, float]:
    """`make TARGET` (hostlab-image, hostlab-up) for a module's fixture. A failure raises
    Unavailable with one line, hostlab's own error (tests/integration/conftest.py reports it
    once: one error, the other tests skip on it), not each test's error with the whole output."""
    start = time.monotonic()
    proc = subprocess.run(["make", "--no-print-directory", target], cwd=paths.ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - start
    print(f"$ make {target}  ({took:.1f} s)\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    if proc.returncode != 0:
        lines = (proc.stderr + proc.stdout).strip().splitlines() or ["no output"]
        line = next((ln for ln in lines if ln.startswith("hostlab: error:")), lines[-1])
        raise Unavailable(f"make {target} failed: {line}")
    return proc.stdout, took


#: The release whose hosts the repository's inventory last converged in this pytest run
#: (a deploy that passed), None once a test changed the topology, and each host's container
#: id then. A later module's converge of the same release skips the deploy when every host
#: is that same container (a recreated host is a bare image again) and its systemd runs
#: cleanly (a second deploy on hosts changes nothing and restarts nothing:
#: test_hostlab_pyhpc_restore.py checks it on the five hosts the new db's deploy finds as
#: they were).
CONVERGED: dict[str, Any] = {"release": None, "ids": {}}


def mark_converged(release: str | None) -> None:
    CONVERGED.update(release=release, ids={} if release is None else
                     {host: row.get("id") for host, row in status().items()})


def still_converged(release: str) -> bool:
    """Whether the hosts are the ones converged for `release` in this run, all running."""
    if CONVERGED["release"] != release:
        return False
    ids = {host: row.get("id") for host, row in status().items()}
    if any(ids.get(host) != CONVERGED["ids"].get(host) for host in HOSTS):
        print(f"hostlab ({release}): a host was recreated since it converged: deploy")
        return False
    return all(run_on(host, "systemctl", "is-system-running").stdout.strip() == "running"
               for host in HOSTS)


def on(host: str, *cmd: str) -> str:
    """Run a command on a host through hostlab (podman exec); its stdout."""
    proc, _ = _run([*HOSTLAB, "run", host, "--", *cmd], timeout=60)
    return proc.stdout.strip()


def address(host: str) -> str:
    """The host's address on the hostlab network."""
    return on(host, "hostname", "-I").split()[0]


def status() -> dict[str, dict[str, Any]]:
    proc, _ = _run([*HOSTLAB, "status", "--json"])
    return {row["host"]: row for row in json.loads(proc.stdout)}


def release_hosts(release: str) -> None:
    """Make way for hosts of `release`: `make hostlab-down` when the hosts up run another
    release's image (up leaves a running host alone, whatever it runs)."""
    proc = subprocess.run([*HOSTLAB, "podman", "image", "inspect", "--format", "{{.Id}}",
                           f"localhost/pyhpc-hostlab:{release}"], capture_output=True, text=True)
    want = proc.stdout.strip() if proc.returncode == 0 else None
    if any(row.get("image_id") not in (None, want) for row in status().values()):
        _make("hostlab-down")


@pytest.fixture(scope="module")
def hostlab() -> dict[str, Any]:
    """Debian 13 hosts (the default release; test_hostlab_life.py runs Debian 12's) up:
    image (built or cached), then `make hostlab-up`; the figures measured."""
    release_hosts("trixie")
    out, first = bring_up("hostlab-image")
    built = "image built in" in out
    _, cached = bring_up("hostlab-image")
    out, up = bring_up("hostlab-up")
    figures = {"image_s": first, "image_built": built, "image_cached_s": cached, "up_s": up,
               "up_started": "started " in out, "status": status()}
    print(f"hostlab: image {'built (cold)' if built else 'was cached'} in {first:.1f} s, "
          f"cached in {cached:.1f} s; make hostlab-up {up:.1f} s "
          f"({'hosts started' if figures['up_started'] else 'hosts were already running'})")
    return figures


#: The start of the one line `up` prints when it repairs what an interrupted run left.
REPAIRED = "hostlab: podman state left by an interrupted run ("


def test_second_up_restarts_no_running_host(hostlab: dict[str, Any]) -> None:
    before = hostlab["status"]
    out, took = _make("hostlab-up")
    after = status()
    assert "were already running" in out and "started" not in out
    assert REPAIRED not in out  # nothing wrong: no repair, no line
    for host in HOSTS:
        assert after[host]["state"] == "running"
        assert (after[host]["id"], after[host]["started_at"]) == \
            (before[host]["id"], before[host]["started_at"]), f"{host} was restarted"
    print(f"hostlab: idempotent make hostlab-up {took:.1f} s")


def test_every_host_booted_systemd(hostlab: dict[str, Any]) -> None:
    states = {}
    for host in HOSTS:
        proc = subprocess.run([*HOSTLAB, "run", host, "systemctl", "is-system-running"],
                              capture_output=True, text=True, timeout=60)
        states[host] = proc.stdout.strip()
        assert on(host, "cat", "/proc/1/comm") == "systemd"
    assert all(s in ("running", "degraded") for s in states.values()), states


def test_hostnames_are_the_inventory_names(hostlab: dict[str, Any]) -> None:
    names = [on(host, "hostname") for host in HOSTS]
    assert names == HOSTS and len(set(names)) == len(HOSTS)


def test_hosts_resolve_each_other_by_name(hostlab: dict[str, Any]) -> None:
    ctl_addr = on("ctl", "hostname", "-I").split()[0]
    for host in HOSTS:
        answer = on("login", "getent", "hosts", host).split()
        assert answer, f"login cannot resolve {host}"
        if host == "ctl":
            assert answer[0] == ctl_addr
        assert not answer[0].startswith("127."), f"{host} resolves to loopback: {answer}"


def test_ansible_sees_systemd_on_every_host(hostlab: dict[str, Any]) -> None:
    env = dict(os.environ, ANSIBLE_CONFIG=str(paths.ROOT / "ansible" / "ansible.cfg"),
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    proc = subprocess.run([str(BIN / "ansible"), "-i", str(INVENTORY), "all", "-m", "setup",
                           "-a", "filter=ansible_service_mgr"],
                          cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=300)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]
    managers = {host: r.get("ansible_facts", {}).get("ansible_service_mgr") for host, r in results.items()}
    assert managers == {host: "systemd" for host in HOSTS}


@pytest.mark.parametrize("host", COMPUTE)
def test_compute_host_has_a_writable_cgroup_subtree(hostlab: dict[str, Any], host: str) -> None:
    assert on(host, "systemctl", "is-active", "pyhpc-cgroup-rw.service") == "active"
    probe = "/sys/fs/cgroup/memory/pyhpc-hostlab-probe"
    on(host, "sh", "-c", f"mkdir {probe} && test -e {probe}/memory.limit_in_bytes && rmdir {probe}")


def test_memory_per_host(hostlab: dict[str, Any]) -> None:
    rows = status()
    mib = {h: rows[h]["usage_bytes"] / 2**20 for h in HOSTS}
    rss = {h: rows[h]["rss_bytes"] / 2**20 for h in HOSTS}
    print("hostlab: memory per host (MiB, cgroup usage / rss): "
          + ", ".join(f"{h} {mib[h]:.0f}/{rss[h]:.0f}" for h in HOSTS))
    # usage counts page cache (apt, MariaDB's files), which the kernel reclaims; rss does not.
    assert all(r < 512 for r in rss.values()), rss


def kill_from_outside(host: str) -> None:
    """Kill a host's conmon, then its init (and with it every process of the host), as a
    session's end does: podman misses the exit and still lists the host as running."""
    proc, _ = _run([*HOSTLAB, "podman", "inspect", "--format",
                    "{{.State.ConmonPid}} {{.State.Pid}}", host])
    conmon, init = proc.stdout.split()
    subprocess.run(["kill", "-KILL", conmon], check=True)
    subprocess.run(["kill", "-KILL", init], check=True)


def test_up_recreates_a_host_whose_processes_were_killed(hostlab: dict[str, Any]) -> None:
    """Processes killed from outside (conmon first, so podman misses the exit) leave a
    host that podman lists as running; `make hostlab-up` must bring it back, not hang.
    (Before the deploy: a recreated host is a bare image again, and `deployed` converges it.)"""
    host = COMPUTE[0]
    mac = on(host, "cat", "/sys/class/net/eth0/address")
    kill_from_outside(host)
    out, _ = _make("hostlab-up")
    assert f"started {host};" in out, out
    after = status()
    assert after[host]["state"] == "running"
    # Its address and its MAC, as before: this machine's neighbour entry stays right.
    assert on(host, "cat", "/sys/class/net/eth0/address") == mac
    assert on(host, "cat", "/proc/1/comm") == "systemd"
    assert on(host, "systemctl", "is-system-running") in ("running", "degraded")


def pids(*marks: str) -> list[int]:
    """Processes whose command line holds every one of `marks`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if all(mark in line for mark in marks):
            found.append(int(entry.name))
    return found


def kill_podman_mid_up(host: str) -> str:
    """`make hostlab-up` whose `podman run` of `host` is SIGKILLed once it has started the
    host's conmon (the container made, not yet started); up's output. Tried up to 3 times:
    a run that wins the race brings the host up, and is removed for the next try."""
    for _ in range(3):
        _run([*HOSTLAB, "podman", "rm", "--force", "--time", "0", host])
        up = subprocess.Popen(["make", "--no-print-directory", "hostlab-up"], cwd=paths.ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline, killed = time.monotonic() + 120, []
        while up.poll() is None and time.monotonic() < deadline and not killed:
            if pids("conmon", f" -n {host} "):
                killed = pids("podman", f" run --detach --name {host} ")
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
        out = up.communicate(timeout=300)[0]
        print(f"$ make hostlab-up, its podman run of {host} killed: {killed or 'missed'}\n{out}")
        if killed:
            return out
    pytest.fail(f"podman run of {host} ended before this test could kill it, 3 times")


def test_up_repairs_what_a_podman_killed_mid_up_left(hostlab: dict[str, Any]) -> None:
    """A `podman run` SIGKILLed mid-up leaves the host "created", which `podman start` cannot
    start (runc still holds its state); the next `make hostlab-up` says so in one line, makes
    the host anew from its volume (a file written in its /var/log is there) and it works."""
    host = COMPUTE[0]
    on(host, "sh", "-c", "echo kept > /var/log/pyhpc-hostlab-repair")
    out = kill_podman_mid_up(host)
    assert "failed with exit status -9" in out, out
    left = status()[host]
    assert left["state"] == "created"
    out, took = _make("hostlab-up")
    assert [line for line in out.splitlines() if line.startswith(REPAIRED)] == [
        f"{REPAIRED}{host} created, never started); removed {host} to recreate from the volumes"]
    assert f"started {host};" in out, out
    assert on(host, "cat", "/var/log/pyhpc-hostlab-repair") == "kept"
    assert on(host, "systemctl", "is-system-running") in ("running", "degraded")
    assert not pids("conmon", f" -c {left['id']} "), "the killed run's conmon outlived its container"
    print(f"hostlab: make hostlab-up repaired {host} in {took:.1f} s")


SSH_DIR = Path("/var/lib/pyhpc/hostlab/ssh")


def ssh(host: str, *cmd: str, known_hosts: Path | None = None) -> subprocess.CompletedProcess[str]:
    """ssh as Ansible connects: hostlab's config (and another known_hosts where given)."""
    extra = ["-o", f"UserKnownHostsFile={known_hosts}"] if known_hosts else []
    return subprocess.run(["ssh", "-F", str(SSH_DIR / "config"), "-o", "BatchMode=yes",
                           "-o", "ControlMaster=no", *extra, host, *cmd],
                          capture_output=True, text=True, timeout=60)


def test_ssh_reaches_each_host_with_the_key_it_made_and_refuses_another(
        hostlab: dict[str, Any], tmp_path: Path) -> None:
    """Each host made its own host key at its first boot (the host recreated above, a new
    one), `up` trusts exactly those keys, and a host that shows another host's key is refused."""
    keys = {host: on(host, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()[:2] for host in HOSTS}
    assert len({blob for _, blob in keys.values()}) == len(HOSTS), keys
    known = (SSH_DIR / "known_hosts").read_text().splitlines()
    for host in HOSTS:
        assert f"{host},{address(host)} {' '.join(keys[host])}" in known
        proc = ssh(host, "hostname")
        assert (proc.returncode, proc.stdout.strip()) == (0, host), proc.stderr
    ctl, db = "ctl", "db"
    forged = tmp_path / "known_hosts"
    forged.write_text(f"{ctl},{address(ctl)} {' '.join(keys[db])}\n")
    proc = ssh(ctl, "true", known_hosts=forged)
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr, proc.stderr


# --- the Slurm cluster on the hosts (make hostlab-deploy) ----------------------

DEPLOY_LOG = paths.ROOT / ".deploy" / "hostlab-deploy.log"
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
#: The systemd units each host runs (the packages' own units).
UNITS = {"ctl": ["nslcd", "slapd", "munge", "slurmctld"], "db": ["nslcd", "munge", "mariadb", "slurmdbd"],
         "login": ["nslcd", "munge"], **{host: ["nslcd", "munge", "slurmd"] for host in COMPUTE}}
#: Units from Debian's init scripts (systemd knows no MainPID of theirs): found by name.
SYSV_UNITS = ("nslcd", "slapd")


def run_on(host: str, *cmd: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """A command on a host, whatever its exit status."""
    proc = subprocess.run([*HOSTLAB, "run", host, "--", *cmd], cwd=paths.ROOT, capture_output=True,
                          text=True, timeout=timeout)
    print(f"[{host}] $ {' '.join(cmd)} -> {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc


def secret(host: str, *cmd: str) -> str:
    """A command's stdout, never printed (the secrets tests read secrets)."""
    proc = subprocess.run([*HOSTLAB, "run", host, "--", *cmd], cwd=paths.ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    return proc.stdout.strip()


def main_pids() -> dict[str, str]:
    """MainPID of every unit the deploy manages, by host/unit."""
    def pid(host: str, unit: str) -> str:
        if unit in SYSV_UNITS:
            return run_on(host, "pgrep", "--oldest", "--exact", unit).stdout.strip()
        return run_on(host, "systemctl", "show", "--property=MainPID", "--value",
                      f"{unit}.service").stdout.strip()

    return {f"{host}/{unit}": pid(host, unit) for host, units in UNITS.items() for unit in units}


def sacct_state(job_id: str, wait: float = 60) -> str:
    deadline = time.monotonic() + wait
    state = ""
    while time.monotonic() < deadline:
        out = on("login", "sacct", "-n", "-P", "-X", f"-j{job_id}", "-oState").split()
        state = out[0] if out else ""
        if state and state not in ("PENDING", "RUNNING", "COMPLETING"):
            break
        time.sleep(1)
    return state


@pytest.fixture(scope="module")
def deployed(hostlab: dict[str, Any]) -> dict[str, Any]:
    """`make hostlab-deploy`: site.yml against the hostlab inventory (converges the hosts)."""
    out, took = _make("hostlab-deploy", timeout=1800)
    print(f"hostlab: make hostlab-deploy {took:.1f} s")
    mark_converged("trixie")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # slurmd registers within seconds of starting
        states = on("login", "sinfo", "--noheader", "--Node", "--format=%N %t").split()
        if set(states[1::2]) == {"idle"}:
            break
        time.sleep(2)
    return {"deploy_s": took, "out": out}


def test_every_compute_host_is_idle(deployed: dict[str, Any]) -> None:
    rows = dict(line.split() for line in on("login", "sinfo", "--noheader", "--Node",
                                            "--format=%N %t").splitlines())
    assert rows == {host: "idle" for host in COMPUTE}


def test_srun_spans_three_distinct_hosts(deployed: dict[str, Any]) -> None:
    names = on("login", "srun", "--partition=all", "--nodes=3", "hostname").split()
    assert sorted(names) == sorted(COMPUTE)


def test_sbatch_job_completes_in_sacct_on_the_db_host(deployed: dict[str, Any]) -> None:
    job_id = on("login", "sbatch", "--parsable", "--partition=all", "--nodes=2",
                "--wrap=srun hostname").split(";")[0]
    assert sacct_state(job_id) == "COMPLETED"
    assert on("ctl", "scontrol", "show", "config").count("AccountingStorageHost   = db") == 1


def test_daemons_are_active_systemd_units_on_their_hosts(deployed: dict[str, Any]) -> None:
    for host, units in UNITS.items():
        assert on(host, "systemctl", "is-active", *units).split() == ["active"] * len(units), host
    for daemon in ("slurmctld", "slurmdbd", "slurmd"):
        assert run_on("login", "pgrep", "-x", daemon).returncode == 1, f"{daemon} runs on login"


def test_munge_key_is_one_key_0400_munge_everywhere(deployed: dict[str, Any]) -> None:
    keys = {host: on(host, "sha256sum", "/etc/munge/munge.key").split()[0] for host in HOSTS}
    assert len(set(keys.values())) == 1, keys
    for host in HOSTS:
        assert on(host, "stat", "--format=%a %U", "/etc/munge/munge.key") == "400 munge"


def test_db_password_exists_only_on_db_0600(deployed: dict[str, Any]) -> None:
    secret = "/etc/pyhpc/secrets/slurmdbd_db_password"
    assert on("db", "stat", "--format=%a %U", secret) == "600 root"
    for host in HOSTS:
        if host != "db":
            assert run_on(host, "test", "-e", secret).returncode == 1, f"{secret} on {host}"
    assert on("db", "stat", "--format=%a %U", "/etc/slurm/slurmdbd.conf") == "600 slurm"


def test_mariadb_listens_only_locally_and_slurmdbd_on_the_network(deployed: dict[str, Any]) -> None:
    listening = on("db", "ss", "--listening", "--tcp", "--numeric", "--no-header").splitlines()
    mysql = [line.split()[3] for line in listening if line.split()[3].endswith(":3306")]
    assert mysql and all(a.startswith(("127.0.0.1:", "[::1]:")) for a in mysql), mysql
    assert run_on("ctl", "bash", "-c", "echo > /dev/tcp/db/6819").returncode == 0


def test_no_secret_appears_in_the_deploy_log(deployed: dict[str, Any]) -> None:
    log = DEPLOY_LOG.read_text()
    password, key_b64, ldap_admin, ca_key = (secret(host, *cmd) for host, *cmd in (
        ("db", "cat", "/etc/pyhpc/secrets/slurmdbd_db_password"),
        ("ctl", "base64", "--wrap=0", "/etc/munge/munge.key"),
        ("ctl", "cat", "/etc/pyhpc/secrets/ldap_admin_password"),
        ("ctl", "cat", "/etc/pyhpc/secrets/directory-ca.key")))
    assert len(password) >= 16 and password not in log
    assert key_b64[:32] not in log and key_b64 not in log
    assert len(ldap_admin) >= 16 and ldap_admin not in log
    ca_lines = [line for line in ca_key.splitlines() if not line.startswith("-----")]
    assert ca_lines and not any(line in log for line in ca_lines)


def test_the_service_action_answers_as_the_systemd_module_and_starts_a_stopped_unit(
        deployed: dict[str, Any]) -> None:
    """pyhpc.deploy.service answers an active, enabled unit from `systemctl is-active` and
    `is-enabled`, with no module run ("invocation" is the module's), as the systemd module
    answers it; a unit stopped and disabled by hand goes to the module, which starts and
    enables it."""
    units = UNITS["ctl"]
    twins = roleplay.service_twins(INVENTORY, "ctl", units, ["builtin", "pyhpc"])
    keys = ("changed", "enabled", "name", "state", "failed")
    for unit in units:
        builtin, ours = twins["builtin"][unit], twins["pyhpc"][unit]
        assert {k: ours.get(k) for k in keys} == {k: builtin.get(k) for k in keys}, unit
        assert ours["changed"] is False and "invocation" in builtin, unit
    native = [unit for unit in units if unit not in SYSV_UNITS]
    assert native and not any("invocation" in twins["pyhpc"][unit] for unit in native)
    on("login", "systemctl", "disable", "--now", "munge")
    started = roleplay.service_twins(INVENTORY, "login", ["munge"], ["pyhpc"])["pyhpc"]["munge"]
    assert started["changed"] is True and "invocation" in started, started
    assert on("login", "systemctl", "is-active", "munge") == "active"
    assert on("login", "systemctl", "is-enabled", "munge") == "enabled"

def test_a_step_is_killed_past_its_memory_and_runs_within_it(deployed: dict[str, Any]) -> None:
    grab = "import sys; b = b'x' * (int(sys.argv[1]) << 20); print(len(b))"
    ok = run_on("login", "srun", "--partition=cpu", "--mem=100M", "python3", "-c", grab, "30")
    assert ok.returncode == 0 and ok.stdout.strip() == str(30 << 20)
    big = run_on("login", "srun", "--partition=cpu", "--mem=100M", "python3", "-c", grab, "300")
    assert big.returncode != 0
    assert "oom" in big.stderr.lower() or "out of memory" in big.stderr.lower(), big.stderr


OPEN_GPUS = ("import glob, os; ok = []\n"
             "for path in sorted(glob.glob('/dev/nvidia[0-9]*')):\n"
             "    try:\n        os.close(os.open(path, os.O_RDONLY)); ok.append(path)\n"
             "    except PermissionError:\n        pass\n"
             "print(len(glob.glob('/dev/nvidia[0-9]*')), ','.join(ok) or '-',"
             " os.environ.get('CUDA_VISIBLE_DEVICES', '-'))")


def test_a_job_without_gres_cannot_open_a_gpu_standin(deployed: dict[str, Any]) -> None:
    present, opened, _ = on("login", "srun", "--partition=gpu", "python3", "-c", OPEN_GPUS).split()
    assert (present, opened) == ("2", "-")


def test_a_one_gpu_job_opens_exactly_one_and_sees_one(deployed: dict[str, Any]) -> None:
    present, opened, visible = on("login", "srun", "--partition=gpu", "--gres=gpu:1", "python3", "-c",
                                  OPEN_GPUS).split()
    assert present == "2" and len(opened.split(",")) == 1 and opened.startswith("/dev/nvidia")
    assert len(visible.split(",")) == 1 and visible != "-"


def test_one_cpu_job_gets_a_cpuset_of_one_cpu(deployed: dict[str, Any]) -> None:
    allowed = on("login", "srun", "--partition=cpu", "--cpus-per-task=1", "grep", "Cpus_allowed_list",
                 "/proc/self/status").split()[-1]
    assert re.fullmatch(r"\d+", allowed), allowed


@pytest.mark.alone  # the lab's other tests submit to the daemons it restarts
@pytest.mark.skipif(not Path("/etc/init.d/pyhpc-slurmctld").exists(),
                    reason="the single-host lab is not deployed on this machine")
def test_restarting_the_lab_controller_leaves_hostlabs_alone(deployed: dict[str, Any]) -> None:
    """The lab's daemons stop by pid file: hostlab's slurmctld (same executable, another
    pid namespace) keeps running and keeps its pid."""
    before = main_pids()
    # slurmdbd first, as an admin would: a slurmctld that starts while slurmdbd is down
    # runs on its cached associations until it reconnects.
    subprocess.run(["service", "pyhpc-slurmdbd", "restart"], check=True, timeout=120)
    subprocess.run(["service", "pyhpc-slurmctld", "restart"], check=True, timeout=120)
    assert main_pids() == before
    assert subprocess.run(["service", "pyhpc-slurmctld", "status"], timeout=30).returncode == 0


@pytest.mark.alone  # the lab's other tests submit to the daemons it restarts
@pytest.mark.skipif(not Path("/etc/init.d/pyhpc-munge").exists(),
                    reason="the single-host lab is not deployed on this machine")
def test_the_labs_munged_is_found_by_its_pid_file_not_by_name(deployed: dict[str, Any]) -> None:
    """The lab's munged died while hostlab's run: its init script says so and starts it,
    where Debian's (by name) would see the hosts' munged and start nothing."""
    pids = {host: on(host, "systemctl", "show", "--property=MainPID", "--value", "munge.service")
            for host in HOSTS}
    subprocess.run(["service", "pyhpc-munge", "stop"], check=True, timeout=60)
    try:
        assert subprocess.run(["service", "pyhpc-munge", "status"], timeout=30).returncode == 3
        assert subprocess.run(["pgrep", "--exact", "munged"], capture_output=True).returncode == 0
    finally:
        subprocess.run(["service", "pyhpc-munge", "start"], check=True, timeout=60)
    assert subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0
    assert {host: on(host, "systemctl", "show", "--property=MainPID", "--value", "munge.service")
            for host in HOSTS} == pids
