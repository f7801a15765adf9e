"""hostlab's connection: containers.podman's podman connection, with pipelining.

The collection's plugin runs every module in three or four podman commands (mount the
container, make a temporary directory, mark the module executable, run it) and says that
pipelining does not work: its ``podman exec`` has no ``--interactive``, so a module sent on
standard input never arrives. This one passes ``--interactive`` when there is input, so a
module runs in one ``podman exec``, and mounts the container only when a file is copied in
or out. Everything else (the options, ``podman cp`` when no mount is possible) is the
collection's.
"""
from __future__ import annotations

import shlex

from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ConnectionBase, ensure_connect
from ansible_collections.containers.podman.plugins.connection.podman import Connection as Podman

DOCUMENTATION = """
    name: pyhpc_podman
    short_description: Run modules in a podman container, pipelined (hostlab's hosts)
    description:
      - containers.podman.podman with pipelining and the container mounted only for file copies.
    author: pyhpc
    options:
      remote_addr:
        description: The container's name or id.
        default: inventory_hostname
        vars:
          - name: inventory_hostname
          - name: ansible_host
          - name: ansible_podman_host
      remote_user:
        description: The user in the container (default the image's, root).
        vars:
          - name: ansible_user
      podman_executable:
        description: The podman program.
        default: podman
        vars:
          - name: ansible_podman_executable
      podman_extra_args:
        description: Arguments given to every podman command (hostlab's own storage and network).
        default: ''
        vars:
          - name: ansible_podman_extra_args
    extends_documentation_fragment:
      - connection_pipelining
"""


class Connection(Podman):
    # transport stays the collection's: ansible.posix.synchronize knows podman by it and
    # copies with `podman exec -i` (the options below keep their names for it).
    has_pipelining = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._mount_tried = False

    def _connect(self) -> Connection:
        # No `podman mount` per task: _mount() does it on the first file copy.
        ConnectionBase._connect(self)
        self._connected = True
        return self

    def _mount(self) -> None:
        if not self._mount_tried:
            self._mount_tried = True
            super()._connect()  # the collection's: mounts, or leaves podman cp to be used

    @ensure_connect
    def exec_command(self, cmd: str, in_data: bytes | None = None,
                     sudoable: bool = False) -> tuple[int, bytes, bytes]:
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        args = ["exec", "--interactive"] if in_data is not None else ["exec"]
        if self.user:
            args += ["--user", self.user]
        rc, out, err = self._podman(args, shlex.split(to_native(cmd, errors="surrogate_or_strict")),
                                    in_data)
        return rc, out, err

    def put_file(self, in_path: str, out_path: str) -> None:
        self._mount()
        super().put_file(in_path, out_path)

    def fetch_file(self, in_path: str, out_path: str) -> None:
        self._mount()
        super().fetch_file(in_path, out_path)
