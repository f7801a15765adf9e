"""``pyhpc doctor``: check a running cluster through the commands a user runs.

Munge round-trip, slurmctld and slurmdbd answer, every node idle, a 2-node
``srun`` (in the default partition, or the first with two nodes) lands on two distinct
nodes and ``sacct`` records it, and where the definition's container runtime has an
image, that image starts on a compute node exactly as the ``container`` template starts
its tasks (:mod:`pyhpc.containers.run`), so a runtime that cannot start (crun on a hybrid
cgroup host, say) shows here, not in a researcher's job. Each check is a
real command (run through :mod:`pyhpc.slurm.slurm`); a check that needs a failed one is
skipped and names what it waits for. Jobs run without slurmdbd, so the 2-node job
needs only the controller and the nodes; only the accounting check needs slurmdbd. Where
the definition runs a hub, its URL must answer JupyterHub's API over verified TLS.

``pyhpc doctor --gpus`` is the GPU acceptance: per GPU node, one step holding all its GPUs
runs :mod:`pyhpc.admin.gpucheck`; the GPUs the node sees must be the GPUs Slurm has as GRES, and
the matmul and DCGM must pass. ``--drain`` drains a node only for a fault the node itself
reported (a check that could not run drains nothing).

The last check lists runaway records (:mod:`pyhpc.admin.runaway`): jobs accounting holds
open that slurmctld lost in a restart; ``--fix-runaway`` closes them.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyhpc import cluster, paths
from pyhpc.admin import gpucheck, runaway
from pyhpc.errors import PyhpcError
from pyhpc.hub import api as hub_api
from pyhpc.slurm import rows as slurm_rows
from pyhpc.slurm import slurm

#: How long sacct gets to record the doctor's job (accounting is asynchronous).
SACCT_WAIT = 30.0


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str


def _why(proc: object) -> str:
    return f"exit {getattr(proc, 'returncode', '?')}: {slurm.why(proc)}"  # type: ignore[arg-type]  # a CompletedProcess


#: The image the container check starts per runtime (what `make containers` exports);
#: enroot's tasks start through pyxis's srun options, which this check does not run.
IMAGES = {"podman": paths.IMAGES / "pyhpc-cpu", "apptainer": paths.IMAGES / "pyhpc-cuda.sif"}
#: The container check's step: its time limit (minutes) and the image's self-test.
CONTAINER_MINUTES = 5
SELFTEST = 'echo "node: $SLURMD_NODENAME"; exec /usr/local/bin/pyhpc-selftest'


class Doctor:
    """Runs the checks in order (every command through pyhpc.slurm)."""

    def __init__(self, sacct_wait: float = SACCT_WAIT, runtime: str | None = None,
                 images: dict[str, Path] | None = None,
                 the_cluster: cluster.Cluster | None = None) -> None:
        self.sacct_wait = sacct_wait
        self.job_id: str | None = None
        self.runtime = runtime
        self.images = IMAGES if images is None else images
        self._cluster = the_cluster

    @property
    def cluster(self) -> cluster.Cluster:
        if self._cluster is None:
            self._cluster = cluster.load(paths.cluster_file())
        return self._cluster

    def munge(self) -> Check:
        cred, back = slurm.munge_roundtrip()
        if back is None:
            return Check("munge", False, f"munge -n: {_why(cred)}")
        ok = back.returncode == 0 and "STATUS:" in back.stdout and "Success" in back.stdout
        return Check("munge", ok, "munge -n | unmunge: Success" if ok else f"unmunge: {_why(back)}")

    def slurmctld(self) -> Check:
        """Which controller schedules. With a backup, the primary down fails the check: the
        cluster runs, without the controller that would take over next."""
        proc = slurm.ping()
        found = slurm_rows.controllers(proc.stdout)
        chief = slurm_rows.in_charge(found)
        if chief is None:
            return Check("slurmctld", False, f"scontrol ping: {_why(proc)}")
        down = [f"{row.role} {row.host} DOWN" for row in found if not row.up]
        detail = f"{chief.host} in charge ({chief.role})"
        if len(found) > 1:
            detail += "; " + ", ".join(down or [f"{row.role} {row.host} UP"
                                                for row in found if row is not chief])
        return Check("slurmctld", not down, detail)

    def slurmdbd(self) -> Check:
        proc = slurm.clusters()
        names = proc.stdout.split()
        ok = proc.returncode == 0 and bool(names)
        detail = f"clusters: {', '.join(names)}" if ok else f"sacctmgr show cluster: {_why(proc)}"
        return Check("slurmdbd", ok, detail)

    def nodes(self) -> Check:
        try:
            states = slurm.nodes()
        except slurm.SlurmError as exc:
            return Check("nodes idle", False, str(exc))
        busy = {n: s for n, s in states.items() if s != "idle"}
        if not states:
            return Check("nodes idle", False, "sinfo lists no nodes")
        if busy:
            try:  # why a node is drained or down, where Slurm holds a reason
                why = slurm.reasons()
            except slurm.SlurmError:
                why = {}
            return Check("nodes idle", False, "not idle: " + ", ".join(
                f"{n} ({s}: {why[n]})" if n in why else f"{n} ({s})" for n, s in busy.items()))
        return Check("nodes idle", True, f"{len(states)} idle: {', '.join(states)}")

    def two_node_partition(self) -> str:
        """The default partition where it has two nodes, else the first that has (a job
        asking a partition for more nodes than it has would pend, not fail); the default
        where none has (the job then fails in Slurm's one line)."""
        parts = (self.cluster.default_partition, *self.cluster.partitions)
        return next((p.name for p in parts if len(p.nodes) >= 2), parts[0].name)

    def srun(self) -> Check:
        try:
            proc = slurm.srun([f"--partition={self.two_node_partition()}", "--nodes=2",
                               "--ntasks-per-node=1", "--time=1", "--job-name=pyhpc-doctor",
                               f"--chdir={STEP_DIR}", "sh", "-c", 'echo "$SLURM_JOB_ID $SLURMD_NODENAME"'])
        except slurm.SlurmError as exc:  # no answer in time: the report goes on
            return Check("srun -N2", False, str(exc))
        if proc.returncode != 0:
            return Check("srun -N2", False, f"srun: {_why(proc)}")
        lines = [line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2]
        names = sorted({name for _, name in lines})
        self.job_id = lines[0][0] if lines else None
        ok = len(names) == 2
        return Check("srun -N2", ok, f"job {self.job_id} ran on {', '.join(names) or 'nothing'}")

    def sacct(self) -> Check:
        if self.job_id is None:
            return Check("sacct", False, "no job to look up (srun -N2 failed)")
        deadline = time.monotonic() + self.sacct_wait
        state = ""
        while True:
            # The newest job of the id: after a controller crash it may be a lost job's too.
            rows = sorted((r for r in slurm.accounting([self.job_id]) if r.job_id == self.job_id),
                          key=lambda r: r.submit)
            state = rows[-1].state if rows else ""
            if state == "COMPLETED" or time.monotonic() >= deadline:
                break
            time.sleep(1)
        ok = state == "COMPLETED"
        return Check("sacct", ok, f"job {self.job_id}: {state or 'not recorded'}")

    def container(self) -> Check:
        """Start the runtime's image on one compute node, as the container template does."""
        runtime = self.runtime or self.cluster.container_runtime
        image = self.images.get(runtime)
        if image is None:
            return Check("container", True, f"{runtime}: tasks start through pyxis's srun "
                         "options; not checked here")
        if not image.exists():
            return Check("container", True, f"{runtime}: no image at {image} yet (make containers "
                         "builds it); nothing to start")
        # From /, with a safe import path: root's step never runs where users can write.
        try:
            proc = slurm.srun(["--nodes=1", "--ntasks=1", f"--time={CONTAINER_MINUTES}",
                               "--job-name=pyhpc-doctor-container", "--chdir=/", str(PYTHON), "-P",
                               "-m", "pyhpc.container_run", "--runtime", runtime, "--image",
                               str(image), "--workdir", "/", "--probe", "--", "sh", "-c", SELFTEST],
                              timeout_s=CONTAINER_MINUTES * 60 + 30)
        except slurm.SlurmError as exc:
            return Check("container", False, str(exc))
        lines = proc.stdout.splitlines()
        said = next((line for line in lines if line.startswith("pyhpc: ")), None)
        if proc.returncode != 0:
            return Check("container", False, said.removeprefix("pyhpc: ") if said else f"srun: {_why(proc)}")
        facts = dict(line.split(": ", 1) for line in lines if ": " in line)
        return Check("container", True, f"{image.name} started on {facts.get('node', '?')}: "
                     f"torch {facts.get('torch', '?')}, python {facts.get('python', '?')}")

    def hub(self) -> Check:
        """The hub answers through its proxy, over TLS verified as a browser would."""
        ok, detail = hub_api.health(self.cluster)
        return Check("hub", ok, detail)

    def checks(self) -> list[Check]:
        munge, ctld, dbd, nodes = self.munge(), self.slurmctld(), self.slurmdbd(), self.nodes()
        results = [munge, ctld, dbd, nodes]
        blockers = [c.name for c in (munge, ctld, nodes) if not c.ok]
        results.append(self.srun() if not blockers else Check(
            "srun -N2", False, f"skipped: needs {', '.join(blockers)}"))
        results.append(self.container() if not blockers else Check(
            "container", False, f"skipped: needs {', '.join(blockers)}"))
        if not dbd.ok:
            results.append(Check("sacct", False, "skipped: slurmdbd does not answer "
                                 "(jobs still run; accounting is not recorded)"))
        else:
            try:
                results.append(self.sacct())
            except slurm.SlurmError as exc:
                results.append(Check("sacct", False, str(exc)))
        missing = [c.name for c in (ctld, dbd) if not c.ok]
        results.append(self.runaway() if not missing else Check(
            runaway.NAME, False, f"skipped: needs {', '.join(missing)}"))
        hub = self.cluster.jupyterhub
        if hub is not None and hub.enabled:
            results.append(self.hub())
            if self.cluster.monitoring.enabled:
                results.append(Check("my-jobs page", *hub_api.my_jobs_health(self.cluster)))
        return results

    def runaway(self) -> Check:
        """Jobs accounting holds open that slurmctld lost (see :mod:`pyhpc.admin.runaway`)."""
        try:
            ok, detail = runaway.check(runaway.find())
        except slurm.SlurmError as exc:
            ok, detail = False, str(exc)
        if paths.RUNAWAY_LEDGER_SHARED.exists():
            ok, detail = False, (f"{detail}; {paths.RUNAWAY_LEDGER_SHARED} holds every user's "
                                 "closed runaway jobs (a ledger from before per-user ledgers): "
                                 "pyhpc doctor --fix-runaway moves each row to its owner's")
        return Check(runaway.NAME, ok, detail)


def table(checks: Sequence[Check]) -> str:
    """Render the checks as an aligned text table."""
    width = max(len(c.name) for c in checks)
    lines = [f"{'CHECK'.ljust(width)}  RESULT  DETAIL"]
    lines += [f"{c.name.ljust(width)}  {'ok' if c.ok else 'FAIL':<6}  {c.detail}" for c in checks]
    return "\n".join(lines)


# -- GPU acceptance (pyhpc doctor --gpus) ---------------------------------------------

#: The shared environment's interpreter on every node, as the job templates use it. The
#: check step runs it isolated (``-I``: no directory of the step's and no PYTHON*
#: variable of the caller's on the import path), since an admin runs the doctor as root.
PYTHON = paths.SHARED_VENV / "bin" / "python"
#: Where the doctor's steps run: root's, never a directory other users can write (/tmp).
STEP_DIR = "/"
#: The check step's time limit (minutes) and how long it may wait for the node's GPUs (s).
GPU_JOB_MINUTES = 5
GPU_WAIT_S = 60
#: State words of a node that runs no new job: it is reported, not checked.
UNAVAILABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "MAINT", "FUTURE", "POWER",
               "REBOOT", "INVAL", "UNKNOWN")


@dataclass(frozen=True)
class GpuRow:
    """One GPU node's verdict. ``fault``: the node itself reported it (what --drain acts on)."""

    node: str
    state: str
    gres: int
    seen: int | None
    matmul: str
    dcgm: str
    ok: bool
    why: str
    fault: bool = False
    drained: bool = False


def gres_gpus(gres: str) -> int:
    """GPUs in a node's ``Gres=`` (``gpu:h100:4(S:0-1)``, ``gpu:2,gpu:a100:1``, ``(null)``)."""
    return sum(int(m.group(1)) for m in re.finditer(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", gres))


def gpu_step(node: str, gpus: int, partition: str) -> list[str]:
    """srun's arguments for the check step: this node, all its GPUs, one task."""
    return [f"--nodelist={node}", "--nodes=1", "--ntasks=1", f"--gres=gpu:{gpus}",
            *([f"--partition={partition}"] if partition else []), f"--time={GPU_JOB_MINUTES}",
            f"--immediate={GPU_WAIT_S}", "--job-name=pyhpc-doctor-gpus", f"--chdir={STEP_DIR}",
            str(PYTHON), "-I", "-m", "pyhpc.admin.gpucheck"]


def gpu_verdict(node: str, state: str, gres: int, data: dict[str, Any]) -> GpuRow:
    """Compare the node's report with Slurm's GRES count."""
    seen = data.get("seen")
    if not isinstance(seen, int) or isinstance(seen, bool):
        return GpuRow(node, state, gres, None, "-", "-", False, "not checked: the report "
                      f"has no GPU count: {json.dumps(data)[:200]}")
    matmul, dcgm = str(data.get("matmul", "error")), str(data.get("dcgm", "error"))
    source = data.get("seen_source", "?")
    faults, errors = [], []
    if seen != gres:
        faults.append(f"Slurm has {gres} GPUs as GRES, the node sees {seen} ({source})")
    for name, status in (("matmul", matmul), ("dcgm", dcgm)):
        detail = str(data.get(f"{name}_detail", ""))
        if status == "fail":
            faults.append(detail)
        elif status not in ("pass", "absent"):
            errors.append(f"{name} could not run: {detail}")
    why = "; ".join(faults + errors) or (f"{source}; matmul {data.get('matmul_detail', '?')}; "
                                         f"dcgm {dcgm}")
    return GpuRow(node, state, gres, seen, matmul, dcgm, ok=not faults and not errors,
                  why=why, fault=bool(faults))


def gpu_check(node: str, fields: dict[str, str]) -> GpuRow:
    """Check one GPU node through one srun step (or say why it was not checked)."""
    state, gres = fields.get("State", "?"), gres_gpus(fields.get("Gres", ""))
    if any(word in state.upper() for word in UNAVAILABLE):
        return GpuRow(node, state, gres, None, "-", "-", False, f"not checked: node is {state}")
    partition = fields.get("Partitions", "").split(",")[0]
    try:
        proc = slurm.srun(gpu_step(node, gres, "" if partition == "(null)" else partition),
                          timeout_s=GPU_JOB_MINUTES * 60 + GPU_WAIT_S + 30)
    except slurm.SlurmError as exc:
        return GpuRow(node, state, gres, None, "-", "-", False, f"not checked: {exc}")
    data = gpucheck.parse(proc.stdout)
    if data is None or "error" in data:
        why = data["error"] if data else f"srun {_why(proc)}"
        return GpuRow(node, state, gres, None, "-", "-", False, f"not checked: {why}")
    return gpu_verdict(node, state, gres, data)


def gpu_rows() -> list[GpuRow]:
    """Every node with GPUs as GRES in Slurm, checked in turn."""
    nodes = {n: f for n, f in slurm.node_info().items() if gres_gpus(f.get("Gres", ""))}
    if not nodes:
        raise PyhpcError("--gpus: no node has GPUs as GRES in Slurm (scontrol show node); "
                         "nothing to check", "--gpus")
    return [gpu_check(node, fields) for node, fields in sorted(nodes.items())]


def drain_faulty(rows: Sequence[GpuRow]) -> list[GpuRow]:
    """Drain each node with a fault it reported (``Reason=pyhpc doctor: ...``); only those."""
    out = []
    for row in rows:
        if row.fault:
            slurm.drain(row.node, f"pyhpc doctor: {row.why}")
            row = replace(row, drained=True)
        out.append(row)
    return out


def gpu_table(rows: Sequence[GpuRow]) -> str:
    """The GPU rows as an aligned text table."""
    head = ("NODE", "GRES", "SEEN", "MATMUL", "DCGM", "RESULT", "DETAIL")
    body = [(r.node, str(r.gres), "-" if r.seen is None else str(r.seen), r.matmul, r.dcgm,
             "ok" if r.ok else ("DRAINED" if r.drained else "FAIL"), r.why) for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(line, widths, strict=False)),
                                line[-1]]) for line in [head, *body])
