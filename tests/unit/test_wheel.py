"""pyhpc as a wheel: built from a copy of the checkout, installed into a fresh virtualenv
outside it and run from another directory, it renders every job template and container
file to its golden file, from the data the wheel carries (pyhpc/_data, setup.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from test_containers_render import JOB_VALUES
from test_render import CASES

from pyhpc import paths
from pyhpc.admin import homes
from pyhpc.containers import spec as containers
from pyhpc.slurm import render

#: What the build reads: the metadata, the build step, the package and its data.
SOURCES = ["pyproject.toml", "setup.py", "README.md", "pyhpc", "slurm", "containers", "workshops"]
RUNTIMES = ("podman", "apptainer", "enroot")
#: Runs in the installed virtualenv: every rendering asked for, and where pyhpc found it all.
RENDER = r"""
import json, sys
import pyhpc
from pyhpc import cluster, paths
from pyhpc.admin import homes
from pyhpc.containers import spec as containers
from pyhpc.slurm import render

lab = cluster.load(paths.cluster_file())
out = {"package": pyhpc.__file__, "shipped": str(paths.SHIPPED), "templates": render.available(),
       "variants": sorted(containers.load_spec()["variants"]),
       "notebooks": [p.name for p in homes.notebooks()], "files": {}}
for golden, kind, args in json.loads(sys.argv[1]):
    if kind == "job":
        text = render.render(args[0], args[1], lab)
    elif kind == "image":
        text = containers.render(containers.variant(args[0]), args[1])
    else:
        text = containers.render_script(containers.variant(args[0]), args[1])
    out["files"][golden] = text
print(json.dumps(out))
"""


def renderings() -> list[tuple[str, str, list[Any]]]:
    """(golden file, kind, arguments): the golden cases of test_render and test_containers_render."""
    jobs = [(f"jobs/{name}.sbatch", "job", [name, values]) for name, values in sorted(CASES.items())]
    boxed = [(f"containers/container.sbatch.{rt}", "job", ["container", {**JOB_VALUES, "runtime": rt}])
             for rt in RUNTIMES]
    variants = sorted(containers.load_spec()["variants"])
    images = [(f"containers/Containerfile.{v}", "image", [v, "oci"]) for v in variants]
    images += [(f"containers/pyhpc-{v}.def", "image", [v, "apptainer"]) for v in variants]
    scripts = [(f"containers/{name}.cpu", "script", ["cpu", name]) for name in containers.SCRIPTS]
    return jobs + boxed + images + scripts


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv outside the checkout with the wheel in it: no pip, no index; the
    dependencies (jinja2, PyYAML, ...) from this one's site-packages, which a .pth adds
    after the venv's own (it holds this checkout's editable pyhpc only as metadata)."""
    base = tmp_path_factory.mktemp("wheel")
    src, dist, venv = base / "src", base / "dist", base / "venv"
    src.mkdir()
    for name in SOURCES:
        if (paths.ROOT / name).is_dir():
            shutil.copytree(paths.ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "build", ".ipynb_checkpoints"))
        else:
            shutil.copy2(paths.ROOT / name, src / name)
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
                   check=True, env=env, timeout=300)
    wheels = sorted(dist.glob("pyhpc-*.whl"))
    assert len(wheels) == 1, wheels
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps",
                    str(wheels[0])], check=True, env=env, timeout=300)
    return venv


def _run(venv: Path, argv: list[str]) -> str:
    """``argv`` from an empty directory outside the checkout, with the lab's definition."""
    elsewhere = venv.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(elsewhere),
           "PYHPC_CLUSTER": str(paths.LAB_CLUSTER)}
    proc = subprocess.run(argv, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_installed_wheel_renders_every_template_to_its_golden_file(installed: Path, golden) -> None:
    cases = renderings()
    out = json.loads(_run(installed, [str(installed / "bin" / "python"), "-I", "-c", RENDER,
                                      json.dumps(cases)]))
    assert Path(out["package"]).is_relative_to(installed)
    assert Path(out["shipped"]) == Path(out["package"]).parent / "_data"
    # Every job template and variant has its golden case: a new one fails here until it does.
    assert out["templates"] == render.available()
    assert set(out["templates"]) == set(CASES) | {"container"}
    assert out["variants"] == sorted(containers.load_spec()["variants"])
    for name, _, _ in cases:
        golden.check(name, out["files"][name])
    # The commands a user types, through the wheel's own entry point.
    pyhpc = str(installed / "bin" / "pyhpc")
    command = CASES["single"]["command"]
    golden.check("jobs/single.sbatch",
                 _run(installed, [pyhpc, "render", "single", "--set", f"command={command}"]))
    golden.check("containers/Containerfile.cpu",
                 _run(installed, [pyhpc, "containers", "render", "--variant", "cpu", "--format", "oci"]))


def test_the_wheel_carries_the_repositorys_files_unchanged(installed: Path) -> None:
    """The top-level slurm/, containers/ and workshops/ are the one source: each shipped
    file is the checkout's, byte for byte, and the notebooks are the workshop's."""
    out = json.loads(_run(installed, [str(installed / "bin" / "python"), "-I", "-c", RENDER, "[]"]))
    shipped = Path(out["shipped"])
    files = sorted(p.relative_to(shipped) for p in shipped.rglob("*") if p.is_file())
    assert {p.parts[0] for p in files} == {"slurm", "containers", "workshops"}
    for rel in files:
        assert (shipped / rel).read_bytes() == (paths.ROOT / rel).read_bytes(), rel
    assert out["notebooks"] == [p.name for p in homes.notebooks(paths.ROOT / "workshops")]
    assert {p.name for p in (shipped / "slurm" / "etc").iterdir()} == \
        {p.name for p in (paths.ROOT / "slurm" / "etc").glob("*.j2")}
