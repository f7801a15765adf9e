"""Issue 21, the logic under its lab tests: no code of one user runs as another.

The one directory check, the import path of what pyhpc starts, private job folders,
templates that cannot run code, reads that never block on a planted FIFO, and runs that
report nothing unless they have results. (Two real users on the lab:
tests/integration/test_hostile_colleagues.py.)
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import pyhpc
from pyhpc import dist, files
from pyhpc.cluster import Cluster
from pyhpc.slurm import render
from pyhpc.slurm import submit as _submit
from pyhpc.train import metrics, report

#: A uid that is nobody on this machine: what another user's directory looks like.
OTHER = 54321


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail instead of hanging: a planted FIFO must make no read wait."""
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


# -- the one directory check ------------------------------------------------------------------

def test_a_directory_of_ones_own_passes_and_comes_back_resolved(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert files.safe_dir(tmp_path / "link" / "run") == tmp_path / "real" / "run"


@pytest.mark.parametrize(("mode", "why"), [
    (0o777, r"is writable by every user \(mode 0777\)"),
    (0o1777, r"is writable by every user \(mode 1777\)"),  # sticky helps only above it
])
def test_a_directory_others_can_write_is_refused_with_one_line(tmp_path: Path, mode: int,
                                                              why: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(files.FileError, match=rf"^out: refusing {shared}: {shared} {why}; "
                                               "pyhpc writes and reads back only in "
                                               "directories that nobody else can write$"):
        files.safe_dir(shared)


def test_a_directory_under_one_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "mine").mkdir(parents=True, mode=0o700)
    shared.chmod(0o777)
    with pytest.raises(files.FileError, match=rf"{shared} is writable by every user"):
        files.safe_dir(shared / "mine" / "run")
    shared.chmod(0o1777)  # sticky (/tmp): nobody can rename what is mine in it
    assert files.safe_dir(shared / "mine" / "run") == shared / "mine" / "run"


def test_a_group_writable_directory_is_refused_unless_the_group_is_private(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o770)
    os.chown(project, -1, OTHER)
    with pytest.raises(files.FileError, match=rf"{project} is writable by group gid {OTHER}"):
        files.safe_dir(project)


def test_someone_elses_directory_is_refused_as_target_or_above(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    (theirs / "jobs").mkdir(parents=True)
    os.chown(theirs, OTHER, -1)
    with pytest.raises(files.FileError, match=rf"{theirs} belongs to uid {OTHER}, not to you"):
        files.safe_dir(theirs / "jobs")
    os.chown(theirs / "jobs", OTHER, -1)
    theirs.chmod(0o755)
    os.chown(theirs, os.getuid(), -1)
    with pytest.raises(files.FileError, match=rf"{theirs / 'jobs'} belongs to uid {OTHER}"):
        files.safe_dir(theirs / "jobs")


def test_a_link_or_file_where_the_directory_belongs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(files.FileError, match="is a symbolic link; name the directory itself"):
        files.safe_dir(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(files.FileError, match="exists and is not a directory"):
        files.safe_dir(tmp_path / "file")
    with pytest.raises(files.FileError, match="is under a file, not a directory"):
        files.safe_dir(tmp_path / "file" / "run")


def test_make_dir_checks_before_it_creates_anything(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(files.FileError):
        files.make_dir(shared / "a" / "b")
    assert list(shared.iterdir()) == []
    made = files.make_dir(tmp_path / "mine" / "run")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


# -- private job folders, the import path of jobs -------------------------------------------

@pytest.fixture
def fake_sbatch(monkeypatch, tmp_path: Path) -> Path:
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "srun", "squeue", "sacct", "scontrol", "scancel"):
        (bin_dir / tool).write_text(f'#!/bin/bash\necho "$(basename "$0") $*" >> "{log}"\n'
                                    'echo "Submitted batch job 4243"\n')
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    monkeypatch.chdir(work)
    return log


def _batch_script(log: Path) -> str:
    (call,) = [c for c in log.read_text().splitlines() if c.startswith("sbatch")]
    return Path(call.split()[-1]).read_text()


def test_a_submitit_job_is_private_and_imports_nothing_from_where_it_runs(
        fake_sbatch: Path, lab: Cluster) -> None:
    job = pyhpc.submit(print, "hi", cluster=lab)
    folder = Path.cwd() / "pyhpc-jobs" / "4243"
    assert job.paths.folder == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "4243_submitted.pkl").stat().st_mode) == 0o600
    text = _batch_script(fake_sbatch)
    assert f"{sys.executable} -P -u -m submitit.core._submit" in text
    # The submit directory is the user's alone: it stays importable, explicitly.
    assert f"export PYTHONPATH={Path.cwd()}${{PYTHONPATH:+:$PYTHONPATH}}" in text


def test_a_submit_directory_others_can_write_is_never_on_the_jobs_path(
        fake_sbatch: Path, lab: Cluster) -> None:
    os.chmod(".", 0o777)
    with pytest.raises(files.FileError, match=r"^folder: refusing .*pyhpc-jobs: .* is writable "
                                              "by every user"):
        pyhpc.submit(print, cluster=lab)
    assert not fake_sbatch.exists() and not Path("pyhpc-jobs").exists()
    # A folder elsewhere is fine, but the shared directory stays off the import path.
    home = Path.cwd().parent / "own"
    pyhpc.submit(print, cluster=lab, folder=home / "%j")
    text = _batch_script(fake_sbatch)
    assert "export PYTHONPATH" not in text and " -P -u -m submitit.core._submit" in text


def test_a_root_owned_jobs_folder_is_one_line_not_a_permission_error(
        fake_sbatch: Path, lab: Cluster) -> None:
    Path("pyhpc-jobs").mkdir()
    os.chown("pyhpc-jobs", OTHER, -1)
    with pytest.raises(files.FileError, match=rf"^folder: refusing .*pyhpc-jobs: .* belongs to "
                                              rf"uid {OTHER}, not to you"):
        pyhpc.submit(print, cluster=lab)
    assert not fake_sbatch.exists()


def test_dist_puts_back_only_what_the_program_needs(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    assert dist.import_path(["/srv/code/train.py", "--lr", "1"], own) == ["/srv/code"]
    assert dist.import_path(["-m", "mytrain"], own) == [str(own)]
    own.chmod(0o777)
    assert dist.import_path(["-m", "mytrain"], own) == []


def test_a_module_in_a_shared_directory_is_not_imported_by_dist(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "numpy.py").write_text("open('pwned', 'w').close()\n")
    (shared / "pyhpc_probe.py").write_text("open('pwned', 'w').close()\n")
    shared.chmod(0o777)
    proc = subprocess.run([sys.executable, "-P", "-m", "pyhpc.dist", "-m", "pyhpc_probe"],
                          cwd=shared, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not (shared / "pwned").exists()
    assert proc.stderr.count("\n") == 1 and "no module named 'pyhpc_probe'" in proc.stderr


# -- templates are text -------------------------------------------------------------------------

@pytest.mark.parametrize("source", [
    "{{ cycler.__init__.__globals__.os.system('touch pwned') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ sbatch.__globals__ }}",
    "{% set x = [] %}{{ x.append(1) }}",
])
def test_a_template_cannot_run_code(tmp_path: Path, monkeypatch, source: str,
                                    lab: Cluster) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.sbatch.j2").write_text(source)
    with pytest.raises(render.RenderError) as exc:
        render.render("./x.sbatch.j2", {}, lab)
    assert str(exc.value).startswith("template: 'x.sbatch.j2' ") and "\n" not in str(exc.value)
    assert not (tmp_path / "pwned").exists()


def test_a_shipped_name_always_means_the_shipped_template(tmp_path: Path, monkeypatch,
                                                         lab: Cluster) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "single.sbatch.j2").write_text("planted {{ command }}\n")
    (tmp_path / "single").write_text("#!/bin/sh\necho planted\n")
    shipped = render.render("single", {"command": "true"}, lab)
    assert shipped.startswith("#!/bin/bash") and "planted" not in shipped
    assert render.render("single.sbatch.j2", {"command": "true"}, lab) == shipped
    assert _submit.target_kind("single") == "template"
    assert render.render("./single.sbatch.j2", {"command": "true"}, lab) == "planted true\n"


def test_a_users_template_includes_the_shipped_ones_only(tmp_path: Path, monkeypatch,
                                                        lab: Cluster) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "_rendezvous.sh.j2").write_text("planted\n")
    (tmp_path / "mine.sbatch.j2").write_text('{% include "_rendezvous.sh.j2" %}')
    assert "MASTER_ADDR" in render.render("./mine.sbatch.j2", {}, lab)
    with pytest.raises(render.RenderError, match=r"^template: unknown template 'mine\.sbatch\."
                                                 r"j2'; .*name its path, e\.g\. \./mine"):
        render.render("mine.sbatch.j2", {}, lab)


def test_a_fifo_named_as_a_template_is_refused_at_once(tmp_path: Path, lab: Cluster) -> None:
    with within(5), pytest.raises(files.FileError, match="not a regular file"):
        render.render(str(fifo(tmp_path / "t.sbatch.j2")), {}, lab)


# -- reads never block; results are honest ----------------------------------------------------

def test_no_reader_blocks_on_a_planted_fifo(tmp_path: Path) -> None:
    for name in ("metrics.jsonl", "history.json", "ranks.jsonl"):
        fifo(tmp_path / name)
    with within(5):
        with pytest.raises(metrics.MetricsError, match="not a regular file"):
            metrics.read_jsonl(tmp_path / "metrics.jsonl")
        assert report._history(tmp_path) == []
        with pytest.raises(files.FileError, match=r"cannot append to .*ranks\.jsonl \(No such "
                                                  "device or address"):  # no reader: ENXIO
            files.append_text(tmp_path / "ranks.jsonl", "x\n")
        assert not _submit._holds(tmp_path / "history.json", "x")


def test_a_run_without_epochs_or_files_has_no_results(tmp_path: Path) -> None:
    summary = report.run_summary(tmp_path)
    why = report.missing_results(tmp_path, summary)
    assert why == (f"out: the job ended COMPLETED but left no results in {tmp_path} "
                   "(0 epochs trained, no metrics.jsonl, no checkpoint.pt)")
    (tmp_path / "history.json").write_text(json.dumps([{"epoch": 0, "loss": 1.0}]))
    fifo(tmp_path / "checkpoint.pt")
    (tmp_path / "metrics.jsonl").write_text("")
    why = report.missing_results(tmp_path, report.run_summary(tmp_path))
    assert why is not None and why.endswith("(no checkpoint.pt, no metrics record)")


def test_a_report_beside_a_colleagues_runs_is_refused_and_writes_nothing(tmp_path: Path,
                                                                         capsys) -> None:
    from pyhpc.cli import main as cli

    runs = tmp_path / "shared"
    files.make_dir(runs / "a")
    metrics.write_jsonl(runs / "a" / "metrics.jsonl", [metrics.Summary(
        workers=1, local_batch=32, global_batch=32, steps=5, warmup_steps=1,
        step_time_p50=0.1, step_time_p90=0.1, step_time_mean=0.1, samples_per_s=320.0,
        samples_per_s_per_worker=320.0, torch_version="x", backend="gloo", job_id="1",
        nodes="cpu1", mode="digits", model="LeNet")])
    runs.chmod(0o777)
    assert cli.main(["report", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyhpc: error: png: refusing {runs}: {runs} is writable by every "
                          "user") and err.count("\n") == 1
    assert sorted(p.name for p in runs.iterdir()) == ["a"]
    # Reading a colleague's runs is fine; the plot goes where the researcher says.
    assert cli.main(["report", str(runs), "--png", str(tmp_path / "mine.png")]) == 0


def test_in_a_rootless_container_unmapped_owners_above_pass_the_target_does_not(
        tmp_path: Path, monkeypatch) -> None:
    # There every owner but the user shows as the overflow uid (nobody), root's included.
    above = tmp_path / "home"
    (above / "me").mkdir(parents=True)
    os.chown(above, OTHER, -1)
    monkeypatch.setattr(files, "unmapped_uid", lambda: OTHER)
    assert files.safe_dir(above / "me" / "run") == above / "me" / "run"
    os.chown(above / "me", OTHER, -1)
    with pytest.raises(files.FileError, match=rf"{above / 'me'} belongs to uid {OTHER}"):
        files.safe_dir(above / "me")
