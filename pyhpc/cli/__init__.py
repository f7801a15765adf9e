"""The ``pyhpc`` command: :mod:`~pyhpc.cli.main` dispatches, and each command group is one
module of parsers, each command one call into the domain below."""
