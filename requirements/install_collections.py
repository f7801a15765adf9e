"""Install the Ansible collections of requirements/collections.yml, and only those, into
this Python's site-packages, from the `ansible` bundle's wheel on PyPI.

    .venv/bin/python -I requirements/install_collections.py   # `make venv-deploy` runs it

pip downloads the wheel into a temporary directory (``--require-hashes``: its sha256 is
pinned), and each listed collection is unpacked from it (``ansible_collections/NS/NAME/``)
into a directory beside its place, checked (its MANIFEST.json must give the pinned
version) and renamed into place. A collection already there at its version is left as it
is; one at another version is replaced; nothing else in site-packages is touched. When
every one is in place it downloads nothing. A wrong file, or a bundle without a collection
at its version, exits 2 with one line.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

import yaml

SPEC = Path(__file__).resolve().parent / "collections.yml"
TOP = "ansible_collections"
FQCN = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")
VERSION = re.compile(r"^\d+(\.\d+){1,3}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Refused(Exception):
    """A one-line reason, naming the file and key."""


def load(path: Path = SPEC) -> tuple[dict[str, str], dict[str, str]]:
    """The bundle (name, version, sha256) and the collections (FQCN: version) of path."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise Refused(f"{path.name}: cannot be read ({err.__class__.__name__})") from None
    bundle = data.get("bundle") if isinstance(data, dict) else None
    wanted = data.get("collections") if isinstance(data, dict) else None
    if not isinstance(bundle, dict) or set(bundle) != {"name", "version", "sha256"}:
        raise Refused(f"{path.name}: bundle: must have exactly name, version and sha256")
    bundle = {key: str(value) for key, value in bundle.items()}
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", bundle["name"]):
        raise Refused(f"{path.name}: bundle.name: a distribution name (lower case), not {bundle['name']!r}")
    if not VERSION.match(bundle["version"]):
        raise Refused(f"{path.name}: bundle.version: an exact version like 12.3.0, not {bundle['version']!r}")
    if not SHA256.match(bundle["sha256"]):
        raise Refused(f"{path.name}: bundle.sha256: 64 lower-case hex digits")
    if not isinstance(wanted, dict) or not wanted:
        raise Refused(f"{path.name}: collections: a mapping of NAMESPACE.NAME to an exact version")
    for fqcn, version in wanted.items():
        if not isinstance(fqcn, str) or not FQCN.match(fqcn):
            raise Refused(f"{path.name}: collections: {fqcn!r} is not NAMESPACE.NAME (lower case)")
        if not isinstance(version, str) or not VERSION.match(version):
            raise Refused(f"{path.name}: collections.{fqcn}: an exact version string like 2.1.0 "
                          f"(quote one YAML reads as a number), not {version!r}")
    return bundle, dict(wanted)


def installed(site: Path, fqcn: str) -> str | None:
    """The version of fqcn under site (its MANIFEST.json), or None."""
    manifest = site.joinpath(TOP, *fqcn.split("."), "MANIFEST.json")
    try:
        version = json.loads(manifest.read_text())["collection_info"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return version if isinstance(version, str) else None


def members(wheel: zipfile.ZipFile, fqcn: str) -> list[zipfile.ZipInfo]:
    """The wheel's files of fqcn; Refused on a name that would land outside its directory."""
    prefix = f"{TOP}/{fqcn.replace('.', '/')}/"
    found = [info for info in wheel.infolist() if info.filename.startswith(prefix) and not info.is_dir()]
    for info in found:
        parts = PurePosixPath(info.filename).parts
        if ".." in parts or "\\" in info.filename or info.filename.startswith("/"):
            raise Refused(f"{wheel.filename}: {info.filename!r} leaves {prefix}")
    return found


def unpack(wheel_path: Path, site: Path, wanted: dict[str, str]) -> list[str]:
    """Put each wanted collection not already at its version under site; those it put."""
    put = []
    with zipfile.ZipFile(wheel_path) as wheel:
        for fqcn, version in wanted.items():
            if installed(site, fqcn) == version:
                continue
            files = members(wheel, fqcn)
            if not files:
                raise Refused(f"{SPEC.name}: collections.{fqcn}: not in {wheel_path.name}")
            target = site.joinpath(TOP, *fqcn.split("."))
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
                for info in files:
                    wheel.extract(info, tmp)
                staged = Path(tmp).joinpath(TOP, *fqcn.split("."))
                got = installed(Path(tmp), fqcn)
                if got != version:
                    raise Refused(f"{SPEC.name}: collections.{fqcn}: {wheel_path.name} holds {got}, "
                                  f"not {version}")
                if target.exists():
                    shutil.rmtree(target)
                staged.rename(target)
            put.append(fqcn)
    return put


def download(bundle: dict[str, str], into: Path) -> Path:
    """The bundle's wheel, downloaded by pip into `into`, its hash checked."""
    pins = into / "bundle.txt"
    pins.write_text(f"{bundle['name']}=={bundle['version']} --hash=sha256:{bundle['sha256']}\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                           "--only-binary", ":all:", "--require-hashes", "-r", str(pins), "-d", str(into)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise Refused(f"{SPEC.name}: bundle: pip could not download {bundle['name']}=={bundle['version']} "
                      "with that sha256 (its output above)")
    wheels = sorted(into.glob(f"{bundle['name']}-{bundle['version']}-*.whl"))
    if len(wheels) != 1:
        raise Refused(f"{SPEC.name}: bundle: pip left {len(wheels)} wheels of {bundle['name']}")
    return wheels[0]


def main() -> int:
    site = Path(sysconfig.get_paths()["purelib"])
    try:
        bundle, wanted = load()
        if all(installed(site, fqcn) == version for fqcn, version in wanted.items()):
            return 0
        with tempfile.TemporaryDirectory() as tmp:
            for fqcn in unpack(download(bundle, Path(tmp)), site, wanted):
                print(f"collections: {fqcn} {wanted[fqcn]} from {bundle['name']}=={bundle['version']}")
    except Refused as err:
        print(f"collections: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
