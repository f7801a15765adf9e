"""The backup role's schedule: the cron line (hosts whose PID 1 is not systemd) and the
systemd timer and service run one command; systemd-analyze accepts the units."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from pyhpc import paths

ROLE = paths.ROOT / "ansible" / "roles" / "backup"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
UNITS = VARS["backup_units"]


def render(template: str) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"),
                             trim_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    values = {**DEFAULTS, "backup_config": {"interval": "6h", "interval_s": 21600}}
    values["backup_command"] = env.from_string(VARS["backup_command"]).render(values)
    values["backup_log"] = VARS["backup_log"]
    return env.get_template(template).render(values)


def test_cron_and_the_timer_run_one_command() -> None:
    command = f"{DEFAULTS['backup_python']} -P -m pyhpc admin backup now --if-due"
    [line] = [ln for ln in render("etc/cron.d/pyhpc-backup.j2").splitlines()
              if ln and not ln.startswith("#") and "=" not in ln.split()[0]]
    assert line == (f"*/{DEFAULTS['backup_tick_min']} * * * * root umask 077; cd / && "
                    f"{command} > {VARS['backup_log']} 2>&1")
    service = render("etc/systemd/system/pyhpc-backup.service.j2")
    assert f"\nExecStart={command}\n" in service and "\nUMask=0077\n" in service
    timer = render("etc/systemd/system/pyhpc-backup.timer.j2")
    assert f"\nOnCalendar=*:0/{DEFAULTS['backup_tick_min']}\n" in timer
    assert "\nPersistent=true\n" in timer


def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here (Debian: systemd)")
    for unit in UNITS:
        (tmp_path / unit).write_text(render(f"etc/systemd/system/{unit}.j2"))
    # It checks that ExecStart's program exists: the pyhpc environment's Python, or this one.
    service = tmp_path / "pyhpc-backup.service"
    if not Path(DEFAULTS["backup_python"]).exists():
        service.write_text(service.read_text().replace(DEFAULTS["backup_python"],
                                                       shutil.which("python3") or "/bin/true"))
    proc = subprocess.run([analyze, "verify", *(str(tmp_path / u) for u in UNITS)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
