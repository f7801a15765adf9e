"""The control node's Ansible collections (requirements/collections.yml and .py): the list
is what the deploy names, the virtualenv holds exactly those, and the unpacking from a real
zip (a wheel of our own making) puts only what is listed, checks versions, and stays inside
its directory."""
from __future__ import annotations

import json
import re
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from pyhpc import paths
from requirements import install_collections as col

#: The collections a name like NS.NAME.PLUGIN can come from (ansible-core's own excepted).
FQCN = re.compile(r"\b((?:ansible|community)\.[a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*")
#: In Python, only names in a string (a callback or module name), not import paths.
QUOTED = re.compile(r"[\"',]((?:ansible|community)\.[a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*")
CORE = {"ansible.builtin", "ansible.legacy"}


def named() -> set[str]:
    """Every collection the deploy's YAML, templates, Ansible config and Python name."""
    found: set[str] = set()
    for path in (paths.ROOT / "ansible").rglob("*"):
        if path.suffix in {".yml", ".yaml", ".j2", ".cfg"} and path.is_file():
            found |= set(FQCN.findall(path.read_text()))
    for top in ("benchmarks", "tests", "hostlab", "pyhpc"):
        for path in (paths.ROOT / top).rglob("*.py"):
            found |= set(QUOTED.findall(path.read_text()))
    return found - CORE


def test_the_list_is_every_collection_the_deploy_and_its_tests_name() -> None:
    _, wanted = col.load()
    assert named() == set(wanted)


def test_the_virtualenv_holds_exactly_the_listed_collections_at_their_versions() -> None:
    _, wanted = col.load()
    site = Path(sysconfig.get_paths()["purelib"])
    present = {f"{ns.name}.{name.name}" for ns in (site / col.TOP).iterdir() if ns.is_dir()
               and not ns.name.startswith(("_", ".")) for name in ns.iterdir() if name.is_dir()}
    assert present == set(wanted), "make venv puts the listed ones; an old venv's bundle is uninstalled"
    assert {fqcn: col.installed(site, fqcn) for fqcn in wanted} == wanted


def test_deploy_txt_pins_the_ansible_core_the_bundle_pins() -> None:
    bundle, _ = col.load()
    pins = dict(re.findall(r"^([a-z-]+)==(\S+)", (col.SPEC.parent / "deploy.txt").read_text(), re.M))
    assert "ansible" not in pins, "the bundle's ~100 collections: only collections.yml's are installed"
    from importlib import metadata
    assert metadata.version("ansible-core") == pins["ansible-core"]
    assert bundle["name"] == "ansible"


def manifest(version: str) -> str:
    return json.dumps({"collection_info": {"version": version}})


def wheel(where: Path, files: dict[str, str]) -> Path:
    path = where / "ansible-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as out:
        for name, text in files.items():
            out.writestr(name, text)
    return path


BUNDLE = {"ansible_collections/a/b/MANIFEST.json": manifest("1.2.3"),
          "ansible_collections/a/b/plugins/modules/m.py": "print('b')\n",
          "ansible_collections/a/c/MANIFEST.json": manifest("9.9.9"),
          "ansible_collections/ansible_release.py": "x = 1\n"}


def test_only_the_listed_collection_is_put_and_a_second_run_puts_nothing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    whl = wheel(tmp_path, BUNDLE)
    assert col.unpack(whl, site, {"a.b": "1.2.3"}) == ["a.b"]
    assert sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()) == [
        "ansible_collections/a/b/MANIFEST.json", "ansible_collections/a/b/plugins/modules/m.py"]
    assert col.unpack(whl, site, {"a.b": "1.2.3"}) == []


def test_another_version_there_is_replaced_whole(tmp_path: Path) -> None:
    site = tmp_path / "site"
    old = site / "ansible_collections/a/b"
    old.mkdir(parents=True)
    (old / "MANIFEST.json").write_text(manifest("1.0.0"))
    (old / "gone.py").write_text("")
    beside = site / "ansible_collections/a/other"
    beside.mkdir()
    assert col.unpack(wheel(tmp_path, BUNDLE), site, {"a.b": "1.2.3"}) == ["a.b"]
    assert col.installed(site, "a.b") == "1.2.3" and not (old / "gone.py").exists()
    assert beside.is_dir() and sorted(p.name for p in old.parent.iterdir()) == ["b", "other"]


def test_a_version_the_bundle_does_not_hold_is_refused_and_nothing_is_put(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    with pytest.raises(col.Refused, match=r"collections\.a\.b: .* holds 1\.2\.3, not 2\.0\.0"):
        col.unpack(wheel(tmp_path, BUNDLE), site, {"a.b": "2.0.0"})
    with pytest.raises(col.Refused, match=r"collections\.x\.y: not in"):
        col.unpack(wheel(tmp_path, BUNDLE), site, {"x.y": "1.0.0"})
    assert [p for p in site.rglob("*") if p.is_file()] == []


def test_a_member_that_climbs_out_is_refused(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    evil = dict(BUNDLE, **{"ansible_collections/a/b/../../../../escaped.py": "x"})
    with pytest.raises(col.Refused, match="leaves ansible_collections/a/b/"):
        col.unpack(wheel(tmp_path, evil), site, {"a.b": "1.2.3"})
    assert not (tmp_path / "escaped.py").exists() and [p for p in site.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize(("change", "key"), [
    ({"bundle": {"name": "ansible", "version": "12.3.0"}}, "bundle: must have exactly"),
    ({"bundle": {"name": "ansible", "version": "latest", "sha256": "0" * 64}}, "bundle.version"),
    ({"bundle": {"name": "ansible", "version": "12.3.0", "sha256": "abc"}}, "bundle.sha256"),
    ({"collections": {"Community.Crypto": "3.0.5"}}, "collections: 'Community.Crypto'"),
    ({"collections": {"community.crypto": 3.0}}, "collections.community.crypto: an exact version"),
    ({"collections": {}}, "collections: a mapping"),
])
def test_a_wrong_file_is_one_line_naming_the_key(tmp_path: Path, change: dict[str, object], key: str) -> None:
    data = yaml.safe_load(col.SPEC.read_text()) | change
    path = tmp_path / "collections.yml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(col.Refused) as raised:
        col.load(path)
    assert key in str(raised.value) and "\n" not in str(raised.value)


def test_the_deploy_collection_and_every_role_require_the_pinned_ansible_core_series() -> None:
    """pyhpc.deploy subclasses ansible-core's actions and private hooks: it declares the
    one minor series it was tested on, the one requirements/deploy.txt pins, and every role
    (each calls its actions) says the same minimum."""
    pin = re.search(r"^ansible-core==(\d+)\.(\d+)\.\d+$",
                    (paths.ROOT / "requirements" / "deploy.txt").read_text(), re.M)
    assert pin is not None
    major, minor = int(pin[1]), int(pin[2])
    runtime = yaml.safe_load((paths.ROOT / "ansible" / "collections" / "ansible_collections" /
                              "pyhpc" / "deploy" / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"] == f">={major}.{minor}.0,<{major}.{minor + 1}"
    roles = sorted((paths.ROOT / "ansible" / "roles").glob("*/meta/main.yml"))
    assert roles
    for meta in roles:
        info = yaml.safe_load(meta.read_text())["galaxy_info"]
        assert info["min_ansible_version"] == f"{major}.{minor}", meta
