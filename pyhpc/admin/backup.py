"""``pyhpc admin backup now|list|verify``: this host's share of the cluster's state, kept.

``now`` takes, of what this host holds: a consistent dump of the accounting database
(``mysqldump --single-transaction``, where slurmdbd's configuration is), the directory
(``slapcat``, where pyhpc's slapd runs), and a tar of munge's key, ``/etc/pyhpc/secrets``
and Slurm's configuration; each gzip-compressed, 0600, in a new root-only directory named
for the host and the time (:mod:`pyhpc.admin.backup_store`), with a sha256 manifest. Then
it prunes beyond ``backup.keep`` and records the time for Prometheus (node_exporter's
textfile collector), whose alert fires when it is older than twice ``backup.interval``.
``verify`` loads a backup's dump into a scratch database (dropped afterwards) and counts
the job table's rows, and checks the directory's entries with ``slapadd -u`` (dry run).
"""
from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import os
import secrets
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from pyhpc import files
from pyhpc.admin import backup_store as store
from pyhpc.admin.backup_store import BackupError
from pyhpc.cluster import Cluster

SLURMDBD_CONF = Path("/etc/slurm/slurmdbd.conf")
SLURM_CONF = Path("/etc/slurm/slurm.conf")
SLURMCTLD = Path("/usr/sbin/slurmctld")
SLAPD_CONFIG = Path("/etc/ldap/slapd.d")
#: Copied into files.tar.gz where present (munge's key, pyhpc's secrets, Slurm's config).
FILES = (Path("/etc/munge/munge.key"), Path("/etc/pyhpc/secrets"), Path("/etc/slurm"))
LOCK = Path("/run/pyhpc-backup.lock")
#: The deploy's mark that slurmdbd waits, stopped, for a restore onto its new, empty database
#: (the slurm role's slurm_dbd_hold_file); `pyhpc admin restore` removes it.
HOLD = Path("/var/lib/pyhpc/slurmdbd-held")
#: node_exporter's textfile collector (Debian's default directory).
TEXTFILE_DIR = Path("/var/lib/prometheus/node-exporter")
METRICS_FILE = "pyhpc_backup.prom"
METRICS = {
    "pyhpc_backup_last_success_timestamp_seconds": "when this host's newest good backup "
                                                   "was taken (Unix time)",
    "pyhpc_backup_last_size_bytes": "the size of that backup",
}
#: The backup role writes the others the alert reads: pyhpc_backup_interval_seconds and,
#: at the first deploy (never rewritten), pyhpc_backup_deployed_timestamp_seconds, which
#: the alert counts from until a first backup.
DUMP_END = b"-- Dump completed"
CHUNK = 1 << 20


def _host() -> str:
    host = socket.gethostname().split(".")[0].lower()
    if not store.NAME.fullmatch(f"{host}-00000000T000000Z"):
        raise BackupError(f"this host's name {host!r} cannot name a backup (lower-case "
                          "letters, digits and '-')")
    return host


def _section(cluster: Cluster) -> Any:
    if cluster.backup is None:
        raise BackupError("the cluster definition has no backup section (path, interval, "
                          "keep: docs/admin/backups.md)")
    return cluster.backup


def _root_dir(path: str) -> Path:
    """``backup.path``: created 0700; refused unless root's alone and no link."""
    if os.geteuid() != 0:
        raise BackupError("run as root (backups hold the cluster's keys)")
    try:
        return files.make_dir(path, "backup.path", mode=0o700)
    except files.FileError as exc:
        raise BackupError(str(exc).removeprefix("backup.path: ")) from None


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    fd = os.open(LOCK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackupError("another backup is running on this host") from None
        yield
    finally:
        os.close(fd)


def conf_value(path: Path, key: str) -> str | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == key:
            return value.strip()
    return None


def tool(name: str) -> str:
    """The program's path: on PATH, or in the sbin directories a cron line may lack
    (slapcat, slapadd)."""
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if found is None:
        raise BackupError(f"{name} is not installed on this host")
    return found


def _stream(argv: list[str], out: IO[bytes]) -> None:
    """Run ``argv``, its output gzip-compressed into ``out``; one line on failure."""
    with subprocess.Popen([tool(argv[0]), *argv[1:]], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        pipe, errors = proc.stdout, proc.stderr
        assert pipe is not None and errors is not None
        with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as packed:
            for chunk in iter(lambda: pipe.read(CHUNK), b""):
                packed.write(chunk)
        err = errors.read().decode(errors="replace").strip().splitlines()
    if proc.returncode != 0:
        raise BackupError(f"{argv[0]} failed (exit {proc.returncode}): "
                          f"{err[-1] if err else 'no message'}")


def _tar(out: IO[bytes]) -> None:
    with tarfile.open(fileobj=out, mode="w:gz", dereference=False) as tar:
        for path in FILES:
            if os.path.lexists(path):
                tar.add(path, arcname=str(path).lstrip("/"))


def _tar_tree(out: IO[bytes], top: Path) -> None:
    """``top``'s tree while a daemon goes on writing it. slurmctld writes a state file as
    NAME.new, then renames it to NAME (the old one to NAME.old): a file can go between
    the listing and its turn. It is left out; its data is under the name it went to."""
    with tarfile.open(fileobj=out, mode="w:gz", dereference=False) as tar:
        tar.add(top, arcname=str(top).lstrip("/"), recursive=False)
        for root, dirs, names in os.walk(top):
            dirs.sort()
            for name in [*dirs, *sorted(names)]:
                path = os.path.join(root, name)
                try:
                    tar.add(path, arcname=path.lstrip("/"), recursive=False)
                except FileNotFoundError:
                    continue


def state_dir() -> Path | None:
    """slurmctld's StateSaveLocation, where this host runs slurmctld (the upgrade backs it
    up: the new release's slurmctld does not take it over)."""
    state = conf_value(SLURM_CONF, "StateSaveLocation")
    return Path(state) if state and SLURMCTLD.exists() and Path(state).is_dir() else None


def dump_accounting(database: str, out: IO[bytes]) -> None:
    """A consistent dump of ``database`` (slurmdbd's StorageLoc), gzip-compressed into
    ``out``: accounting.sql.gz's writer."""
    _stream(["mysqldump", "--single-transaction", "--quick", "--routines", "--triggers",
             "--hex-blob", database], out)


def _parts(cluster: Cluster, state: bool = False) -> dict[str, Any]:
    """What this host holds: part file name -> how to write it. With ``state`` (the
    upgrade's backup), also slurmctld's state directory where this host has one."""
    parts: dict[str, Any] = {}
    db = conf_value(SLURMDBD_CONF, "StorageLoc") if cluster.accounting else None
    if db and HOLD.exists():
        # Its dump would be of a database that holds nothing, and the newest: the one a
        # restore then picks.
        raise BackupError(f"slurmdbd is held for a restore ({HOLD}): its database is new and "
                          "empty; run pyhpc admin restore first")
    if db:
        parts["accounting.sql.gz"] = lambda out: dump_accounting(db, out)
    d = cluster.directory
    if d is not None and d.managed and SLAPD_CONFIG.is_dir():
        parts["directory.ldif.gz"] = lambda out: _stream(
            ["slapcat", "-F", str(SLAPD_CONFIG), "-b", d.base_dn, "-o", "ldif-wrap=no"], out)
    parts["files.tar.gz"] = _tar
    where = state_dir() if state else None
    if where is not None:
        parts["slurmctld-state.tar.gz"] = lambda out: _tar_tree(out, where)
    return parts


def now(cluster: Cluster, if_due: bool = False, state: bool = False) -> dict[str, Any]:
    """Take this host's backup, prune, record the metric; returns what was done. With
    ``if_due`` (the schedulers' every tick) only where the newest good one is due; with
    ``state`` with slurmctld's state directory too."""
    section = _section(cluster)
    root = _root_dir(section.path)
    host = _host()
    with _locked():
        started = time.time()
        newest = store.newest_good(root, host)
        if if_due and not store.due(newest, section.interval_s, started):
            assert newest is not None
            return {"name": newest.name, "skipped": "not due: the newest good backup is "
                    f"younger than backup.interval ({section.interval})"}
        name = store.backup_name(host, datetime.fromtimestamp(started, UTC))
        partial = root / f"{store.PARTIAL}{name}.{secrets.token_hex(4)}"
        partial.mkdir(mode=0o700)
        try:
            made = _write_parts(partial, cluster, name, started, state)
            try:
                os.rename(partial, root / name)
            except OSError as exc:
                raise BackupError(f"cannot name it {root / name} ({exc.strerror}: something "
                                  "is there already; nothing is written through a link)") \
                    from None
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        removed = store.prune(root, host, section.keep)
    entry = store.newest_good(root, host)
    if entry is not None:
        write_metrics(entry)
    return {"name": name, "path": str(root / name), "parts": made,
            "size": sum(made.values()), "seconds": round(time.time() - started, 3),
            "pruned": removed}


def _write_parts(folder: Path, cluster: Cluster, name: str, started: float,
                 state: bool = False) -> dict[str, int]:
    sizes: dict[str, int] = {}
    try:
        for part, writer in _parts(cluster, state).items():
            files.write_with(folder / part, writer, "backup", mode=0o600)
            sizes[part] = (folder / part).stat().st_size
        meta = {"made_by": "pyhpc", "host": _host(), "cluster": cluster.name, "name": name,
                "time": datetime.fromtimestamp(started, UTC).isoformat(),
                "parts": sorted(sizes)}
        files.write_text(folder / store.MARKER, json.dumps(meta, indent=2, sort_keys=True)
                         + "\n", "backup", mode=0o600)
        files.write_text(folder / store.MANIFEST,
                         store.manifest_text(folder, [*sizes, store.MARKER]), "backup",
                         mode=0o600)
    except OSError as exc:
        raise BackupError(f"cannot write {folder} ({exc.strerror}); nothing was kept") \
            from None
    except files.FileError as exc:
        raise BackupError(f"{exc}; nothing was kept") from None
    return sizes


def metrics_text(entry: store.Entry) -> str:
    values = {"pyhpc_backup_last_success_timestamp_seconds": int(entry.time.timestamp()),
              "pyhpc_backup_last_size_bytes": entry.size}
    return "".join(f"# HELP {k} {METRICS[k]}\n# TYPE {k} gauge\n{k} {values[k]}\n"
                   for k in METRICS)


def write_metrics(entry: store.Entry, folder: Path | None = None) -> None:
    """Where node_exporter's textfile collector is (``folder``, default
    :data:`TEXTFILE_DIR`), tell it the newest good backup."""
    folder = TEXTFILE_DIR if folder is None else folder
    if folder.is_dir() and not folder.is_symlink():
        files.write_text(folder / METRICS_FILE, metrics_text(entry), "backup",
                         mode=0o644)


def listing(cluster: Cluster) -> list[dict[str, object]]:
    root = _root_dir(_section(cluster).path)
    return [e.row() for e in store.entries(root)]


def _named(root: Path, name: str | None) -> store.Entry:
    """The backup ``name``, or this host's newest good one (on a share, each host's
    backups hold what that host has: verify the db host's on the db host)."""
    found = store.entries(root)
    if name is None:
        good = [e for e in found if e.ok and e.host == _host()]
        if not good:
            raise BackupError(f"no good backup of this host ({_host()}) in {root}; name "
                              "one (pyhpc admin backup list)")
        return good[-1]
    for entry in found:
        if entry.name == name:
            return entry
    raise BackupError(f"no backup named {name!r} in {root}; pyhpc admin backup list shows "
                      "them")


def mysql(sql: str, database: str | None = None) -> str:
    argv = [tool("mysql"), "--batch", "--skip-column-names", "-e", sql,
            *([database] if database else [])]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BackupError(f"mysql failed: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def feed(argv: list[str], packed: Path, tail_must: bytes | None = None) -> bytes:
    """Decompress ``packed`` into ``argv``'s stdin; returns its last line (the dump's end)."""
    last = b""
    with subprocess.Popen([tool(argv[0]), *argv[1:]], stdin=subprocess.PIPE,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc, \
            gzip.open(packed, "rb") as src:
        assert proc.stdin is not None and proc.stderr is not None
        try:
            for chunk in iter(lambda: src.read(CHUNK), b""):
                proc.stdin.write(chunk)
                last = (last + chunk)[-4096:]
        except (EOFError, gzip.BadGzipFile, OSError) as exc:
            proc.kill()
            raise BackupError(f"{packed.name} is truncated or corrupt ({exc})") from None
        finally:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        err = proc.stderr.read().decode(errors="replace").strip().splitlines()
    if proc.returncode != 0:
        raise BackupError(f"{argv[0]} refused {packed.name}: {err[-1] if err else proc.returncode}")
    tail = last.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    if tail_must is not None and not tail.startswith(tail_must):
        raise BackupError(f"{packed.name} ends before mysqldump's last line (truncated)")
    return tail


def verify_dump(dump: Path, job_table: str, jobs: tuple[int, ...] = ()) -> dict[str, Any]:
    """verify's accounting check: ``dump`` loaded into a scratch database (dropped
    afterwards), ``job_table``'s rows counted (``jobs``, newest_job_id) and ``jobs`` looked
    for (``found_jobs``)."""
    done: dict[str, Any] = {}
    scratch = f"pyhpc_verify_{secrets.token_hex(4)}"
    mysql(f"CREATE DATABASE `{scratch}`")
    try:
        feed(["mysql", scratch], dump, DUMP_END)
        table = f"`{job_table}`"
        count, newest = mysql(f"SELECT COUNT(*), COALESCE(MAX(id_job), 0) FROM {table}",
                               scratch).split()
        if jobs:
            wanted = ", ".join(str(int(j)) for j in jobs)
            done["found_jobs"] = sorted({int(j) for j in mysql(
                f"SELECT DISTINCT id_job FROM {table} WHERE id_job IN ({wanted})",
                scratch).split()})
    finally:
        mysql(f"DROP DATABASE IF EXISTS `{scratch}`")
    return {"jobs": int(count), "newest_job_id": int(newest), **done}


def verify(cluster: Cluster, name: str | None = None,
           jobs: tuple[int, ...] = ()) -> dict[str, Any]:
    """Check one backup (default: this host's newest good one) by restoring what it holds into
    scratch places; raises :class:`BackupError` on the first thing that does not hold.
    ``jobs``: job ids to look for in the restored job table (``found_jobs``)."""
    root = _root_dir(_section(cluster).path)
    entry = _named(root, name)
    if not entry.ok:
        raise BackupError(f"{entry.name}: {entry.problem}")
    folder = root / entry.name
    done: dict[str, Any] = {"name": entry.name, "checksums": "ok"}
    dump = folder / "accounting.sql.gz"
    if dump.exists():
        done.update(verify_dump(dump, f"{cluster.name}_job_table", jobs))
    ldif = folder / "directory.ldif.gz"
    if ldif.exists():
        with gzip.open(ldif, "rb") as fh:
            done["directory_entries"] = sum(1 for line in fh if line.startswith(b"dn:"))
        d = cluster.directory
        if d is not None and SLAPD_CONFIG.is_dir():
            feed(["slapadd", "-u", "-q", "-F", str(SLAPD_CONFIG), "-b", d.base_dn], ldif)
            done["directory_check"] = "slapadd -u"
    with tarfile.open(folder / "files.tar.gz", "r:gz") as tar:
        done["files"] = sorted(m.name for m in tar.getmembers() if m.isfile())
    return done
