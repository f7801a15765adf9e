"""pyhpc.container_run: the command line each container task starts with, and its refusals."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pyhpc.containers import run as container_run


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """An exported image with the directories the spec's mount_points give it."""
    for path in ("home", "tmp", "srv", "opt/pyhpc/src"):
        (tmp_path / "image" / "rootfs" / path).mkdir(parents=True)
    (tmp_path / "image" / "env").write_text("PATH=/usr/bin\n")
    return tmp_path / "image"


def argv(*words: str) -> list[str]:
    return container_run.build(container_run.parser().parse_args(list(words)))


def values(words: list[str], flag: str) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words) if word == flag]


@pytest.mark.parametrize(("submit_dir", "mount"), [
    ("/home/alice/my run", "/home"),
    ("/tmp/job", "/tmp"),
    ("/opt/pyhpc/src", "/opt/pyhpc/src"),
    ("/scratch/alice/run", "/scratch/alice/run"),
])
def test_podman_mounts_each_host_path_through_its_deepest_directory_in_the_image(
        submit_dir: str, mount: str, image: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rootless podman cannot create a mount point in the shared rootfs: the submit dir
    and each bind are mounted, at the same path, through the deepest directory above them
    that the image has; with none (here /scratch), as themselves (root only)."""
    monkeypatch.setenv("SLURM_SUBMIT_DIR", submit_dir)
    words = argv("--image", str(image), "--bind", "/srv/data/set-1", "--bind", "/scratch/run-1",
                 "--", "python", "-m", "pyhpc.dist")
    expected = ["/tmp:/tmp", "/opt/pyhpc/src:/opt/pyhpc/src:ro", f"{mount}:{mount}", "/srv:/srv",
                "/scratch/run-1:/scratch/run-1"]
    assert values(words, "--volume") == list(dict.fromkeys(expected))
    assert values(words, "--workdir") == [submit_dir]
    assert words[-5:] == ["--rootfs", str(image / "rootfs"), "python", "-m", "pyhpc.dist"]


def test_podman_task_stays_in_its_jobs_cgroup_on_a_read_only_rootfs(
        image: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_SUBMIT_DIR", "/home/alice/run")
    words = argv("--image", str(image), "--", "true")
    assert words[:3] == ["env", "-u", "XDG_RUNTIME_DIR"]
    assert values(words, "--runtime") == ["crun"]
    assert values(words, "--cgroups") == ["disabled"]
    assert "--read-only" in words
    assert "--device" not in words
    assert "nvidia.com/gpu=all" in argv("--image", str(image), "--gpus", "2", "--", "true")


def test_probe_runs_the_true_command_when_none_is_given(image: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_SUBMIT_DIR", "/home/alice")
    assert argv("--image", str(image), "--probe")[-1] == "/bin/true"


@pytest.mark.parametrize(("runtime", "submit_dir", "bad"), [
    ("podman", "/home/alice/a:b", "':'"),
    ("apptainer", "/home/alice/a,b", "','"),
    ("apptainer", "/home/alice/a:b,c", "',' and ':'"),
])
def test_a_path_with_the_runtimes_separator_is_refused(runtime: str, submit_dir: str, bad: str,
                                                       image: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_SUBMIT_DIR", submit_dir)
    assert container_run.main(["--runtime", runtime, "--image", str(image), "--", "true"]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert out.startswith(f"pyhpc: '{submit_dir}' contains {bad}, which {runtime}'s mount syntax")


def test_a_comma_is_fine_for_podman(image: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_SUBMIT_DIR", "/home/alice/a,b")
    assert "/home:/home" in values(argv("--image", str(image), "--", "true"), "--volume")


def test_a_missing_image_fails_at_once_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_SUBMIT_DIR", "/home/alice")
    assert container_run.main(["--image", str(tmp_path / "gone"), "--probe"]) == 2
    assert capsys.readouterr().out == (f"pyhpc: image {tmp_path / 'gone'} has no rootfs/ and env "
                                       "(build it with `make containers` or `pyhpc containers build`)\n")


def test_probe_reports_the_runtimes_last_word_in_one_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "cpu1")
    failing = [sys.executable, "-c", "import sys; sys.stderr.write('time=... level=warning\\n"
               "Error: OCI runtime error: crun: cgroups in hybrid mode not supported\\n'); sys.exit(126)"]
    assert container_run.probe(failing) == 3
    assert capsys.readouterr().out == ("pyhpc: the container runtime cannot start the image on cpu1: "
                                       "OCI runtime error: crun: cgroups in hybrid mode not supported\n")
    assert container_run.probe([sys.executable, "-c", "pass"]) == 0
    assert capsys.readouterr().out == ""


def test_probe_of_a_runtime_that_is_not_installed_is_one_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "cpu1")
    assert container_run.probe(["/nonexistent/podman", "run"]) == 3
    assert capsys.readouterr().out == ("pyhpc: the container runtime cannot start the image on cpu1: "
                                       "/nonexistent/podman: No such file or directory\n")


def test_apptainer_binds_the_submit_dir_source_and_binds(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    sif = tmp_path / "x.sif"
    sif.write_bytes(b"")
    monkeypatch.setenv("SLURM_SUBMIT_DIR", "/home/alice/run")
    words = argv("--runtime", "apptainer", "--image", str(sif), "--bind", "/srv", "--", "python")
    assert words[:3] == ["apptainer", "exec", "--nv"]
    assert values(words, "--bind") == ["/home/alice/run", "/opt/pyhpc/src:/opt/pyhpc/src:ro", "/srv"]
    assert words[-2:] == [str(sif), "python"]


def test_root_workdir_is_not_mounted_over_the_image(image: Path) -> None:
    """The doctor's step runs from /: the host's / must never cover the image's."""
    words = argv("--image", str(image), "--workdir", "/", "--probe")
    assert values(words, "--volume") == ["/tmp:/tmp", "/opt/pyhpc/src:/opt/pyhpc/src:ro"]
    assert values(words, "--workdir") == ["/"]
