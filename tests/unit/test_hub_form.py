"""The hub's Python side against faked Slurm output (pyhpc.slurm.slurm.RUNNER): the
definition's jupyterhub section, the form's choices and HTML, the checks of a spawn (a bad
value is one line and nothing is submitted), the server's batch script (golden) and the
allow rule."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from pyhpc import cluster, paths
from pyhpc.hub import choices, form, options, script
from pyhpc.hub.choices import Choices
from pyhpc.hub.options import HubError, ServerRequest
from pyhpc.slurm import as_user

HEAD = ("Cluster|Account|User|Partition|Share|Priority|GrpJobs|GrpTRES|GrpSubmit|GrpWall|"
        "GrpTRESMins|MaxJobs|MaxTRES|MaxTRESPerNode|MaxSubmit|MaxWall|MaxTRESMins|QOS|Def QOS|"
        "GrpTRESRunMins")


def assoc(account: str, user: str = "", partition: str = "", qos: str = "normal",
          default_qos: str = "") -> str:
    row = dict.fromkeys(HEAD.split("|"), "")
    row.update({"Cluster": "lab", "Account": account, "User": user, "Partition": partition,
                "Share": "1", "QOS": qos, "Def QOS": default_qos})
    return "|".join(row.values())


def reservation(name: str, users: str = "(null)", accounts: str = "(null)",
                partition: str = "cpu", state: str = "ACTIVE") -> str:
    return (f"ReservationName={name} StartTime=2026-03-02T09:00:00 EndTime=2026-03-02T11:00:00 "
            f"Duration=02:00:00 Nodes=cpu1 NodeCnt=1 CoreCnt=2 Features=(null) "
            f"PartitionName={partition} Flags=SPEC_NODES TRES=cpu=2 Users={users} Groups=(null) "
            f"Accounts={accounts} Licenses=(null) State={state} BurstBuffer=(null) Watts=n/a "
            f"MaxStartDelay=(null)")


#: What Slurm shows each user (PrivateData: their own associations, the reservations they
#: may use; user2's view also lists a row of another user's, which must be dropped).
SLURM: dict[str, dict[str, str]] = {
    "ws-01": {"sacctmgr": "\n".join([HEAD, assoc("ws"), assoc("ws", "ws-01", qos="ws",
                                                                 default_qos="ws")]) + "\n",
              "scontrol": reservation("ws", accounts="ws") + "\n"
              + reservation("other", users="user9", accounts="elsewhere") + "\n"},
    "user2": {"sacctmgr": "\n".join([HEAD, assoc("lab", "user2"),
                                     assoc("teaching", "user2", qos="normal,teaching"),
                                     assoc("lab", "user1")]) + "\n",
              "scontrol": "No reservations in the system\n"},
    "nobody1": {"sacctmgr": HEAD + "\n", "scontrol": "No reservations in the system\n"},
}


@pytest.fixture
def slurm_as(fake_slurm):
    """Slurm's answers to the hub's sudo -u USER commands; sbatch answers job 4242."""
    def answer(argv: list[str]) -> tuple[int, str, str]:
        assert argv[:3] == [as_user.SUDO, "-n", "-u"], argv
        user, tool = argv[3], argv[4].rsplit("/", 1)[1]
        if tool == "sbatch":
            return 0, "4242\n", ""
        if user not in SLURM:
            return 1, "", f"sudo: unknown user {user}"
        return 0, SLURM[user].get(tool, ""), ""
    fake_slurm.answers[as_user.SUDO] = answer
    return fake_slurm


def submitted(fake) -> list[list[str]]:
    return [c for c in fake.calls if c[4:5] == ["/usr/bin/sbatch"]]


# -- the definition -----------------------------------------------------------------------

def lab_with(**hub: Any) -> cluster.Cluster:
    data = yaml.safe_load(paths.LAB_CLUSTER.read_text())
    data["jupyterhub"] = hub
    return cluster.parse(data, 24 * 1024)


def test_an_empty_jupyterhub_section_is_a_hub_on_port_8000_culling_after_an_hour() -> None:
    assert lab_with().jupyterhub == cluster.JupyterHub(True, 8000, 60, None, None, None)


@pytest.mark.parametrize("hub, message", [
    ({"port": 6819}, "jupyterhub.port: 6819 is taken by slurmdbd"),
    ({"port": 17002}, "jupyterhub.port: 17002 is taken by the lab's slurmd of cpu2"),
    ({"port": 80}, "jupyterhub.port: must be an integer from 1024 to 65535, got 80"),
    ({"idle_timeout_min": 0}, "jupyterhub.idle_timeout_min: must be an integer from 1 to 10080"),
    ({"tls_cert": "/etc/ssl/hub.pem"}, "jupyterhub.tls_key: required with jupyterhub.tls_cert"),
    ({"tls_cert": "relative.pem", "tls_key": "/k"}, "jupyterhub.tls_cert: 'relative.pem' is not"),
    ({"hostname": "hub example"}, "jupyterhub.hostname: 'hub example' is not allowed"),
    ({"admins": ["x"]}, "jupyterhub.admins: unknown key; allowed: enabled, hostname"),
])
def test_a_bad_jupyterhub_section_is_refused_with_one_line(hub, message) -> None:
    with pytest.raises(cluster.ConfigError) as err:
        lab_with(**hub)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_hub_needs_the_directory_and_accounting() -> None:
    data = yaml.safe_load(paths.LAB_CLUSTER.read_text())
    data["jupyterhub"] = {}
    with pytest.raises(cluster.ConfigError, match=r"^jupyterhub.enabled: the hub needs a directory"):
        cluster.parse({**data, "directory": None}, 24 * 1024)
    with pytest.raises(cluster.ConfigError, match=r"^jupyterhub.enabled: the hub needs accounting"):
        cluster.parse({**data, "accounting": False}, 24 * 1024)
    assert cluster.parse({**data, "directory": None, "jupyterhub": {"enabled": False}},
                         24 * 1024).jupyterhub.enabled is False  # type: ignore[union-attr]


# -- choices and the form -----------------------------------------------------------------

def test_a_participant_sees_their_workshop_account_qos_and_reservation_only(slurm_as) -> None:
    found = choices.read("ws-01")
    assert found.accounts == ["ws"] and found.qos_of("ws") == ["ws"]
    assert [r.name for r in found.reservations] == ["ws"]
    assert slurm_as.calls == [
        ["/usr/bin/sudo", "-n", "-u", "ws-01", "/usr/bin/sacctmgr", "-P", "show", "associations"],
        ["/usr/bin/sudo", "-n", "-u", "ws-01", "/usr/bin/scontrol", "-o", "show", "reservation"]]


def test_another_users_rows_are_dropped_even_where_slurm_shows_them(slurm_as) -> None:
    found = choices.read("user2")
    assert found.accounts == ["lab", "teaching"] and found.reservations == ()
    assert found.qos_of("teaching") == ["normal", "teaching"]


def test_the_form_preselects_the_workshops_reservation_account_and_qos(slurm_as, lab) -> None:
    assert form.preselected(choices.read("ws-01"), lab) == {
        "reservation": "ws", "account": "ws", "qos": "ws", "partition": "cpu", "nodes": "1",
        "gpus_per_node": "0", "time": "01:00:00"}


def test_the_form_is_golden(slurm_as, lab, golden) -> None:
    golden.check("hub/form-ws-01.html", form.render(choices.read("ws-01"), lab, 60))
    html = form.render(choices.read("user2"), lab, 60)
    assert '<option value="lab" selected>lab</option>' in html
    assert 'name="reservation"' in html and 'value="ws"' not in html


def test_the_form_escapes_what_slurm_says(lab) -> None:
    found = Choices("u", (as_user.Association("a<b>"),), ())
    assert "a&lt;b&gt;" in form.render(found, lab, 5) and "a<b>" not in form.render(found, lab, 5)


# -- the checks of a spawn ----------------------------------------------------------------

def good() -> dict[str, Any]:
    return {"reservation": "ws", "account": "ws", "qos": "ws", "partition": "cpu", "nodes": "1",
            "gpus_per_node": "0", "time": "02:00:00"}


def test_a_good_request_is_checked_into_sbatch_values(slurm_as, lab) -> None:
    assert options.check(good(), choices.read("ws-01"), lab) == ServerRequest(
        "cpu", 1, 0, "02:00:00", "ws", "ws", "ws")


@pytest.mark.parametrize("change, message", [
    ({"account": "lab"}, "account: 'lab' is not yours; yours: ws"),
    ({"qos": "normal"}, "qos: 'normal' is not one of account ws's; allowed: ws"),
    ({"reservation": "other"}, "reservation: 'other' does not admit you; yours: ws"),
    ({"partition": "gpu"}, "reservation: ws holds nodes of partition cpu; choose that partition"),
    ({"partition": "nope"}, "partition: unknown partition 'nope'; allowed: cpu, gpu"),
    ({"nodes": "3"}, "nodes: partition 'cpu' has 2 nodes, 3 requested"),
    ({"nodes": "1; rm -rf ~"}, "nodes: must be an integer from 1 to 4096"),
    ({"gpus_per_node": "1"}, "gpus_per_node: partition 'cpu' has 0 GPUs per node, 1 requested"),
    ({"time": "2-00:00:00"}, "time: 2-00:00:00 is longer than partition 'cpu' allows"),
    ({"time": "soon"}, "time: 'soon' is not a Slurm time limit"),
    ({"account": "ws\n#SBATCH --uid=0"}, "account: 'ws\\n#SBATCH --uid=0' is not yours"),
    ({"reservation": "x" * 65}, "reservation: 'xxxxxxxx"),
    ({"mem": "1G"}, "'mem': not an option of the hub"),
])
def test_a_bad_request_is_one_line_and_nothing_is_submitted(slurm_as, lab, change, message) -> None:
    with pytest.raises(options.PyhpcError) as err:
        options.check({**good(), **change}, choices.read("ws-01"), lab)
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
    assert submitted(slurm_as) == []


def test_an_account_bound_to_a_partition_is_refused_elsewhere(lab) -> None:
    found = Choices("ws-01", (as_user.Association("ws", "cpu"),), ())
    request = {**good(), "reservation": "", "qos": "", "partition": "gpu"}
    with pytest.raises(HubError, match=r"^account: ws is yours on partition cpu only, not gpu$"):
        options.check(request, found, lab)


@pytest.mark.parametrize("formdata, message", [
    ({"nodes": ["1", "2"]}, "nodes: give exactly one value"),
    ({"password": ["x"]}, "'password': not a field of the form"),
])
def test_form_fields_come_one_value_each(formdata, message) -> None:
    with pytest.raises(HubError, match=f"^{message}"):
        options.from_form(formdata)
    assert options.from_form({"nodes": ["2"], "_xsrf": ["t"], "time": "01:00:00"}) == {
        "nodes": "2", "time": "01:00:00"}


# -- the server's batch script ------------------------------------------------------------

ENV = {"JUPYTERHUB_API_TOKEN": "0123456789abcdef", "JPY_API_TOKEN": "0123456789abcdef",
       "JUPYTERHUB_API_URL": "http://127.0.0.1:881/hub/api", "JUPYTERHUB_USER": "ws-01",
       "JUPYTERHUB_OAUTH_SCOPES": '["access:servers!server=ws-01/"]',
       "JUPYTERHUB_SERVICE_PREFIX": "/user/ws-01/",
       "JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:0/user/ws-01/",
       "PATH": "/opt/pyhpc/hub/bin:/usr/bin", "HOME": "/var/lib/pyhpc-hub", "SHELL": "/bin/bash"}
#: As the spawner builds it (test_hub_loads renders the same golden file through it).
COMMAND = ["/opt/pyhpc/venv/bin/batchspawner-singleuser", "/opt/pyhpc/venv/bin/jupyterhub-singleuser",
           "--ServerApp.port_retries=0",
           "--ServerApp.jpserver_extensions=jupyterhub.singleuser.extension=True",
           "--ServerApp.jpserver_extensions=pyhpc.hub.proof=True"]


def render(request: ServerRequest, lab: cluster.Cluster, env: dict[str, str] = ENV) -> str:
    return script.script(request, lab, "ws-01", "/home/ws-01", env, COMMAND, "/opt/pyhpc/venv",
                         "pyhpc-hub-0123456789abcdef")  # the spawner's comment, one per submission


def test_the_servers_batch_script_is_golden(lab, golden) -> None:
    text = render(ServerRequest("cpu", 1, 0, "02:00:00", "ws", "ws", "ws"), lab)
    golden.check("hub/server-ws-01.sbatch", text)
    assert "/opt/pyhpc/hub" not in text and "HOME=" not in text  # nothing else of the hub's
    assert render(ServerRequest("cpu", 1, 0, "02:00:00", "ws", "ws", "ws"), lab) == text


def test_a_server_without_qos_or_reservation_names_neither(lab) -> None:
    text = render(ServerRequest("gpu", 2, 2, "01:00:00", "lab"), lab)
    assert "#SBATCH --gpus-per-node=2" in text and "#SBATCH --nodes=2" in text
    assert "--qos" not in text and "--reservation" not in text and "SBATCH_RESERVATION" not in text


def test_a_value_with_a_newline_never_reaches_the_script(lab) -> None:
    with pytest.raises(HubError, match=r"^environment: JUPYTERHUB_USER has a value a script"):
        render(ServerRequest("cpu", 1, 0, "01:00:00", "lab"), lab,
               {**ENV, "JUPYTERHUB_USER": "ws-01\nrm -rf ~"})


def test_a_server_needs_an_existing_home(monkeypatch, tmp_path) -> None:
    import pwd

    entry = pwd.struct_passwd(("ws-09", "x", 20009, 20009, "", str(tmp_path / "ws-09"), "/bin/bash"))
    monkeypatch.setattr(pwd, "getpwnam", lambda name: entry)
    with pytest.raises(HubError, match=r"^home: .*ws-09 does not exist yet; log in once with ssh"):
        script.home_of("ws-09")
    (tmp_path / "ws-09").mkdir()
    assert script.home_of("ws-09") == str(tmp_path / "ws-09")


# -- the allow rule -----------------------------------------------------------------------

def test_only_users_with_an_association_may_log_in(slurm_as) -> None:
    assert choices.may_log_in("ws-01", ["root"]) and choices.may_log_in("user2", ["root"])
    assert not choices.may_log_in("nobody1", ["root"])  # in the directory, no association
    calls = len(slurm_as.calls)
    assert not choices.may_log_in("root", ["root"])  # local: never asks Slurm
    assert not choices.may_log_in("Root; id", ["root"])
    assert len(slurm_as.calls) == calls


def test_a_slurm_that_does_not_answer_refuses_a_login_but_keeps_one(fake_slurm) -> None:
    fake_slurm.answers[as_user.SUDO] = (1, "", "sacctmgr: error: Problem talking to the database")
    assert not choices.may_log_in("ws-01", ["root"])
    assert choices.may_log_in("ws-01", ["root"], unknown=True)


def test_reservations_admitting_by_exclusion_are_not_offered() -> None:
    line = reservation("open", users="-bob")
    fields = dict(part.split("=", 1) for part in line.split())
    assert choices.admitted(fields, "ws-01", ["ws"]) is None
    assert choices.admitted({**fields, "Users": "ws-01"}, "ws-01", ["ws"]) is not None


def test_a_changed_lab_partition_changes_the_forms_choices(lab) -> None:
    longer = replace(lab, partitions=tuple(replace(p, max_time="UNLIMITED") for p in lab.partitions))
    assert form.times(longer)[-1] == "08:00:00"
    shorter = replace(lab, partitions=tuple(replace(p, max_time="00:45:00") for p in lab.partitions))
    assert form.times(shorter) == ["00:30:00"]
