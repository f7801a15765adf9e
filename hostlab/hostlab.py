#!/usr/bin/env python3
"""hostlab: an emulated multi-host cluster on one machine, for testing the deploy.

One rootful podman container per host of ansible/inventories/hostlab/hosts.yml,
systemd as PID 1, own hostname, on a private bridge network whose DNS
(aardvark-dns) resolves every host by name. Ansible reaches the hosts as it reaches a
real cluster's: over SSH, as root, with hostlab's own key; `up` writes the SSH config
and the hosts' keys (read through podman) that the inventory points ssh at.

Recipe (measured on a Debian 12 VM: no systemd on the host, cgroup v1):
  * image: Debian from Debian's packages with mmdebstrap (systemd, python3, sudo,
    openssh-server, ...; no Slurm), plus hostlab/image/ (a localhost-only /etc/hosts,
    the pyhpc-cgroup-rw unit, and a unit that gives each host its own SSH host key at
    its first boot: the image holds none); built once per recipe, the recipe's hash is
    a label;
  * own podman storage (overlay) and network config, apart from the store the
    containers role builds images in: the global flags in hosts.yml
    (hostlab_podman_args), the rest in hostlab/containers.conf;
  * SSH: STATE_DIR/ssh holds hostlab's key (its public half is every host's root
    authorized_keys, read-only), and, written by every `up`, an ssh config naming each
    running host's address and a known_hosts of the keys the hosts made;
  * `--systemd always`, CAP_SYS_ADMIN (for the cgroup remount; not --privileged), and
    two more of a host root's capabilities that podman leaves out: CAP_SYS_PTRACE (init
    scripts stop daemons that run as their own user with start-stop-daemon --exec, which
    reads /proc/PID/exe: slapd) and CAP_SYS_NICE (slurmstepd binds a user's task to its
    CPUs after the task has become the user: task/affinity);
    the host's cgroup namespace (with --cgroupns=private systemd stalls in
    "starting"), `--no-hosts` (the machine's /etc/hosts must not leak in);
  * one volume per host for /var/log, kept across down/up (removed by --purge);
  * shared storage, the NFS stand-in: /opt/pyhpc, /home, /var/backups/pyhpc and
    /srv/slurmctld are directories of this machine (STATE_DIR/shared) bind-mounted into
    every host;
    /opt/wheels read-only.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DESCRIPTION = "an emulated multi-host cluster: one podman container per host, systemd as PID 1"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
INVENTORY = ROOT / "ansible" / "inventories" / "hostlab" / "hosts.yml"
CONTAINERS_CONF = HERE / "containers.conf"
IMAGE_FILES = HERE / "image"
#: This machine's site CAs (Debian's place for them): its hosts trust what it trusts, as a
#: site's hosts get its CA, e.g. of a TLS-inspecting proxy in front of PyPI and the mirror.
SITE_CAS = Path("/usr/local/share/ca-certificates")
NETWORK = "pyhpc-hostlab"
#: The network's subnet: each host keeps one address from it for life (its container's
#: --ip), as a real host keeps its address across reboots; podman would otherwise hand a
#: restarted container a new one, and slurmctld keeps the address it resolved.
SUBNET = ipaddress.ip_network(os.environ.get("HOSTLAB_SUBNET", "10.89.77.0/24"))
#: Host addresses start here (below: the gateway and room for podman's own).
FIRST_HOST_OFFSET = 10
IMAGE = "localhost/pyhpc-hostlab"
LABEL = "org.pyhpc.hostlab"
RECIPE_LABEL = f"{LABEL}.recipe"
STATE_DIR = Path("/var/lib/pyhpc/hostlab")
CACHE = Path("/var/cache/pyhpc/hostlab")
#: Per-host volumes (name suffix -> path in the host): what survives `down`. One set per
#: Debian release and image: the packages' system users get other uids on another release
#: (munge is 100 on Debian 13, 101 on Debian 12) or after the image's packages change, and
#: munged refuses a log directory it does not own.
VOLUMES = {"log": "/var/log"}
#: Shared storage, the NFS stand-in: one directory of this machine (below
#: STATE_DIR/shared) bind-mounted at the same path into every host.
#: /var/backups/pyhpc: the share the definition's backups land on (docs/admin/backups.md);
#: /srv/slurmctld: a StateSaveLocation two controllers can share (docs/admin/controllers.md).
SHARED = ("/opt/pyhpc", "/home", "/var/backups/pyhpc", "/srv/slurmctld")
#: This machine's local wheels (the CPU torch), read-only in every host, where present.
WHEELS = Path("/opt/wheels")
RELEASES = ("trixie", "bookworm")
DEFAULT_RELEASE = "trixie"
MIRROR = "http://deb.debian.org/debian"
SECURITY = "http://deb.debian.org/debian-security"
#: What Ansible and the roles need on a bare host (rsync: ansible.posix.synchronize);
#: no Slurm, the deploy installs it.
#: openssh-server: Ansible connects as to a real host.
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-apt", "sudo", "iproute2",
            "iputils-ping", "procps", "ca-certificates", "less", "rsync", "openssh-server")
#: `--restart always`: a host that reboots (`systemctl reboot`, as a release upgrade does)
#: comes back, as a real one does; `podman kill` and `podman stop` (a host lost, or turned
#: off) leave it down, as podman applies no restart policy to them.
RUN_FLAGS = ("--systemd", "always", "--restart", "always", "--cap-add", "SYS_ADMIN",
             "--cap-add", "SYS_PTRACE", "--cap-add", "SYS_NICE", "--no-hosts")
#: Systemd states after boot: done (booted) and still booting.
BOOTED = ("running", "degraded")
BOOTING = ("initializing", "starting", "offline", "unknown", "")
#: How Ansible reaches the hosts (the inventory's ssh arguments name the config).
SSH_DIR = STATE_DIR / "ssh"
SSH_KEY = SSH_DIR / "id_ed25519"
SSH_CONFIG = SSH_DIR / "config"
KNOWN_HOSTS = SSH_DIR / "known_hosts"
#: Made at a host's first boot by pyhpc-ssh-hostkey.service (hostlab/image).
HOST_KEY = "/etc/ssh/ssh_host_ed25519_key.pub"
HOST_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
#: What podman 4 says when two of its objects hold one lock ("... share lock ID 3: deadlock
#: due to lock mismatch", wrapped in "please run 'podman system renumber' ...").
LOCK_MISMATCH = ("deadlock due to lock mismatch", "podman system renumber")
#: The states `up` and `down` leave a host in; any other is a killed podman's (created, never
#: started: `podman run` killed; stopping, removing: `stop` or `rm` killed; configured...).
SETTLED = ("running", "exited", "stopped")
EXEC_TIMEOUT_S = 30
ANSWER_TIMEOUT_S = 10


class HostlabError(Exception):
    """A one-line message for the user."""


class LockMismatch(HostlabError):
    """podman found two of its objects holding one lock: its state and the lock segment
    disagree (/dev/shm remade under a kept state, or a killed podman's allocation)."""


def log(message: str) -> None:
    print(f"hostlab: {message}", flush=True)


# --- inventory ----------------------------------------------------------------

@dataclass(frozen=True)
class Inventory:
    hosts: tuple[str, ...]
    podman_args: tuple[str, ...]


def _group_hosts(group: dict[str, Any], where: str) -> Iterator[str]:
    for name in (group.get("hosts") or {}):
        if not isinstance(name, str) or not HOST_NAME.match(name):
            raise HostlabError(f"{where}.hosts: {name!r} is not a hostlab host name "
                               "(lower-case letters, digits and '-', no ranges)")
        yield name
    for child, sub in (group.get("children") or {}).items():
        yield from _group_hosts(sub or {}, f"{where}.children.{child}")


def inventory_path() -> Path:
    """hosts.yml of $HOSTLAB_INVENTORY (an inventory directory), else hostlab's own."""
    where = os.environ.get("HOSTLAB_INVENTORY")
    return Path(where) / "hosts.yml" if where else INVENTORY


def load_inventory(path: Path | None = None) -> Inventory:
    """The hosts (in file order, each once) and podman's global flags from hosts.yml."""
    path = path or inventory_path()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise HostlabError(f"inventory: cannot read {path}: {exc.strerror}") from None
    top = data.get("all") or {}
    hosts = tuple(dict.fromkeys(_group_hosts(top, "all")))
    if not hosts:
        raise HostlabError(f"{path}: no hosts")
    args = (top.get("vars") or {}).get("hostlab_podman_args")
    if not isinstance(args, str) or "--root" not in args:
        raise HostlabError(f"{path}: all.vars.hostlab_podman_args must give hostlab's "
                           "podman --root (and --runroot)")
    return Inventory(hosts, tuple(shlex.split(args)))


# --- podman -------------------------------------------------------------------

class Podman:
    """podman with hostlab's storage, network config and containers.conf."""

    def __init__(self, inventory: Inventory) -> None:
        self.argv = ["podman", *inventory.podman_args]
        self.env = dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF))

    def run(self, *args: str, check: bool = True, capture: bool = True,
            timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.argv, *args], env=self.env, text=True, timeout=timeout,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.PIPE if capture else None)
        if check and proc.returncode != 0:
            detail = (proc.stderr or "").strip().splitlines()[-1:] if capture else []
            error = LockMismatch if is_lock_mismatch(proc.stderr or "") else HostlabError
            raise error(f"podman {' '.join(args[:3])} ... failed with exit status "
                        f"{proc.returncode}{': ' + detail[0] if detail else ''}")
        return proc

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.strip()

    def exists(self, kind: str, name: str) -> bool:
        return self.run(kind, "exists", name, check=False).returncode == 0

    def containers(self) -> dict[str, dict[str, Any]]:
        """hostlab's containers by name (podman ps fields: State, ImageID, Id, StartedAt...)."""
        rows = json.loads(self.out("ps", "-a", "--filter", f"label={LABEL}", "--format", "json")
                          or "[]")
        return {row["Names"][0]: row for row in rows}

    def exec(self, host: str, *cmd: str, timeout: float = EXEC_TIMEOUT_S
             ) -> subprocess.CompletedProcess[str]:
        """``cmd`` on a host; one that hangs past ``timeout`` counts as exit status 124."""
        try:
            return self.run("exec", host, *cmd, check=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout} s")


def is_lock_mismatch(stderr: str) -> bool:
    """Whether podman's error says its locks disagree (it names its own remedy)."""
    return any(text in stderr for text in LOCK_MISMATCH)


def preflight() -> None:
    if shutil.which("podman") is None:
        raise HostlabError("podman is missing: apt-get install -y podman netavark aardvark-dns")
    if os.geteuid() != 0:
        raise HostlabError("hostlab runs rootful podman: run it as root")
    if shutil.which("iptables") is None and shutil.which("iptables", path="/usr/sbin:/sbin") is None:
        raise HostlabError("iptables is missing (netavark sets up the network with it): "
                           "apt-get install -y iptables")
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        raise HostlabError("ssh is missing (Ansible reaches the hosts with it): "
                           "apt-get install -y openssh-client")


@contextmanager
def locked() -> Iterator[None]:
    """One hostlab command at a time changes the hosts, network or image."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# --- image --------------------------------------------------------------------

def image_ref(release: str) -> str:
    return f"{IMAGE}:{release}"


def sources(release: str) -> list[str]:
    return [f"deb {MIRROR} {release} main", f"deb {MIRROR} {release}-updates main",
            f"deb {SECURITY} {release}-security main"]


def image_files(root: Path = IMAGE_FILES) -> dict[str, str]:
    """The files under root as {path: sha256 of content and mode}: part of the recipe."""
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []:
        digest = hashlib.sha256(path.read_bytes() + oct(path.stat().st_mode & 0o111).encode())
        files[str(path.relative_to(root))] = digest.hexdigest()
    return files


def recipe(release: str) -> str:
    """Hash of everything the image is built from: same hash, same image."""
    text = json.dumps({"release": release, "packages": PACKAGES, "sources": sources(release),
                       "files": image_files(), "site_cas": image_files(SITE_CAS),
                       # the hooks without this checkout's path: any clone, one image
                       "hooks": [h.replace(str(ROOT), ".") for h in hooks()], "version": 1},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def hooks() -> list[str]:
    cas = [f"sync-in {SITE_CAS} {SITE_CAS}", 'chroot "$1" update-ca-certificates'] \
        if image_files(SITE_CAS) else []
    # No host key in the image: each host makes its own at its first boot.
    return [f"sync-in {IMAGE_FILES} /", 'rm -f "$1"/etc/ssh/ssh_host_*',
            'chroot "$1" systemctl enable pyhpc-cgroup-rw.service pyhpc-ssh-hostkey.service',
            *cas]


def image_recipe(podman: Podman, release: str) -> str | None:
    """The recipe label of the built image, None when there is none."""
    if not podman.exists("image", image_ref(release)):
        return None
    return podman.out("image", "inspect", "--format",
                      f'{{{{ index .Labels "{RECIPE_LABEL}" }}}}', image_ref(release))


def build_image(podman: Podman, release: str) -> bool:
    """Build and import the image unless one from the same recipe exists; True if built."""
    want = recipe(release)
    if image_recipe(podman, release) == want:
        log(f"image {image_ref(release)} is up to date (recipe {want[:12]})")
        return False
    if shutil.which("mmdebstrap") is None:
        raise HostlabError("mmdebstrap is missing: apt-get install -y mmdebstrap")
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"{release}.tar"
    log(f"building {image_ref(release)} with mmdebstrap ({release}: {', '.join(PACKAGES)})")
    argv = ["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
            "--aptopt=Acquire::Retries=3", *(f"--customize-hook={h}" for h in hooks()),
            release, str(tarball), *sources(release)]
    if subprocess.run(argv).returncode != 0:
        raise HostlabError(f"mmdebstrap {release} failed (is {MIRROR} reachable?)")
    old = podman.out("image", "inspect", "--format", "{{.Id}}", image_ref(release)) \
        if podman.exists("image", image_ref(release)) else None
    try:
        podman.out("import", "--change", f"LABEL {RECIPE_LABEL}={want}",
                   "--change", f"LABEL {LABEL}=1", "--change", 'CMD ["/sbin/init"]',
                   str(tarball), image_ref(release))
    finally:
        tarball.unlink(missing_ok=True)
    if old:  # now untagged; kept while a host still runs it
        podman.run("rmi", old, check=False)
    return True


def cmd_image(args: argparse.Namespace) -> int:
    podman = Podman(load_inventory())
    start = time.monotonic()
    with locked():
        built = build_image(podman, args.release)
    log(f"image {'built' if built else 'cached'} in {time.monotonic() - start:.1f} s")
    return 0


# --- hosts --------------------------------------------------------------------

def ensure_network(podman: Podman) -> None:
    if not podman.exists("network", NETWORK):
        podman.out("network", "create", "--label", f"{LABEL}=1", "--subnet", str(SUBNET),
                   NETWORK)
        log(f"network {NETWORK} created ({SUBNET})")


def addresses(hosts: Sequence[str], subnet: ipaddress.IPv4Network | ipaddress.IPv6Network = SUBNET
              ) -> dict[str, str]:
    """A fixed address per host name: a hash of the name into the subnet, the next free one
    on a clash (names in sorted order), so adding or removing a host moves no other."""
    room = subnet.num_addresses - FIRST_HOST_OFFSET - 1
    if len(set(hosts)) > room:
        raise HostlabError(f"hosts: {len(set(hosts))} hosts do not fit subnet {subnet} "
                           f"(room for {room}); set HOSTLAB_SUBNET to a larger one")
    taken: dict[int, str] = {}
    for host in sorted(set(hosts)):
        slot = int(hashlib.sha256(host.encode()).hexdigest(), 16) % room
        while slot in taken:
            slot = (slot + 1) % room
        taken[slot] = host
    return {host: str(subnet[FIRST_HOST_OFFSET + slot]) for slot, host in taken.items()}


def mac_address(address: str) -> str:
    """A host's fixed MAC, from its fixed address (locally administered, unicast: 02:42 and
    the address's last 4 bytes). A host recreated at its address with a new random MAC was
    not reached for up to a minute: this machine's neighbour entry still held the old one."""
    return ":".join(f"{byte:02x}" for byte in (0x02, 0x42, *ipaddress.ip_address(address).packed[-4:]))


def volume_name(host: str, release: str, suffix: str) -> str:
    return f"{NETWORK}-{host}-{release}-{suffix}"


def create_host(podman: Podman, host: str, release: str, address: str) -> None:
    volumes: list[str] = []
    made_by = recipe(release)
    for suffix, path in VOLUMES.items():
        volume = volume_name(host, release, suffix)
        if podman.exists("volume", volume) and podman.out(
                "volume", "inspect", "--format", f'{{{{ index .Labels "{RECIPE_LABEL}" }}}}',
                volume) != made_by:
            # Another image's: its system users may have other uids (the image's packages
            # changed), and munged refuses a log directory it does not own.
            podman.out("volume", "rm", volume)
            log(f"{host}: volume {volume} was another image's: removed")
        if not podman.exists("volume", volume):
            podman.out("volume", "create", "--label", f"{LABEL}=1", "--label",
                       f"{RECIPE_LABEL}={made_by}", volume)
        volumes += ["--volume", f"{volume}:{path}"]
    for path in SHARED:
        source = STATE_DIR / "shared" / path.strip("/").replace("/", "-")
        source.mkdir(parents=True, exist_ok=True)
        volumes += ["--volume", f"{source}:{path}"]
    if WHEELS.is_dir():
        volumes += ["--volume", f"{WHEELS}:{WHEELS}:ro"]
    volumes += ["--volume", f"{SSH_KEY}.pub:/root/.ssh/authorized_keys:ro"]
    podman.out("run", "--detach", "--name", host, "--hostname", host, "--network", NETWORK,
               "--ip", address, "--mac-address", mac_address(address), "--label", f"{LABEL}=1",
               *RUN_FLAGS, *volumes, image_ref(release),
               "/sbin/init")


def start_hosts(podman: Podman, hosts: Sequence[str], release: str) -> list[str]:
    """Create or start every host that is not running; return those it started."""
    image = image_ref(release)
    current = podman.containers()
    image_id = podman.out("image", "inspect", "--format", "{{.Id}}", image)
    for host in hosts:
        row = current.get(host)
        if row and row["State"] == "running" and row["ImageID"] != image_id:
            log(f"{host} runs an image other than {image} (older, or another release); "
                "`make hostlab-down` and up again to recreate it")
    started = [h for h in hosts if h not in current or current[h]["State"] != "running"]
    # Every container podman knows keeps its slot, so a new host never takes its address.
    address = addresses([*hosts, *current])

    def start(host: str) -> None:
        if host in current:
            podman.out("start", host)
        else:
            create_host(podman, host, release, address[host])

    with ThreadPoolExecutor(max_workers=len(started) or 1) as pool:
        list(pool.map(start, started))
    return started


# --- repair: what a killed run or a machine's end left -------------------------

@dataclass
class Repair:
    """What `up` found of an interrupted run's podman state and what it did: one line."""
    found: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    renumbered: bool = False

    def line(self) -> str | None:
        if not self.found:
            return None
        return (f"podman state left by an interrupted run ({'; '.join(self.found)}); "
                f"{', '.join(self.done)}")


def broken_hosts(rows: dict[str, dict[str, Any]], hosts: Sequence[str],
                 answers_: Callable[[str], bool]) -> dict[str, str]:
    """The hosts to recreate, each with what is wrong: a state `up` and `down` never leave
    (rows: `podman ps -a` by name), or listed as running while `answers_(host)` is False."""
    broken = {}
    for host in hosts:
        state = rows[host]["State"] if host in rows else None
        if state is not None and state not in SETTLED:
            broken[host] = f"{host} {state}" + (", never started" if state == "created" else "")
        elif state == "running" and not answers_(host):
            broken[host] = f"{host} listed as running but does not answer"
    return broken


def repair_hosts(podman: Podman, hosts: Sequence[str], repair: Repair) -> None:
    """Remove the broken hosts; start_hosts makes them anew from their volumes.

    Recreate, not start: a `podman run` killed mid-way leaves runc's state of a container
    podman never started ("created"), and `podman start` then fails ("container with given
    ID already exists"); a host killed from outside stays "running" in podman's state. A
    host's state lives in its volumes and the shared storage, so a new container of it
    loses only what a reboot loses."""
    rows = podman.containers()
    broken = broken_hosts(rows, hosts, lambda h: answers(podman, h))
    if broken:
        remove(podman, sorted(broken), stop_s=0, say=False)
        end_conmons({rows[h]["Id"] for h in broken})
        repair.found += broken.values()
        repair.done.append(f"removed {', '.join(sorted(broken))} to recreate from the volumes")


def conmon_pids(ids: set[str], proc: Path = Path("/proc")) -> list[int]:
    """The conmon processes (`conmon ... -c ID`) of the given containers, then their children."""
    parents: dict[int, int] = {}
    conmons = []
    for entry in proc.iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if argv[0].endswith(b"conmon") and b"-c" in argv[:-1] and \
                argv[argv.index(b"-c") + 1].decode() in ids:
            conmons.append(int(entry.name))
    return sorted(conmons) + sorted(pid for pid, parent in parents.items() if parent in conmons)


def end_conmons(ids: set[str]) -> None:
    """SIGKILL the conmon of each removed container that outlived it, and its children: a
    container made by a `podman run` killed mid-way keeps them after `rm` (its `runc init`
    waits for a start that never comes)."""
    for pid in reversed(conmon_pids(ids)):  # children first
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def renumber(podman: Podman, repair: Repair, error: LockMismatch) -> None:
    """`podman system renumber`, podman's own remedy for a lock mismatch, once per `up`.

    Only where podman says so: it rewrites each object's lock number and keeps running hosts
    running (its state on disk outlived the lock segment, a tmpfs: /dev/shm remade under a
    kept /run, or a killed podman's lock freed). The segment (/dev/shm/libpod_lock) is one
    for every rootful store of the machine: renumber frees all their locks and takes back
    hostlab's, so a container another store holds then may later share a lock (podman says
    so there). Under hostlab's lock: no other hostlab podman runs."""
    if repair.renumbered:
        raise HostlabError(f"podman's locks still disagree after podman system renumber "
                           f"({error}); `make hostlab-down` and up again (volumes are kept)")
    podman.out("system", "renumber")
    repair.renumbered = True
    repair.found.insert(0, "lock mismatch")
    repair.done.insert(0, "ran podman system renumber")


def bring_up(podman: Podman, hosts: Sequence[str], release: str, repair: Repair) -> list[str]:
    """Repair what an interrupted run left, then the network and start_hosts; where podman
    says its locks disagree (on the way, or already in `podman ps`), renumber and again."""
    while True:
        try:
            repair_hosts(podman, hosts, repair)
            ensure_network(podman)
            return start_hosts(podman, hosts, release)
        except LockMismatch as error:
            renumber(podman, repair, error)


def ensure_ssh_key() -> None:
    """hostlab's SSH key, made once: the hosts' root accepts it and nothing else."""
    SSH_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(SSH_DIR, 0o700)
    if not SSH_KEY.exists():
        proc = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hostlab",
                               "-f", str(SSH_KEY)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise HostlabError(f"ssh-keygen failed: {proc.stderr.strip()}")
        log(f"SSH key {SSH_KEY} made")


def ssh_files(hosts: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """The ssh config and known_hosts for hosts {name: (address, host key line)}."""
    config = ["# Written by `hostlab up`: how Ansible reaches the running hosts."]
    known = []
    for name, (address, key) in sorted(hosts.items()):
        config += [f"Host {name}", f"  HostName {address}"]
        kind, blob = key.split()[:2]
        known.append(f"{name},{address} {kind} {blob}")
    config += ["Host *", "  User root", f"  IdentityFile {SSH_KEY}", "  IdentitiesOnly yes",
               f"  UserKnownHostsFile {KNOWN_HOSTS}", "  GlobalKnownHostsFile /dev/null",
               "  StrictHostKeyChecking yes", "  PasswordAuthentication no",
               # A host killed or restarted leaves a master whose peer is gone: noticed in 10 s.
               "  ServerAliveInterval 5", "  ServerAliveCountMax 2"]
    return "\n".join(config) + "\n", "\n".join(known) + "\n"


def write_private(path: Path, text: str) -> None:
    """Replace path with text, 0600, through a new file (a planted link is replaced, not followed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def write_ssh(podman: Podman) -> None:
    """The ssh config and known_hosts of every running hostlab host (any inventory's)."""
    running = sorted(name for name, row in podman.containers().items() if row["State"] == "running")
    hosts = {}
    if running:
        fmt = "{{.Name}} {{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        found = [line.split() for line in podman.out("inspect", "--format", fmt, *running).splitlines()]
        where = {words[0]: words[1] for words in found if len(words) == 2}
        # A container of hostlab's image without an address (another network, or none: a
        # probe someone runs beside the hosts) is no host ssh can reach: left out.
        for name in [name for name in running if name not in where]:
            log(f"{name}: running from hostlab's image without an address: not in the ssh config")
        running = [name for name in running if name in where]
        for name in running:
            key = podman.exec(name, "cat", HOST_KEY)
            if key.returncode != 0 or not key.stdout.strip():
                raise HostlabError(f"{name}: no SSH host key at {HOST_KEY} ({key.stderr.strip()}); "
                                   f"look with `make hostlab-run HOST={name} "
                                   "CMD='systemctl status pyhpc-ssh-hostkey ssh'`")
            hosts[name] = (where[name], key.stdout.strip())
    config, known = ssh_files(hosts)
    write_private(KNOWN_HOSTS, known)
    write_private(SSH_CONFIG, config)


def remove(podman: Podman, names: Sequence[str], stop_s: int, say: bool = True) -> None:
    """`podman rm --force` the containers, each given `stop_s` to stop.

    A container whose processes were killed from outside, conmon first, stays "running" in
    podman's state with no exit file ever written: a session's end leaves every host so. The
    first rm finds the runtime's container gone, marks it stopped and gives up on it ("timed
    out waiting for file .../exits/ID" or "container state improper"); the second removes
    it, and ignores those the first removed."""
    argv = ("rm", "--force", "--time", str(stop_s))
    try:
        podman.run(*argv, *names)
    except HostlabError as first:
        if say:  # a repair says what it did in its own one line
            log(f"podman rm failed ({first}); removing again")
        podman.out(*argv, "--ignore", *names)


def answers(podman: Podman, host: str) -> bool:
    """Whether a host podman calls running really runs: `true` in it returns at once."""
    return podman.exec(host, "true", timeout=ANSWER_TIMEOUT_S).returncode == 0


def system_state(podman: Podman, host: str) -> str:
    proc = podman.exec(host, "systemctl", "is-system-running")
    return proc.stdout.strip() if proc.stdout.strip() else "unknown"


def failed_units(podman: Podman, host: str) -> list[str]:
    proc = podman.exec(host, "systemctl", "--failed", "--plain", "--no-legend", "--no-pager")
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def wait_booted(podman: Podman, hosts: Sequence[str], timeout_s: float) -> dict[str, str]:
    """Poll `systemctl is-system-running` until every host is booted; bounded."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    pending = list(hosts)
    while pending:
        with ThreadPoolExecutor(max_workers=len(pending)) as pool:
            states.update(zip(pending, pool.map(lambda h: system_state(podman, h), pending), strict=True))
        pending = [h for h in pending if states[h] in BOOTING]
        if pending and time.monotonic() > deadline:
            detail = ", ".join(f"{h}: {states[h]}" for h in pending)
            raise HostlabError(f"not booted after {timeout_s:.0f} s ({detail}); look with "
                               "`make hostlab-run HOST=<host> CMD='systemctl list-jobs'`")
        if pending:
            time.sleep(0.25)
    return states


def report_states(podman: Podman, states: dict[str, str]) -> None:
    bad = []
    for host, state in states.items():
        if state == "degraded":
            log(f"{host}: degraded, failed units: {', '.join(failed_units(podman, host)) or '?'}")
        elif state not in BOOTED:
            bad.append(f"{host}: {state}")
    if bad:
        raise HostlabError(f"hosts did not boot: {', '.join(bad)}")


def cmd_up(args: argparse.Namespace) -> int:
    inventory = load_inventory()
    podman = Podman(inventory)
    image = image_ref(args.release)
    start = time.monotonic()
    with locked():
        have = image_recipe(podman, args.release)
        if have is None:
            raise HostlabError(f"image {image} is missing: run `make hostlab-image` first")
        if have != recipe(args.release):
            log(f"image {image} is older than its recipe: `make hostlab-image` rebuilds it")
        ensure_ssh_key()
        repair = Repair()
        try:
            started = bring_up(podman, inventory.hosts, args.release, repair)
        finally:
            if line := repair.line():
                log(line)
        created = time.monotonic() - start
        states = wait_booted(podman, inventory.hosts, args.timeout)
        report_states(podman, states)
        write_ssh(podman)
    took = time.monotonic() - start
    if started:
        log(f"started {', '.join(started)}; {len(inventory.hosts)} hosts up in {took:.1f} s "
            f"(containers {created:.1f} s, then systemd {took - created:.1f} s)")
    else:
        log(f"all {len(inventory.hosts)} hosts were already running ({took:.1f} s)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    inventory = load_inventory()
    if args.host not in inventory.hosts:
        raise HostlabError(f"host: unknown host {args.host!r}; hosts: {', '.join(inventory.hosts)}")
    command = args.command or ["bash", "-l"]
    tty = ["--tty"] if sys.stdin.isatty() and sys.stdout.isatty() else []
    proc = Podman(inventory).run("exec", "--interactive", *tty, args.host, *command,
                                 check=False, capture=False)
    return proc.returncode


def cmd_podman(args: argparse.Namespace) -> int:
    """Any podman command on hostlab's storage and network (a bare `podman` would miss them)."""
    return Podman(load_inventory()).run(*args.args, check=False, capture=False).returncode


def memory(row: dict[str, Any]) -> dict[str, int]:
    """Memory of a running host's cgroup (v1): usage (with page cache) and rss, in bytes."""
    group = Path("/sys/fs/cgroup/memory/libpod_parent") / f"libpod-{row['Id']}"
    stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    return {"usage_bytes": int((group / "memory.usage_in_bytes").read_text()),
            "rss_bytes": int(stat["total_rss"])}


def cmd_status(args: argparse.Namespace) -> int:
    inventory = load_inventory()
    current = Podman(inventory).containers()
    rows = []
    for host in inventory.hosts:
        row = current.get(host)
        entry: dict[str, Any] = {"host": host, "state": row["State"] if row else "absent"}
        if row:
            entry.update(id=row["Id"], started_at=row["StartedAt"], image_id=row["ImageID"])
        if row and row["State"] == "running":
            try:
                entry.update(memory(row))
            except OSError:
                pass
        rows.append(entry)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for entry in rows:
        mib = f"{entry['usage_bytes'] / 2**20:.0f} MiB" if "usage_bytes" in entry else "-"
        print(f"{entry['host']:<12} {entry['state']:<10} {mib}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    podman = Podman(load_inventory())
    with locked():
        names = sorted(podman.containers())
        if names:
            remove(podman, names, stop_s=10)
            log(f"removed {', '.join(names)}")
        if podman.exists("network", NETWORK):
            podman.out("network", "rm", NETWORK)
            log(f"network {NETWORK} removed")
        if args.purge:
            purge(podman)
    return 0


def purge(podman: Podman) -> None:
    volumes = podman.out("volume", "ls", "--quiet", "--filter", f"label={LABEL}").split()
    if volumes:
        podman.out("volume", "rm", *volumes)
        log(f"removed volumes {', '.join(volumes)}")
    images = podman.out("images", "--all", "--quiet", "--filter", f"label={LABEL}").split()
    if images:
        podman.out("rmi", "--force", *sorted(set(images)))
        log(f"removed {len(set(images))} image(s) ({IMAGE}:*)")
    shutil.rmtree(CACHE, ignore_errors=True)
    if (STATE_DIR / "shared").exists():
        shutil.rmtree(STATE_DIR / "shared")
        log(f"removed the shared storage {STATE_DIR / 'shared'}")
    if SSH_DIR.exists():
        shutil.rmtree(SSH_DIR)
        log(f"removed hostlab's SSH key and config {SSH_DIR}")


# --- command line ---------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="hostlab", description=DESCRIPTION)
    sub = top.add_subparsers(dest="cmd", required=True)
    release = os.environ.get("HOSTLAB_RELEASE") or DEFAULT_RELEASE

    def add(name: str, func: Any, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        p.set_defaults(func=func)
        return p

    for name, func, text in (("image", cmd_image, "build the host image (cached by recipe)"),
                             ("up", cmd_up, "start every host and wait until booted")):
        p = add(name, func, text)
        p.add_argument("--release", choices=RELEASES, default=release,
                       help=f"Debian release of the hosts (default {release}; $HOSTLAB_RELEASE)")
        if name == "up":
            p.add_argument("--timeout", type=float, default=120.0,
                           help="seconds to wait for systemd on every host (default 120)")
    p = add("run", cmd_run, "run a command on a host (podman exec); no command: a shell")
    p.add_argument("host")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p = add("podman", cmd_podman, "run podman with hostlab's storage and network flags")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p = add("status", cmd_status, "state and memory of every host")
    p.add_argument("--json", action="store_true")
    p = add("down", cmd_down, "remove the hosts and the network")
    p.add_argument("--purge", action="store_true",
                   help="also remove the hosts' volumes, the shared storage, the SSH key and the image")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "run" and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if args.cmd == "podman" and args.args[:1] == ["--"]:
        args.args = args.args[1:]
    try:
        preflight()
        return int(args.func(args))
    except HostlabError as err:
        print(f"hostlab: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
