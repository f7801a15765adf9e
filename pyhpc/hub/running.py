"""Which pyhpc code the running hub runs, so that a deploy that changes it restarts the hub.

The hub imports pyhpc (its spawner and authenticator) when it starts, from the copy of the
repository (/opt/pyhpc/src); a deploy that changes that code does not reach a running hub
by itself. The hub's configuration calls :func:`record` as it loads: a digest of every
module of the package, as they are then, goes into the hub's state directory. The
deploy's check (the role's ``jupyterhub_check_argv``) calls :func:`stale`: the modules on
disk now against that record. A difference, or no record (a hub started before this, or
never), restarts the hub; users' servers keep running across it (``cleanup_servers`` is
off). A digest, not a time: no clock of another host (the shared copy's) is compared.
Standard library only.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from pyhpc import files

#: The record in the hub's state directory: the hub's user's, 0600.
RECORD = "code-digest"
#: The package whose modules the digest covers: pyhpc, wherever it is imported from.
PACKAGE = Path(__file__).resolve().parent.parent
#: A record is one hex SHA-256 and a newline; anything longer is not one.
LIMIT = 128


def digest(package: Path = PACKAGE) -> str:
    """SHA-256 over every module of ``package``: each one's path, length and content, in
    path order (a module renamed, added or removed changes it too)."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        data = path.read_bytes()
        h.update(f"{path.relative_to(package).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def record(state_dir: str | Path, package: Path = PACKAGE) -> None:
    """The hub, as it starts: the digest of the code it runs, in its state directory."""
    files.write_text(Path(state_dir) / RECORD, digest(package) + "\n", arg=RECORD, mode=0o600)


def stale(state_dir: str | Path, package: Path = PACKAGE) -> bool:
    """The modules on disk are not the ones the running hub recorded, or it recorded none.
    Only a regular file is read (a link or FIFO there counts as no record)."""
    fh, _ = files.try_open_regular(Path(state_dir) / RECORD)
    if fh is None:
        return True
    with fh:
        data = fh.read(LIMIT + 1)
    return len(data) > LIMIT or data.decode(errors="replace").strip() != digest(package)
