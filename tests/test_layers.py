"""The package's imports flow one way: config -> nn -> build/accounting -> training, interop, bench,
report -> cli. Walks every import statement with ast (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import archlab

ROOT = Path(archlab.__file__).parent


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The archlab modules ``path`` imports anywhere in its body (``from archlab.x import y`` counts
    ``archlab.x.y`` when that is a module, else ``archlab.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            ]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the archlab modules it imports. Importing ``archlab.a.b`` also runs the package
    ``archlab.a`` (its ``__init__``), so that is an edge too; the top-level ``archlab`` facade, which
    re-exports the public API, is left out."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    modules = set(files)
    edges = {m: imports_of(p, modules) - {m} for m, p in files.items()}
    for m, targets in edges.items():
        for target in list(targets):
            pkg = target.rpartition(".")[0]
            while pkg.count(".") >= 1:
                if pkg in modules and not m.startswith(pkg + "."):
                    targets.add(pkg)
                pkg = pkg.rpartition(".")[0]
        targets.discard("archlab")
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), as a sorted list."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_function_level_import_closes_a_cycle(tmp_path):
    pkg = tmp_path / "archlab"
    (pkg / "nn").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("def validate():\n    from archlab.nn.norms import NORMS\n")
    (pkg / "nn" / "__init__.py").write_text("")
    (pkg / "nn" / "norms.py").write_text("from archlab.config import validate\nNORMS = {}\n")
    assert cycles(graph(pkg)) == [["archlab.config", "archlab.nn.norms"]]


def test_archlab_has_no_import_cycle():
    assert cycles(graph()) == []


def test_the_config_layer_imports_neither_nn_nor_training():
    edges = graph()
    for module, targets in edges.items():
        if module.startswith("archlab.config") or module in ("archlab.errors", "archlab.checks", "archlab.registry"):
            bad = [t for t in targets if t.startswith(("archlab.nn", "archlab.training", "archlab.cli"))]
            assert not bad, f"{module} imports {bad}"
        if module.startswith("archlab.nn"):
            bad = [t for t in targets if t.startswith(("archlab.training", "archlab.cli", "archlab.build"))]
            assert not bad, f"{module} imports {bad}"
