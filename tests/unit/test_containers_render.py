"""containers/spec.yml rendered to a Containerfile and an Apptainer .def; bad requests."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pyhpc import cli, container_build, containers
from pyhpc.containers import ContainerError

VARIANTS = ("cpu", "cuda")
DEF_SECTIONS = ["%labels", "%environment", "%files", "%post", "%runscript", "%test"]


@pytest.mark.parametrize("name", VARIANTS)
def test_containerfile_matches_golden(golden, name: str) -> None:
    golden.check(f"containers/Containerfile.{name}", containers.render(containers.variant(name), "oci"))


@pytest.mark.parametrize("name", VARIANTS)
def test_apptainer_def_matches_golden(golden, name: str) -> None:
    text = containers.render(containers.variant(name), "apptainer")
    golden.check(f"containers/pyhpc-{name}.def", text)


@pytest.mark.parametrize("name", containers.SCRIPTS)
def test_baked_scripts_match_golden(golden, name: str) -> None:
    golden.check(f"containers/{name}.cpu", containers.render_script(containers.variant("cpu"), name))


@pytest.mark.parametrize("name", VARIANTS)
def test_def_has_header_and_every_section_once_in_order(name: str) -> None:
    text = containers.render(containers.variant(name), "apptainer")
    assert re.match(r"^Bootstrap: (debootstrap|docker)\n", text)
    sections = re.findall(r"^%[a-z]+", text, flags=re.M)
    assert sections == DEF_SECTIONS
    for section in DEF_SECTIONS:
        body = text.split(section + "\n", 1)[1].split("\n%", 1)[0]
        assert body.strip(), f"{section} is empty"


@pytest.mark.parametrize("fmt", ["oci", "apptainer"])
def test_render_is_deterministic(fmt: str) -> None:
    assert containers.render(containers.variant("cpu"), fmt) == containers.render(
        containers.variant("cpu"), fmt)


@pytest.mark.parametrize("fmt", ["oci", "apptainer"])
def test_labels_carry_every_pinned_version(fmt: str) -> None:
    spec = containers.load_spec()
    text = containers.render(containers.variant("cpu"), fmt)
    pins = {"torch": spec["torch"], **spec["packages"]}
    for name, version in pins.items():
        key = "org.pyhpc.torch" if name == "torch" else f"org.pyhpc.pip.{name}"
        assert re.search(rf"{re.escape(key)}[= ]\"?{re.escape(version)}\"?( \\)?$", text, flags=re.M), key
    for name, version in spec["variants"]["cpu"]["base"]["packages"].items():
        assert f"org.pyhpc.deb.{name}" in text and version in text
    for key in ("org.pyhpc.python", "org.pyhpc.cuda", "org.pyhpc.nccl"):
        assert key in text


def test_spec_pins_equal_runtime_requirements(repo_root: Path) -> None:
    pins = {}
    for line in (repo_root / "requirements/runtime.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name] = version
    assert containers.variant("cpu").requirements == "".join(
        f"{k}=={v}\n" for k, v in sorted(pins.items()))


def test_cpu_variant_takes_torch_from_cpu_wheels_only() -> None:
    var = containers.variant("cpu")
    assert var.wheels == {"find_links": ["/opt/wheels"]}
    assert var.cuda == "none"


def test_selftest_prints_versions_and_gpu_visibility() -> None:
    script = containers.render_script(containers.variant("cuda"), "pyhpc-selftest")
    for word in ("torch:", "cuda:", "nccl:", "gpu visible:"):
        assert word in script
    assert '"cuda": "12.8"' in script


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().err


@pytest.fixture
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record, and refuse, every command the build would run: nothing may be built."""
    calls: list[list[str]] = []

    def fake(cmd: list[str], *args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(list(cmd))
        if cmd[-3:-1] == ["image", "exists"]:
            return subprocess.CompletedProcess(cmd, 1, "", "")
        raise AssertionError(f"build ran {cmd}")

    monkeypatch.setattr(container_build.subprocess, "run", fake)
    monkeypatch.setattr(container_build.subprocess, "Popen", fake)
    return calls


@pytest.mark.parametrize("command", ["render", "build"])
def test_unknown_variant_is_one_error_and_nothing_built(command, capsys, no_subprocess, tmp_path) -> None:
    out = tmp_path / "Containerfile"
    code, err = run_cli(["containers", command, "--variant", "gpu",
                         *(["-o", str(out)] if command == "render" else
                           ["--images-dir", str(tmp_path)])], capsys)
    assert code == 2
    assert err == "pyhpc: error: variant: unknown variant 'gpu'; allowed: cpu, cuda\n"
    assert no_subprocess == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["render", "build"])
def test_torch_version_not_in_spec_is_one_error(command, capsys, no_subprocess, tmp_path) -> None:
    code, err = run_cli(["containers", command, "--variant", "cpu", "--torch", "2.12.0",
                         *(["--images-dir", str(tmp_path)] if command == "build" else [])], capsys)
    assert code == 2
    assert err == ("pyhpc: error: torch: version '2.12.0' is not in containers/spec.yml; "
                   "allowed: 2.13.0\n")
    assert no_subprocess == [] and list(tmp_path.iterdir()) == []


def test_variant_without_base_is_one_error(capsys, monkeypatch, tmp_path) -> None:
    spec = containers.load_spec()
    del spec["variants"]["cuda"]["base"]
    path = tmp_path / "spec.yml"
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("PYHPC_CONTAINER_SPEC", str(path))
    code, err = run_cli(["containers", "render", "--variant", "cuda"], capsys)
    assert code == 2
    assert err.startswith("pyhpc: error: variants.cuda.base: missing in containers/spec.yml")


def test_base_image_missing_locally_fails_before_any_download(no_subprocess, monkeypatch,
                                                              tmp_path) -> None:
    monkeypatch.setattr(container_build, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(container_build.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    with pytest.raises(ContainerError, match=r"^base: image 'docker.io/nvidia/cuda:.*' of variant "
                       r"'cuda' is missing from local storage"):
        container_build.build(containers.variant("cuda"), tmp_path / "images")
    assert [c[-3:-1] for c in no_subprocess] == [["image", "exists"]]
    assert list(tmp_path.iterdir()) == []


def test_unknown_format_is_one_error() -> None:
    with pytest.raises(ContainerError, match="format: unknown format 'docker'; allowed: oci, apptainer"):
        containers.render(containers.variant("cpu"), "docker")


def test_unpinned_version_in_spec_is_one_error() -> None:
    spec = containers.load_spec()
    spec["packages"]["numpy"] = ">=2"
    with pytest.raises(ContainerError, match=r"^packages.numpy: '>=2' is not a pinned version"):
        containers.variant("cpu", spec=spec)


def test_render_writes_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "pyhpc-cpu.def"
    assert cli.main(["containers", "render", "--variant", "cpu", "--format", "apptainer",
                     "-o", str(out)]) == 0
    assert out.read_text() == containers.render(containers.variant("cpu"), "apptainer")


def test_cli_startup_and_render_do_not_import_torch() -> None:
    code = ("import sys, io, contextlib\nfrom pyhpc import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    cli.main(['containers', 'render', '--variant', 'cpu'])\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


JOB_VALUES = {"module": "pyhpc.train", "args": "--out run --mode synthetic",
              "binds": "/srv/data,/tmp/with space"}


@pytest.mark.parametrize("runtime", ["podman", "apptainer", "enroot"])
def test_container_job_matches_golden(golden, runtime: str) -> None:
    from pyhpc import cluster, paths, render

    text = render.render("container", {**JOB_VALUES, "runtime": runtime},
                         cluster.load(paths.LAB_CLUSTER))
    golden.check(f"containers/container.sbatch.{runtime}", text)


def test_container_job_wraps_the_bare_job_line() -> None:
    from pyhpc import cluster, paths, render

    lab = cluster.load(paths.LAB_CLUSTER)
    bare = render.render("ddp-srun", {"module": "pyhpc.train", "args": "--out run"}, lab)
    boxed = render.render("container", {"module": "pyhpc.train", "args": "--out run"}, lab)
    srun_bare = next(line for line in bare.splitlines() if line.startswith("srun "))
    srun_boxed = next(line for line in boxed.splitlines() if line.startswith("srun "))
    head, _, tail = srun_bare.partition("/opt/pyhpc/venv/bin/python")
    assert srun_boxed.startswith(head + "podman ")
    assert srun_boxed.endswith(" --rootfs /opt/pyhpc/images/pyhpc-cpu/rootfs "
                               "/opt/pyhpc/venv/bin/python" + tail)


def test_container_job_quotes_every_value() -> None:
    from pyhpc import cluster, paths, render

    text = render.render("container", {"module": "pyhpc.train", "image": "/images/x; rm -rf /",
                                       "binds": "/a$(id)"}, cluster.load(paths.LAB_CLUSTER))
    assert "--env-file '/images/x; rm -rf //env'" in text
    assert "--volume '/a$(id):/a$(id)'" in text


def test_container_job_unknown_runtime_is_an_error() -> None:
    from pyhpc import cluster, paths, render

    with pytest.raises(render.RenderError) as err:
        render.render("container", {"module": "pyhpc.train", "runtime": "docker"},
                      cluster.load(paths.LAB_CLUSTER))
    assert str(err.value) == "runtime: unknown container runtime docker; allowed: podman, apptainer, enroot"
