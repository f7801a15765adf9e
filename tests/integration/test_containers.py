"""The framework image on the lab: built offline with podman, self-tested, run under Slurm.

Real podman (vfs, runc, chroot isolation), real mmdebstrap, real sbatch/srun and
torch.distributed (gloo) across the lab's two CPU nodes, each task in the image: root's
jobs, and a researcher's (the directory user user1, podman rootless) from their home.
"""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_directory import as_user

from pyhpc import paths
from pyhpc.containers import build as container_build
from pyhpc.containers import run as container_run

pytestmark = pytest.mark.integration

IMAGE_DIR = Path("/opt/pyhpc/images/pyhpc-cpu")
TEMPLATE = "slurm/jobs/container.sbatch.j2"
#: What `make containers` runs: this checkout's pyhpc (jobs use the deployed copy).
MAKE_CONTAINERS = (sys.executable, "-m", "pyhpc")


DEPLOYED_CLI = (str(paths.SHARED_VENV / "bin" / "pyhpc"),)


def _pyhpc(cwd: Path, *args: str, timeout: int = 300,
           cli: tuple[str, ...] = DEPLOYED_CLI) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*cli, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    print(proc.stdout, proc.stderr, sep="\n")
    assert proc.returncode == 0, f"pyhpc {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def built() -> dict:
    """`pyhpc containers build --variant cpu` (what `make containers` runs); cached when unchanged."""
    for tool in ("podman", "runc", "crun", "mmdebstrap"):
        assert shutil.which(tool), f"{tool} is missing: the containers role installs it (make deploy)"
    assert (paths.SHARED_SRC / TEMPLATE).read_bytes() == (paths.ROOT / TEMPLATE).read_bytes(), \
        "/opt/pyhpc/src is older than this checkout; run make deploy"
    proc = _pyhpc(paths.ROOT, "containers", "build", "--variant", "cpu", timeout=1800, cli=MAKE_CONTAINERS)
    assert "selftest: ok" in proc.stdout
    return json.loads((IMAGE_DIR / "image.json").read_text())


def test_built_image_self_test_reports_versions_and_no_gpu(built: dict) -> None:
    lines = built["selftest"]
    assert "torch: 2.13.0+cpu" in lines and "cuda: none" in lines and "nccl: none" in lines
    assert "gpu visible: no" in lines and lines[-1] == "selftest: ok"
    assert built["labels"]["org.pyhpc.torch"] == "2.13.0"
    assert "torch==2.13.0+cpu" in built["pip_freeze"]
    # NVML's bindings (pure Python, for the job exporter) are the only package naming NVIDIA.
    nvidia = [p.split("==")[0] for p in built["pip_freeze"] if p.startswith("nvidia")]
    assert nvidia == ["nvidia-ml-py"], f"CUDA wheels in the CPU image: {nvidia}"
    assert (IMAGE_DIR / "rootfs/opt/pyhpc/venv/bin/python").exists()


def test_documented_oci_self_test_command_passes(built: dict) -> None:
    proc = subprocess.run([*container_build.PODMAN, "run", "--rm", *container_build.ULIMITS,
                           built["ref"], "pyhpc-selftest"], capture_output=True, text=True, timeout=600)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "selftest: ok"


def test_image_labels_carry_the_spec_pins(built: dict) -> None:
    out = subprocess.run([*container_build.PODMAN, "image", "inspect", "--format", "{{json .Labels}}",
                          built["ref"]], capture_output=True, text=True, check=True).stdout
    labels = json.loads(out)
    assert {k: labels.get(k) for k in built["labels"]} == built["labels"]


def test_second_build_is_cached_and_builds_nothing(built: dict) -> None:
    proc = _pyhpc(paths.ROOT, "containers", "build", "--variant", "cpu", cli=MAKE_CONTAINERS)
    assert "is up to date" in proc.stdout and "building" not in proc.stdout
    assert json.loads((IMAGE_DIR / "image.json").read_text())["image_id"] == built["image_id"]


#: Each task prints where it runs, writes a file in the submit directory and one in
#: /var/tmp (its own), and tries to write into the shared image (read-only).
PROBE = (
    "import json, os, torch\n"
    "open(f'rank-{os.environ[\"RANK\"]}.txt', 'w').write('ok')\n"
    "open(f'/var/tmp/pyhpc-probe-{os.environ[\"RANK\"]}', 'w').write('mine')\n"
    "try:\n    open('/etc/pyhpc-probe', 'w').close(); image_writable = True\n"
    "except OSError:\n    image_writable = False\n"
    "print('PROBE', json.dumps({'rank': os.environ['RANK'], 'node': os.environ['SLURMD_NODENAME'],"
    " 'image': os.environ.get('PYHPC_IMAGE'), 'containerenv': os.path.exists('/run/.containerenv'),"
    " 'torch': torch.__version__, 'image_writable': image_writable,"
    " 'cgroup': [l for l in open('/proc/self/cgroup') if ':memory:' in l][0].strip()}))\n")


def probe_rows(work: Path, job_id: str) -> list[dict]:
    """The PROBE lines of a job's log, after checking each rank ran in the image."""
    log = next(work.glob(f"*-{job_id}.out")).read_text()
    print(log)
    rows = [json.loads(line.split(" ", 1)[1]) for line in log.splitlines() if line.startswith("PROBE ")]
    assert sorted((r["rank"], r["node"]) for r in rows) == [("0", "cpu1"), ("1", "cpu2")]
    assert all(r["image"] == "pyhpc-cpu" and r["containerenv"] for r in rows), rows
    # The shared image is read-only, and /var/tmp was each task's own.
    assert not any(r["image_writable"] for r in rows), rows
    assert not list((IMAGE_DIR / "rootfs/var/tmp").glob("pyhpc-probe-*"))
    # Each task stays in its job step's cgroup (step 1: step 0 is the template's check that
    # the image starts), so Slurm's confinement holds inside the image.
    assert all(f"/job_{job_id}/step_1/task_" in r["cgroup"] for r in rows), rows
    return rows


def rootfs_entries() -> list[str]:
    """What a job could leave in the shared rootfs: its top level and the mount points' parents."""
    rootfs = IMAGE_DIR / "rootfs"
    return sorted(str(p.relative_to(rootfs))
                  for d in ("", "home", "tmp", "run", "opt/pyhpc", "etc", "var/tmp")
                  for p in (rootfs / d).iterdir())


def test_two_node_job_runs_every_task_inside_the_image(built: dict, work: Path) -> None:
    probe = work / "probe.py"
    probe.write_text(PROBE)
    before = rootfs_entries()
    proc = _pyhpc(work, "submit", "container", "--nodes", "2", "--set", f"script={probe}",
                  "--wait", "--json")
    result = json.loads(proc.stdout)
    assert result["state"] == "COMPLETED"
    probe_rows(work, result["job_id"])
    assert (work / "rank-1.txt").read_text() == "ok"
    assert rootfs_entries() == before


RESEARCHER = "user1"
#: Another user of the login host, who would use the shared tree against the others.
COLLEAGUE = "user2"


def test_the_shared_rootfs_gives_a_host_user_no_setuid_file_no_device_and_no_place_to_write(
        built: dict) -> None:
    """The image has setuid-root su, mount and passwd, 1777 tmp and var/tmp and 0666 device
    nodes (podman export lists them); the tree on the host keeps none of it (issue 51)."""
    rootfs = IMAGE_DIR / "rootfs"
    # A link's own mode is always 0777 and never used: its owner counts, not its bits. A
    # mount point the runtime makes later (1755, the submit directory's) is writable by none.
    found = subprocess.run(["find", str(rootfs), "-xdev", "(", "-perm", "/6022", "!", "-type",
                            "l", "-o", "!", "-type", "f", "!", "-type", "d", "!", "-type", "l",
                            "-o", "!", "-user", "root", "-o", "!", "-group", "root", ")",
                            "-printf", r"%m %u:%g %y %P\n"],
                           capture_output=True, text=True, check=True)
    assert found.stdout == ""
    for tool in ("usr/bin/su", "usr/bin/mount", "usr/bin/passwd"):
        assert (rootfs / tool).stat().st_mode & 0o7777 == 0o755, tool
    # The colleague cannot plant anything in the image's tmp directories.
    for where in ("tmp", "var/tmp"):
        proc = as_user(COLLEAGUE, f"touch {rootfs / where}/pyhpc-planted", check=False)
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, proc.stderr
        assert not (rootfs / where / "pyhpc-planted").exists()


def test_researchers_two_node_job_runs_rootless_inside_the_image_in_the_jobs_cgroup(
        built: dict) -> None:
    """A directory user (no subuid ranges) from their home: podman rootless, one uid mapped."""
    home = Path(as_user(RESEARCHER, "cd && pwd").stdout.strip())
    work = home / "ci-containers"
    as_user(RESEARCHER, f"rm -rf {work} && mkdir -p {work} && printf %s {shlex.quote(PROBE)} "
                        f"> {work}/probe.py")
    before = rootfs_entries()
    proc = as_user(RESEARCHER, f"cd {work} && {DEPLOYED_CLI[0]} submit container --nodes 2 "
                               f"--set script={work}/probe.py --wait --json", check=False)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["state"] == "COMPLETED"
    probe_rows(work, result["job_id"])
    uid = home.stat().st_uid
    assert uid != 0
    # The files the tasks wrote are the researcher's; nothing was added to the shared image.
    assert {p.stat().st_uid for p in work.glob("rank-*.txt")} == {uid}
    assert rootfs_entries() == before


def test_two_node_training_in_the_image_reports_throughput(built: dict, work: Path) -> None:
    run = work / "ddp"
    proc = _pyhpc(work, "submit", "container", "--nodes", "2", "--set", "module=pyhpc.train",
                  "--set", f"args=--out {run} --epochs 2", "--wait", "--json")
    result = json.loads(proc.stdout)
    assert result["state"] == "COMPLETED"
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["workers"] == 2 and row["backend"] == "gloo" and row["job_id"] == result["job_id"]
    assert set(row["nodes"].split(",")) == {"cpu1", "cpu2"}
    assert row["samples_per_s"] > 0 and row["step_time_p50"] > 0
    assert row["torch_version"] == "2.13.0+cpu"


def test_apptainer_def_builds_and_passes_its_self_test(tmp_path: Path) -> None:
    """Real clusters with container_runtime apptainer; this lab runs podman."""
    if shutil.which("apptainer") is None:
        pytest.skip("apptainer is not installed: it is not in Debian, and this lab's "
                    "container_runtime is podman (install it with the containers role's "
                    "containers_deb_files to run this test)")
    _pyhpc(paths.ROOT, "containers", "build", "--variant", "cpu", "--context-only", cli=MAKE_CONTAINERS)
    ctx = container_build.CACHE / "cpu"
    sif = tmp_path / "pyhpc-cpu.sif"
    subprocess.run(["apptainer", "build", str(sif), "pyhpc-cpu.def"], cwd=ctx, check=True, timeout=1800)
    proc = subprocess.run(["apptainer", "test", str(sif)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "selftest: ok" in proc.stdout, proc.stdout + proc.stderr


CUDA_BASE = "docker.io/nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04"


def test_cuda_variant_without_its_base_is_refused_in_one_line(tmp_path: Path) -> None:
    """No registry here: the CUDA build must stop before any work and say what to supply."""
    if container_build.image_exists(CUDA_BASE):
        pytest.skip(f"{CUDA_BASE} is loaded here; test_cuda_variant_builds covers the build")
    proc = subprocess.run([*MAKE_CONTAINERS, "containers", "build", "--variant", "cuda",
                           "--images-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=paths.ROOT)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"base: image '{CUDA_BASE}' of variant 'cuda' is missing from local storage" in proc.stderr
    assert "podman load -i FILE" in proc.stderr and list(tmp_path.iterdir()) == []


def test_cuda_variant_builds_where_its_base_is_supplied(tmp_path: Path) -> None:
    if not container_build.image_exists(CUDA_BASE):
        pytest.skip(f"the CUDA variant's base {CUDA_BASE} is not in podman's storage: no registry "
                    "is reachable from this machine; an admin supplies it (`podman load -i FILE`)")
    proc = _pyhpc(paths.ROOT, "containers", "build", "--variant", "cuda", "--images-dir",
                  str(tmp_path), timeout=3600, cli=MAKE_CONTAINERS)
    record = json.loads((tmp_path / "pyhpc-cuda" / "image.json").read_text())
    assert "cuda: 12.8" in record["selftest"] and any(
        line.startswith("nccl: ") and line != "nccl: none" for line in record["selftest"])
    assert proc.stdout.count("selftest: ok") >= 1


def test_the_hosts_cgroup_layout_is_one_crun_accepts() -> None:
    """crun refuses every container on a hybrid host whose cgroup2 holds a controller (a
    fresh machine of this kind had hugetlb there): after the deploy, nothing is left there,
    and what the role bound is recorded for its teardown."""
    proc = subprocess.run(["/usr/local/sbin/pyhpc-cgroup-layout", "check"], capture_output=True,
                          text=True, check=True)
    layout = json.loads(proc.stdout)
    print(layout, Path("/proc/cgroups").read_text(), sep="\n")
    assert layout["refused"] is None
    assert layout["mode"] != "hybrid" or layout["leftover"] == []
    state = Path("/var/lib/pyhpc/cgroup-v1-bound")
    for name in state.read_text().split() if state.exists() else []:
        assert layout["v1"][name] == f"/sys/fs/cgroup/{name}"


def test_doctor_starts_the_image_on_a_compute_node(built: dict, work: Path) -> None:
    proc = subprocess.run([DEPLOYED_CLI[0], "doctor", "--json"], cwd=work, capture_output=True,
                          text=True, timeout=300)
    print(proc.stdout, proc.stderr)
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["container"]["ok"], checks["container"]
    assert checks["container"]["detail"].startswith("pyhpc-cpu started on ")
    assert checks["container"]["detail"].endswith(f"torch {built['labels']['org.pyhpc.torch']}+cpu, "
                                                  "python 3.11" + checks["container"]["detail"][-2:])


def test_a_runtime_that_cannot_start_ends_the_job_in_one_line_before_any_task(
        built: dict, work: Path) -> None:
    """An image crun cannot start (here: a rootfs with nothing to run) ends the job after the
    check step with one line and exit 3; no task starts, no 'exit code 126' per task. Each
    node's start ends by itself and removes its container: none is left in the submitter's
    (here root's) podman storage (a start killed by the other node's failure left one)."""
    containers = [*container_run.PODMAN, "ps", "--all", "--quiet", "--no-trunc"]
    kept = set(subprocess.run(containers, capture_output=True, text=True, check=True).stdout.split())
    broken = work / "broken-image"
    (broken / "rootfs").mkdir(parents=True)
    (broken / "env").write_text("PATH=/usr/bin:/bin\n")
    probe = work / "probe.py"
    probe.write_text(PROBE)
    proc = subprocess.run([*DEPLOYED_CLI, "submit", "container", "--nodes", "2", "--set",
                           f"image={broken}", "--set", f"script={probe}", "--wait", "--json"],
                          cwd=work, capture_output=True, text=True, timeout=300)
    print(proc.stdout, proc.stderr)
    result = json.loads(proc.stdout)
    assert proc.returncode == 1 and result["state"] == "FAILED"
    log = next(work.glob(f"*-{result['job_id']}.out")).read_text()
    print(log)
    lines = log.splitlines()
    assert lines[0].startswith(f"pyhpc: job {result['job_id']}, 2 tasks")
    assert len(lines) == 2 and "PROBE" not in log
    assert lines[1].startswith("pyhpc: the container runtime cannot start the image on cpu")
    assert "/bin/true" in lines[1]
    exit_code = subprocess.run(["sacct", "-X", "-n", "-P", "-j", result["job_id"], "-o", "ExitCode"],
                               capture_output=True, text=True, check=True).stdout.split()
    assert exit_code in ([], ["3:0"])
    left = set(subprocess.run(containers, capture_output=True, text=True, check=True).stdout.split())
    assert left <= kept, f"the check step left containers behind: {sorted(left - kept)}"
