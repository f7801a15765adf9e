#!/usr/bin/python3 -I
"""Slurm's HealthCheckProgram: drain this node on a fault, never because a check itself failed.

The slurm role installs this file as ``pyhpc-healthcheck`` on compute hosts, beside its
settings (``/etc/slurm/pyhpc-healthcheck.json``, rendered from the cluster definition). It
runs with the system's Python and the standard library only: nodes need no pyhpc. It runs
as root: -I (isolated) keeps every directory and PYTHON* variable that is not Python's own
off its import path, for this process and for its child.

slurmd runs it as root when it starts and every HealthCheckInterval, with only
SLURMD_NODENAME set, and does nothing with its exit status but log it: draining is this
program's job (scontrol update State=DRAIN Reason="pyhpc-healthcheck: ...").

Checks: the node's GPUs are all there (device files, or nvidia-smi -L where the driver
finds them), `munge -n | unmunge` answers, the slurmd spool has min_free_mb free. Each
command has command_s; a check that cannot decide (its command is missing or does not
answer) is logged and drains nothing. The checks run in a child process that is killed
after timeout_s: a run that overruns or errs drains nothing and exits 0. A node that
someone else drained keeps their reason.

Usage: pyhpc-healthcheck [--config FILE] [NODE]   (default: $SLURMD_NODENAME, else the
short hostname). Exit status: 0 healthy or undecided, 1 a fault was found (and drained).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

CONFIG = "/etc/slurm/pyhpc-healthcheck.json"
REASON = "pyhpc-healthcheck: "
#: A check's verdict ("ok", "fail" or "unsure") and what it saw.
Result = tuple[str, str]


@dataclass(frozen=True)
class Config:
    """The settings the slurm role renders: the bounds, the paths, each node's GPUs."""

    cluster: str
    timeout_s: float
    command_s: float
    min_free_mb: int
    log: str
    #: ``{node}`` is the node's name: the lab's several slurmd have a spool each.
    spool: str
    #: ``{node}`` and ``{index}``: a GPU's device file.
    gpu_file: str
    #: Node -> (how its GPUs are found: "files" or "nvml", how many).
    nodes: dict[str, tuple[str, int]]

    @classmethod
    def read(cls, path: str) -> Config:
        with open(path) as fh:
            data: dict[str, Any] = json.load(fh)
        data["nodes"] = {name: (str(detect), int(count)) for name, (detect, count)
                         in data["nodes"].items()}
        return cls(**data)


def log(config: Config | None, message: str) -> None:
    """One line on stdout (slurmd logs it when the exit status is not 0) and in the log."""
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}"
    print(line, flush=True)
    try:
        if config is not None:
            with open(config.log, "a") as out:
                out.write(line + "\n")
    except OSError:
        pass


def command(config: Config, argv: Sequence[str], stdin: bytes | None = None,
            ) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr); the status is None when the command is missing
    or does not answer within command_s (it is killed)."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except OSError as exc:
        return None, "", f"{argv[0]}: {exc.strerror}"
    try:
        out, err = proc.communicate(stdin, timeout=config.command_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()  # not communicate(): a child it left may hold the pipes open
        return None, "", f"{argv[0]}: no answer within {config.command_s:g} s"
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def last_line(text: str, default: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else default


def check_gpus(config: Config, node: str) -> Result:
    detect, count = config.nodes[node]
    if not count:
        return "ok", "no GPUs"
    if detect == "nvml":
        code, out, err = command(config, ["nvidia-smi", "-L"])
        if code is None:
            return "unsure", err
        if code != 0:
            return "fail", f"nvidia-smi -L: {last_line(out + err, f'exit {code}')}"
        found = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        if found < count:
            return "fail", f"nvidia-smi -L lists {found} of {count} GPUs"
        return "ok", f"{found} GPUs"
    files = [config.gpu_file.format(node=node, index=i) for i in range(count)]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        return "fail", f"{len(missing)} of {count} GPU devices missing: {' '.join(missing)}"
    return "ok", f"{count} GPU devices"


def check_munge(config: Config, node: str) -> Result:
    code, cred, err = command(config, ["munge", "-n"])
    if code is None:
        return "unsure", err
    if code != 0:
        return "fail", f"munge -n: {last_line(err, f'exit {code}')}"
    code, out, err = command(config, ["unmunge"], cred.encode())
    if code is None:
        return "unsure", err
    if code != 0 or "Success" not in out:
        return "fail", f"unmunge: {last_line(err or out, f'exit {code}')}"
    return "ok", "munge -n | unmunge: Success"


def check_spool(config: Config, node: str) -> Result:
    path = config.spool.format(node=node)
    code, out, err = command(config, ["df", "-Pk", path])
    if code != 0:
        return "unsure", f"df {path}: {last_line(err, 'no answer')}"
    try:
        free_mb = int(out.strip().splitlines()[-1].split()[3]) // 1024
    except (IndexError, ValueError):
        return "unsure", f"df {path}: unreadable output"
    if free_mb < config.min_free_mb:
        return "fail", f"{path} has {free_mb} MiB free, below {config.min_free_mb} MiB"
    return "ok", f"{free_mb} MiB free"


CHECKS: dict[str, Callable[[Config, str], Result]] = {
    "gpus": check_gpus, "munge": check_munge, "spool": check_spool}


def run_checks(config: Config, node: str) -> int:
    """The child: every check, as one JSON line {name: [verdict, detail]}."""
    print(json.dumps({name: check(config, node) for name, check in CHECKS.items()}), flush=True)
    return 0


def checked(config: Config, config_path: str, node: str) -> dict[str, Result] | None:
    """Run the checks in a child process killed after timeout_s; None when it overran or
    erred (then the caller drains nothing)."""
    child = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "--config", config_path,
                              "--checks", node], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        out, err = child.communicate(timeout=config.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the child and its commands (not reaped yet)
        child.wait()
        log(config, f"{node}: the checks did not finish within {config.timeout_s:g} s; "
                    "nothing drained")
        return None
    try:
        results = json.loads(out.decode(errors="replace"))
        return {name: (str(results[name][0]), str(results[name][1])) for name in CHECKS}
    except (ValueError, KeyError, TypeError, IndexError):
        log(config, f"{node}: the checks failed ({last_line(err.decode(errors='replace'), 'no output')});"
                    " nothing drained")
        return None


def drained_by_someone_else(config: Config, node: str) -> bool:
    code, out, _ = command(config, ["scontrol", "show", "node", "-o", node])
    state = next((w[6:] for w in out.split() if w.startswith("State=")), "") if code == 0 else ""
    return "DRAIN" in state and f"Reason={REASON}" not in out


def reason_text(text: str) -> str:
    """One line for scontrol: no quotes or control characters, at most 200 characters."""
    kept = "".join(" " if c in "\"'`\\" or not c.isprintable() else c for c in text)
    return " ".join(kept.split())[:200]


def drain(config: Config, node: str, results: dict[str, Result]) -> int:
    """Log what could not be decided; drain the node for its faults (1), or leave it (0)."""
    for name, (verdict, detail) in sorted(results.items()):
        if verdict == "unsure":
            log(config, f"{node}: {name} undecided ({detail}); not a reason to drain")
    faults = [f"{name}: {detail}" for name, (verdict, detail) in sorted(results.items())
              if verdict == "fail"]
    if not faults:
        return 0
    reason = reason_text(REASON + "; ".join(faults))
    if drained_by_someone_else(config, node):
        log(config, f"{node}: {reason} (already drained for another reason; left as it is)")
        return 1
    code, out, err = command(config, ["scontrol", "update", f"NodeName={node}", "State=DRAIN",
                                      f"Reason={reason}"])
    log(config, f"{node}: drained: {reason}" if code == 0 else
        f"{node}: {reason}; the drain failed: {last_line(err or out, 'no answer')}")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    parser = argparse.ArgumentParser(prog="pyhpc-healthcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=CONFIG, help="the settings (default %(default)s)")
    parser.add_argument("--checks", metavar="NODE", help=argparse.SUPPRESS)  # the child
    parser.add_argument("node", nargs="?", help="default: $SLURMD_NODENAME, else the short hostname")
    args = parser.parse_args(argv)
    try:
        config = Config.read(args.config)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log(None, f"pyhpc-healthcheck: cannot read {args.config} ({type(exc).__name__}); nothing checked")
        return 0
    try:
        if args.checks:
            return run_checks(config, args.checks)
        node = args.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        if node not in config.nodes:
            log(config, f"{node}: not a node of cluster {config.cluster}; nothing checked")
            return 0
        results = checked(config, args.config, node)
        return 0 if results is None else drain(config, node, results)
    except Exception as exc:  # the checker's own error must never count against the node
        log(config, f"pyhpc-healthcheck: internal error: {type(exc).__name__}: {exc}; nothing drained")
        return 0


if __name__ == "__main__":
    sys.exit(main())
