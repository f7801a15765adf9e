"""The one family of expected failures: bad input, a refused request, a cluster that says no.

Every error the CLI expects is a :class:`PyhpcError`. Its message starts with the key or
argument it is about (``nodes: must be ...``), and ``arg`` carries that name, so the
command line can print one line and exit 2 for all of them alike.
"""
from __future__ import annotations

#: Longest value an error message repeats; longer ones are cut (hostile input can be huge).
ECHO_LIMIT = 60


class PyhpcError(Exception):
    """An expected failure; ``str(exc)`` is ``"<arg>: <what is wrong and what is allowed>"``."""

    def __init__(self, message: str, arg: str | None = None) -> None:
        super().__init__(message)
        self.arg = arg if arg is not None else message.split(":", 1)[0]


def echo(value: object) -> str:
    """``repr(value)``, cut to :data:`ECHO_LIMIT` characters, for error messages."""
    text = repr(value)
    if len(text) <= ECHO_LIMIT:
        return text
    return f"{text[:ECHO_LIMIT]}... ({len(text)} characters)"
