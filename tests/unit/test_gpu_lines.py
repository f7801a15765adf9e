"""docs/gpu-lines.md lists every line marked ``# GPU-only:``, and nothing else."""
from __future__ import annotations

import ast
import io
import re
import tokenize

from pyhpc.paths import ROOT

MARK = "# GPU-only:"
ROW = re.compile(r"^\| `(pyhpc/[\w/]+\.py)` \| `([\w.]+)` \|")


def enclosing(tree: ast.Module, line: int) -> str:
    """The qualified name of the innermost function holding ``line``."""
    found = "<module>"

    def walk(node: ast.AST, prefix: str) -> None:
        nonlocal found
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                if child.lineno <= line <= end:
                    if not isinstance(child, ast.ClassDef):
                        found = name
                    walk(child, name + ".")

    walk(tree, "")
    return found


def marked() -> list[tuple[str, str]]:
    """(file, function) of every ``# GPU-only:`` comment in the package."""
    out = []
    for path in sorted((ROOT / "pyhpc").rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and tok.string.startswith(MARK):
                out.append((str(path.relative_to(ROOT)), enclosing(tree, tok.start[0])))
    return out


def documented() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "gpu-lines.md").read_text()
    section = text.split("\n## ", 1)[0]  # the first table: the GPU-only lines
    return [m.groups() for line in section.splitlines() if (m := ROW.match(line))]


def test_every_gpu_only_line_is_listed_for_review() -> None:
    found = marked()
    assert found, "no # GPU-only: markers found"
    assert sorted(found) == sorted(documented())


def test_gpu_only_lines_are_kept_in_one_module() -> None:
    assert {path for path, _ in marked()} == {"pyhpc/dist/device.py"}
