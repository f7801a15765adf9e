"""Issue 21 on the lab: no code of one user runs as another user or as root.

Two real directory users, as two hostile colleagues: user2 plants (modules, pickles,
templates, a FIFO, a fake Jupyter server) in a project directory both can write
(root:lab, 2775) and in /tmp; user1 runs pyhpc (`su - user1`), and root runs the doctor.
Every case asserts that nothing planted ran (no marker file of any uid) and that each
refusal is one line.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_directory import as_user, sh

from pyhpc import paths

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

VICTIM, PLANTER = "user1", "user2"
BIN = paths.SHARED_VENV / "bin"
RUN = uuid.uuid4().hex[:8]
#: Every payload touches MARKER-<uid> (in /tmp, which anyone can write) and records what
#: it saw of its victim's home.
MARKER = f"/tmp/pyhpc-iso-{RUN}-ran"
PAYLOAD = (f"import os\nopen({MARKER!r} + '-' + str(os.getuid()), 'w').write("
           "repr(os.listdir(os.path.expanduser('~'))))\n")


def ran() -> list[str]:
    """The uids any planted payload ran as (nothing, when all is well)."""
    return sorted(p.name for p in Path("/tmp").glob(Path(MARKER).name + "-*"))


def as_victim(cwd: Path | str, command: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return sh("su", "-", VICTIM, "-c", f"cd {shlex.quote(str(cwd))} && {command}",
              check=False, timeout=timeout)


def pyhpc(cwd: Path | str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return as_victim(cwd, f"{BIN / 'pyhpc'} {shlex.join(args)}", timeout)


def refused(proc: subprocess.CompletedProcess[str], pattern: str) -> None:
    """One line on stderr matching ``pattern``, exit 2, nothing on stdout."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert re.match(rf"pyhpc: error: {pattern}", proc.stderr), proc.stderr


def victim_jobs() -> list[str]:
    return sh("squeue", "-h", "-u", VICTIM, "-o", "%i").stdout.split()


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """user1's own directory for what the refusals leave it (a fresh one each run)."""
    path = Path(as_user(VICTIM, "cd && rm -rf ci-iso && mkdir -m 700 ci-iso && cd ci-iso && "
                                "pwd").stdout.strip())
    as_user(PLANTER, "true")  # the planter's home exists too (first login)
    yield path
    assert ran() == [], f"planted code ran as uid(s) {ran()}"


@pytest.fixture(scope="module")
def shared(home: Path) -> Iterator[Path]:
    """A project directory user1 and user2 can both write (their group lab), with user2's
    modules planted where `python -m` would import them from."""
    path = Path(f"/tmp/pyhpc-iso-{RUN}")
    path.mkdir()
    sh("chown", "root:lab", str(path))
    path.chmod(0o2775)
    plant = shlex.quote(PAYLOAD)
    as_user(PLANTER, f"cd {path} && mkdir pyhpc submitit && "
                     f"for f in numpy.py json.py pyhpc/__init__.py submitit/__init__.py; do "
                     f"printf %s {plant} > $f; done")
    yield path
    sh("rm", "-rf", str(path))
    for marker in Path("/tmp").glob(Path(MARKER).name + "-*"):
        marker.unlink()


def test_a_module_planted_in_tmp_never_runs_as_root(shared: Path) -> None:
    planted = Path("/tmp/pyhpc")
    assert not planted.exists(), "/tmp/pyhpc is there already; remove it first"
    as_user(PLANTER, f"mkdir /tmp/pyhpc && printf %s {shlex.quote(PAYLOAD)} > "
                     "/tmp/pyhpc/__init__.py")
    try:
        # The admin checks the GPUs from /tmp, the worst place: its steps run from / with -I.
        proc = subprocess.run([str(BIN / "pyhpc"), "doctor", "--gpus", "--json"], cwd="/tmp",
                              capture_output=True, text=True, timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert all(row["ok"] for row in json.loads(proc.stdout)["gpus"])
        # The health check (root, every 5 min) with a colleague's directory on PYTHONPATH.
        check = subprocess.run(["/usr/local/sbin/pyhpc-healthcheck", "gpu1"], cwd=shared,
                               env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                    "PYTHONPATH": str(shared)},
                               capture_output=True, text=True, timeout=60, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        sh("rm", "-rf", str(planted))
    assert ran() == []


def test_a_colleagues_shared_directory_is_refused_and_never_imported_from(
        home: Path, shared: Path) -> None:
    before = sorted(shared.rglob("*"))
    proc = pyhpc(shared, "train", "--nodes", "1", "--epochs", "1", "--wait")
    refused(proc, rf"out: refusing .*: {shared} is writable by group lab \(mode 2775\); ")
    assert sorted(shared.rglob("*")) == before and victim_jobs() == []
    # Run directory and submitit folder of user1's own, started from the shared directory:
    # the job runs there, and imports nothing from it.
    run = home / "train"
    proc = pyhpc(shared, "train", "--nodes", "1", "--epochs", "1", "--out", str(run),
                 "--folder", f"{home}/jobs/%j", "--wait", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["state"] == "COMPLETED" and result["summary"]["epochs"] == 1
    assert ran() == []
    # What submitit keeps for the job is private: 0700 folder, 0600 files (logs included).
    folder = home / "jobs" / result["job_id"]
    assert folder.stat().st_mode & 0o777 == 0o700
    kept = list(folder.iterdir())
    assert kept and all(p.lstat().st_mode & 0o777 == 0o600 for p in kept if not p.is_symlink())
    # A second run into the finished directory trains nothing: a failure, never COMPLETED.
    again = pyhpc(shared, "train", "--nodes", "1", "--epochs", "1", "--out", str(run),
                  "--folder", f"{home}/jobs/%j", "--wait")
    assert again.returncode == 1 and re.match(r"job \d+ FAILED: ", again.stdout), again.stdout
    log = pyhpc(home, "logs", again.stdout.split()[1]).stdout
    assert "has already trained 1 of 1 epochs; nothing left to train" in log


@pytest.mark.parametrize("template", ["ddp-srun", "torchrun"])
def test_template_jobs_run_from_a_shared_directory_import_nothing_from_it(
        home: Path, shared: Path, template: str) -> None:
    script = home / f"{template}.sbatch"
    args = f"--out {home / template} --epochs 1"
    render = pyhpc(home, "render", template, "--set", "module=pyhpc.train", "--set", "nodes=1",
                   "--set", f"args={args}", "--set", f"output={home}/%x-%j.out")
    assert render.returncode == 0, render.stderr
    as_user(VICTIM, f"printf %s {shlex.quote(render.stdout)} > {script}")
    proc = pyhpc(shared, "submit", str(script), "--wait", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["state"] == "COMPLETED"
    assert (home / template / "metrics.jsonl").is_file() and ran() == []


def test_a_planted_submitit_folder_is_refused_before_anything_runs(home: Path,
                                                                   shared: Path) -> None:
    # user2 pre-creates the next job ids' folders, each with a pickle that runs code.
    last = max((int(j) for j in sh("squeue", "-h", "-o", "%i").stdout.split() if j.isdigit()),
               default=0)
    last = max(last, *(int(j.split("_")[0]) for j in sh(
        "sacct", "-a", "-X", "-n", "-o", "JobID", "-S", "now-1day").stdout.split()
        if j.split("_")[0].isdigit()), 0)
    pickler = (f"import os, pickle\nclass P:\n    def __reduce__(self):\n        return "
               f"(exec, ({PAYLOAD!r},))\nfor j in range({last + 1}, {last + 40}):\n"
               f"    os.makedirs(f'pyhpc-jobs/{{j}}', exist_ok=True)\n"
               f"    open(f'pyhpc-jobs/{{j}}/{{j}}_submitted.pkl', 'wb').write(pickle.dumps(P()))\n")
    as_user(PLANTER, f"cd {shared} && {BIN / 'python'} -c {shlex.quote(pickler)} && "
                     "chmod -R a+rwx pyhpc-jobs")
    proc = pyhpc(shared, "submit", "socket:gethostname", "--wait")
    refused(proc, rf"folder: refusing {shared}/pyhpc-jobs: {shared} is writable by group lab ")
    assert victim_jobs() == [] and ran() == []
    # An existing pyhpc-jobs/ of root's in user1's own directory: the same one line.
    Path(home / "rootowned" / "pyhpc-jobs").mkdir(parents=True)
    sh("chown", f"{VICTIM}:lab", str(home / "rootowned"))
    refused(pyhpc(home / "rootowned", "submit", "socket:gethostname"),
            rf"folder: refusing {home}/rootowned/pyhpc-jobs: .* belongs to root, not to you")
    # A directory user1 cannot write: the same one line, not an unexpected PermissionError.
    as_user(VICTIM, f"mkdir -m 500 {home}/readonly")
    refused(pyhpc(home / "readonly", "submit", "socket:gethostname"),
            rf"folder: cannot create directory {home}/readonly/pyhpc-jobs \(permission denied in "
            rf"{home}/readonly\)")


def test_a_colleagues_template_renders_as_text_and_never_as_code(home: Path,
                                                                 shared: Path) -> None:
    payload = ("{{ cycler.__init__.__globals__.os.system('touch " + MARKER
               + "-template') }}")
    as_user(PLANTER, f"cd {shared} && printf %s {shlex.quote(payload)} > x.sbatch.j2 && "
                     "printf %s 'planted {{ command }}' > single.sbatch.j2")
    refused(pyhpc(shared, "render", "./x.sbatch.j2"),
            r"template: 'x\.sbatch\.j2' tried what a template may not ")
    refused(pyhpc(shared, "render", "x.sbatch.j2"), r"template: unknown template 'x\.sbatch\.j2'")
    shipped = pyhpc(shared, "render", "single", "--set", "command=true")
    assert shipped.returncode == 0 and "planted" not in shipped.stdout
    assert ran() == []


def _http(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


FAKE_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        open(sys.argv[2], 'a').write(self.path + '\\n')
        self.send_response(200); self.end_headers()
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
"""


def test_jupyter_names_the_port_its_own_server_holds(home: Path, shared: Path) -> None:
    port = 20000 + uuid.uuid4().int % 20000
    heard = f"/tmp/pyhpc-iso-{RUN}-heard"
    pid = as_user(PLANTER, f"nohup {BIN / 'python'} -c {shlex.quote(FAKE_SERVER)} {port} {heard}"
                           " >/dev/null 2>&1 & echo $!").stdout.strip()
    job = ""
    try:
        time.sleep(2)  # the colleague's fake server holds the port on the shared node
        proc = pyhpc(home, "submit", "jupyter", "--set", f"port={port}", "--set",
                     f"output={home}/jupyter-%j.out", "--json")
        job = json.loads(proc.stdout)["job_id"]
        out, deadline, log = home / f"jupyter-{job}.out", time.monotonic() + 240, ""
        while "ssh -N -L" not in log:
            assert time.monotonic() < deadline, f"job {job} printed no tunnel:\n{log}"
            time.sleep(2)
            log = out.read_text() if out.exists() else ""
        assert f"pyhpc: port {port} is taken on " in log
        real = int(re.search(r"ssh -N -L (\d+):127\.0\.0\.1:\1 ", log).group(1))  # type: ignore[union-attr]
        assert real != port
        token = (home.parent / ".pyhpc" / "jupyter" / f"{job}.token").read_text().strip()
        assert token not in log
        assert _http(f"http://127.0.0.1:{real}/api/status?token={token}") == 200
        assert not Path(heard).exists()  # the colleague's server never heard from anyone
    finally:
        if job:
            sh("scancel", job, check=False)
        sh("kill", pid, check=False)
        sh("rm", "-f", heard, check=False)


def test_results_read_back_never_hang_on_a_planted_fifo(home: Path, shared: Path) -> None:
    as_user(PLANTER, f"mkdir -p {shared}/run && mkfifo {shared}/run/metrics.jsonl "
                     f"{shared}/run/checkpoint.pt")
    proc = pyhpc(shared, "report", f"{shared}/run", "--png", f"{home}/x.png", timeout=60)
    refused(proc, rf"{shared}/run/metrics\.jsonl: not a regular file")
    # The checkpoint planted in a shared run directory is never resumed from: refused.
    proc = pyhpc(home, "train", "--out", f"{shared}/run", "--wait", timeout=60)
    refused(proc, rf"out: refusing {shared}/run: {shared} is writable by group lab ")


# -- a colleague squatting the rendezvous ports (issue 51, item 2) ----------------------------

#: user2's squatter: binds every port it can from FIRST on, counts who connects, and ends
#: after LIFE seconds (or at once when its stop file appears).
SQUATTER = """import os, select, socket, sys, time
first, count, life, log = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
socks = []
for port in range(first, first + count):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port)); s.listen(16); socks.append(s)
    except OSError:
        s.close()
print(len(socks), flush=True)
end = time.monotonic() + life
while time.monotonic() < end and not os.path.exists(log + ".stop"):
    for s in select.select(socks, [], [], 0.5)[0]:
        conn, peer = s.accept()
        with open(log, "a") as f:
            f.write(f"{s.getsockname()[1]} {peer}\\n")
        conn.close()
"""


def next_job_ids(count: int) -> list[int]:
    """The ids the lab's controller gives next (only this worker submits to it)."""
    known = sh("squeue", "-h", "-a", "-o", "%i").stdout.split() + sh(
        "sacct", "-n", "-X", "-a", "-o", "JobID", "-S", "now-7days").stdout.split()
    last = max([int(j.split("_")[0]) for j in known if j.split("_")[0].isdigit()] or [0])
    return list(range(last + 1, last + 1 + count))


@pytest.fixture
def squatted() -> Iterator[Path]:
    """user2 holds the ports the next jobs' old rendezvous took (20000 + job id % 12768)
    with 20 on either side; yields the file where it logs every connection."""
    folder = Path(as_user(PLANTER, f"mkdir -p -m 700 ~/ci-squat-{RUN} && cd ~/ci-squat-{RUN} && "
                                   "pwd").stdout.strip())
    as_user(PLANTER, f"printf %s {shlex.quote(SQUATTER)} > {folder}/squat.py")
    log = folder / "heard"
    first = 20000 + next_job_ids(1)[0] % 12768 - 20
    proc = subprocess.Popen(["su", "-", PLANTER, "-c", f"exec python3 {folder}/squat.py {first} "
                             f"50 500 {log}"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and int(proc.stdout.readline()) >= 45
        yield log
    finally:
        as_user(PLANTER, f"touch {log}.stop")
        proc.wait(30)
        sh("rm", "-rf", str(folder))


@pytest.mark.parametrize("how", ["ddp-srun", "torchrun", "train"])
def test_a_colleague_squatting_the_rendezvous_ports_is_never_reached(
        home: Path, squatted: Path, how: str) -> None:
    """Before the fix the ranks joined the squatter's "store" (whose pickles torch's
    rendezvous loads) and the job failed; now the job's port is its store's, bound before
    any rank learns it: the job completes and the squatter hears from nobody."""
    run = home / f"squat-{how}"
    if how == "train":
        proc = pyhpc(home, "train", "--nodes", "2", "--epochs", "1", "--out", str(run),
                     "--wait", "--json")
    else:
        proc = pyhpc(home, "submit", how, "--nodes", "2", "--set", "module=pyhpc.train",
                     "--set", f"args=--out {run} --epochs 1", "--set",
                     f"output={home}/%x-%j.out", "--wait", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["state"] == "COMPLETED"
    assert (run / "metrics.jsonl").is_file()
    assert not squatted.exists(), squatted.read_text()
