"""The docs hold together: the site builds with `mkdocs build --strict`, every relative
link and #anchor in README.md and docs/**/*.md resolves, and every `pyhpc …` command they
show names a subcommand and flags the real parser has (and parses whole where it is a
concrete example)."""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import markdown
import pytest

from pyhpc.cli.main import build_parser
from pyhpc.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
INLINE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: Code blocks whose lines are shell commands (an untyped block too: `$ pyhpc …` examples).
SHELL = {"", "sh", "bash", "shell", "console", "text"}
#: A placeholder the reader fills in: FILE, JOB, DIR, N, ISO-TIME, FILE.png, <job>, k=v's k.
PLACEHOLDER = re.compile(r"^(?:<[^>]+>|[A-Z][A-Z0-9_-]*(?:\.[a-z]+)?)$")
ELLIPSIS = {"…", "..."}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@dataclass(frozen=True)
class Text:
    """A page split into prose (code blocks blanked, so links in code do not count) and
    the lines of its shell code blocks."""
    prose: str
    shell: list[str]


def split(page: Path) -> Text:
    prose, shell, fence, lang = [], [], None, ""
    for line in page.read_text().splitlines():
        opened = FENCE.match(line)
        if fence is None and opened:
            fence, lang = opened.group(1), opened.group(2).lower()
            prose.append("")
        elif fence is not None and line.strip().startswith(fence):
            fence = None
            prose.append("")
        elif fence is not None:
            if lang in SHELL:
                shell.append(line)
            prose.append("")
        else:
            prose.append(line)
    return Text("\n".join(prose), shell)


def anchors(page: Path) -> set[str]:
    """The ids mkdocs gives the page's headings (python-markdown's toc, as mkdocs runs it)."""
    md = markdown.Markdown(extensions=["toc", "tables"])
    md.convert(page.read_text())

    def walk(tokens: list[dict]) -> set[str]:
        return {t["id"] for t in tokens} | {i for t in tokens for i in walk(t["children"])}
    return walk(md.toc_tokens)  # type: ignore[attr-defined]  # set by the toc extension


def links(page: Path) -> list[str]:
    prose = INLINE.sub("", split(page).prose)
    return [m.group(1) for m in LINK.finditer(prose)]


def broken(page: Path) -> list[str]:
    out = []
    for target in links(page):
        if re.match(r"^[a-z][a-z+.-]*:", target):      # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            out.append(f"{rel(page)}: {target}: no such file")
        elif ROOT not in dest.parents and dest != ROOT:
            out.append(f"{rel(page)}: {target}: outside the repository")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            out.append(f"{rel(page)}: {target}: no heading #{anchor} in {rel(dest)}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Real heading\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#real-heading) [gone](c.md) [bad](b.md#nope) `[code](x.md)`\n"
                    "```sh\n[in code](y.md)\n```\n[web](https://example.org/x#y) [self](#top)\n")
    assert broken(page) == ["a.md: c.md: no such file",
                            "a.md: b.md#nope: no heading #nope in b.md",
                            "a.md: #top: no heading #top in a.md"]


# -- `pyhpc …` commands --------------------------------------------------------------------

def commands(page: Path) -> list[tuple[str, bool]]:
    """Every `pyhpc …` command the page shows, and whether it is an example to run: each
    shell line that starts one (after a `$ ` prompt) is; an inline code span that is one
    may be a command's name in prose (`pyhpc jobstats`), so only its words are checked."""
    text = split(page)
    found = []
    for line in text.shell:
        line = line.strip().removeprefix("$ ")
        if line.startswith("pyhpc "):
            found.append((line, True))
    for m in INLINE.finditer(text.prose):
        span = m.group(2).strip()
        if span.startswith("pyhpc "):
            found.append((span, False))
    return found


def words(command: str) -> list[str]:
    """The command's words, without a comment, a pipe or what follows it; optional parts
    (`[--x N]`) count as written, and `a|b` alternatives as the first."""
    try:
        tokens = shlex.split(command, comments=True)
    except ValueError:
        tokens = command.split()
    out = []
    for token in tokens:
        if token in {"|", "||", "&&", ";", ">", ">>", "2>&1"}:
            break
        token = token.strip("[]")
        if token and token not in ELLIPSIS:
            out.append(token.split("|")[0] if not token.startswith("|") else token)
    return out[1:]  # without "pyhpc"


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check(command: str, example: bool = True) -> str | None:
    """None if the command's subcommands and flags exist (and an example without
    placeholders parses whole); else what is wrong."""
    root = build_parser()
    parser, args = root, words(command)
    options = dict(root._option_string_actions)
    concrete = not any(PLACEHOLDER.match(w.split("=", 1)[-1]) or w.endswith("…") for w in args)
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            if flag not in options:
                return f"{command!r}: {flag} is not an option of `{parser.prog}`"
            action = options[flag]
            takes = action.nargs != 0
            if takes and "=" not in word and i + 1 < len(args):
                value = args[i + 1]
                if action.choices and not PLACEHOLDER.match(value) and value not in action.choices:
                    return f"{command!r}: {flag} {value}: not one of {sorted(action.choices)}"
                i += 1
        elif subparsers(parser):
            choices = subparsers(parser)
            if word not in choices and not PLACEHOLDER.match(word):
                return f"{command!r}: `{parser.prog}` has no command {word!r}"
            if word in choices:
                parser = choices[word]
                options.update(parser._option_string_actions)
        i += 1
    if example and subparsers(parser) and not any(w in subparsers(parser) for w in args):
        return f"{command!r}: `{parser.prog}` needs a subcommand"
    if example and concrete:
        try:
            root.parse_args(args)
        except SystemExit:
            return f"{command!r}: does not parse (`pyhpc {' '.join(args)}`)"
    return None


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_pyhpc_command_shown_parses(page: Path, capsys) -> None:
    problems = [p for c, example in commands(page) if (p := check(c, example))]
    capsys.readouterr()  # argparse's own usage lines
    assert problems == []


def test_the_docs_show_commands_and_the_check_catches_wrong_ones(capsys) -> None:
    shown = [c for p in PAGES for c in commands(p)]
    assert len(shown) > 50 and sum(example for _, example in shown) > 20
    assert check("pyhpc train --nodes 2 --epochs 3 --out runs/digits --wait") is None
    assert check("pyhpc doctor --gpus [--drain] [--json]") is None
    assert check("pyhpc render TEMPLATE --set k=v … [--list]") is None
    assert "--nodez is not an option" in (check("pyhpc train --nodez 2") or "")
    assert "has no command 'trian'" in (check("pyhpc trian --nodes 2") or "")
    assert "not one of" in (check("pyhpc train --mode imagenet") or "")
    assert "does not parse" in (check("pyhpc train --nodes two") or "")
    assert "needs a subcommand" in (check("pyhpc workshop") or "")
    assert check("pyhpc jobstats", example=False) is None
    assert "does not parse" in (check("pyhpc jobstats") or "")
    assert "is not an option" in (check("pyhpc jobstats --nodes 2", example=False) or "")
    capsys.readouterr()


# -- the site ------------------------------------------------------------------------------

def test_the_docs_site_builds_with_strict(tmp_path: Path) -> None:
    """mkdocs --strict fails on a broken link or anchor, a page missing from the nav, or a
    bad setting; the site goes to a temporary folder, never into the checkout."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "admin" / "security" / "index.html").exists()


def test_the_site_and_the_screenshots_go_to_ignored_build_folders() -> None:
    for path in ("build/site/index.html", "build/screenshots/hub-notebook.png"):
        proc = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", path], check=False)
        assert proc.returncode == 0, f"{path} is not ignored by git"


def test_no_test_writes_a_picture_into_docs() -> None:
    """Screenshots go to build/screenshots; `make docs-pictures` copies them into docs/."""
    writes = re.compile(r"""ROOT\s*/\s*["']docs["'].*\.png|\bDOCS\s*/\s*["'][^"']+\.png""")
    tests = [p for p in sorted((ROOT / "tests").rglob("*.py")) if p != Path(__file__)]
    found = [f"{rel(p)}:{n}" for p in tests
             for n, line in enumerate(p.read_text().splitlines(), 1) if writes.search(line)]
    assert found == []


def test_every_picture_in_docs_is_shown_on_a_page() -> None:
    shown = {(page.parent / t).resolve() for page in PAGES for t in links(page)
             if t.endswith(".png")}
    pictures = sorted((ROOT / "docs").glob("*.png"))
    assert pictures and [rel(p) for p in pictures if p.resolve() not in shown] == []
