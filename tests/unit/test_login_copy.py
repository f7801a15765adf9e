"""What the login role copies of the repository to /opt/pyhpc/src: rsync with the role's own
filters (vars/main.yml) over a tree that holds what a developer's checkout holds after
``make test``. What git ignores (the venv, the deploy log, build output, the caches lint
and tests write) is not copied: a copy that took them would change on the deploy after
every test run, and carry them to every login host."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pyhpc import paths

FILTERS = yaml.safe_load((paths.ROOT / "ansible" / "roles" / "pyhpc_login" / "vars" /
                          "main.yml").read_text())["pyhpc_login_rsync_filters"]
TRACKED = ["README.md", "pyhpc/__init__.py", "ansible/site.yml", "containers/Containerfile.cpu",
           "benchmarks/results/gpu.json"]
IGNORED = [".git/HEAD", ".venv/bin/python", ".deploy/deploy.log", ".pytest_cache/README.md",
           ".mypy_cache/3.11/pyhpc.data.json", ".ruff_cache/0.1/cache", ".hypothesis/constants/x",
           "pyhpc/__pycache__/cli.cpython-311.pyc", "pyhpc.egg-info/PKG-INFO",
           "containers/build/pyhpc-cpu.sif", "benchmarks/work/run.json", ".ansible/tmp/x"]


@pytest.mark.skipif(shutil.which("rsync") is None,
                    reason="rsync is not installed here (make deploy installs it on the control node)")
def test_the_copy_takes_what_git_tracks_and_nothing_git_ignores(tmp_path: Path) -> None:
    src, dest = tmp_path / "checkout", tmp_path / "copy"
    for name in [*TRACKED, *IGNORED]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(name)
    shutil.copy(paths.ROOT / ".gitignore", src / ".gitignore")
    # The module's own call, less its transfer options: -F and the role's rsync_opts.
    subprocess.run(["rsync", "--recursive", "--checksum", "--delete", "-F", "--omit-dir-times",
                    *FILTERS, f"{src}/", f"{dest}/"], check=True)
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == sorted([*TRACKED, ".gitignore"])


def test_every_ignored_probe_is_one_git_ignores() -> None:
    # The probes above stand for .gitignore's lines: git itself must ignore each.
    proc = subprocess.run(["git", "-C", str(paths.ROOT), "check-ignore", "--no-index", *IGNORED[1:]],
                          capture_output=True, text=True, check=False)
    if proc.returncode == 128:
        pytest.skip(f"git cannot read {paths.ROOT} as a repository: {proc.stderr.strip()}")
    assert sorted(proc.stdout.split()) == sorted(IGNORED[1:])
