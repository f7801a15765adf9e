#!/usr/bin/python3 -I
"""Convert the accounting database for the new slurmdbd, on the accounting host after its
move to the next Debian release (issue 46; the route: docs/admin/upgrades.md).

The accounting_convert operation copies this file to the host with its settings (the
route's facts, from pyhpc/admin/upgrade_releases.py) and runs it as root with the system's
Python and the standard library only: the host needs no pyhpc. Steps, each resumable:

1. MariaDB up; the database's schema version (``convert_version_table``).
2. A dump of it (``mysqldump --single-transaction``) into the state directory: the copy
   every later step can go back to. A run that finds the dump reloads it first, so a run
   killed in the middle of a step starts that step again on the same data.
3. The digest of every job's and step's fields the old and new releases share.
4. The steps of the releases Debian skips, replayed by SQL (SchedMD does not support
   this), where the schema is older than the new slurmdbd converts.
5. The new slurmdbd in the foreground (``slurmdbd -D``, as SchedMD's upgrade guide runs
   it: systemd would time out on a long conversion) until it says it started, then
   stopped; the schema version and the digest checked.
6. slurmdbd's unit unmasked and started; a mark written, so a second run is a no-op.

A refusal or a failure after the dump puts the database back from it and exits 1 with one
line; nothing else changed. Exit 2: it cannot begin (one line, nothing changed).

Usage: pyhpc-accounting-convert --settings FILE [--state-dir DIR]
Prints one JSON object: what it found and did.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SLURMDBD_CONF = Path("/etc/slurm/slurmdbd.conf")
STATE_DIR = Path("/var/lib/pyhpc/release")
STARTED = re.compile(r"slurmdbd version (\S+) started")
UNIT = "slurmdbd.service"
#: A name MariaDB takes unquoted, and nothing else, where one goes into SQL.
NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


class Refused(Exception):
    """It cannot begin: exit 2, nothing changed."""


class Failed(Exception):
    """A step failed after the dump: the database goes back to it, exit 1."""


def run(argv: Sequence[str], stdin: str | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}")
        raise Failed(f"{argv[0]}: {last.splitlines()[-1]}")
    return proc.stdout


def sql(database: str, query: str) -> list[list[str]]:
    out = run(["mysql", "-N", "-B", database], stdin=query)
    return [line.split("\t") for line in out.splitlines() if line]


def conf(path: Path) -> dict[str, str]:
    """slurmdbd.conf's keys (lower case) and values."""
    pairs = (line.split("#", 1)[0].strip().split("=", 1) for line in path.read_text().splitlines())
    return {k.strip().lower(): v.strip() for k, v in (p for p in pairs if len(p) == 2)}


def private(path: Path, text: str) -> None:
    """``text`` into ``path``, root's only, never through a link."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600),
              "w") as out:
        out.write(text)


def checked_name(value: str, key: str) -> str:
    if not NAME.fullmatch(value):
        raise Refused(f"{key}: {value[:40]!r} is not a database or cluster name pyhpc deployed "
                      "(letters, digits, _)")
    return value


class Conversion:
    def __init__(self, settings: dict[str, Any], state_dir: Path) -> None:
        self.route = settings
        self.release = str(settings["release"])
        self.state_dir = state_dir
        self.mark = state_dir / f"accounting-{self.release}"
        self.dump = state_dir / f"accounting-before-{self.release}.sql"
        self.digest_file = state_dir / f"accounting-digest-{self.release}.json"
        self.log = state_dir / f"accounting-{self.release}.log"
        self.done: dict[str, Any] = {"release": self.release, "steps": []}

    def step(self, name: str, **facts: Any) -> None:
        self.done["steps"].append({"step": name, "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **facts})

    # -- what is there
    def begin(self) -> None:
        if not SLURMDBD_CONF.exists():
            raise Refused(f"{SLURMDBD_CONF}: missing; run this on the accounting host")
        keys = conf(SLURMDBD_CONF)
        self.database = checked_name(keys.get("storageloc", "slurm_acct_db"), "StorageLoc")
        self.slurm_user = keys.get("slurmuser", "slurm")
        self.logfile = keys.get("logfile")
        self.pidfile = keys.get("pidfile", "/run/slurmdbd.pid")
        if shutil.which("slurmdbd") is None:
            raise Refused("slurmdbd: not installed on this host; move it first (make debian-release)")
        run(["systemctl", "start", "mariadb"], timeout=300)
        self.clusters = [checked_name(row[0], "cluster_table") for row in sql(
            self.database, "select name from cluster_table where deleted = 0")]
        self.done.update(database=self.database, clusters=self.clusters)

    def schema(self) -> int:
        return int(sql(self.database, "select version from convert_version_table")[0][0])

    def digest(self) -> dict[str, str]:
        """md5 of the shared fields of every job and step, per cluster and table."""
        found: dict[str, str] = {}
        for cluster in self.clusters:
            for table, spec in self.route["digest"].items():
                rows = sql(self.database, "set session group_concat_max_len = 1073741824; "
                           f"select count(*), md5(group_concat(concat_ws('|', {spec['fields']}) "
                           f"order by {spec['order']} separator '\\n')) "
                           f"from `{cluster}_{table}_table`")
                found[f"{cluster}_{table}"] = "/".join(rows[0])
        return found

    # -- the steps
    def take_dump(self) -> None:
        """The copy to go back to, once: a resumed run keeps the first one."""
        if self.dump.exists():
            self.reload("a run before this one stopped part-way")
            return
        partial = self.dump.with_suffix(".partial")
        with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600),
                  "w") as out:
            # --databases with --add-drop-database: a reload drops what the conversion made.
            proc = subprocess.run(["mysqldump", "--single-transaction", "--routines",
                                   "--add-drop-database", "--databases", self.database],
                                  stdout=out,
                                  stderr=subprocess.PIPE, text=True, check=False)
        if proc.returncode != 0:
            partial.unlink()
            raise Refused(f"mysqldump: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
        partial.rename(self.dump)
        self.step("dump", file=str(self.dump), bytes=self.dump.stat().st_size)

    def reload(self, why: str) -> None:
        """The dump back in place of the database, slurmdbd stopped first."""
        run(["systemctl", "stop", UNIT], timeout=300)
        started = time.monotonic()
        with open(self.dump) as source:
            proc = subprocess.run(["mysql"], stdin=source, capture_output=True, text=True,
                                  check=False)
        if proc.returncode != 0:
            raise Failed(f"mysql: reloading {self.dump}: {proc.stderr.strip()[-200:]}")
        self.step("reload", why=why, seconds=round(time.monotonic() - started, 2))

    def no_step(self, version: int) -> str:
        return (f"convert_version_table: schema {version}; slurmdbd {self.release} converts "
                f"{self.route['schema_min']} and newer, and pyhpc knows no step from it "
                "(pyhpc/admin/upgrade_releases.py)")

    def replay(self, version: int) -> int:
        while version < int(self.route["schema_min"]):
            steps = self.route["replay"].get(str(version))
            if steps is None:
                raise Failed(self.no_step(version))
            sql(self.database, "; ".join(steps))
            after = self.schema()
            self.step("replay", schema_from=version, schema_to=after, sql=steps)
            if after <= version:
                raise Failed(f"replay from schema {version}: the schema stayed {after}")
            version = after
        return version

    def convert(self, timeout: float) -> str:
        """The new slurmdbd in the foreground until it says it started; its version."""
        started = time.monotonic()
        with open(os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                          0o600), "w") as out:
            proc = subprocess.Popen(["slurmdbd", "-D", "-v"], stdout=out,
                                    stderr=subprocess.STDOUT)
        try:
            while True:
                text = self.log.read_text(errors="replace")
                if found := STARTED.search(text):
                    break
                if proc.poll() is not None:
                    if self.route["too_old"] in text:
                        raise Failed(f"slurmdbd {self.release} refused the database: "
                                     f"{self.route['too_old']}")
                    lines = text.strip().splitlines() or [f"exit {proc.returncode}"]
                    fatal = next((line for line in lines if "fatal" in line), lines[-1])
                    raise Failed(f"slurmdbd {self.release}: {fatal}")
                if time.monotonic() - started > timeout:
                    raise Failed(f"slurmdbd {self.release}: not started within {timeout:g} s "
                                 f"(see {self.log})")
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if self.logfile and os.path.exists(self.logfile):  # as the unit's daemon writes it
                shutil.chown(self.logfile, self.slurm_user, self.slurm_user)
            # Root made it before slurmdbd became SlurmUser, which could not remove it: ours
            # only, the one naming the slurmdbd this ran.
            with contextlib.suppress(OSError):
                if Path(self.pidfile).read_text().strip() == str(proc.pid):
                    Path(self.pidfile).unlink()
        self.step("convert", seconds=round(time.monotonic() - started, 2), log=str(self.log))
        return found.group(1)

    def start_unit(self) -> None:
        run(["systemctl", "unmask", UNIT])
        run(["systemctl", "enable", "--now", UNIT], timeout=300)
        self.step("unit", unit=UNIT, state="started")

    def go(self, timeout: float) -> dict[str, Any]:
        if self.mark.exists():
            self.done.update(outcome="converted already", mark=str(self.mark))
            return self.done
        try:
            self.begin()
            first = self.schema()
        except Failed as exc:  # before the dump: nothing was changed
            raise Refused(str(exc)) from None
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.done["schema_before"] = first
        if first < int(self.route["schema_min"]) and str(first) not in self.route["replay"]:
            raise Refused(self.no_step(first))
        self.take_dump()
        try:
            before = self.digest()
            self.replay(self.schema())
            version = self.convert(timeout)
            after, schema = self.digest(), self.schema()
            if schema != int(self.route["schema"]):
                raise Failed(f"slurmdbd {version} left schema {schema}, not {self.route['schema']}")
            if after != before:
                changed = sorted(k for k in before if before[k] != after.get(k))
                raise Failed(f"the jobs' and steps' fields differ after the conversion: {', '.join(changed)}")
        except Failed:
            self.rollback()
            raise
        private(self.digest_file, json.dumps({"before": before, "after": after}, indent=2) + "\n")
        self.start_unit()
        private(self.mark, f"{first} -> {schema}\n")
        self.done.update(outcome="converted", schema_after=schema, slurmdbd=version,
                         digest=after, mark=str(self.mark))
        return self.done

    def rollback(self) -> None:
        self.reload("a step failed: the database as it was before")
        self.done.update(outcome="rolled back", schema_after=self.schema())


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    parser = argparse.ArgumentParser(prog="pyhpc-accounting-convert",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--settings", required=True, help="the route (JSON)")
    parser.add_argument("--state-dir", type=Path, default=STATE_DIR)
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds the new slurmdbd may take to convert (default %(default)s)")
    args = parser.parse_args(argv)
    with open(args.settings) as fh:
        conversion = Conversion(json.load(fh), args.state_dir)
    try:
        done = conversion.go(args.timeout)
    except Refused as exc:
        print(f"pyhpc-accounting-convert: {exc}; nothing changed", file=sys.stderr)
        return 2
    except Failed as exc:
        print(json.dumps(conversion.done, indent=2))
        print(f"pyhpc-accounting-convert: {exc}; the database is back as it was "
              f"({conversion.dump})", file=sys.stderr)
        return 1
    print(json.dumps(done, indent=2))
    return 0


if __name__ == "__main__":
    os.umask(0o077)  # what slurmdbd and mysql write here too: root's only
    sys.exit(main())
