"""Hostile files and bad input: each numbered item of the hardening issue, reproduced.

Every case asserts the one-line message and that nothing changed: no file written,
nothing submitted, no planted code run.
"""
from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyhpc import cluster, files, paths
from pyhpc.cli import main as cli
from pyhpc.cluster import ConfigError
from pyhpc.slurm import render
from pyhpc.slurm.submit import submit_template, write_script
from pyhpc.train import metrics


def lab_data() -> dict[str, Any]:
    return yaml.safe_load(paths.LAB_CLUSTER.read_text())


def one_line_error(capsys, argv: list[str]) -> str:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # a usage error, refused while parsing
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("pyhpc: error: ") and err.count("\n") == 1, err
    return err


class Payload:
    """A pickle that would create ``marker`` when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# -- 1, 2: run directories --------------------------------------------------------------

def test_1_a_planted_checkpoint_pickle_does_not_run(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from pyhpc.train import loop as train
    from pyhpc.train.config import TrainError

    marker = tmp_path / "pwned"
    ckpt = tmp_path / "checkpoint.pt"
    torch.save({"model": Payload(marker), "optimizer": {}, "epoch": 0}, ckpt)
    with pytest.raises(TrainError, match=r"^checkpoint: .* is not a pyhpc checkpoint"):
        train.load_checkpoint(ckpt)
    assert not marker.exists()
    ckpt.write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(TrainError, match=r"^checkpoint: "):
        train.load_checkpoint(ckpt)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["history.json", "checkpoint.pt"])
def test_2_a_planted_link_is_replaced_not_written_through(tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / name).symlink_to(victim)
    files.write_text(tmp_path / "run" / name, "new\n")
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "run" / name).is_symlink()
    assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("name", ["metrics.jsonl", "ranks.jsonl"])
def test_2_appends_never_follow_a_planted_link(tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / name).symlink_to(victim)
    with pytest.raises(files.FileError, match="a symlink is never followed"):
        files.append_text(tmp_path / name, "{}\n")
    assert victim.read_text() == "precious\n"


def test_2_run_directories_and_files_are_private(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(files.GROUP_ENV, raising=False)
    run = files.make_dir(tmp_path / "a" / "run")
    files.append_text(run / "metrics.jsonl", "{}\n")
    assert run.stat().st_mode & 0o777 == 0o700
    assert (run / "metrics.jsonl").stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv(files.GROUP_ENV, "1")
    files.write_text(run / "shared.txt", "x")
    assert (run / "shared.txt").stat().st_mode & 0o777 == 0o640


# -- 3: scripts ----------------------------------------------------------------------------

@pytest.mark.parametrize("plant", ["file", "link"])
def test_3_a_planted_script_is_never_what_gets_submitted(plant: str, tmp_path: Path, slurm,
                                                         lab) -> None:
    text = render.render("single", {"command": "true"}, lab)
    target = write_script(text, "single")  # learn the predictable name
    target.unlink()
    evil = tmp_path / "evil.sh"
    evil.write_text("#!/bin/bash\ntouch pwned\n")
    if plant == "file":
        target.write_text(evil.read_text())
    else:
        target.symlink_to(evil)
    job = submit_template("single", {"command": "true"}, lab)
    assert job.script == target and not target.is_symlink()
    assert target.read_text() == text
    assert evil.read_text() == "#!/bin/bash\ntouch pwned\n"


def test_3_a_scripts_folder_others_can_write_is_refused(tmp_path: Path, slurm, lab) -> None:
    folder = tmp_path / "pyhpc-jobs" / "scripts"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    with pytest.raises(Exception, match=r"^folder: refusing .*: .*scripts is writable by every "
                                        r"user \(mode 0777\); pyhpc writes and reads back only"):
        submit_template("single", {"command": "true"}, lab)
    assert slurm.calls == [] and list(folder.iterdir()) == []


# -- 4-7: the cluster definition --------------------------------------------------------------

def edited(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(lab_data())
    for path, value in changes.items():
        *parents, last = [int(p) if p.isdigit() else p for p in path.split("__")]
        target: Any = data
        for key in parents:
            target = target[key]
        target[last] = value
    return data


@pytest.mark.parametrize(("changes", "message"), [
    ({"nodes__1__gpu_type": "lab\nNodeName=cpu1 Name=gpu File=/dev/sda"},
     r"^nodes\[1\]\.gpu_type: 'lab\\nNodeName=cpu1 .*' is not allowed"),
    ({"nodes__1__gpu_type": 7}, r"^nodes\[1\]\.gpu_type: 7 is not allowed"),
    ({"nodes__0__name": "cpu\n"}, r"^nodes\[0\]\.name: 'cpu\\n' is not allowed"),
    ({"name": "lab\n"}, r"^name: 'lab\\n' is not allowed"),
    ({"partitions__0__max_time": "1-00:00:00\n"}, r"^partitions\[0\]\.max_time: .* is not a Slurm"),
    ({"accounts__0__users": ["user1,user2"]}, r"^accounts\[0\]\.users\[0\]: 'user1,user2' is not"),
    ({"accounts__0__users": ["adminlevel=admin"]}, r"^accounts\[0\]\.users\[0\]: 'adminlevel="),
    ({"accounts__0__users": ["root", "root"]}, r"^accounts\[0\]\.users\[1\]: duplicate name"),
    ({"nodes__0__count": 1_000_000_000}, r"^nodes\[0\]\.count: must be an integer from 1 to 1024"),
    ({"nodes__1__gpus": 1_000_000}, r"^nodes\[1\]\.gpus: must be an integer from 0 to 16"),
    ({"lab": {"slurmd_base_port": 65534}},
     r"^lab\.slurmd_base_port: 65534 \+ 4 nodes goes past port 65535 \(the last node would get "
     r"65537\); allowed: 1024 to 65532$"),
    ({"nodes__0__count": 1024, "nodes__0__memory_mb": 64 << 20},
     r"^nodes\.memory_mb: the 1026 lab nodes declare 68719480832 MiB together, more than 4 x "),
    ({"lab": {"slurmd_base_port": 70000}}, r"^lab\.slurmd_base_port: must be an integer from 1024"),
])
def test_4_to_7_definition_values_that_would_rewrite_configs_are_refused(changes, message) -> None:
    with pytest.raises(ConfigError, match=message):
        cluster.parse(edited(**changes))


def test_7_long_values_are_not_echoed_whole() -> None:
    with pytest.raises(ConfigError) as err:
        cluster.parse(edited(name="x" * 100_000))
    assert len(str(err.value)) < 300 and "(100002 characters)" in str(err.value)


BOMB = """a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: [*e,*e,*e,*e,*e,*e,*e,*e,*e]
"""


@pytest.mark.parametrize(("text", "message"), [
    (BOMB, r"bomb.yml:2:\d+: not valid YAML \(aliases \(\*name\) are not allowed\)"),
    ("name: lab\nname: evil\n", r"bomb.yml:2:1: not valid YAML \(duplicate key 'name'\)"),
    ("nodes: [unclosed\n", r"bomb.yml:\d+:\d+: not valid YAML \("),
    ("", r"bomb.yml: cluster definition is empty"),
    ("x" * (2 << 20), r"bomb.yml: cluster definition is larger than 1024 KiB"),
])
def test_7_yaml_bombs_duplicates_and_syntax_are_one_line(tmp_path: Path, text: str,
                                                         message: str, capsys) -> None:
    path = tmp_path / "bomb.yml"
    path.write_text(text)
    err = one_line_error(capsys, ["cluster", "validate", str(path)])
    assert pytest.importorskip("re").search(message, err), err
    assert len(err) < 400


# -- 9-12, 19-20: templates ------------------------------------------------------------------

@pytest.mark.parametrize(("values", "message"), [
    ({"module": "m", "python": "--uid=0"}, r"^python: '--uid=0' is not allowed"),
    ({"script": "-m", "args": "os"}, r"^script: '-m' is not allowed"),
    ({"module": "m", "job_name": "a\\"}, r"^job_name: 'a\\\\' is not allowed"),
    ({"module": "m", "gpus_per_node": "abc"}, r"^gpus_per_node: must be an integer from 0 to 64"),
    ({"module": "m", "gpus_per_node": "inf"}, r"^gpus_per_node: must be an integer"),
    ({"module": "m", "script": "train.py"}, r"^script: give script or module, not both"),
    ({"module": "m", "args": "a\\"}, r"^args: cannot split 'a\\\\' into words"),
    ({"module": "m", "image_dir": "/x"}, r"^image_dir: unknown variable for template"),
])
def test_9_to_11_bad_template_values_are_named(values, message, lab) -> None:
    with pytest.raises(render.RenderError, match=message):
        render.render("container", values, lab)


@pytest.mark.parametrize(("values", "message"), [
    ({"command": "it's"}, r"^command: cannot split \"it's\" into words \(No closing quotation\)"),
    ({"command": "-a evil true"}, r"^command: must start with a program, not '-a'"),
    ({"command": "true", "time": "99-00:00:00"}, r"^time: 99-00:00:00 is longer than partition"),
])
def test_13_and_19_single_template_refusals(values, message, lab) -> None:
    with pytest.raises(Exception, match=message):
        render.render("single", values, lab)


def test_11_array_ranges_expand_to_one_task_per_value(lab) -> None:
    text = render.render("array", {"command": "echo", "values": "0-999"}, lab)
    assert "#SBATCH --array=0-999\n" in text and "VALUES=( 0 1 2 " in text and " 999 )" in text
    with pytest.raises(render.RenderError, match=r"^values: at most 1001 values"):
        render.render("array", {"command": "echo", "values": "0-999,1000-1999"}, lab)


def test_12_jupyter_binds_the_node_address_and_keeps_the_token_private(lab) -> None:
    text = render.render("jupyter", {}, lab)
    assert "--ip=0.0.0.0" not in text and '--ip="$ADDR"' in text
    assert "umask 077" in text and "JUPYTER_TOKEN" in text
    # The server starts under pyhpc.jupyter: its log (URL and token) goes to the private
    # state directory, and the tunnel is printed for the port it verified.
    assert "-P -m pyhpc.jupyter " in text and 'JUPYTER_RUNTIME_DIR="$STATE/' in text


@pytest.mark.parametrize(("source", "message"), [
    ("{% if %}", r"^template: t.sbatch.j2:1: Expected an expression"),
    ('{% include "nope.j2" %}', r"^template: 't.sbatch.j2' includes 'nope.j2', which does not"),
    ("{{ 1 // 0 }}", r"^template: 't.sbatch.j2' failed while rendering \(ZeroDivisionError"),
])
def test_20_user_template_errors_are_one_line(tmp_path: Path, source: str, message: str,
                                              lab) -> None:
    (tmp_path / "t.sbatch.j2").write_text(source)
    with pytest.raises(render.RenderError, match=message):
        render.render(str(tmp_path / "t.sbatch.j2"), {}, lab)


# -- CLI: every expected failure is one line, exit 2, nothing submitted ---------------------

CLI_ERRORS = [
    (["submit", "single", "--set", "command=true", "--time", "99-00:00:00", "--test-only"],
     "time: 99-00:00:00 is longer than partition 'cpu' allows"),
    (["submit", "single", "--set", "command=true", "--job-name", "a\\"], "job_name: 'a\\\\'"),
    (["submit", "single", "--set", "command=it's"], "command: cannot split"),
    (["submit", "single", "--set", "command=true", "--nodes", "0"],
     "nodes: must be an integer from 1 to 4096, got 0"),
    (["submit", "ddp-srun", "--set", "module=m", "--set", "python=--uid=0"], "python: '--uid=0'"),
    (["train", "--nodes", "99"], "nodes: partition 'cpu' has 2 nodes, 99 requested"),
    (["train", "--tasks-per-node", "0"], "tasks_per_node: must be an integer from 1 to 1024"),
    (["train", "--tasks-per-node", "-3"], "tasks_per_node: must be an integer from 1 to 1024"),
    (["train", "--batch-size", "0"], "batch_size: must be an integer from 1 to 65536, got 0"),
    (["train", "--warmup-steps", "-1"], "warmup_steps: must be an integer from 0 to 100000"),
    (["train", "--out", "afile"], "afile exists and is not a directory"),
    (["train", "--out", "afile/run"], "afile/run is under a file"),
    (["cancel", "--", "--user=root"], "job_ids: '--user=root' is not allowed"),
    (["status", "--", "-1"], "job_ids: '-1' is not allowed"),
    (["logs", ""], "job_id: '' is not allowed"),
    (["status", "1", "--watch", "--interval", "-1"], "interval: must be a number from 0.1"),
    (["scale", "--out", "s", "--interval", "-1"], "interval: must be a number from 0.1"),
    (["submit", "single", "--set", "command=true", "--wait", "--timeout", "nan"],
     "argument --timeout: must be a number from 0 to 2.592e+06, got 'nan'"),
    (["train", "--wait", "--timeout", "-1"], "argument --timeout: must be a number from 0"),
    (["bench", "--wait", "--timeout", "inf"], "argument --timeout: must be a number from 0"),
    (["report", "nope"], "dirs: no metrics.jsonl under nope"),
    (["report", "runs", "--png", "plot.svg"], "png: must end in .png, got 'plot.svg'"),
    (["report", "runs", "--png", "afile/x.png"], "png: afile exists and is not a directory"),
    (["report", "bad-json"], "metrics.jsonl:2: not valid JSON"),
    (["report", "bad-shape"], "metrics.jsonl:1: expected a JSON object, got list"),
    (["report", "bad-type"], "metrics.jsonl:1: not a metrics record; missing local_batch"),
    (["report", "binary"], "metrics.jsonl:1: not UTF-8 text"),
    (["cluster", "validate", "binary.yml"], "binary.yml: cluster definition is not UTF-8 text"),
]


@pytest.fixture
def workdir(tmp_path: Path, slurm) -> Path:
    (tmp_path / "afile").write_text("x")
    summary = metrics.Summary(
        workers=1, local_batch=32, global_batch=32, steps=5, warmup_steps=1,
        step_time_p50=0.1, step_time_p90=0.1, step_time_mean=0.1, samples_per_s=320.0,
        samples_per_s_per_worker=320.0, torch_version="x", backend="gloo", job_id="1",
        nodes="cpu1", mode="digits", model="LeNet")
    files.make_dir(tmp_path / "runs" / "a")
    metrics.write_jsonl(tmp_path / "runs" / "a" / "metrics.jsonl", [summary])
    good = (tmp_path / "runs" / "a" / "metrics.jsonl").read_text()
    for name, text in {"bad-json": good + "{oops\n", "bad-shape": "[1, 2]\n",
                       "bad-type": '{"workers": "many"}\n'}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(text)
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "metrics.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "binary.yml").write_bytes(b"\xff\xfe\x00garbage")
    return tmp_path


@pytest.mark.parametrize(("argv", "message"), CLI_ERRORS, ids=[" ".join(a) for a, _ in CLI_ERRORS])
def test_cli_refusals_are_one_line_and_change_nothing(argv, message, workdir: Path, slurm,
                                                      capsys) -> None:
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*") if "fake-bin" not in
                    p.parts and p.name != "slurm-calls.log")
    err = one_line_error(capsys, argv)
    assert message in err, err
    assert slurm.calls == [] and slurm.tool_calls == []
    after = sorted(p.relative_to(workdir) for p in workdir.rglob("*") if "fake-bin" not in
                   p.parts and p.name != "slurm-calls.log")
    assert after == before


def test_25_a_user_without_an_association_gets_one_line(slurm, capsys) -> None:
    slurm.fake.answers["sbatch"] = (1, "", "sbatch: error: Batch job submission failed: "
                                           "Invalid account or account/partition combination "
                                           "specified")
    err = one_line_error(capsys, ["submit", "single", "--set", "command=true"])
    assert "has no account on cluster lab; an admin adds it to accounts in cluster.yml" in err


def test_25_an_empty_cluster_file_is_named(tmp_path: Path, slurm, monkeypatch, capsys) -> None:
    empty = tmp_path / "empty.yml"
    empty.write_text("")
    monkeypatch.setenv("PYHPC_CLUSTER", str(empty))
    err = one_line_error(capsys, ["submit", "single", "--set", "command=true"])
    assert f"{empty}: cluster definition is empty" in err


def test_18_a_binary_cluster_file_in_the_environment_is_one_line(tmp_path: Path, slurm,
                                                                 monkeypatch, capsys) -> None:
    binary = tmp_path / "binary.yml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    monkeypatch.setenv("PYHPC_CLUSTER", str(binary))
    err = one_line_error(capsys, ["submit", "single", "--set", "command=true"])
    assert f"{binary}: cluster definition is not UTF-8 text" in err
    assert slurm.calls == [] and slurm.tool_calls == []


def test_report_into_a_directory_prints_the_file_it_wrote(workdir: Path, capsys) -> None:
    (workdir / "plots").mkdir()
    assert cli.main(["report", "runs", "--png", "plots"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("plot: plots/scaling.png")
    assert (workdir / "plots" / "scaling.png").read_bytes()[:4] == b"\x89PNG"


def test_an_unexpected_error_is_one_line_with_a_hint(monkeypatch, capsys) -> None:
    from pyhpc.cli import jobs as cli_jobs

    def boom(args):
        raise RuntimeError("disk on fire\nsecond line")
    monkeypatch.setattr(cli_jobs, "cmd_cancel", boom)
    assert cli.main(["cancel", "1"]) == 1
    err = capsys.readouterr().err
    assert err == ("pyhpc: error: unexpected RuntimeError: disk on fire; run with --debug for "
                   "the traceback\n")
    with pytest.raises(RuntimeError):
        cli.main(["--debug", "cancel", "1"])


def test_a_usage_error_is_one_line_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--nodes", "many"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --nodes: invalid int value: 'many'" in err
