"""Jobs on the lab cluster through the user-facing CLI (/opt/pyhpc/venv/bin/pyhpc), as a
researcher: the directory user user1 (`su - user1`), in their home.

Real sbatch/srun/sacct, real submitit, real torch.distributed (gloo: the lab's
GPUs are emulated). Every job is tiny: the machine has two cores. Only what an
admin does (scontrol requeue, scancel of a leftover) and reading results run as root.
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
from pathlib import Path

import pytest
from test_directory import as_user, sh

from pyhpc import paths

# Jobs import pyhpc from /opt/pyhpc/src: conftest checks it is this checkout's code.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("deployed_copy_is_current")]

SUMMARY_FIELDS = ("workers", "local_batch", "global_batch", "steps", "warmup_steps",
                  "step_time_p50", "step_time_p90", "step_time_mean", "samples_per_s",
                  "samples_per_s_per_worker", "torch_version", "backend", "job_id", "nodes",
                  "mode", "model")
#: Variables that make each shipped template renderable (same as the golden cases).
TEMPLATES = {
    "single": ["command=true"],
    "node-gpus": ["module=pyhpc.train", "partition=gpu", "gpus_per_node=2"],
    "ddp-srun": ["module=pyhpc.train", "nodes=2"],
    "torchrun": ["module=pyhpc.train", "nodes=2"],
    "array": ["command=echo", "values=1,2,3"],
    "jupyter": [],
}


#: The researcher every job of this module runs as: a directory user of the lab's definition.
RESEARCHER = "user1"


def researcher(work: Path, command: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """A shell command as the researcher logged in (`su -`), in work."""
    return sh("su", "-", RESEARCHER, "-c", f"cd {shlex.quote(str(work))} && {command}",
              check=False, timeout=timeout)


@pytest.fixture(scope="module")
def home() -> Path:
    """The researcher's home (made on first login), without earlier runs' job directories."""
    path = Path(as_user(RESEARCHER, "rm -rf ~/ci-jobs && cd && pwd").stdout.strip())
    assert path.stat().st_uid != 0
    return path


@pytest.fixture
def work(home: Path, request: pytest.FixtureRequest) -> Path:
    """A job directory of the researcher's, in their home (every node sees it)."""
    path = home / "ci-jobs" / request.node.name[:60]
    as_user(RESEARCHER, f"mkdir -p {shlex.quote(str(path))}")
    return path


def pyhpc(work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = researcher(work, f"{paths.SHARED_VENV / 'bin' / 'pyhpc'} {shlex.join(args)}")
    if check:
        assert proc.returncode == 0, f"pyhpc {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc


def wait(work: Path, job_id: str, timeout: int = 240) -> str:
    proc = pyhpc(work, "status", job_id, "--watch", "--interval", "1", "--json")
    return json.loads(proc.stdout)[job_id]


def sacct(job_id: str, fields: str = "JobID,State,NNodes") -> list[list[str]]:
    # Not -X: Slurm 22.05's sacct -X drops array tasks. Job steps (123.batch) are skipped.
    out = subprocess.run(["sacct", "-n", "-P", "-j", job_id, "-o", f"JobID,{fields}"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split("|") for line in out.splitlines()]
    return [row[1:] for row in rows if "." not in row[0]]


def sacct_settles(job_id: str, expected: list[list[str]], fields: str = "JobID,State,NNodes",
                  timeout: float = 60) -> list[list[str]]:
    """sacct's rows once they equal ``expected`` (the accounting database lags slurmctld)."""
    deadline = time.monotonic() + timeout
    while sorted(rows := sacct(job_id, fields)) != expected and time.monotonic() < deadline:
        time.sleep(1)
    return sorted(rows)


def read_history(run: Path) -> list[dict]:
    return json.loads((run / "history.json").read_text())


def check_run(run: Path, workers: int) -> dict:
    """Every rank reported, loss went down, the metrics carry every field."""
    ranks = [json.loads(line) for line in (run / "ranks.jsonl").read_text().splitlines()]
    assert sorted(r["rank"] for r in ranks[-workers:]) == list(range(workers))
    assert all(r["peak_memory_bytes"] > 64 << 20 for r in ranks[-workers:])
    history = read_history(run)
    assert history[-1]["loss"] < history[0]["loss"]
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    for key in SUMMARY_FIELDS:
        assert row.get(key) not in (None, ""), key
    assert row["workers"] == workers and row["backend"] == "gloo"
    assert row["global_batch"] == workers * row["local_batch"]
    assert (run / "metrics.csv").read_text().count("\n") >= 2
    return row


def requeue(job: str) -> None:
    """`scontrol requeue` the job, and let it go again a few seconds after it pends: Slurm
    holds a requeued batch job for minutes (BeginTime, so the old launch credential
    expires), and a relaunch within the same second as the revocation is refused
    ("credential revoked")."""
    subprocess.run(["scontrol", "requeue", job], check=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                               text=True).stdout.strip()
        if state == "PENDING" and subprocess.run(
                ["scontrol", "update", f"JobId={job}", "StartTime=now+5"]).returncode == 0:
            break
        time.sleep(0.5)


def test_two_node_data_parallel_job_via_submit_completes(work: Path) -> None:
    run = work / "ddp"
    proc = pyhpc(work, "submit", "ddp-srun", "--nodes", "2", "--set", "module=pyhpc.train",
                 "--set", f"args=--out {run} --epochs 3", "--wait", "--json")
    result = json.loads(proc.stdout)
    assert result["state"] == "COMPLETED"
    expected = [[result["job_id"], "COMPLETED", "2"]]
    assert sacct_settles(result["job_id"], expected) == expected
    row = check_run(run, workers=2)
    assert set(row["nodes"].split(",")) == {"cpu1", "cpu2"}
    assert row["job_id"] == result["job_id"]


def test_torchrun_template_runs_on_two_nodes(work: Path) -> None:
    run = work / "torchrun"
    proc = pyhpc(work, "submit", "torchrun", "--nodes", "2", "--set", "module=pyhpc.train",
                 "--set", f"args=--out {run} --epochs 2", "--wait", "--json")
    result = json.loads(proc.stdout)
    assert result["state"] == "COMPLETED"
    row = check_run(run, workers=2)
    assert len(row["nodes"].split(",")) == 2


#: A researcher's own program: plain torch.distributed, nothing of pyhpc's.
OWN_SCRIPT = """import json, torch, torch.distributed as td
td.init_process_group("gloo")
total = torch.tensor([td.get_rank() + 1.0])
td.all_reduce(total)
print(json.dumps({"rank": td.get_rank(), "world": td.get_world_size(), "sum": total.item()}))
td.destroy_process_group()
"""


@pytest.fixture(scope="module")
def own_venv(home: Path) -> Path:
    """The researcher's own environment as they would make it: a venv with torch alone
    (pip, from this machine's CPU wheel), no pyhpc, no submitit; kept between runs."""
    venv = home / "ci-own-torch"
    python = venv / "bin" / "python"
    probe = f"{python} -c 'import torch' && ! {python} -c 'import pyhpc' 2>/dev/null"
    if researcher(home, probe).returncode != 0:
        made = researcher(home, f"rm -rf {venv} && python3 -m venv {venv} && {venv}/bin/pip "
                                "install -q --disable-pip-version-check --find-links /opt/wheels "
                                "torch==2.13.0", timeout=900)
        assert made.returncode == 0, made.stdout + made.stderr
    assert researcher(home, probe).returncode == 0
    return venv


@pytest.mark.parametrize("template", ["ddp-srun", "node-gpus", "torchrun"])
def test_every_template_runs_in_the_researchers_own_venv_without_pyhpc(
        work: Path, own_venv: Path, template: str) -> None:
    """Issue 51's 2b: the tasks start through the launcher the script carries, not
    ``-m pyhpc.dist``, which a venv without pyhpc cannot import."""
    as_user(RESEARCHER, f"printf %s {shlex.quote(OWN_SCRIPT)} > {work}/own.py")
    shape = (["--partition", "gpu", "--gpus-per-node", "2"] if template == "node-gpus"
             else ["--nodes", "2"])
    proc = pyhpc(work, "submit", template, *shape, "--set", f"script={work}/own.py",
                 "--set", f"python={own_venv}/bin/python", "--set", f"output={work}/%j.out",
                 "--wait", "--json")
    result = json.loads(proc.stdout)
    log = (work / f"{result['job_id']}.out").read_text()
    assert result["state"] == "COMPLETED", log
    rows = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in rows) == [0, 1], log
    assert all(r["world"] == 2 and r["sum"] == 3.0 for r in rows), log


def test_single_node_template_runs_one_task_per_gpu(work: Path) -> None:
    run = work / "node-gpus"
    proc = pyhpc(work, "submit", "node-gpus", "--partition", "gpu", "--gpus-per-node", "2",
                 "--set", "module=pyhpc.train", "--set", f"args=--out {run} --epochs 2",
                 "--wait", "--json")
    assert json.loads(proc.stdout)["state"] == "COMPLETED"
    row = check_run(run, workers=2)
    assert len(row["nodes"].split(",")) == 1 and row["nodes"].startswith("gpu")


def test_jupyter_job_prints_no_tunnel_for_a_server_that_never_listens(work: Path) -> None:
    # `echo` stands in for a server that never listens: it exits at once. The job fails
    # with one line and never names a port (nothing there is the researcher's server).
    proc = pyhpc(work, "submit", "jupyter", "--set", "jupyter=echo started", "--set",
                 "port=8899", "--set", "login_host=login.example.org", "--wait", "--json",
                 check=False)
    job = json.loads(proc.stdout)["job_id"]
    assert proc.returncode == 1 and json.loads(proc.stdout)["state"] == "FAILED"
    log = pyhpc(work, "logs", job).stdout
    assert "ssh -N -L" not in log and "127.0.0.1:8899" not in log
    assert ("pyhpc: error: jupyter: the server exited with status 0 before it listened "
            "(a port it could not take?)") in log
    state = work.parent.parent / ".pyhpc" / "jupyter"
    token = (state / f"{job}.token").read_text().strip()
    assert len(token) == 48 and token not in log
    assert (state / f"{job}.token").stat().st_mode & 0o777 == 0o600
    assert (state / f"{job}.log").read_text() == "started --no-browser --ip=127.0.0.1 --port=8899\n"


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_jupyterlab_answers_with_its_token_and_refuses_without(work: Path) -> None:
    port = 20000 + uuid.uuid4().int % 20000
    proc = pyhpc(work, "submit", "jupyter", "--set", f"port={port}", "--json")
    job = json.loads(proc.stdout)["job_id"]
    token_file = work.parent.parent / ".pyhpc" / "jupyter" / f"{job}.token"
    base = f"http://127.0.0.1:{port}/api/status"
    try:
        # The token goes only where the job log says its own server listens (checked by
        # the job), never to the port asked for before that.
        deadline, log = time.monotonic() + 180, ""
        while "ssh -N -L" not in log:
            assert time.monotonic() < deadline, f"JupyterLab of job {job} never listened"
            time.sleep(1)
            log = pyhpc(work, "logs", job, check=False).stdout
        token = token_file.read_text().strip()
        assert _http_status(f"{base}?token={token}") == 200
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert _http_status(base) == 403
        assert _http_status(f"{base}?token={'0' * len(token)}") == 403
        log = pyhpc(work, "logs", job).stdout
        assert f"ssh -N -L {port}:127.0.0.1:{port}" in log and token not in log
    finally:
        subprocess.run(["scancel", job], check=False)


def test_array_job_completes_all_tasks(work: Path) -> None:
    proc = pyhpc(work, "submit", "array", "--set", "command=echo value", "--set",
                 "values=a,b c,d", "--wait", "--json")
    job = json.loads(proc.stdout)["job_id"]
    assert json.loads(proc.stdout)["state"] == "COMPLETED"
    expected = [[f"{job}_{i}", "COMPLETED"] for i in range(3)]
    assert sacct_settles(job, expected, "JobID,State") == expected
    outputs = {i: (work / f"array-{job}_{i}.out").read_text() for i in range(3)}
    assert "value a\n" in outputs[0] and "value b c\n" in outputs[1] and "value d\n" in outputs[2]


def test_train_wait_ends_with_a_readable_summary(work: Path) -> None:
    run = work / "summary"
    proc = pyhpc(work, "train", "--nodes", "1", "--epochs", "2", "--out", str(run), "--wait")
    first, *rest = proc.stdout.splitlines()
    assert re.fullmatch(rf"job \d+ COMPLETED: {run}", first), proc.stdout
    text = "\n".join(rest)
    accuracy = re.search(r"test accuracy\s+([\d.]+) after 2 epochs", text)
    assert accuracy and 0.0 < float(accuracy.group(1)) <= 1.0, text
    assert re.search(r"throughput\s+[\d.]+ samples/s on 1 workers \(cpu\d\)", text), text
    assert re.search(r"step time\s+p50 [\d.]+ ms, p90 [\d.]+ ms", text), text
    assert f"checkpoint     {run / 'checkpoint.pt'}" in text and (run / "checkpoint.pt").is_file()


def test_requeued_job_resumes_from_its_checkpoint_with_the_exact_epoch_count(work: Path) -> None:
    run = work / "requeue"
    epochs = 6
    # --kernels deterministic (what a resume is exact with on GPUs) through Slurm and a requeue.
    proc = pyhpc(work, "train", "--nodes", "2", "--mode", "synthetic", "--synthetic-samples",
                 "2048", "--epochs", str(epochs), "--kernels", "deterministic", "--out", str(run),
                 "--json")
    job = json.loads(proc.stdout)["job_id"]
    deadline = time.monotonic() + 180
    while not ((run / "history.json").exists() and len(read_history(run)) >= 2):
        assert time.monotonic() < deadline, "no two epochs checkpointed in time"
        time.sleep(0.5)
    requeue(job)
    assert wait(work, job) == "COMPLETED"
    history = read_history(run)
    assert [h["epoch"] for h in history] == list(range(epochs))
    attempts = [h["attempt"] for h in history]
    assert attempts[0] == 0 and attempts[-1] == 1, attempts
    log = "".join(p.read_text() for p in (work / "pyhpc-jobs" / job).glob("*_log.*"))
    assert "pyhpc.train: resuming from checkpoint after epoch" in log
    check_run(run, workers=2)
    ranks = [json.loads(line) for line in (run / "ranks.jsonl").read_text().splitlines()]
    assert ranks and all(r["deterministic"] for r in ranks), ranks


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_rendered_template_passes_sbatch_test_only(work: Path, template: str) -> None:
    sets = [arg for kv in TEMPLATES[template] for arg in ("--set", kv)]
    proc = pyhpc(work, "submit", template, *sets, "--test-only", "--json")
    assert "to start at" in json.loads(proc.stdout)["test_only"]


def test_hostile_job_name_is_refused_and_nothing_runs(work: Path) -> None:
    marker = Path(f"/tmp/pyhpc-pwned-{uuid.uuid4().hex}")
    hostile = f'x"; touch {marker}; #'
    before = sorted(work.rglob("*"))
    proc = pyhpc(work, "submit", "single", "--set", "command=echo inert", "--set",
                 f"job_name={hostile}", "--wait", "--json", check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("pyhpc: error: job_name: ") and proc.stderr.count("\n") == 1
    assert sorted(work.rglob("*")) == before  # no script written, nothing submitted
    assert not marker.exists()


def test_function_submission_runs_on_every_task(work: Path) -> None:
    proc = pyhpc(work, "submit", "socket:gethostname", "--nodes", "2", "--wait", "--json")
    result = json.loads(proc.stdout)
    assert result["state"] == "COMPLETED"
    job = result["job_id"]
    assert {p.name for p in (work / "pyhpc-jobs" / job).glob("*_result.pkl")} == {
        f"{job}_0_result.pkl", f"{job}_1_result.pkl"}


API_SCRIPT = """
import json, os
import pyhpc


def where():
    import torch.distributed as td
    return {"rank": td.get_rank(), "world": td.get_world_size(), "backend": td.get_backend(),
            "node": os.environ["SLURMD_NODENAME"], "master": os.environ["MASTER_ADDR"]}


job = pyhpc.submit(where, nodes=2, partition="gpu", gpus_per_node=2, folder="api/%j")
print(json.dumps({"job_id": job.job_id, "results": job.results()}))
"""


def test_python_api_sets_up_torch_distributed_on_every_task(work: Path) -> None:
    as_user(RESEARCHER, f"printf %s {shlex.quote(API_SCRIPT)} > {shlex.quote(str(work / 'api.py'))}")
    proc = researcher(work, "/opt/pyhpc/venv/bin/python api.py")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    results = out["results"]
    # gpu partition: one task per (emulated) GPU, 2 nodes x 2 GPUs; gloo since no CUDA.
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    assert {r["world"] for r in results} == {4} and {r["backend"] for r in results} == {"gloo"}
    assert sorted(r["node"] for r in results) == ["gpu1", "gpu1", "gpu2", "gpu2"]
    assert {r["master"] for r in results} == {"gpu1"}
    assert wait(work, out["job_id"]) == "COMPLETED"
    expected = [[out["job_id"], "COMPLETED", "2"]]
    assert sacct_settles(out["job_id"], expected) == expected


def test_scale_sweep_reports_throughput_and_efficiency(work: Path) -> None:
    sweep = work / "sweep"
    proc = pyhpc(work, "scale", "--nodes", "1,2", "--batch-sizes", "32", "--mode", "synthetic",
                 "--epochs", "1", "--interval", "1", "--out", str(sweep), "--json")
    report = json.loads(proc.stdout)
    runs = {r["workers"]: r for r in report["runs"]}
    assert set(runs) == {1, 2} and runs[1]["efficiency"] == pytest.approx(1.0)
    assert 0 < runs[2]["efficiency"] and runs[2]["scaling"] == "weak"
    assert Path(report["png"]).read_bytes()[:4] == b"\x89PNG"
    table = pyhpc(work, "report", str(sweep)).stdout
    assert "samples/s" in table and "efficiency" in table


def test_cancel_and_status(work: Path) -> None:
    proc = pyhpc(work, "submit", "single", "--set", "command=sleep 120", "--json")
    job = json.loads(proc.stdout)["job_id"]
    pyhpc(work, "cancel", job)
    assert wait(work, job) == "CANCELLED"
