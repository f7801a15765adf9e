"""hadolint on the rendered Containerfiles; shellcheck on every script baked into the images."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyhpc import paths
from pyhpc.containers import spec as containers

BIN = Path(sys.executable).parent
VARIANTS = ("cpu", "cuda")


def _lint(argv: list[str], text: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, input=text, capture_output=True, text=True, check=False)
    print(proc.stdout, proc.stderr, sep="\n")
    return proc


@pytest.mark.parametrize("name", VARIANTS)
def test_hadolint_passes_on_rendered_containerfile(name: str, tmp_path: Path) -> None:
    path = tmp_path / "Containerfile"
    path.write_text(containers.render(containers.variant(name), "oci"))
    proc = _lint([str(BIN / "hadolint"), "--failure-threshold", "info", str(path)])
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("script", containers.SCRIPTS)
@pytest.mark.parametrize("name", VARIANTS)
def test_shellcheck_passes_on_baked_scripts(name: str, script: str, shellcheck: str) -> None:
    text = containers.render_script(containers.variant(name), script)
    proc = _lint([shellcheck, "-"], text)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("section", ["%post", "%runscript", "%test"])
@pytest.mark.parametrize("name", VARIANTS)
def test_shellcheck_passes_on_apptainer_sections(name: str, section: str, shellcheck: str) -> None:
    text = containers.render(containers.variant(name), "apptainer")
    body = text.split(section + "\n", 1)[1].split("\n%", 1)[0]
    # Apptainer runs these sections with /bin/sh.
    proc = _lint([shellcheck, "--shell", "sh", "-"], "#!/bin/sh\n" + body + "\n")
    assert proc.returncode == 0, proc.stdout


def test_shellcheck_passes_on_containerfile_run_steps(shellcheck: str) -> None:
    text = containers.render(containers.variant("cuda"), "oci")
    runs = re.findall(r"^RUN (?:--mount=\S+ \\\n)?(.*?)(?<!\\)\n", text, flags=re.M | re.S)
    assert len(runs) == 2
    for body in runs:
        proc = _lint([shellcheck, "--shell", "bash", "-"], "#!/bin/bash\n" + body + "\n")
        assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("runtime", ["podman", "apptainer", "enroot"])
def test_shellcheck_passes_on_rendered_container_job(runtime: str, shellcheck: str) -> None:
    from pyhpc import cluster
    from pyhpc.slurm import render

    text = render.render("container", {"module": "pyhpc.train", "args": "--out run",
                                       "runtime": runtime, "binds": "/srv/data"},
                         cluster.load(paths.LAB_CLUSTER))
    proc = _lint([shellcheck, "-"], text)
    assert proc.returncode == 0, proc.stdout
