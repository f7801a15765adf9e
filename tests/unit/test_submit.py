"""The Python API: pyhpc.submit(fn, ...) and script submission, against fake Slurm tools."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import pyhpc
from pyhpc import SubmitError, cluster, submit_script, submit_template
from pyhpc.slurm import jobspec
from pyhpc.slurm.jobspec import JobSpec, JobSpecError

FAKE = """#!/bin/bash
echo "$(basename "$0") $*" >> "{log}"
case " $* " in *" --parsable "*) echo "4243" ;; *) echo "Submitted batch job 4243" ;; esac
"""


@pytest.fixture
def fake_sbatch(monkeypatch, tmp_path: Path) -> Path:
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "srun", "squeue", "sacct", "scontrol", "scancel"):
        (bin_dir / tool).write_text(FAKE.format(log=log))
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    return log


def test_import_pyhpc_does_not_import_submitit_or_torch() -> None:
    code = "import sys, pyhpc; print('submitit' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nodes": 0}, r"^nodes: must be an integer from 1 to 4096, got 0"),
    ({"partition": "bigmem"}, r"^partition: unknown partition 'bigmem'; allowed: cpu, gpu"),
    ({"gpus_per_node": 1}, r"^gpus_per_node: partition 'cpu' has 0 GPUs"),
])
def test_bad_request_raises_before_anything_is_submitted(kwargs, message, fake_sbatch: Path,
                                                         lab: cluster.Cluster) -> None:
    with pytest.raises(JobSpecError, match=message):
        pyhpc.submit(print, cluster=lab, **kwargs)
    assert not fake_sbatch.exists()


def test_submit_maps_the_request_onto_submitit(fake_sbatch: Path, lab: cluster.Cluster) -> None:
    job = pyhpc.submit(print, "hello", nodes=2, gpus_per_node=2, partition="gpu", cluster=lab,
                       folder="jobs/%j")
    assert job.job_id == "4243"
    (call,) = [c for c in fake_sbatch.read_text().splitlines() if c.startswith("sbatch")]
    text = Path(call.split()[-1]).read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --partition=gpu", "#SBATCH --requeue", "#SBATCH --signal=USR2@90"):
        assert line in text


def test_a_submitit_job_takes_the_templates_rendezvous_and_ends_when_a_rank_dies(
        fake_sbatch: Path, lab: cluster.Cluster) -> None:
    pyhpc.submit(print, "hello", nodes=2, cluster=lab, folder="jobs/%j")
    (call,) = [c for c in fake_sbatch.read_text().splitlines() if c.startswith("sbatch")]
    script = Path(call.split()[-1]).read_text()
    assert re.search(r"^srun .*--kill-on-bad-exit=1 ", script, re.M), script
    setup = script[:script.index("\nsrun ")]
    # The setup hosts the job's store in this Python and reads its port from it: a port
    # already held when the tasks learn it (submitit's own, Random(job id), is not).
    pytest.importorskip("torch")
    out = subprocess.run(["bash", "-c", f"{setup}\necho $MASTER_ADDR $MASTER_PORT\n"
                          "python3 -c 'import socket, sys; socket.create_connection((sys.argv[1], "
                          "int(sys.argv[2]))); print(\"reached\")' $MASTER_ADDR $MASTER_PORT"],
                         env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "185",
                              "SLURMD_NODENAME": "localhost", "SLURM_JOB_NODELIST": "cpu[1-2]"},
                         capture_output=True, text=True, check=True, timeout=120).stdout.split()
    assert out[0] == "localhost" and out[-1] == "reached", out


def test_cpu_partition_gets_one_task_per_node_and_no_gpu_flag(fake_sbatch: Path,
                                                               lab: cluster.Cluster) -> None:
    pyhpc.submit(print, nodes=2, cluster=lab, folder="jobs/%j")
    (call,) = [c for c in fake_sbatch.read_text().splitlines() if c.startswith("sbatch")]
    text = Path(call.split()[-1]).read_text()
    assert "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --partition=cpu" in text
    assert "gpus" not in text and "gres" not in text


def test_submit_template_saves_the_script_and_returns_a_handle(fake_sbatch: Path,
                                                                lab: cluster.Cluster) -> None:
    job = submit_template("single", {"command": "true"}, lab)
    assert job.job_id == "4243" and job.script.read_text().startswith("#!/bin/bash")
    calls = fake_sbatch.read_text().splitlines()
    assert calls == ["scontrol show reservation -o", f"sbatch --parsable -- {job.script}"]


def test_submit_script_checks_the_spec_and_the_file(fake_sbatch: Path, lab: cluster.Cluster,
                                                     tmp_path: Path) -> None:
    with pytest.raises(SubmitError, match=r"^script: no such file 'nope.sh'"):
        submit_script("nope.sh", cluster=lab)
    (tmp_path / "ok.sh").write_text("#!/bin/bash\n")
    with pytest.raises(JobSpecError, match=r"^nodes: must be an integer from 1 to 4096"):
        submit_script("ok.sh", JobSpec(nodes=0), cluster=lab)
    assert not fake_sbatch.exists()
    job = submit_script("ok.sh", JobSpec(nodes=2), cluster=lab)
    assert fake_sbatch.read_text().split() == [
        "scontrol", "show", "reservation", "-o",
        "sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", "--partition=cpu",
        "--time=00:10:00", "--", "ok.sh"]
    assert job.job_id == "4243"


@pytest.mark.parametrize("spec", ["0", "0-999%50", "1,3,10-20:2", "0-1000000", "7%1",
                                  "0-9%100000", ",".join(str(i) for i in range(64))])
def test_slurm_array_expressions_are_accepted(spec: str) -> None:
    assert jobspec.check_value("array", spec) == spec


@pytest.mark.parametrize(("spec", "reason"), [
    ("0-9:0", "step 0 is below 1"), ("1000001", "task id 1000001 is above 1000000"),
    (",".join(str(i) for i in range(65)), "65 items"), ("0-9%100001", "running limit"),
    ("0-9%", "running limit '%'"), ("0,,1", "item ''"), ("0-9%1%2", "running limit"),
    ("--uid=0", "item '--uid=0'"), ("0x10", "item '0x10'"), ("１", "item '１'"),
    ("0" * 2000, "not a string of 1 to 1024"), (7, "not a string"),
])
def test_bad_array_expression_names_array_and_the_reason(spec, reason) -> None:
    with pytest.raises(JobSpecError, match=r"^array: .* is not a job array \(" + re.escape(reason)):
        jobspec.check_value("array", spec)


def test_array_is_an_sbatch_option_and_no_submitit_parameter(lab: cluster.Cluster) -> None:
    spec = jobspec.check(JobSpec(array="0-3"), lab)
    assert jobspec.sbatch_args(spec)[0] == "--array=0-3"
    assert "array" not in jobspec.submitit_parameters(spec)
    assert set(jobspec.submitit_parameters(spec)) == \
        set(jobspec.submitit_parameters(jobspec.check(JobSpec(), lab)))


def test_submit_script_passes_the_array_once(fake_sbatch: Path, lab: cluster.Cluster,
                                             tmp_path: Path) -> None:
    (tmp_path / "ok.sh").write_text("#!/bin/bash\n")
    with pytest.raises(JobSpecError, match=r"^array: '5-2' is not a job array"):
        submit_script("ok.sh", JobSpec(array="5-2"), cluster=lab)
    assert not fake_sbatch.exists()
    submit_script("ok.sh", JobSpec(array="0-999%50"), cluster=lab, only={"array"})
    assert fake_sbatch.read_text().split() == ["scontrol", "show", "reservation", "-o", "sbatch",
                                               "--parsable", "--array=0-999%50", "--", "ok.sh"]


def test_submit_array_is_one_sbatch_for_all_items(fake_sbatch: Path, lab: cluster.Cluster) -> None:
    jobs = pyhpc.submit_array(abs, list(range(-5, 5)), partition="cpu", cluster=lab,
                              parallelism=3, folder="arr/%j")
    (call,) = [c for c in fake_sbatch.read_text().splitlines() if c.startswith("sbatch")]
    script = Path(call.split()[-1]).read_text()
    assert "#SBATCH --array=0-9%3" in script
    assert [j.job_id for j in jobs] == [f"4243_{i}" for i in range(10)]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"items": []}, "items: nothing to submit"),
    ({"items": [1], "parallelism": 0}, "parallelism: must be a number from 1 to 100000"),
    ({"items": [1], "nodes": 0}, "nodes"),
])
def test_submit_array_refuses_bad_input_before_sbatch(kwargs, message, fake_sbatch: Path,
                                                      lab: cluster.Cluster) -> None:
    with pytest.raises(SubmitError if "items" in message or "parallelism" in message
                       else JobSpecError, match=message):
        pyhpc.submit_array(abs, cluster=lab, folder="arr/%j", **kwargs)
    assert not fake_sbatch.exists()


# --- one keyword set: a JobSpec, or its fields as keywords, for all three -------------------


def _sbatch_script(log: Path) -> str:
    (call,) = [c for c in log.read_text().splitlines() if c.startswith("sbatch")]
    return Path(call.split()[-1]).read_text()


def test_submit_takes_a_jobspec_and_its_fields_as_keywords_alike(fake_sbatch: Path,
                                                                 lab: cluster.Cluster) -> None:
    pyhpc.submit(print, spec=JobSpec(nodes=2, partition="gpu", gpus_per_node=2, job_name="a"),
                 cluster=lab, folder="one/%j")
    by_spec = _sbatch_script(fake_sbatch)
    fake_sbatch.unlink()
    pyhpc.submit(print, nodes=2, partition="gpu", gpus_per_node=2, name="a", cluster=lab,
                 folder="two/%j")
    by_keywords = _sbatch_script(fake_sbatch)
    assert "#SBATCH --job-name=a" in by_spec
    assert by_spec.replace("one/", "two/") == by_keywords


def test_a_keyword_overrides_the_specs_field_and_the_rest_are_the_functions(
        fake_sbatch: Path, lab: cluster.Cluster, tmp_path: Path) -> None:
    job = pyhpc.submit(print, "hi", spec=JobSpec(nodes=1, partition="gpu"), nodes=2, sep="-",
                       job_name="b", cluster=lab, folder="kw/%j")
    script = _sbatch_script(fake_sbatch)
    assert "#SBATCH --nodes=2" in script and "#SBATCH --job-name=b" in script
    assert job.job_id == "4243"


@pytest.mark.parametrize(("call", "message"), [
    (lambda lab: pyhpc.submit(print, array="0-3", cluster=lab), r"^array: a function's array is its items"),
    (lambda lab: pyhpc.submit(print, name="a", job_name="b", cluster=lab), r"^name: give name or job_name"),
    (lambda lab: pyhpc.submit_array(abs, [1], nodez=2, cluster=lab),
     r"^nodez: not a resource; allowed: nodes, tasks_per_node, .*, reservation, name$"),
    (lambda lab: submit_script("ok.sh", nodez=2, cluster=lab), r"^nodez: not a resource"),
])
def test_a_keyword_outside_the_set_is_refused_before_sbatch(call, message, fake_sbatch: Path,
                                                            lab: cluster.Cluster,
                                                            tmp_path: Path) -> None:
    (tmp_path / "ok.sh").write_text("#!/bin/bash\n")
    with pytest.raises(pyhpc.PyhpcError, match=message):
        call(lab)
    assert not fake_sbatch.exists()


def test_submit_array_takes_a_jobspec(fake_sbatch: Path, lab: cluster.Cluster) -> None:
    jobs = pyhpc.submit_array(abs, [1, 2], spec=JobSpec(partition="cpu", time="00:05:00"),
                              cluster=lab, folder="arr/%j")
    assert "#SBATCH --time=5" in _sbatch_script(fake_sbatch)
    assert len(jobs) == 2


def test_submit_scripts_keywords_override_only_their_lines(fake_sbatch: Path, lab: cluster.Cluster,
                                                           tmp_path: Path) -> None:
    (tmp_path / "ok.sh").write_text("#!/bin/bash\n#SBATCH --time=00:01:00\n")
    submit_script("ok.sh", nodes=2, cluster=lab)
    assert fake_sbatch.read_text().split()[4:] == ["sbatch", "--parsable", "--nodes=2", "--", "ok.sh"]
    fake_sbatch.unlink()
    submit_script("ok.sh", JobSpec(nodes=2), job_name="c", cluster=lab)  # a spec: all its fields
    assert "--job-name=c" in fake_sbatch.read_text().split()
    assert "--time=00:10:00" in fake_sbatch.read_text().split()
