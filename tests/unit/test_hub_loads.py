"""The rendered jupyterhub_config.py loads in JupyterHub itself, and pyhpc's spawner and
authenticator work inside it: the form from faked Slurm, a bad spawn refused before
sbatch, a good one submitted as the user with the golden script, batchspawner's callback
narrowed to a port. Needs jupyterhub and batchspawner (requirements/hub.txt): in the
hub's virtualenv, or any with them; skipped where they are not installed."""
from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("jupyterhub", reason="jupyterhub is not installed here (requirements/hub.txt)")
pytest.importorskip("batchspawner", reason="batchspawner is not installed here "
                    "(requirements/hub.txt)")

from test_hub_form import COMMAND, ENV, SLURM, submitted  # noqa: E402
from test_hub_form import slurm_as as slurm_as  # noqa: E402,F401  (the fixture)
from test_hub_role import TIMED_OUT, render  # noqa: E402

from pyhpc import paths  # noqa: E402
from pyhpc.hub import script  # noqa: E402
from pyhpc.hub.options import HubError  # noqa: E402


@pytest.fixture
def config(tmp_path: Path) -> Path:
    for name in ("cookie-secret", "proxy-token", "workshop-token"):
        (tmp_path / name).write_text("ab" * 32 + "\n")
        (tmp_path / name).chmod(0o600)
    path = tmp_path / "jupyterhub_config.py"
    path.write_text(render("lab", "jupyterhub_config.py", jupyterhub_state_dir=str(tmp_path)))
    return path


@pytest.fixture
def hub(config: Path):
    from jupyterhub.app import JupyterHub

    app = JupyterHub()
    app.load_config_file(str(config))
    return app


def test_the_config_loads_with_pyhpcs_classes_and_no_allow_all(hub) -> None:
    from pyhpc.hub.auth import PyhpcAuthenticator
    from pyhpc.hub.spawner import PyhpcSlurmSpawner

    cfg = hub.config
    assert cfg.JupyterHub.spawner_class is PyhpcSlurmSpawner
    assert cfg.JupyterHub.authenticator_class is PyhpcAuthenticator
    assert cfg.JupyterHub.bind_url == "https://127.0.0.1:8000/"
    assert cfg.Authenticator.allow_all is False and cfg.Authenticator.admin_users == set()
    assert cfg.ConfigurableHTTPProxy.auth_token == "ab" * 32
    services = cfg.JupyterHub.services
    assert [s["name"] for s in services] == ["idle-culler", "pyhpc-workshop", "my-jobs"]
    culler = services[0]["command"]
    assert culler[1:3] == ["-m", "jupyterhub_idle_culler"] and "--timeout=3600" in culler
    # The my-jobs page: every user may open it (the user role), no service gets more.
    page = services[2]["command"]
    assert page[1:4] == ["-P", "-m", "pyhpc.monitor.my_jobs_page"] and "--scrape-interval=5s" in page
    assert {"name": "user", "scopes": ["self", "access:services!service=my-jobs"]} \
        in cfg.JupyterHub.load_roles
    authenticator = PyhpcAuthenticator(config=cfg)
    assert authenticator.service == "pyhpc-hub" and authenticator.open_sessions is False
    assert authenticator.local_users == ["root"]


def test_the_hub_records_the_code_it_runs_as_it_loads(hub, config: Path) -> None:
    """What the deploy's check compares with the copy (pyhpc.hub.running)."""
    from pyhpc.hub import running

    assert not running.stale(config.parent)
    assert (config.parent / running.RECORD).stat().st_mode & 0o777 == 0o600


def test_batchspawners_callback_takes_only_a_port() -> None:
    from jupyterhub.apihandlers import default_handlers

    from pyhpc.hub import spawner

    routes = {entry[0]: entry[1] for entry in default_handlers}
    assert routes[spawner.CALLBACK] is spawner.PortHandler
    assert spawner.port_of({"port": 40123}) == 40123
    for body in ({"port": 22}, {"port": "40123"}, {"port": True},
                 {"port": 40123, "exec_prefix": "sh -c id"}, {"batch_submit_cmd": "id"}, []):
        assert spawner.port_of(body) is None, body


def make_spawner(hub, user: str):
    from jupyterhub.objects import Hub

    from pyhpc.hub.spawner import PyhpcSlurmSpawner

    owner = SimpleNamespace(name=user, escaped_name=user, url=f"/user/{user}/", spawners={},
                            server=None)
    return PyhpcSlurmSpawner(user=owner, hub=Hub(), config=hub.config,
                             cluster_file=str(paths.LAB_CLUSTER))


def test_the_spawner_renders_the_form_from_slurm_as_the_user(hub, slurm_as, golden) -> None:
    spawner = make_spawner(hub, "ws-01")
    golden.check("hub/form-ws-01.html", asyncio.run(spawner.get_options_form()))
    assert spawner.env_keep == []


def test_a_bad_form_is_one_line_and_nothing_is_submitted(hub, slurm_as) -> None:
    spawner = make_spawner(hub, "ws-01")
    with pytest.raises(HubError, match=r"^account: 'lab' is not yours; yours: ws$"):
        asyncio.run(spawner.run_options_from_form({"account": ["lab"], "time": ["01:00:00"]}))
    assert submitted(slurm_as) == []


def test_a_spawn_submits_the_golden_script_as_the_user(hub, slurm_as, monkeypatch,
                                                       golden) -> None:
    spawner = make_spawner(hub, "ws-01")
    options = asyncio.run(spawner.run_options_from_form({"time": ["02:00:00"]}))
    assert options == {"partition": "cpu", "nodes": 1, "gpus_per_node": 0, "time": "02:00:00",
                       "account": "ws", "qos": "ws", "reservation": "ws"}
    spawner.user_options = options
    monkeypatch.setattr(script, "home_of", lambda user: f"/home/{user}")
    monkeypatch.setattr(spawner, "get_env", lambda: dict(ENV))
    import secrets  # the submission's comment, random in the hub, fixed for the golden file

    monkeypatch.setattr(secrets, "token_hex", lambda n: "0123456789abcdef"[:2 * n])
    assert asyncio.run(spawner.submit_batch_script()) == "4242"
    (call,) = submitted(slurm_as)
    assert call == ["/usr/bin/sudo", "-n", "-u", "ws-01", "/usr/bin/sbatch", "--parsable"]
    text = next(s for c, s in zip(slurm_as.calls, slurm_as.stdins, strict=True) if c == call)
    golden.check("hub/server-ws-01.sbatch", text)
    assert f"exec {' '.join(COMMAND)}\n" in text


def test_a_spawn_whose_sbatch_slurmctld_did_not_answer_takes_the_job_it_accepted(
        hub, slurm_as, monkeypatch) -> None:
    from pyhpc.slurm import as_user, slurm

    spawner = make_spawner(hub, "ws-01")
    spawner.user_options = {"time": "02:00:00"}
    monkeypatch.setattr(script, "home_of", lambda user: f"/home/{user}")
    monkeypatch.setattr(spawner, "get_env", lambda: dict(ENV))
    monkeypatch.setattr(as_user, "FIND_EVERY_S", 0.0)
    monkeypatch.setattr(as_user, "FIND_WAIT_S", 0.05)
    answer = slurm_as.answers[as_user.SUDO]
    comments: list[str] = []

    def busy(argv: list[str]) -> tuple[int, str, str]:
        if argv[4].endswith("sbatch"):
            text = slurm_as.stdins[-1]
            comments.append(text.split("#SBATCH --comment=", 1)[1].split("\n", 1)[0])
            return TIMED_OUT
        if argv[5:] == ["-h", "--me", "-o", as_user.FIND_FORMAT]:
            return 0, "".join(f"4250 {c}\n" for c in comments[:1]), ""  # the first only
        return answer(argv)

    slurm_as.answers[as_user.SUDO] = busy
    # slurmctld took the first submission all the same: the job is found by its comment.
    assert asyncio.run(spawner.submit_batch_script()) == "4250" and spawner.job_id == "4250"
    assert len(submitted(slurm_as)) == 1 and comments[0].startswith("pyhpc-hub-")
    # It did not take the second: the spawn fails as sbatch did, nothing is sent again, and
    # the first's job (another comment) is not taken for it.
    with pytest.raises(slurm.AmbiguousSubmit, match="may have accepted the job"):
        asyncio.run(spawner.submit_batch_script())
    assert len(submitted(slurm_as)) == 2 and comments[0] != comments[1]


def test_a_spawn_through_the_api_is_checked_too(hub, slurm_as) -> None:
    spawner = make_spawner(hub, "user2")
    spawner.user_options = {"account": "ws", "reservation": "ws"}
    with pytest.raises(HubError, match=r"^account: 'ws' is not yours; yours: lab, teaching$"):
        asyncio.run(spawner.submit_batch_script())
    assert submitted(slurm_as) == [] and "user2" in SLURM


def test_a_server_that_does_not_prove_itself_is_refused_and_its_job_cancelled(
        hub, monkeypatch) -> None:
    """batchspawner's start reports a port where a squatter answers: the spawn fails in one
    line (shown on the spawn page) and the job is cancelled, before any route is added."""
    from batchspawner import SlurmSpawner
    from test_hub_proof import Answers200, squatter

    from pyhpc.hub.spawner import Refused

    spawner = make_spawner(hub, "ws-01")
    spawner.api_token = "f" * 32
    cancelled: list[bool] = []

    async def cancel() -> None:
        cancelled.append(True)

    monkeypatch.setattr(spawner, "cancel_batch_job", cancel)
    with squatter(Answers200) as port:
        async def started(self, where: tuple[str, int] = ("127.0.0.1", port)) -> tuple[str, int]:
            return where

        monkeypatch.setattr(SlurmSpawner, "start", started)
        with pytest.raises(Refused) as refused:
            asyncio.run(spawner.start())
        message = refused.value.jupyterhub_message
        assert message.startswith(f"ws-01's server at 127.0.0.1:{port} did not prove it is")
        assert "\n" not in message and cancelled == [True]
