"""The package keeps the layers docs/architecture.md draws. Its table under "## The layers" (rows
``| N. name | modules | what it holds |``, or ``| Na. name | ...`` for floor a of layer N) places every
module of archlab in one numbered layer or floor; imports may go to the same one or a lower one (config ->
nn -> build/accounting -> 4a what the uses share -> 4b training, report -> 4c interop, evaluation -> 4d
bench -> cli; floors in the order of their letters), never up, and close no cycle; training and the
report import nothing of each other. Every import statement is walked with ast (function-level imports
included), from the source tree, without importing archlab."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "archlab"
DOC = ROOT.parent / "docs" / "architecture.md"


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
    re-exports the public API, is left out as a target."""
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


# ---------------------------------------------------------------- the table of docs/architecture.md


def layer_table(text: str) -> dict[str, str]:
    """The table of the "## The layers" section: each entry of a row's modules column -> the row's layer,
    its number and any floor letter (``"3"``, ``"4b"``).

    Entries are the backticked paths relative to the package directory: ``x.py`` is the module
    ``archlab.x`` (``__init__.py`` the package itself), ``dir/`` the package ``archlab.dir`` with every
    module under it, ``dir/x.py`` the module ``archlab.dir.x``."""
    section = text.split("\n## The layers\n", 1)[1].split("\n## ", 1)[0]
    table: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        number = re.match(r"(\d+[a-z]?)\.\s", cells[0]) if len(cells) >= 3 else None
        if not number:
            continue
        for entry in re.findall(r"`([^`]+)`", cells[1]):
            assert entry not in table, f"{entry} is in two rows of the layer table"
            table[entry] = number.group(1)
    assert table, "no layer table under '## The layers'"
    return table


def entry_module(entry: str, package: str = "archlab") -> str:
    """The module (or package) an entry of the table names: ``report/`` -> ``archlab.report``."""
    path = entry.removesuffix("/").removesuffix(".py").removesuffix("__init__").strip("/")
    return ".".join(p for p in (package, *path.split("/")) if p)


def covers(entry: str, module: str) -> bool:
    name = entry_module(entry)
    return module == name or (entry.endswith("/") and module.startswith(name + "."))


def order(layer: str) -> tuple[int, str]:
    """Where a layer stands: by its number, then by its floor letter (``4a`` below ``4b``, both below ``5``)."""
    number = re.match(r"\d+", layer)
    assert number, layer
    return int(number.group()), layer[number.end() :]


def layers(edges: dict[str, set[str]], table: dict[str, str]) -> dict[str, str]:
    """Module -> its layer, for every module of ``edges``; fails naming each module that no entry or
    more than one entry of the table places, and each entry that names no module."""
    placed = {m: [e for e in table if covers(e, m)] for m in edges}
    unplaced = sorted(m for m, found in placed.items() if not found)
    twice = {m: found for m, found in placed.items() if len(found) > 1}
    stale = sorted(e for e in table if not any(covers(e, m) for m in edges))
    assert not unplaced, f"modules in no row of the layer table in docs/architecture.md: {unplaced}"
    assert not twice, f"modules placed by more than one entry of the layer table: {twice}"
    assert not stale, f"entries of the layer table that name no module of the package: {stale}"
    return {m: table[found[0]] for m, found in placed.items()}


def upward_imports(edges: dict[str, set[str]], layer: dict[str, str]) -> list[str]:
    """Every import from a module to one of a higher layer or floor, as ``a (N) imports b (M)``."""
    return [
        f"{m} ({layer[m]}) imports {t} ({layer[t]})"
        for m in sorted(edges)
        for t in sorted(edges[m])
        if order(layer[t]) > order(layer[m])
    ]


def imports_between(edges: dict[str, set[str]], a: str, b: str) -> list[str]:
    """Every import from a module of package ``a`` to one of package ``b``, or back, as ``x imports y``."""

    def within(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return [
        f"{m} imports {t}"
        for m in sorted(edges)
        for t in sorted(edges[m])
        if (within(m, a) and within(t, b)) or (within(m, b) and within(t, a))
    ]


def numbered_in_order(layers: set[str]) -> bool:
    """Layers numbered 0, 1, 2, ...; a number split into floors has them lettered a, b, c, ... alone."""
    numbers = sorted({order(x)[0] for x in layers})
    floors = {n: sorted(order(x)[1] for x in layers if order(x)[0] == n) for n in numbers}
    return numbers == list(range(len(numbers))) and all(
        f == [""] or f == [chr(ord("a") + i) for i in range(len(f))] for f in floors.values()
    )


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


TOY_DOC = """# Toy

## The layers

| layer | modules | what it holds |
|---|---|---|
| 0. basics | `__init__.py`, `errors.py` | the facade, `ConfigError` |
| 1. config | `config.py` | schemas (`config.py` named again here is not read) |
| 2. components | `nn/` | `nn/norms.py` |

## Next section

| 9. not | `nn/norms.py` | a table of another section is not read |
"""


def toy_package(tmp_path: Path) -> Path:
    """config (layer 1) imports nn.norms (layer 2) inside a function: an upward import, and no cycle."""
    pkg = tmp_path / "archlab"
    (pkg / "nn").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("class ConfigError(ValueError):\n    pass\n")
    (pkg / "config.py").write_text("def validate():\n    from archlab.nn.norms import NORMS\n")
    (pkg / "nn" / "__init__.py").write_text("")
    (pkg / "nn" / "norms.py").write_text("from archlab.errors import ConfigError\nNORMS = {}\n")
    return pkg


def test_the_table_is_read_from_its_section_and_its_modules_column():
    table = layer_table(TOY_DOC)
    assert table == {"__init__.py": "0", "errors.py": "0", "config.py": "1", "nn/": "2"}
    assert [entry_module(e) for e in table] == ["archlab", "archlab.errors", "archlab.config", "archlab.nn"]
    assert covers("nn/", "archlab.nn.norms") and covers("nn/", "archlab.nn") and not covers("nn/", "archlab.nnx")
    assert not covers("config.py", "archlab.config.model")


def test_an_import_from_a_lower_layer_to_a_higher_one_is_found(tmp_path):
    edges = graph(toy_package(tmp_path))
    layer = layers(edges, layer_table(TOY_DOC))
    assert layer == {
        "archlab": "0",
        "archlab.errors": "0",
        "archlab.config": "1",
        "archlab.nn": "2",
        "archlab.nn.norms": "2",
    }
    assert cycles(edges) == []
    assert upward_imports(edges, layer) == [  # importing archlab.nn.norms runs the package archlab.nn too
        "archlab.config (1) imports archlab.nn (2)",
        "archlab.config (1) imports archlab.nn.norms (2)",
    ]


def test_a_module_missing_from_the_table_or_a_stale_entry_fails(tmp_path):
    pkg = toy_package(tmp_path)
    (pkg / "peak_flops.py").write_text("")
    with pytest.raises(AssertionError, match=r"in no row .*\['archlab.peak_flops'\]"):
        layers(graph(pkg), layer_table(TOY_DOC))
    (pkg / "peak_flops.py").unlink()
    with pytest.raises(AssertionError, match=r"name no module .*\['bench/peak_flops.py'\]"):
        layers(graph(pkg), {**layer_table(TOY_DOC), "bench/peak_flops.py": "1"})
    with pytest.raises(AssertionError, match="more than one entry"):
        layers(graph(pkg), {**layer_table(TOY_DOC), "nn/norms.py": "2"})


FLOORS_DOC = """# Toy, in floors

## The layers

| layer | modules | what it holds |
|---|---|---|
| 0. basics | `__init__.py`, `errors.py` | the facade, `ConfigError` |
| 1a. config | `config.py` | schemas |
| 1b. components | `nn/` | modules |
| 2. commands | `cli.py` | commands |
"""


def test_floors_are_ordered_by_their_letters_below_the_next_number(tmp_path):
    pkg = toy_package(tmp_path)  # config (1a) imports nn.norms (1b): up a floor
    (pkg / "cli.py").write_text("from archlab.nn.norms import NORMS\n")  # 2 imports 1b: down
    layer = layers(graph(pkg), layer_table(FLOORS_DOC))
    assert layer["archlab.config"] == "1a" and layer["archlab.nn.norms"] == "1b" and layer["archlab.cli"] == "2"
    assert upward_imports(graph(pkg), layer) == [
        "archlab.config (1a) imports archlab.nn (1b)",
        "archlab.config (1a) imports archlab.nn.norms (1b)",
    ]
    assert numbered_in_order({"0", "1a", "1b", "2"}) and numbered_in_order({"0", "1", "2"})
    assert not numbered_in_order({"0", "1a", "1c", "2"}) and not numbered_in_order({"0", "1", "1a"})
    assert not numbered_in_order({"0", "2"})


def test_every_module_is_in_exactly_one_layer_of_the_architecture_doc():
    layer = layers(graph(), layer_table(DOC.read_text(encoding="utf-8")))
    assert numbered_in_order(set(layer.values())), "the layers are numbered 0, 1, 2, ..., floors lettered a, b, ..."


def test_imports_go_to_the_same_or_a_lower_layer():
    edges = graph()
    upward = upward_imports(edges, layers(edges, layer_table(DOC.read_text(encoding="utf-8"))))
    assert not upward, "imports against the layer table of docs/architecture.md:\n" + "\n".join(upward)


def test_training_and_the_report_import_nothing_of_each_other():
    """What both read of a run (its files, the figures' look) lies below both, in 4a; ``lr_from``, where a run
    takes a proxy sweep's best rate, is resolved by archlab-train, above both."""
    toy = {"archlab.training.run": {"archlab.report.proxy"}, "archlab.report.runs": {"archlab.run_files"}}
    assert imports_between(toy, "archlab.training", "archlab.report") == [
        "archlab.training.run imports archlab.report.proxy"
    ]
    between = imports_between(graph(), "archlab.training", "archlab.report")
    assert not between, "imports between training and the report:\n" + "\n".join(between)
