"""The one validator for names, numbers, time limits and job arrays that reach a config
or a command line.

Names are matched whole (``fullmatch``) against an explicit character set with a length
limit, so ``"cpu\\n"`` or ``"--uid=0"`` never passes; numbers have bounds; the messages
name the key and what is allowed, and never repeat more than a short piece of the value.
The cluster definition, the job spec, the templates' variables and the container spec
all check their values here.
"""
from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from typing import Any

from pyhpc.errors import PyhpcError, echo


@dataclass(frozen=True)
class Kind:
    """A kind of name: its characters, its length limit, and the rule in words."""

    pattern: re.Pattern[str]
    max_len: int
    rule: str


KINDS: dict[str, Kind] = {
    # Cluster, node, partition, account, GRES type: Slurm config and host names.
    "slurm": Kind(re.compile(r"[a-z][a-z0-9_-]*"), 31,
                  "lower-case letters, digits, '-' and '_', starting with a letter"),
    "user": Kind(re.compile(r"[a-z_][a-z0-9_-]*"), 32,
                 "lower-case letters, digits, '-' and '_', starting with a letter or '_'"),
    "job": Kind(re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*"), 64,
                "letters, digits, '.', '_', '+' and '-', starting with a letter or digit"),
    "job_id": Kind(re.compile(r"[0-9]+(_[0-9]+)?"), 24,
                   "a Slurm job id: digits, or ARRAYID_TASK (e.g. 4242 or 4242_7)"),
    "image": Kind(re.compile(r"[a-z0-9][a-z0-9._-]*"), 64,
                  "lower-case letters, digits, '.', '_' and '-', starting with a letter or digit"),
    "env": Kind(re.compile(r"[A-Za-z_][A-Za-z0-9_]*"), 64,
                "letters, digits and '_', not starting with a digit"),
    "module": Kind(re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"), 200,
                   "a dotted Python module name"),
    "path": Kind(re.compile(r"[A-Za-z0-9._+@/%][A-Za-z0-9._+@/%=,-]*"), 1024,
                 "letters, digits and '._+@/%=,-', not starting with '-'"),
    "abspath": Kind(re.compile(r"/[A-Za-z0-9._+@/%=,-]*"), 1024,
                    "an absolute path of letters, digits and '._+@/%=,-'"),
    "host": Kind(re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?"), 253,
                 "a host name: letters, digits, '.' and '-'"),
    # Container image reference: [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST].
    "imageref": Kind(re.compile(r"[a-z0-9][a-z0-9._-]*(?::[0-9]{1,5})?(?:/[a-z0-9][a-z0-9._-]*)*"
                                r"(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(?:@sha256:[0-9a-f]{64})?"),
                     255, "an image reference [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST] "
                          "of lower-case names"),
    # An LDAP distinguished name of plain attribute=value parts (dc=lab,dc=pyhpc).
    "dn": Kind(re.compile(r"[a-zA-Z]+=[A-Za-z0-9._ -]+(?:,[a-zA-Z]+=[A-Za-z0-9._ -]+)*"), 512,
               "an LDAP DN of attribute=value parts (letters, digits, '._ -'), comma-separated"),
    # One LDAP server: ldap:// or ldaps:// with a host and an optional port.
    "ldap_uri": Kind(re.compile(r"ldaps?://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?/?"),
                     260, "an ldaps:// or ldap:// URI with a host name and an optional port"),
    # http(s) URL with a host, or a file:/// URL; no credentials, query or fragment.
    "url": Kind(re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%/+:@=,-]*)?"
                           r"|file:///[A-Za-z0-9._~%/+:@=,-]*"), 1024,
                "an http://, https:// or file:/// URL of letters, digits and '._~%/+:@=,-'"),
}


#: Words Slurm gives a meaning of their own in a field, compared case-insensitively
#: (``xstrcasecmp``), as read in Slurm's parsers (src/common/read_config.c,
#: src/slurmctld/read_config.c, src/common/node_conf.c, src/interfaces/gres.c,
#: src/common/slurmdb_defs.c, src/sacctmgr/account_functions.c). Per field: word -> why.
RESERVED: dict[str, dict[str, str]] = {
    # NodeName=DEFAULT sets the defaults of later lines (no node); NodeName=ALL is fatal;
    # Nodes=ALL in a partition or reservation means every node. (A lone node called
    # localhost answering every lookup, node_conf.c, is a single-host setup Slurm supports.)
    "node": {"default": "NodeName=DEFAULT sets defaults, it is no node",
             "all": "Nodes=ALL means every node (NodeName=ALL stops slurmctld)"},
    # PartitionName=DEFAULT sets the defaults of later partitions.
    "partition": {"default": "PartitionName=DEFAULT sets defaults, it is no partition"},
    # The root of every cluster's association tree (sacctmgr refuses to delete it).
    "account": {"root": "the root of Slurm's association tree"},
    # Clusters=all (sacct -M all, sacctmgr, sreport) means every cluster of the database.
    "cluster": {"all": "-M all and Clusters=all mean every cluster"},
    # Gres=gpu:no_consume:N marks the GRES as not consumed, it is no type.
    "gres_type": {"no_consume": "Gres=gpu:no_consume:N makes the GPUs unconsumable"},
}


def not_reserved(where: str, value: object, field: str,
                 error: type[PyhpcError] = PyhpcError) -> None:
    """Refuse a word Slurm reserves in ``field`` (a key of :data:`RESERVED`), in any case."""
    words = RESERVED[field]
    if isinstance(value, str) and value.casefold() in words:
        raise error(f"{where}: {echo(value)} is a word Slurm reserves in {field} names "
                    f"({words[value.casefold()]}); reserved, in any case: "
                    f"{', '.join(sorted(words))}", where)


def slurm_name(where: str, value: object, field: str,
               error: type[PyhpcError] = PyhpcError) -> str:
    """A Slurm name for ``field`` (node, partition, account, cluster, gres_type): not a
    word Slurm reserves there, in any case, and of the ``slurm`` kind."""
    not_reserved(where, value, field, error)
    return name(where, value, "slurm", error)


def name(where: str, value: object, kind: str = "slurm",
         error: type[PyhpcError] = PyhpcError) -> str:
    """``value`` if it is a valid name of ``kind``, else ``error`` naming ``where``."""
    spec = KINDS[kind]
    if (not isinstance(value, str) or len(value) > spec.max_len
            or not spec.pattern.fullmatch(value)):
        raise error(f"{where}: {echo(value)} is not allowed; use {spec.rule}, "
                    f"at most {spec.max_len} characters", where)
    return value


INT_RE = re.compile(r"-?[0-9]{1,19}")


def integer(where: str, value: object, low: int, high: int,
            error: type[PyhpcError] = PyhpcError, text: bool = True) -> int:
    """An integer in ``[low, high]``. ``text=True`` also takes its decimal string
    (command-line and ``--set`` values); YAML values must already be integers."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif text and isinstance(value, str) and INT_RE.fullmatch(value.strip()):
        number = int(value.strip())
    if number is None or not low <= number <= high:
        raise error(f"{where}: must be an integer from {low} to {high}, got {echo(value)}", where)
    return number


def number(where: str, value: object, low: float, high: float,
           error: type[PyhpcError] = PyhpcError) -> float:
    """A finite number in ``[low, high]`` (from a number or its decimal string)."""
    result: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value)
    elif isinstance(value, str) and len(value) <= 40:
        try:
            result = float(value)
        except ValueError:
            result = None
    if result is None or not math.isfinite(result) or not low <= result <= high:
        raise error(f"{where}: must be a number from {low:g} to {high:g}, got {echo(value)}",
                    where)
    return result


#: Largest magnitude of a number read back from a file pyhpc wrote (JSON): far beyond any
#: byte count, rate or timestamp it records, far below where float arithmetic overflows.
FILE_NUMBER_MAX = 1e15


class _Refused(ValueError):
    """A number :func:`read_json` does not take."""


def _file_int(text: str) -> int:
    if len(text.lstrip("-")) > 16 or abs(int(text)) > FILE_NUMBER_MAX:
        raise _Refused(f"the integer {echo(text)} is beyond +-{FILE_NUMBER_MAX:.0e}")
    return int(text)


def _file_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or abs(value) > FILE_NUMBER_MAX:
        raise _Refused(f"the number {echo(text)} is beyond +-{FILE_NUMBER_MAX:.0e}")
    if value != 0 and abs(value) < sys.float_info.min:
        raise _Refused(f"the number {echo(text)} is denormal (below {sys.float_info.min:.1e})")
    return value


def _file_constant(text: str) -> float:
    raise _Refused(f"{text} is not a number pyhpc reads")


def read_json(where: str, text: str | bytes, error: type[PyhpcError] = PyhpcError) -> Any:
    """A JSON document read back from a file: every number finite, not denormal, at most
    :data:`FILE_NUMBER_MAX` in magnitude (no NaN, no Infinity, no thousand-digit
    integers); anything else is ``error`` naming ``where`` (the file, or file:line)."""
    try:
        return json.loads(text, parse_int=_file_int, parse_float=_file_float,
                          parse_constant=_file_constant)
    except _Refused as exc:
        raise error(f"{where}: {exc}", where) from None
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})", where) from None
    except RecursionError:
        raise error(f"{where}: not valid JSON (nested too deeply)", where) from None
    except ValueError:  # bytes that are not UTF-8 (or -16, -32) text
        raise error(f"{where}: not valid JSON (not UTF-8 text)", where) from None


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, for files :func:`read_json`
    reads back (a diverged loss is unknown, null, not NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


TIME_RE = re.compile(r"(?:(?P<d>[0-9]{1,4})-(?P<dh>[0-9]{1,2})(?::(?P<dm>[0-9]{2}))?"
                     r"(?::(?P<ds>[0-9]{2}))?|(?P<a>[0-9]{1,7})(?::(?P<b>[0-9]{2}))?"
                     r"(?::(?P<c>[0-9]{2}))?)")
#: A time limit longer than this is a typo (Slurm itself takes far more).
MAX_TIME_S = 366 * 86400


def time_limit(where: str, value: object, error: type[PyhpcError] = PyhpcError,
               unlimited: bool = False) -> int | None:
    """Seconds of a Slurm time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``);
    ``None`` for ``UNLIMITED`` where ``unlimited`` allows it."""
    text = value if isinstance(value, str) else None
    if unlimited and text == "UNLIMITED":
        return None
    match = TIME_RE.fullmatch(text) if text is not None else None
    seconds = -1
    if match:
        g = {k: int(v) if v else 0 for k, v in match.groupdict().items()}
        if match.group("d") is not None:
            seconds = g["d"] * 86400 + g["dh"] * 3600 + g["dm"] * 60 + g["ds"]
        elif match.group("c") is not None:  # HH:MM:SS
            seconds = g["a"] * 3600 + g["b"] * 60 + g["c"]
        else:  # MM or MM:SS
            seconds = g["a"] * 60 + g["b"]
    if not 0 < seconds <= MAX_TIME_S:
        allowed = "UNLIMITED or " if unlimited else ""
        raise error(f"{where}: {echo(value)} is not a Slurm time limit; use {allowed}MM, "
                    "HH:MM:SS or D-HH:MM:SS, up to 366 days", where)
    return seconds


#: Slurm job arrays (``sbatch --array``): task ids, items and running limit allowed.
ARRAY_MAX_ID = 1_000_000
ARRAY_MAX_ITEMS = 64
ARRAY_MAX_LIMIT = 100_000
ARRAY_MAX_LEN = 1024
ARRAY_ITEM_RE = re.compile(r"([0-9]{1,7})(?:-([0-9]{1,7})(?::([0-9]{1,7}))?)?")
ARRAY_RULE = (f"use comma-separated N, N-M or N-M:S (task ids 0 to {ARRAY_MAX_ID}, N <= M, "
              f"step >= 1), at most {ARRAY_MAX_ITEMS} items, optionally ending in %L "
              f"(at most L tasks at once, 1 to {ARRAY_MAX_LIMIT}), e.g. 0-999%50")


def _array_problem(value: str) -> str | None:
    """Why ``value`` is not a Slurm job array expression, or None if it is one."""
    items, sep, limit = value.partition("%")
    if sep and not (re.fullmatch(r"[0-9]{1,6}", limit) and 1 <= int(limit) <= ARRAY_MAX_LIMIT):
        return f"running limit {echo(sep + limit)} is not 1 to {ARRAY_MAX_LIMIT}"
    parts = items.split(",")
    if len(parts) > ARRAY_MAX_ITEMS:
        return f"{len(parts)} items"
    for part in parts:
        match = ARRAY_ITEM_RE.fullmatch(part)
        if not match:
            return f"item {echo(part)} is not N, N-M or N-M:S"
        first, last, step = match.groups()
        if int(last or first) > ARRAY_MAX_ID:
            return f"task id {int(last or first)} is above {ARRAY_MAX_ID}"
        if int(last or first) < int(first):
            return f"range {part} goes down"
        if step is not None and int(step) < 1:
            return f"step {step} is below 1"
    return None


def array_spec(where: str, value: object, error: type[PyhpcError] = PyhpcError) -> str:
    """``value`` if it is a Slurm job array expression (``0-999%50``, ``1,3,10-20:2``),
    else ``error`` naming ``where``, the reason and the rule."""
    text = value if isinstance(value, str) and 0 < len(value) <= ARRAY_MAX_LEN else None
    problem = (_array_problem(text) if text is not None
               else f"not a string of 1 to {ARRAY_MAX_LEN} characters")
    if text is None or problem is not None:
        raise error(f"{where}: {echo(value)} is not a job array ({problem}); {ARRAY_RULE}",
                    where)
    return text
