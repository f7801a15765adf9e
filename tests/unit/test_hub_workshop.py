"""Workshops and the doctor with a hub: the participant's home with the notebooks, the hub's
URL on the sheet, the hub forgetting the participants at delete (or saying it could not),
and the doctor's hub check (against a FakeHub: tests/unit/conftest.py)."""
from __future__ import annotations

import stat
from dataclasses import replace
from pathlib import Path

import pytest
from test_workshop import state as state  # noqa: F401  (the fixture)

from pyhpc import cluster
from pyhpc.admin import doctor, homes, workshop
from pyhpc.hub import api


@pytest.fixture
def hub_lab(lab) -> cluster.Cluster:
    return replace(lab, jupyterhub=cluster.JupyterHub())


def test_a_home_is_made_private_from_skel_with_the_notebooks(tmp_path: Path, fake_hub) -> None:
    skel = tmp_path / "skel"
    skel.mkdir()
    (skel / ".bashrc").write_text("# skel\n")
    (skel / ".bashrc").chmod(0o644)
    (skel / ".profile-link").symlink_to("/etc/passwd")
    books = tmp_path / "books"
    books.mkdir()
    (books / "01-a.ipynb").write_text("{}")
    home = homes.make("ws-01", 20001, 20001, homes.notebooks(books), skel)
    assert home == homes.ROOT / "ws-01"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / ".bashrc").stat().st_mode) == 0o600
    assert (home / "workshop" / "01-a.ipynb").read_text() == "{}"
    assert (home / ".profile-link").is_symlink()
    owners = {Path(p).name: (uid, gid) for p, uid, gid in fake_hub.chowned}
    assert owners == dict.fromkeys([".bashrc", ".profile-link", "workshop", "01-a.ipynb",
                                    "ws-01"], (20001, 20001))
    assert fake_hub.chowned[-1][0] == str(home)  # handed over last
    assert homes.make("ws-01", 20001, 20001, [], skel) is None  # an existing home stays


def test_the_shipped_notebooks_are_the_workshops() -> None:
    assert [p.name for p in homes.notebooks()][:1] == ["01-hello-cluster.ipynb"]


def test_create_makes_homes_and_puts_the_hubs_url_on_the_sheet(state, hub_lab, tmp_path,  # noqa: F811
                                                                fake_ldap) -> None:
    done = workshop.create(workshop.plan("dl", "2", "now", "2", "1", hub_lab), hub_lab,
                           tmp_path / "sheet")
    assert done["hub_url"] == "https://localhost:8000/"
    assert done["homes_made"] == [str(homes.ROOT / "dl-01"), str(homes.ROOT / "dl-02")]
    assert (homes.ROOT / "dl-01" / "workshop" / "01-hello-cluster.ipynb").is_file()
    page = (tmp_path / "sheet" / "dl.txt").read_text()
    assert "  notebooks: https://localhost:8000/  (the same user and password" in page
    assert ",https://localhost:8000/,dl," in (tmp_path / "sheet" / "dl.csv").read_text()


def test_delete_makes_the_hub_forget_only_the_participants(state, hub_lab, tmp_path,  # noqa: F811
                                                           fake_ldap, fake_hub) -> None:
    workshop.create(workshop.plan("dl", "2", "now", "2", "1", hub_lab), hub_lab, tmp_path / "s")
    fake_hub.users = {"dl-01", "user1"}
    done = workshop.delete("dl", hub_lab)
    assert done["hub_users_deleted"] == ["dl-01"] and fake_hub.users == {"user1"}
    deletes = [c for c in fake_hub.calls if c[0] == "DELETE"]
    assert [c[1] for c in deletes] == [f"{api.LOCAL_API}/users/dl-01",
                                       f"{api.LOCAL_API}/users/dl-02"]
    assert all(c[2] == "token test-token" for c in deletes)


def test_a_hub_that_does_not_answer_does_not_stop_a_delete(state, hub_lab, tmp_path,  # noqa: F811
                                                           fake_ldap, fake_hub) -> None:
    workshop.create(workshop.plan("dl", "1", "now", "2", "1", hub_lab), hub_lab, tmp_path / "s")
    fake_hub.up = False
    done = workshop.delete("dl", hub_lab)
    assert done["users_deleted"] == ["dl-01"] and done["changed"]
    assert done["hub_unreachable"].startswith("jupyterhub: http://127.0.0.1:881/hub/api does "
                                              "not answer")


def test_a_cluster_without_a_hub_asks_no_hub(state, lab, tmp_path, fake_ldap,  # noqa: F811
                                             fake_hub) -> None:
    lab = replace(lab, jupyterhub=None)
    done = workshop.create(workshop.plan("dl", "1", "now", "2", "1", lab), lab, tmp_path / "s")
    assert "hub_url" not in done and "notebooks:" not in (tmp_path / "s" / "dl.txt").read_text()
    workshop.delete("dl", lab)
    assert fake_hub.calls == []


def test_the_doctor_checks_the_hub_over_tls_with_the_generated_ca(fake_hub, hub_lab) -> None:
    check = doctor.Doctor(the_cluster=hub_lab).hub()
    assert check == doctor.Check("hub", True, "https://localhost:8000/: JupyterHub 5.5.4")
    assert fake_hub.calls == [("GET", "https://localhost:8000/hub/api", None, api.CA_FILE)]
    fake_hub.up = False
    assert doctor.Doctor(the_cluster=hub_lab).hub().ok is False
    own = replace(hub_lab, jupyterhub=cluster.JupyterHub(hostname="hub.example.org", port=8443,
                                                         tls_cert="/c", tls_key="/k"))
    assert api.url(own) == "https://hub.example.org:8443/" and api.ca_file(own) is None


def test_forget_needs_root_on_the_hubs_host(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(api, "WORKSHOP_TOKEN", tmp_path / "none")
    with pytest.raises(api.HubError, match=r"^jupyterhub: cannot read the hub's workshop token"):
        api.forget(["dl-01"])
