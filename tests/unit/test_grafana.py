"""Grafana: pyhpc's dashboards (ansible/roles/monitoring/files/grafana/*.json), the files the
monitoring role provisions them with, and its check of the package on the control node.
Grafana itself is not run here: Debian ships none and this machine reaches only Debian's,
PyPI's and npm's registries (the lab test asks the real Prometheus each panel's query:
tests/integration/test_grafana_dashboards.py)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from roleplay import extra, results, run_playbook
from test_monitoring_role import ROLE, Roles, definition

from tests.share import PROMTOOL_SKIP

DASHBOARDS = sorted((ROLE / "files" / "grafana").glob("*.json"))
LAB_GROUPS = {g: ["localhost"] for g in ("controller", "login", "compute")}
DEB = "/srv/debs/grafana_11.3.0_amd64.deb"
#: Grafana's own variables a query may name besides the dashboard's.
BUILTIN = {"__rate_interval", "__interval", "__range"}
PLAYBOOK = """\
- name: Check the Grafana package as validate.yml does
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Check the Grafana package
      ansible.builtin.include_role:
        name: monitoring
        tasks_from: grafana-preflight
"""


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def grafana_lab(**grafana: Any) -> Roles:
    return Roles(LAB_GROUPS, definition("lab", grafana=grafana or {"deb": DEB}),
                 {"localhost": "192.0.2.7"}, sysv=True)


def test_there_are_the_cluster_job_and_user_dashboards() -> None:
    assert [p.name for p in DASHBOARDS] == ["pyhpc-cluster.json", "pyhpc-job.json",
                                            "pyhpc-user.json"]
    assert [load(p)["uid"] for p in DASHBOARDS] == [p.stem for p in DASHBOARDS]
    names = {p.stem: [v["name"] for v in load(p)["templating"]["list"]] for p in DASHBOARDS}
    assert names == {"pyhpc-cluster": ["cluster"], "pyhpc-job": ["cluster", "jobid"],
                     "pyhpc-user": ["cluster", "user"]}


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_every_panel_has_queries_on_the_provisioned_datasource(path: Path) -> None:
    data = load(path)
    uid = grafana_lab().ask({"host": "localhost", "expr": "monitoring_grafana_datasource_uid"})[0]
    provisioned = yaml.safe_load(grafana_lab()["localhost"].render(
        "etc/grafana/provisioning/datasources/pyhpc.yaml.j2"))["datasources"]
    assert [d["uid"] for d in provisioned] == [uid]
    ids = [panel["id"] for panel in data["panels"]]
    assert len(ids) == len(set(ids)) and data["panels"]
    named = {v["name"] for v in data["templating"]["list"]} | BUILTIN
    for panel in data["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == uid, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid and target["expr"].strip(), panel["title"]
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= named, (panel["title"], used - named)
            # Every figure is of one cluster: Prometheus gives every target its label.
            assert 'cluster="$cluster"' in target["expr"], panel["title"]
    for variable in data["templating"]["list"]:
        assert variable["datasource"]["uid"] == uid, variable["name"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason=PROMTOOL_SKIP)
def test_every_query_is_promql_that_promtool_accepts(tmp_path: Path) -> None:
    """Each expression, its variables replaced as Grafana does, as a recording rule."""
    values = {"cluster": "lab", "jobid": "1", "user": "user1", "__rate_interval": "1m",
              "__interval": "15s", "__range": "1h"}
    rules = []
    for path in DASHBOARDS:
        for panel in load(path)["panels"]:
            for target in panel["targets"]:
                expr = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], target["expr"])
                rules.append({"record": f"pyhpc:panel_{len(rules)}", "expr": expr})
    (tmp_path / "panels.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels",
                                                                     "rules": rules}]}))
    proc = subprocess.run(["promtool", "check", "rules", str(tmp_path / "panels.yml")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(rules) >= 20


def test_the_datasource_is_prometheus_over_tls_as_grafana_with_no_secret_in_it() -> None:
    text = grafana_lab()["localhost"].render("etc/grafana/provisioning/datasources/pyhpc.yaml.j2")
    (source,) = yaml.safe_load(text)["datasources"]
    assert source["url"] == "https://127.0.0.1:9090" and source["type"] == "prometheus"
    assert source["basicAuth"] and source["basicAuthUser"] == "grafana"
    assert source["jsonData"]["tlsAuthWithCACert"] is True
    assert source["secureJsonData"] == {
        "basicAuthPassword": "$__file{/etc/grafana/pyhpc-prometheus.password}",
        "tlsCACert": "$__file{/etc/pyhpc/monitoring/ca.crt}"}


def test_grafana_listens_on_the_cluster_address_only_and_phones_nowhere() -> None:
    ini = grafana_lab(deb=DEB, port=3001)["localhost"].render("etc/grafana/grafana.ini.j2")
    assert "http_addr = 127.0.0.1\n" in ini and "http_port = 3001\n" in ini
    assert "admin_password = $__file{/etc/grafana/pyhpc-admin.password}\n" in ini
    for line in ("allow_sign_up = false", "reporting_enabled = false",
                 "check_for_updates = false"):
        assert line + "\n" in ini
    hosts = Roles({"controller": ["ctl"], "login": ["login"], "compute": ["cpu1"]},
                  definition("example", listen="10.0.0.0/16", grafana={"deb": DEB}),
                  {"ctl": "10.0.0.1", "login": "10.0.0.2", "cpu1": "10.0.0.3"})
    assert "http_addr = 10.0.0.1\n" in hosts["ctl"].render("etc/grafana/grafana.ini.j2")


def test_a_prometheus_user_for_grafana_only_where_the_definition_asks() -> None:
    off = Roles(LAB_GROUPS, definition("lab"), {"localhost": "192.0.2.7"}, sysv=True)
    names = "monitoring_web_users | map(attribute='name') | list"
    # (the lab runs a hub: its my-jobs page's user, tests/unit/test_my_jobs.py)
    assert off["localhost"].get(names) == ["admin", "prometheus", "record", "hub"]
    assert grafana_lab()["localhost"].get(names) == ["admin", "prometheus", "record", "grafana",
                                                     "hub"]


def test_the_dashboards_provider_reads_the_copied_files_only() -> None:
    text = grafana_lab()["localhost"].render("etc/grafana/provisioning/dashboards/pyhpc.yaml.j2")
    (provider,) = yaml.safe_load(text)["providers"]
    assert provider["options"]["path"] == "/etc/grafana/pyhpc-dashboards"
    assert provider["disableDeletion"] and not provider["allowUiUpdates"]


def fake_deb(root: Path, package: str) -> Path:
    """A .deb of ``package`` that holds nothing, made by dpkg-deb."""
    tree = root / package
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 11.3.0\nArchitecture: amd64\n"
        "Maintainer: pyhpc tests <root@localhost>\nDescription: a test package\n")
    deb = root / f"{package}_11.3.0_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
                   check=True, capture_output=True)
    return deb


def preflight(tmp_path: Path, **grafana: Any) -> tuple[int, dict[str, dict[str, Any]]]:
    playbook, inventory = tmp_path / "play.yml", tmp_path / "hosts"
    playbook.write_text(PLAYBOOK)
    inventory.write_text("localhost ansible_connection=local"
                         " ansible_python_interpreter=/usr/bin/python3\n")
    cluster = {"name": "lab", "monitoring": {"grafana": {
        "deb": None, "apt_repo": None, "apt_key": None, "package": "grafana", "port": 3000,
        **grafana}}}
    proc, report = run_playbook(inventory, playbook, *extra(monitoring_cluster=cluster))
    return proc.returncode, results(report)


def test_a_grafana_deb_passes_the_control_nodes_check(tmp_path: Path) -> None:
    for package in ("grafana", "grafana-enterprise"):
        code, ran = preflight(tmp_path, deb=str(fake_deb(tmp_path, package)))
        assert code == 0 and ran["Stop on a Grafana package that is not Grafana"].get("skipped")


def test_a_package_that_is_not_grafana_stops_in_one_line(tmp_path: Path) -> None:
    deb = fake_deb(tmp_path, "prometheus")
    code, ran = preflight(tmp_path, deb=str(deb))
    message = ran["Stop on a Grafana package that is not Grafana"]["msg"]
    assert code == 2 and message == (f'monitoring.grafana.deb: {deb} is the package "prometheus", '
                                     "not Grafana (grafana or grafana-enterprise)")


def test_a_missing_or_broken_deb_stops_in_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "grafana_11.3.0_amd64.deb"
    broken.write_text("not an archive\n")
    for deb in (tmp_path / "gone" / "grafana_1_amd64.deb", broken):
        code, ran = preflight(tmp_path, deb=str(deb))
        message = ran["Stop on a Grafana package that is not Grafana"]["msg"]
        assert code == 2 and "\n" not in message, message
        assert message.startswith(f"monitoring.grafana.deb: {deb} is not a .deb dpkg-deb reads "
                                  "on the control node: dpkg-deb"), message


def test_a_missing_keyring_stops_in_one_line(tmp_path: Path) -> None:
    code, ran = preflight(tmp_path, apt_key=str(tmp_path / "grafana.gpg"),
                          apt_repo="deb [signed-by=/etc/apt/keyrings/grafana.gpg] "
                                   "https://apt.grafana.com stable main")
    assert code == 2 and ran["Stop on a Grafana keyring missing from the control node"]["msg"] == (
        f"monitoring.grafana.apt_key: {tmp_path / 'grafana.gpg'} is not a file on the control "
        "node (the keyring copied to the apt line's signed-by path)")


def test_the_repositorys_keyring_goes_to_its_lines_signed_by_path() -> None:
    line = ("deb [arch=amd64 signed-by=/etc/apt/keyrings/grafana.gpg] https://apt.grafana.com "
            "stable main")
    repo = grafana_lab(apt_repo=line, apt_key="/srv/keys/grafana.gpg")
    assert repo["localhost"].get("monitoring_grafana_keyring") == "/etc/apt/keyrings/grafana.gpg"
    assert grafana_lab()["localhost"].get("monitoring_grafana_keyring") == ""


def test_grafana_gets_the_password_of_its_own_web_user() -> None:
    """grafana.yml's pick from tls.yml's read of the secrets (one result per file)."""
    names = grafana_lab()["localhost"].get("monitoring_web_users | map(attribute='name') | list")
    files = ["monitoring-ca.crt", "monitoring.crt", "monitoring.key",
             *[f"prometheus-{n}.password" for n in names]]
    read = {"results": [{"item": f, "content": f"{f}\n".encode().hex()} for f in files]}
    lab = Roles(LAB_GROUPS, definition("lab", grafana={"deb": DEB}), {"localhost": "192.0.2.7"},
                sysv=True, monitoring_server_files=read)
    task = yaml.safe_load((ROLE / "tasks" / "grafana.yml").read_text())
    content = next(t for t in task if t["name"].startswith("Give Grafana"))[
        "pyhpc.deploy.copy"]["content"]
    expr = content.strip().removeprefix("{{").removesuffix("}}").replace("| b64decode", "")
    assert bytes.fromhex(lab["localhost"].get(expr).strip()) == b"prometheus-grafana.password\n"
