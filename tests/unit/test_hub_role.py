"""The jupyterhub role's files, rendered as the role renders them (plain Jinja2 in the
template module's settings, the role's defaults and vars resolved from the normalised
definition) to golden files: jupyterhub_config.py, the sudo rule, the PAM service and
the init script. The sudo rule is matched against every command pyhpc.slurm.as_user
builds, and checked by sudo's own tools where they are installed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from jinja2.nativetypes import NativeEnvironment

from pyhpc import cluster, paths
from pyhpc.hub import api, running
from pyhpc.slurm import as_user, slurm

ROLE = paths.ROOT / "ansible" / "roles" / "jupyterhub"
TEMPLATES = {"jupyterhub_config.py": "etc/pyhpc/hub/jupyterhub_config.py.j2",
             "sudoers": "etc/sudoers.d/pyhpc-hub.j2", "pam": "etc/pam.d/pyhpc-hub.j2",
             "init": "pyhpc-init.d.j2"}
#: Golden case -> inventory, the jupyterhub section, host facts.
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "lab": ("lab", {}, {"inventory_hostname": "localhost", "fqdn": "labhost.example"}),
    "example": ("example", {"hostname": "hub.example.org", "port": 443 + 8000,
                            "idle_timeout_min": 20, "tls_cert": "/etc/ssl/hub/fullchain.pem",
                            "tls_key": "/etc/ssl/hub/key.pem"},
                {"inventory_hostname": "login1", "fqdn": "login1.example.org"}),
}


def to_json(value: Any) -> str:
    """Ansible's filter; a value not resolved yet stays undefined (context() resolves again)."""
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    return json.dumps(value)


def definition(case: str) -> cluster.Cluster:
    inventory, hub, _ = CASES[case]
    data = yaml.safe_load((paths.ROOT / "ansible" / "inventories" / inventory / "cluster.yml")
                          .read_text())
    data.setdefault("directory", {})
    return cluster.parse({**data, "jupyterhub": hub}, 24 * 1024)


def context(case: str, **extra: Any) -> dict[str, Any]:
    """The role's defaults and vars, resolved as Ansible would for the hub's host."""
    facts = CASES[case][2]
    env = NativeEnvironment()
    env.filters["to_json"] = to_json
    ctx: dict[str, Any] = {
        "inventory_hostname": facts["inventory_hostname"], "ansible_managed": "Ansible managed",
        "groups": {"login": [facts["inventory_hostname"]]}, "ansible_facts": {"fqdn": facts["fqdn"]},
        "jupyterhub_cluster": json.loads(json.dumps(definition(case).to_dict()))}
    raw = {**yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
           **yaml.safe_load((ROLE / "vars" / "main.yml").read_text()), **extra}
    raw.pop("jupyterhub_cluster")
    for _ in range(6):  # until every value that names another is resolved
        ctx.update({k: resolve(env, v, ctx) for k, v in raw.items()})
    return ctx


def resolve(env: NativeEnvironment, value: Any, ctx: dict[str, Any]) -> Any:
    if isinstance(value, str) and "{{" in value:
        try:
            return env.from_string(value.strip()).render(ctx)
        except jinja2.UndefinedError:
            return value
    if isinstance(value, list):
        return [resolve(env, v, ctx) for v in value]
    if isinstance(value, dict):
        return {k: resolve(env, v, ctx) for k, v in value.items()}
    return value


def render(case: str, name: str, **extra: Any) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(
        [ROLE / "templates", paths.ROOT / "ansible" / "templates"]), trim_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters["to_json"] = to_json
    if name == "init":  # pyhpc's one init script, from the role's data (the task's vars)
        extra = {"initd": "{{ jupyterhub_initd }}", **extra}
    return env.get_template(TEMPLATES[name]).render(context(case, **extra))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_roles_files_are_golden(case: str, name: str, golden) -> None:
    golden.check(f"hub/{case}/{name}", render(case, name))


def test_the_lab_hub_listens_on_the_loopback_and_the_example_everywhere() -> None:
    lab, example = context("lab"), context("example")
    assert (lab["jupyterhub_bind_ip"], lab["jupyterhub_connect_host"]) == ("127.0.0.1", "127.0.0.1")
    assert (example["jupyterhub_bind_ip"], example["jupyterhub_connect_host"]) == ("", "login1")
    assert lab["jupyterhub_tls_names"] == ["localhost", "*.localhost", "labhost.example", "127.0.0.1"]
    assert example["jupyterhub_generated_tls"] is False and lab["jupyterhub_generated_tls"] is True
    assert lab["jupyterhub_cull_every_s"] == 300 and example["jupyterhub_cull_every_s"] == 300


def test_the_role_and_pyhpc_agree_on_paths_and_ports() -> None:
    ctx = context("lab")
    assert Path(ctx["jupyterhub_state_dir"]) == api.STATE_DIR
    assert Path(ctx["jupyterhub_ca_cert"]) == api.CA_FILE
    # (the unit tests' fake_hub points api.WORKSHOP_TOKEN elsewhere: read its definition)
    assert 'WORKSHOP_TOKEN = STATE_DIR / "workshop-token"' in Path(api.__file__).read_text()
    assert "workshop-token" in [s["name"] for s in ctx["jupyterhub_secrets"]]
    config = render("lab", "jupyterhub_config.py")
    hub, proxy = cluster.HUB_API_PORT, cluster.PROXY_API_PORT
    assert (ctx["jupyterhub_api_port"], ctx["jupyterhub_proxy_api_port"]) == (hub, proxy)
    assert f'"http://127.0.0.1:{hub}"' in config and api.LOCAL_API.startswith(f"http://127.0.0.1:{hub}/")
    assert set(cluster.HUB_OWN_PORTS) >= {hub, proxy} and f'"http://127.0.0.1:{proxy}"' in config
    page = cluster.MY_JOBS_PORT
    assert ctx["jupyterhub_my_jobs_port"] == page and f'"url": "http://127.0.0.1:{page}"' in config
    assert page in cluster.HUB_OWN_PORTS
    # Privileged: no user but the hub (CAP_NET_BIND_SERVICE) can bind them while it restarts.
    assert hub < 1024 and proxy < 1024 and page < 1024
    script = render("lab", "init")
    assert "--ambient-caps=-all,+net_bind_service" in script and "--chuid pyhpc-hub" not in script


def test_the_deploys_check_tells_a_stale_hub_from_a_missing_install(tmp_path: Path) -> None:
    """The role's check, run as the role runs it (this interpreter for the hub's): 0 when
    the hub recorded the copy's code, 3 (the hub restarts) when not, 1 (pip installs
    pyhpc) when pyhpc is not imported from the copy."""
    def check(src: Path) -> int:
        argv = context("lab", jupyterhub_src_dir=str(src), jupyterhub_state_dir=str(tmp_path),
                       jupyterhub_prefix="/nonexistent")["jupyterhub_check_argv"]
        assert argv[0] == "/nonexistent/bin/python"
        return subprocess.run([sys.executable, *argv[1:]], check=False, timeout=60).returncode

    package = Path(running.__file__).resolve().parents[2]
    assert check(package) == 3  # no record yet
    running.record(tmp_path)
    assert check(package) == 0
    (tmp_path / running.RECORD).write_text("0" * 64 + "\n")  # what an older hub recorded
    assert check(package) == 3
    assert check(tmp_path / "elsewhere") == 1


def test_no_secret_is_in_the_configuration() -> None:
    config = render("lab", "jupyterhub_config.py")
    assert 'secret("proxy-token")' in config and 'secret("workshop-token")' in config
    assert "cookie_secret_file" in config and "token\": \"" not in config


def test_the_pins_of_the_hub_and_the_servers_are_one() -> None:
    hub = (paths.ROOT / "requirements" / "hub.txt").read_text().splitlines()
    single = (paths.ROOT / "requirements" / "singleuser.txt").read_text()
    assert "-r singleuser.txt" in hub and "jupyterhub==5.5.4" in single
    assert all("==" in line for line in hub + single.splitlines()
               if line.strip() and not line.startswith(("#", "-r")))
    assert "jupyterhub" not in (paths.ROOT / "requirements" / "runtime.txt").read_text()


# -- the sudo rule ------------------------------------------------------------------------

def rules(text: str) -> list[tuple[str, str]]:
    """The rule's commands: (path, the regular expression its arguments must match)."""
    body = text.split("Cmnd_Alias PYHPC_HUB_SLURM =", 1)[1].split("\npyhpc-hub ", 1)[0]
    found = []
    for item in body.replace("\\\n", " ").split(","):
        command, regex = item.split(None, 1)
        found.append((command, regex.strip()))
    return found


def hub_commands(fake_slurm) -> list[list[str]]:
    """Every command the hub runs as a user, built by pyhpc.slurm.as_user itself."""
    fake_slurm.answers[as_user.SUDO] = lambda argv: (
        0, "4242\n" if "sbatch" in argv[4] else "", "")
    as_user.submit("ws-01", "#!/bin/bash\n")
    as_user.find("ws-01", "pyhpc-hub-0123456789abcdef")
    as_user.query("ws-01", "4242")
    as_user.cancel("ws-01", "4242")
    as_user.associations("ws-01")
    as_user.reservations("ws-01")
    return fake_slurm.calls


def allowed(text: str, argv: list[str]) -> bool:
    """sudoers' own rule for a regular expression: the arguments joined by one space,
    matched whole; the command by its full path."""
    import re

    return any(command == argv[0] and re.fullmatch(regex.strip("^$"), " ".join(argv[1:]))
               for command, regex in rules(text))


def test_the_sudo_rule_allows_exactly_the_hubs_commands(fake_slurm) -> None:
    text = render("lab", "sudoers")
    calls = hub_commands(fake_slurm)
    assert sorted(c[4] for c in calls) == sorted(c for c, _ in rules(text)) and len(calls) == 6
    for call in calls:
        assert call[:4] == ["/usr/bin/sudo", "-n", "-u", "ws-01"] and allowed(text, call[4:]), call
    for other in (["/usr/bin/sbatch", "--parsable", "--uid=0"], ["/usr/bin/sbatch"],
                  ["/usr/bin/scancel", "4242", "--user=user2"], ["/usr/bin/scancel", "-u", "user2"],
                  ["/usr/bin/squeue", "-h", "-j", "1", "-o", "%T %B", "-u", "x"],
                  ["/usr/bin/squeue", "-h", "--me", "-o", "%i %k", "-u", "x"],
                  ["/usr/bin/squeue", "-h", "-o", "%i %k"],
                  ["/usr/bin/sacctmgr", "-i", "delete", "user", "x"],
                  ["/usr/bin/scontrol", "update", "NodeName=cpu1", "State=DOWN"],
                  ["/usr/bin/srun", "id"], ["/bin/sh", "-c", "id"]):
        assert not allowed(text, other), other


TIMED_OUT = (1, "", "sbatch: error: Batch job submission failed: Socket timed out on "
                   "send/recv operation\n")
MINE = "pyhpc-hub-0123456789abcdef"


def answering(sbatch: tuple[int, str, str], squeue: list[str]) -> Any:
    """The user's sudo commands: sbatch's one answer, squeue's answers in turn (the last
    again once they run out)."""
    def answer(argv: list[str]) -> tuple[int, str, str]:
        if argv[4].endswith("sbatch"):
            return sbatch
        return 0, squeue.pop(0) if len(squeue) > 1 else squeue[0], ""
    return answer


def test_a_submission_slurmctld_did_not_answer_is_found_by_its_comment(fake_slurm,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(as_user, "FIND_EVERY_S", 0.0)
    # Not in squeue at first (slurmctld has not taken it yet), then there among others.
    fake_slurm.answers[as_user.SUDO] = answering(
        TIMED_OUT, ["", f"4241 \n4243 {MINE}\n4244 pyhpc-hub-ffffffffffffffff\n"])
    with pytest.raises(slurm.AmbiguousSubmit, match="may have accepted the job"):
        as_user.submit("ws-01", "#!/bin/bash\n")
    assert as_user.submitted("ws-01", MINE) == "4243"
    tools = [c[4] for c in fake_slurm.calls]
    assert tools.count("/usr/bin/sbatch") == 1  # never sent twice
    assert tools.count("/usr/bin/squeue") == 2


def test_a_submission_found_nowhere_is_none_after_the_wait(fake_slurm, monkeypatch) -> None:
    monkeypatch.setattr(as_user, "FIND_EVERY_S", 0.0)
    monkeypatch.setattr(as_user, "FIND_WAIT_S", 0.05)
    fake_slurm.answers[as_user.SUDO] = answering(TIMED_OUT, [f"4244 {MINE}x\n"])
    assert as_user.submitted("ws-01", MINE) is None
    # squeue itself unanswered counts as not found, never as an error.
    fake_slurm.answers[as_user.SUDO] = lambda argv: TIMED_OUT
    assert as_user.find("ws-01", MINE) is None


def test_the_sudo_rule_runs_as_no_local_user_and_keeps_no_environment() -> None:
    text = render("lab", "sudoers")
    # prometheus: the account monitoring's exporter package makes after the hub's play, on a
    # fresh host; refused from the first deploy on, so the second changes nothing.
    assert "Runas_Alias PYHPC_HUB_USERS = ALL, !prometheus, !root\n" in text
    assert "env_reset" in text and "SETENV" not in text and "env_keep" not in text
    assert "pyhpc-hub ALL = (PYHPC_HUB_USERS) NOPASSWD: PYHPC_HUB_SLURM" in text


def test_no_account_of_the_hosts_own_files_is_a_sudo_target() -> None:
    """SlurmUser (slurm) may cancel anyone's job: the hub may never act as it, nor as any
    other account of the host's passwd file (read by the role's getent task)."""
    facts = {"fqdn": "login.example.org",
             "getent_passwd": {"root": [], "slurm": [], "munge": [], "pyhpc-hub": []}}
    text = render("example", "sudoers", ansible_facts=facts)
    assert "Runas_Alias PYHPC_HUB_USERS = ALL, !munge, !prometheus, !pyhpc-hub, !root, !slurm\n" in text


def sudo_tool(name: str) -> str:
    """visudo from Debian's sudo, or a sudo build's tool named by $PYHPC_SUDO_BUILD (Debian's
    package ships no testsudoers)."""
    build = os.environ.get("PYHPC_SUDO_BUILD")
    found = (str(Path(build) / "plugins" / "sudoers" / name) if build
             else shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None))
    if not found or not Path(found).exists():
        pytest.skip(f"{name} is not installed (Debian's sudo has visudo; testsudoers comes "
                    "from a build of sudo's source: PYHPC_SUDO_BUILD=DIR)")
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_visudo_accepts_the_sudo_rule(case: str, tmp_path: Path) -> None:
    path = tmp_path / "pyhpc-hub"
    path.write_text(render(case, "sudoers"))
    proc = subprocess.run([sudo_tool("visudo"), "-cf", str(path)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sudos_own_matcher_agrees(tmp_path: Path, fake_slurm) -> None:
    tool = sudo_tool("testsudoers")
    (tmp_path / "passwd").write_text("root:x:0:0::/root:/bin/bash\n"
                                     "pyhpc-hub:x:990:990::/var/lib/pyhpc-hub:/usr/sbin/nologin\n"
                                     "ws-01:x:20001:20001::/home/ws-01:/bin/bash\n")
    (tmp_path / "group").write_text("root:x:0:\npyhpc-hub:x:990:\nws-01:x:20001:\n")
    text = render("lab", "sudoers")

    def verdict(runas: str, argv: list[str]) -> str:
        proc = subprocess.run([tool, "-p", str(tmp_path / "passwd"), "-P", str(tmp_path / "group"),
                               "-u", runas, "pyhpc-hub", *argv], input=text, capture_output=True,
                              text=True, check=False)
        return proc.stdout.strip().splitlines()[-1]

    for call in hub_commands(fake_slurm):
        assert verdict("ws-01", call[4:]) == "Command allowed", call
        assert verdict("root", call[4:]) != "Command allowed", call
    assert verdict("ws-01", ["/usr/bin/scancel", "4242", "--user=root"]) == "Command unmatched"
    assert verdict("ws-01", ["/usr/bin/sbatch", "--parsable", "--wrap=id"]) == "Command unmatched"
