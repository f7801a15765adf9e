"""The package's import graph, read from the source with ast: no cycle, and every import
points down the layers that docs/architecture.md draws (lazy imports inside functions count)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pyhpc import paths

PACKAGE = paths.ROOT / "pyhpc"
#: Top to bottom. A module may import from its own folder or from a layer below its own.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "__main__", "container_run", "jupyter", "meter", "pins"),  # entry points: the API,
    # python -m names, pyhpc.meter (the public name of train.meter), the deploy's pins check
    ("cli",),
    ("train", "bench", "admin", "containers", "monitor"),  # the domain
    ("hub",),  # JupyterHub's side: the form, its checks, the server's script, the hub's API
    ("slurm",),
    ("dist", "cluster"),  # cluster: the definition (its users, accounts and limits, its
    # monitoring and backup sections, the field checks they share: cluster.schema)
    ("plots",),  # what every report's plots share
    ("validate", "yamlio", "files", "paths"),
    ("errors",),
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
#: Imports across one layer: none. bench, train, admin, containers and monitor share only
#: what is below them.
SIDEWAYS: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(paths.ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_only(tree: ast.AST) -> set[ast.AST]:
    """Imports under ``if TYPE_CHECKING:``: for the type checker only, never run."""
    return {node for block in ast.walk(tree) if isinstance(block, ast.If)
            and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
            for stmt in block.body for node in ast.walk(stmt)}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The pyhpc modules ``path`` imports, wherever in it the import statement is (but
    under ``if TYPE_CHECKING:``, where nothing runs)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_only(tree)
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "pyhpc"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "pyhpc":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    return found


def unit(module: str) -> str:
    """The folder or top-level module a module belongs to (``pyhpc.slurm.watch`` -> ``slurm``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def points_down(source: str, target: str) -> bool:
    """Within one folder, or to a layer below the importer's."""
    a, b = unit(source), unit(target)
    return a == b or RANK[b] > RANK[a] or (a, b) in SIDEWAYS


def graph() -> dict[str, set[str]]:
    """Module -> the modules it imports. The package root (``__version__``, the lazy API) is
    left out as a target: Python runs it before any module of the package anyway."""
    known = modules()
    return {name: imports(path, known) - {name, "pyhpc"} for name, path in known.items()}


def test_every_folder_and_top_level_module_has_a_layer() -> None:
    assert {unit(m) for m in modules()} == set(RANK)


def test_every_import_points_down_or_stays_in_its_folder() -> None:
    upward = []
    for source, targets in graph().items():
        upward += [f"{source} -> {target} ({unit(source)} is not above {unit(target)})"
                   for target in targets if not points_down(source, target)]
    assert not upward, "imports that do not point down:\n" + "\n".join(sorted(upward))


def test_an_upward_or_sideways_import_is_found(tmp_path: Path) -> None:
    """The rule itself: bench importing train (one layer) and slurm importing cli fail it."""
    source = tmp_path / "m.py"
    source.write_text("from pyhpc.train import sweep\nfrom pyhpc.cli import main\n")
    known = {"pyhpc.train.sweep": source, "pyhpc.cli.main": source}
    for importer, target in (("pyhpc.bench.submit", "pyhpc.train.sweep"),
                             ("pyhpc.slurm.submit", "pyhpc.cli.main")):
        assert target in imports(source, known)
        assert not points_down(importer, target)
    assert points_down("pyhpc.cli.jobs", "pyhpc.train.sweep")
    assert points_down("pyhpc.train.sweep", "pyhpc.train.config")


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_import_graph_has_no_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("edges, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"b2"}, "b2": {"b"}}, ["b", "b2", "b"]),
])
def test_find_cycle_finds_a_cycle_only_where_there_is_one(edges, cycle) -> None:
    assert find_cycle(edges) == cycle


def test_lazy_imports_count(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from pyhpc.bench import job\n    import pyhpc.slurm.slurm\n")
    known = {"pyhpc.bench.job": source, "pyhpc.slurm.slurm": source}
    assert imports(source, known) == {"pyhpc.bench.job", "pyhpc.slurm.slurm"}
