"""The job commands of the CLI: parsing, every bad-input error, nothing submitted."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpc import paths
from pyhpc.cli import main as cli
from pyhpc.cli.jobs import add_commands  # noqa: F401  (registered by cli.build_parser)

#: The one query each submission makes first: the reservations the caller may run in.
RESERVATIONS = ["scontrol", "show", "reservation", "-o"]
COMMANDS = ("render", "submit", "status", "logs", "cancel", "resubmit", "train", "scale", "report",
            "bench")

@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    assert f"usage: pyhpc {command}" in capsys.readouterr().out

def test_startup_and_render_do_not_import_torch() -> None:
    code = ("import sys; from pyhpc.cli import main as cli; cli.build_parser().format_help();\n"
            f"for c in {COMMANDS!r}:\n"
            "    try: cli.main([c, '--help'])\n"
            "    except SystemExit: pass\n"
            "cli.main(['render', 'single', '--set', 'command=true'])\n"
            "print('torch' in sys.modules, 'submitit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYHPC_CLUSTER": str(paths.LAB_CLUSTER), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip().splitlines()[-1] == "False False"

def test_render_prints_the_script(slurm, capsys) -> None:
    assert cli.main(["render", "single", "--set", "command=echo hi"]) == 0
    assert capsys.readouterr().out.endswith("exec echo hi\n")
    assert slurm.calls == []

def test_render_list_json(slurm, capsys) -> None:
    assert cli.main(["render", "--list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "script" in data["ddp-srun"] and "values" in data["array"]

def test_submit_template_renders_and_calls_sbatch(slurm, capsys) -> None:
    assert cli.main(["submit", "ddp-srun", "--nodes", "2", "--set", "module=pyhpc.train",
                     "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["job_id"] == "4242" and result["kind"] == "template"
    assert slurm.calls == [RESERVATIONS, ["sbatch", "--parsable", "--", result["script"]]]
    assert "#SBATCH --nodes=2" in Path(result["script"]).read_text()

def test_submit_script_passes_checked_resources(slurm, capsys, tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["submit", "job.sh", "--nodes", "2", "--partition", "gpu",
                     "--job-name", "a.b"]) == 0
    assert capsys.readouterr().out.strip() == "4242"
    assert slurm.calls == [RESERVATIONS, ["sbatch", "--parsable", "--job-name=a.b", "--nodes=2",
                            "--partition=gpu", "--", "job.sh"]]

def test_submit_test_only_passes_the_flag(slurm) -> None:
    assert cli.main(["submit", "single", "--set", "command=true", "--test-only"]) == 0
    assert slurm.calls[1][:3] == ["sbatch", "--parsable", "--test-only"]

def test_submit_function_goes_through_submitit(slurm, capsys) -> None:
    assert cli.main(["submit", "os:getcwd", "--nodes", "2", "--partition", "gpu",
                     "--gpus-per-node", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job_id"] == "4243"
    (sbatch,) = [c for c in slurm.tool_calls if c.startswith("sbatch")]
    text = Path(sbatch.split()[-1]).read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --ntasks-per-node=2", "#SBATCH --requeue"):
        assert line in text

NODES_0 = "nodes: must be an integer from 1 to 4096, got 0"
ERRORS = [
    (["submit", "ddp-srun", "--nodes", "0", "--set", "module=m"], NODES_0),
    (["submit", "job.sh", "--nodes", "0"], NODES_0),
    (["submit", "os:getcwd", "--nodes", "0"], NODES_0),
    (["train", "--nodes", "0"], NODES_0),
    (["submit", "single", "--set", "command=true", "--partition", "bigmem"],
     "partition: unknown partition 'bigmem'; allowed: cpu, gpu"),
    (["submit", "job.sh", "--partition", "bigmem"], "partition: unknown partition 'bigmem'"),
    (["train", "--partition", "bigmem"], "partition: unknown partition 'bigmem'"),
    (["submit", "single", "--set", "command=true", "--set", "colour=red"],
     "colour: unknown variable for template 'single.sbatch.j2'"),
    (["render", "single", "--set", "colour=red", "--set", "command=true"],
     "colour: unknown variable for template"),
    (["render", "ddp-srun"], "script: missing variable for template 'ddp-srun.sbatch.j2'"),
    (["submit", "missing.sh"], "script: no such file 'missing.sh'"),
    (["submit", "single", "--set", "command=true", "--gpus-per-node", "1"],
     "gpus_per_node: partition 'cpu' has 0 GPUs per node, 1 requested; partitions with GPUs: gpu"),
    (["submit", "os:getcwd", "--gpus-per-node", "1"], "gpus_per_node: partition 'cpu' has 0 GPUs"),
    (["train", "--gpus-per-node", "1"], "gpus_per_node: partition 'cpu' has 0 GPUs"),
    (["scale", "--nodes", "1,0", "--out", "sweep"], "nodes: must be an integer from 1 to 4096"),
    (["scale", "--nodes", "1,3", "--out", "sweep"], "nodes: partition 'cpu' has 2 nodes, 3 requested"),
    (["scale", "--nodes", "1,2", "--batch-sizes", "33", "--scaling", "strong", "--out", "sweep"],
     "batch_sizes: global batch 33 does not divide over 2 workers"),
    (["submit", "nosuchmodule:main"], "target: cannot import module 'nosuchmodule'"),
    (["submit", "os:getcwd", "--array", "0-9"],
     "--array: not for module:function; for a job array of a function call pyhpc.submit_array"),
    (["submit", "jupyter", "--array", "0-9"],
     "array: unknown variable for template 'jupyter.sbatch.j2'"),
    (["train", "--device", "cuda"], "device: cuda needs GPUs, and this job asks for none on "
                                    "partition 'cpu'; add --gpus-per-node"),
    (["scale", "--device", "cuda", "--out", "sweep"], "device: cuda needs GPUs"),
    (["train", "--local", "--nodes", "2"], "--nodes: --local runs here, one process, with no "
                                           "job to ask Slurm for; drop it, or submit the run"),
    (["train", "--local", "--gpus-per-node", "1"], "--gpus-per-node: --local runs here"),
    (["train", "--local", "--reservation", "dl"], "--reservation: --local runs here"),
    (["train", "--local", "--partition", "gpu"], "--partition: --local runs here"),
    (["train", "--local", "--wait"], "--wait: --local runs here"),
    (["scale", "--nodes", "1,2", "--batch-sizes", "32,64", "--out", "sweep"],
     "batch_size: 64 per worker on 2 workers gives 3 steps per epoch, 3 in all, not more "
     "than the 3 warm-up steps"),
]

@pytest.mark.parametrize(("argv", "message"), ERRORS)
def test_bad_input_is_one_line_exit_2_and_nothing_submitted(argv, message, slurm,
                                                            capsys, tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyhpc: error: ") and message in err and err.count("\n") == 1
    assert slurm.calls == [] and slurm.tool_calls == []
    assert not (tmp_path / "pyhpc-jobs").exists() or not any((tmp_path / "pyhpc-jobs").rglob("*.pkl"))

def test_submit_script_array_reaches_sbatch_once(slurm, capsys, tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["submit", "job.sh", "--array", "0-999%50", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["job_id"] == "4242" and result["array"] == "0-999%50"
    assert slurm.calls == [RESERVATIONS, ["sbatch", "--parsable", "--array=0-999%50", "--", "job.sh"]]

def test_submit_template_array_is_one_sbatch_line(slurm, capsys) -> None:
    assert cli.main(["submit", "single", "--set", "command=true", "--array", "0-999%50",
                     "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["job_id"] == "4242" and result["array"] == "0-999%50"
    assert slurm.calls == [RESERVATIONS, ["sbatch", "--parsable", "--", result["script"]]]
    text = Path(result["script"]).read_text()
    assert [line for line in text.splitlines() if "array" in line] == ["#SBATCH --array=0-999%50"]

def test_submit_without_array_has_no_array_key(slurm, capsys) -> None:
    assert cli.main(["submit", "single", "--set", "command=true", "--json"]) == 0
    assert "array" not in json.loads(capsys.readouterr().out)

BAD_ARRAYS = [("-1", "item '-1' is not N, N-M or N-M:S"), ("5-2", "range 5-2 goes down"),
              ("1-2000000", "task id 2000000 is above 1000000"),
              ("0-9%0", "running limit '%0' is not 1 to 100000"), ("a-b", "item 'a-b'"),
              ("0-9;rm", "item '0-9;rm'"), ("0 -9", "item '0 -9'"),
              ("", "not a string of 1 to 1024 characters")]

@pytest.mark.parametrize("target", [["job.sh"], ["single", "--set", "command=true"], ["os:getcwd"]])
@pytest.mark.parametrize(("spec", "reason"), BAD_ARRAYS)
def test_bad_array_is_one_line_exit_2_and_nothing_submitted(target, spec, reason, slurm, capsys,
                                                            tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["submit", *target, f"--array={spec}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyhpc: error: array: {spec!r} is not a job array ({reason}")
    assert "use comma-separated N, N-M or N-M:S" in err and err.count("\n") == 1
    assert slurm.calls == [] and not slurm.log.exists() and not (tmp_path / "pyhpc-jobs").exists()

def test_status_queries_sacct_once_for_all_ids_and_squeue_once_for_the_rest(slurm, capsys) -> None:
    assert cli.main(["status", "1", "2", "3", "--json"]) == 1
    # scontrol: the controller's boot time, for the message
    assert [c[0] for c in slurm.calls] == ["sacct", "squeue", "scontrol"]
    assert slurm.calls[0][-1] == slurm.calls[1][-1] == "1,2,3"
    out = capsys.readouterr()
    assert json.loads(out.out) == {"1": "NOT_FOUND", "2": "NOT_FOUND", "3": "NOT_FOUND"}
    assert out.err.count("\n") == 1 and "known neither to slurmctld nor to accounting" in out.err

def test_cancel_calls_scancel(slurm) -> None:
    assert cli.main(["cancel", "7", "8"]) == 0
    assert slurm.calls == [["scancel", "--", "7", "8"]]

def test_logs_of_an_unknown_job_is_an_error(slurm, capsys) -> None:
    slurm.fake.answers["squeue"] = (0, '{"jobs": []}')  # squeue --json knows no such job
    assert cli.main(["logs", "99999"]) == 2
    assert "job_id: no log files found for job '99999'" in capsys.readouterr().err

def test_report_of_an_empty_directory_is_an_error(slurm, capsys, tmp_path: Path) -> None:
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "no metrics.jsonl under" in capsys.readouterr().err


def _submitted_script(slurm) -> str:
    (sbatch,) = [c for c in slurm.tool_calls if c.startswith("sbatch")]
    return Path(sbatch.split()[-1]).read_text()


@pytest.mark.parametrize("command", ["train", "scale", "bench"])
def test_one_job_commands_take_every_resource_submit_takes_but_array(command: str, capsys) -> None:
    from pyhpc.slurm.jobspec import JobSpec

    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    for field in dataclasses.fields(JobSpec):
        flag = "--" + field.name.replace("_", "-")
        assert (flag in text) is (field.name != "array"), flag


def test_train_spec_is_checked_once_and_reaches_submitit_whole(slurm, monkeypatch, tmp_path: Path,
                                                               capsys) -> None:
    """The flags become one JobSpec, checked once (each field's check runs once) and handed
    to submitit as it is: CPUs per task and the one-task-per-GPU count included."""
    from pyhpc.slurm import jobspec

    seen: list[str] = []
    real = jobspec.check_value
    monkeypatch.setattr(jobspec, "check_value", lambda k, v: (seen.append(k), real(k, v))[1])
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--nodes", "2", "--partition", "gpu", "--gpus-per-node", "2",
                     "--cpus-per-task", "3", "--time", "00:05:00", "--mode", "synthetic",
                     "--out", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job_id"] == "4243"
    assert seen.count("nodes") == 1 and seen.count("cpus_per_task") == 1
    text = _submitted_script(slurm)
    for line in ("#SBATCH --nodes=2", "#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --ntasks-per-node=2", "#SBATCH --cpus-per-task=3", "#SBATCH --time=5",
                 "#SBATCH --job-name=train-synthetic"):
        assert line in text


def test_scale_carries_cpus_per_task_to_every_point(slurm, monkeypatch, tmp_path: Path) -> None:
    from pyhpc.slurm import watch
    from pyhpc.train import sweep

    specs = []
    real = sweep.submit_spec
    monkeypatch.setattr(sweep, "submit_spec", lambda call, spec, *a, **kw: (
        specs.append(spec), real(call, spec, *a, **kw))[1])
    monkeypatch.setattr(watch, "watch", lambda ids, **kw: {j: "FAILED" for j in ids})
    monkeypatch.chdir(tmp_path)
    assert cli.main(["scale", "--nodes", "1,2", "--batch-sizes", "32", "--cpus-per-task", "2",
                     "--job-name", "sweep", "--out", str(tmp_path / "sweep"), "--json"]) == 1
    assert [(s.nodes, s.tasks_per_node, s.cpus_per_task, s.job_name, s.partition) for s in specs] == [
        (1, 1, 2, "sweep", "cpu"), (2, 1, 2, "sweep", "cpu")]
    assert len([c for c in slurm.tool_calls if c.startswith("sbatch")]) == 2
    assert "#SBATCH --cpus-per-task=2" in _submitted_script_last(slurm)


def _submitted_script_last(slurm) -> str:
    return Path([c for c in slurm.tool_calls if c.startswith("sbatch")][-1].split()[-1]).read_text()


def test_a_training_job_killed_for_memory_is_one_line_that_suggests_a_pipeline(fake_slurm, tmp_path) -> None:
    from pyhpc.cli import jobs
    from pyhpc.train.config import TrainConfig

    fake_slurm.answers["sacct"] = (0, "180|FAILED\n180.batch|FAILED\n180.0|OUT_OF_MEMORY\n")
    why = jobs.out_of_memory("180", TrainConfig(out=str(tmp_path), model="deep", layers=200))
    assert why == ("out of memory: Slurm's cgroup killed a task of job 180 for using more memory than "
                   "it holds (OUT_OF_MEMORY); split the model with --pipeline 2 --model deep, or give "
                   "each task more memory")
    fake_slurm.answers["sacct"] = (0, "181|FAILED\n181.0|FAILED\n")
    assert jobs.out_of_memory("181", TrainConfig(out=str(tmp_path))) is None


#: Job 254's step log on the lab (4 stages over 2 nodes, depth 600): task 0 was killed, and
#: its peers failed on the closed gloo connection, so accounting says FAILED, not OUT_OF_MEMORY.
STEP_ACROSS_NODES_LOG = (
    "slurmstepd-cpu1: error: Detected 1 oom-kill event(s) in StepId=254.0. Some of your processes "
    "may have been killed by the cgroup out-of-memory handler.\n") + """\
srun: error: cpu1: task 0: Out Of Memory
srun: error: cpu2: task 2: Exited with exit code 1
srun: error: cpu2: task 3: Exited with exit code 1
"""


def test_a_task_killed_for_memory_in_a_step_across_nodes_is_found_in_sruns_log(fake_slurm, tmp_path) -> None:
    from pyhpc.cli import jobs
    from pyhpc.train.config import TrainConfig

    fake_slurm.answers["sacct"] = (0, "254|FAILED\n254.batch|FAILED\n254.0|FAILED\n")
    logs = tmp_path / "pyhpc-jobs" / "254"
    logs.mkdir(parents=True)
    (logs / "254_0_log.err").write_text("x" * (2 << 20) + "\n" + STEP_ACROSS_NODES_LOG)
    (logs / "254_1_log.err").write_text("RuntimeError: Connection closed by peer\n")
    cfg = TrainConfig(out=str(tmp_path), model="deep", layers=600, pipeline=4)
    assert jobs.out_of_memory("254", cfg, logs) == (
        "out of memory: Slurm's cgroup killed a task of job 254 for using more memory than it holds "
        "(srun: cpu1: task 0 Out Of Memory); split the model with --pipeline 8 --model deep, or give "
        "each task more memory")
    # A planted link is never followed, and a log without srun's line is no kill.
    (logs / "254_0_log.err").unlink()
    (logs / "254_0_log.err").symlink_to(tmp_path / "elsewhere.err")
    (tmp_path / "elsewhere.err").write_text(STEP_ACROSS_NODES_LOG)
    assert jobs.out_of_memory("254", cfg, logs) is None
    assert jobs.out_of_memory("254", cfg, tmp_path / "no-such-folder") is None
