"""Property tests: no container spec value can add an instruction, a section or a line.

For any spec built from hostile text (newlines, quotes, ``$()``, backslashes, ``%post``,
heredoc terminators, unicode), either the spec is refused with one ContainerError, or the
rendered Containerfile, Apptainer .def, scripts and env file have exactly the structure
of a benign spec with as many labels and environment entries, and every value reads
back unchanged the way podman, Apptainer, sh and Python read it. A second property skips
the spec check and feeds hostile values straight to the templates (defense in depth).
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import re
import shlex
import subprocess
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pyhpc.containers import spec as containers
from pyhpc.containers.spec import ContainerError, Variant

SETTINGS = settings(max_examples=60, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
SPEC = containers.load_spec()
VARIANTS = ("cpu", "cuda")
DEF_SECTIONS = ["%labels", "%environment", "%files", "%post", "%runscript", "%test"]

HOSTILE = st.sampled_from([
    "\n", "\r", "\r\n", "\t", "\x00", "\x1b[2J", "\u2028", "\u0085", "\u202e", '"', "'", "`id`",
    "$(id)", "${PATH}", "$HOME", "\\", "\\\n", " \\", "%post", "\n%post\n    id\n", "%labels",
    "PY", "\nPY\n", "SOURCES", "\nSOURCES\n", "#", " ", "=", ";", "&&", "|", "\nLD_PRELOAD=/x.so",
    "\nRUN id", "\nLABEL x=y", "é", "日本", "\U0001f600", "{{ venv }}", "{", "}", "%", "--x",
])
#: Broad text: anything at all, and pieces stitched from hostile fragments.
TEXT = st.one_of(st.text(max_size=30),
                 st.lists(st.one_of(HOSTILE, st.text(max_size=4)), max_size=6).map("".join))
#: Printable hostile text: what passes a line-break check and must still be quoted.
PRINTABLE_CHAR = st.one_of(st.characters(categories=["L", "M", "N", "P", "S"]), st.just(" "))
QUOTABLE = st.lists(st.one_of(HOSTILE.filter(str.isprintable), st.text(PRINTABLE_CHAR,
                                                                       max_size=4)),
                    max_size=6).map("".join)
#: Values of the right shape, so that many drawn specs are accepted and rendered.
VERSION = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.+~:_-]{0,12}", fullmatch=True)
NAME = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,12}", fullmatch=True)
ENV_KEY = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
PRINTABLE = st.text(PRINTABLE_CHAR, max_size=40)
#: Mostly printable: most drawn variants then get as far as the templates' quoting.
HOSTILE_VALUE = st.one_of(QUOTABLE, PRINTABLE, QUOTABLE, TEXT)


def either(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(good, TEXT)


@st.composite
def specs(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """The real spec with some fields (top level and one variant's) replaced."""
    spec = copy.deepcopy(SPEC)
    name = draw(st.sampled_from(VARIANTS))
    var = spec["variants"][name]
    base = var["base"]
    fields = {
        "name": (spec, "name", either(NAME)),
        "torch": (spec, "torch", either(VERSION)),
        "venv": (spec, "venv", either(st.sampled_from(["/opt/venv", "/x/y.z", "/a b", "rel"]))),
        "mount_points": (spec, "mount_points", st.lists(either(st.sampled_from(
            ["/scratch", "/x/y.z", "/a b", "rel", "/home"])), min_size=1, max_size=3)),
        "environment": (spec, "environment", st.dictionaries(
            either(ENV_KEY), either(PRINTABLE), max_size=4)),
        "packages": (spec, "packages", st.dictionaries(either(NAME), either(VERSION),
                                                       max_size=4)),
        "description": (var, "description", either(PRINTABLE)),
        "python": (var, "python", either(st.sampled_from(["3.11", "3.12", "3"]))),
        "cuda": (var, "cuda", either(VERSION)),
        "nccl": (var, "nccl", either(VERSION)),
        "image": (base, "image", either(st.sampled_from(
            ["debian:bookworm", "docker.io/library/debian:12", "a/b:c d"]))),
        "base.packages": (base, "packages", st.dictionaries(either(NAME), either(VERSION),
                                                            min_size=1, max_size=3)),
    }
    if "sources" in base:
        fields["sources"] = (base, "sources", st.lists(either(st.sampled_from(
            ["deb http://deb.debian.org/debian bookworm main",
             "deb https://x.org/d stable main contrib"])), min_size=1, max_size=3))
        fields["mirror"] = (base, "mirror", either(st.sampled_from(
            ["http://deb.debian.org/debian", "file:///srv/mirror"])))
    for key in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=4,
                             unique=True)):
        target, field, strategy = fields[key]
        target[field] = draw(strategy)
    return spec, name


def _sh_n(text: str) -> None:
    proc = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def _logical_lines(text: str) -> list[str]:
    """Containerfile instructions: physical lines joined at a trailing backslash."""
    out: list[str] = []
    joined = ""
    for line in text.split("\n"):
        if not joined and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            joined += line[:-1] + "\n"
            continue
        out.append(joined + line)
        joined = ""
    assert not joined, "a continuation runs off the end"
    return out


QUOTED = r'"((?:[^"\\$]|\\["\\$])*)"'


def _pairs(block: str, keyword: str) -> list[tuple[str, str]]:
    """KEY="VALUE" pairs of one LABEL or ENV instruction, unescaped as buildah does."""
    lines = block.split("\n")
    pairs = []
    for i, line in enumerate(lines):
        lead = f"{keyword} " if i == 0 else " " * (len(keyword) + 1)
        match = re.fullmatch(rf"{lead}([^\s=\"]+)={QUOTED} ?", line)
        assert match, f"{keyword} line {line!r} is not KEY=\"VALUE\""
        pairs.append((match.group(1), re.sub(r'\\(["\\$])', r"\1", match.group(2))))
    return pairs


def _sections(text: str) -> list[tuple[str, str]]:
    """Apptainer's split of a .def: a section starts at any line whose first word
    starts with '%'; the header comes first, as ("", text)."""
    parts = re.split(r"^[ \t]*(%\S*)[^\n]*\n", text, flags=re.M)
    return [("", parts[0]), *zip(parts[1::2], parts[2::2], strict=True)]


def check_rendered(var: Variant) -> None:
    """Everything rendered for ``var`` has the benign structure; values read back."""
    benign = containers.variant(var.name)
    labels, env = var.labels(), var.env()
    extra = len(labels) - len(benign.labels()) + len(env) - len(benign.env())

    oci, oci_benign = containers.render(var, "oci"), containers.render(benign, "oci")
    assert oci.count("\n") == oci_benign.count("\n") + extra
    instructions = _logical_lines(oci)
    assert [i.split()[0] for i in instructions] == [
        i.split()[0] for i in _logical_lines(oci_benign)]
    assert instructions[0] == f"FROM {var.base['image']}"
    blocks = {i.split()[0]: i for i in instructions[1:3]}
    assert _pairs(blocks["LABEL"], "LABEL") == labels
    assert _pairs(blocks["ENV"], "ENV") == env
    run = instructions[-3]
    mkdir = ["mkdir", "-p", *var.mount_points]
    assert [shlex.split(line) for line in run.splitlines()
            if line.startswith("    mkdir ")] == [mkdir]
    quotes = sum(shlex.quote(path).count("'") for path in var.mount_points)
    assert run.count("'") == 2 + quotes and f"== {containers.python_literal(var.torch)}, " in run

    text = containers.render(var, "apptainer")
    names = [name for name, _ in _sections(text)]
    assert names == ["", *DEF_SECTIONS]
    sections = dict(_sections(text))
    assert text.count("\n") == containers.render(benign, "apptainer").count("\n") + extra + (
        len(var.base.get("sources", [])) - len(benign.base.get("sources", [])))
    # Apptainer: key up to the first space, the rest trimmed; no unquoting.
    def_labels = [line.strip().partition(" ") for line in sections["%labels"].splitlines()
                  if line.strip()]
    assert [(k, v.strip()) for k, _, v in def_labels] == [(k, v.strip()) for k, v in labels]
    exports = [shlex.split(line) for line in sections["%environment"].splitlines()
               if line.strip()]
    assert exports == [["export", f"{k}={v}"] for k, v in env]
    _sh_n(sections["%environment"] + sections["%post"])
    assert [shlex.split(line) for line in sections["%post"].splitlines()
            if line.strip().startswith("mkdir ")] == [mkdir]

    script = containers.render_script(var, "pyhpc-selftest")
    benign_script = containers.render_script(benign, "pyhpc-selftest")
    assert script.count("\n") == benign_script.count("\n")
    head, rest = script.split("<<'PY'\n")
    python, tail = rest.split("\nPY\n")
    assert tail == "" and "\nPY\n" not in python
    tree = ast.parse(python)
    expected = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                    and getattr(node.targets[0], "id", "") == "EXPECTED")
    assert ast.literal_eval(expected) == {"torch": var.torch, "python": var.python,
                                          "cuda": var.cuda}
    assert f'print("image:", {containers.python_literal(var.image)})' in python
    _sh_n(script)
    entry = containers.render_script(var, "pyhpc-entrypoint")
    assert entry.count("\n") == containers.render_script(benign, "pyhpc-entrypoint").count("\n")
    _sh_n(entry)

    env_lines = containers.env_file(var).splitlines()
    assert [tuple(line.split("=", 1)) for line in env_lines] == env


@SETTINGS
@given(specs())
def test_any_spec_is_refused_or_renders_with_the_benign_structure(
        drawn: tuple[dict[str, Any], str]) -> None:
    spec, name = drawn
    try:
        var = containers.variant(name, spec=spec)
    except ContainerError as exc:
        event("refused")
        message = str(exc)
        assert "\n" not in message and "\r" not in message and message.isprintable()
        assert re.match(r"[A-Za-z0-9_.\[\]]+: ", message), message
        return
    event("accepted")
    check_rendered(var)


@SETTINGS
@given(st.sampled_from(VARIANTS), st.fixed_dictionaries({}, optional={
    key: HOSTILE_VALUE for key in ("description", "image", "torch", "python", "cuda",
                                   "nccl")} | {
    "environment": st.dictionaries(ENV_KEY, HOSTILE_VALUE, max_size=3),
    "mount_points": st.lists(HOSTILE_VALUE, min_size=1, max_size=3).map(tuple)}))
def test_templates_quote_what_the_spec_check_would_refuse(name: str,
                                                          values: dict[str, Any]) -> None:
    """Skip the spec check: hostile values reach the templates, which refuse a line break
    or control character and quote every other character for where it lands."""
    var = dataclasses.replace(containers.variant(name), **values)
    try:
        check_rendered(var)
        event("rendered")
    except ContainerError as exc:
        event("refused by the templates")
        assert str(exc).startswith(("render: ", "environment")), exc
        assert any(not str(v).isprintable() for v in [*values.values(),
                                                      *values.get("environment", {}).values(),
                                                      *values.get("mount_points", ())])


@pytest.mark.parametrize("name", VARIANTS)
def test_the_real_spec_has_the_benign_structure(name: str) -> None:
    check_rendered(containers.variant(name))
