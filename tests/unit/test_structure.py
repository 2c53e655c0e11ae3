"""Guards on the product's module structure, read from the source with ``ast`` (nothing of the
product is imported, so this runs in well under a second).

The packages are ``PRODUCT_PACKAGES``. Every import statement counts: at module level, inside
functions and under ``if TYPE_CHECKING:``. A lazy import is still a dependency, and a circle
that only type checkers see is still a circle in the design.

How an import becomes an edge ``importer -> module``:

- ``import a.b.c`` and ``from a.b.c import name``: an edge to ``a.b.c``; ``from a.b import c``
  where ``a.b.c`` is a module: an edge to ``a.b.c``, not to the package.
- Importing ``a.b.c`` first runs the ``__init__.py`` of ``a`` and ``a.b``: an edge to each of
  those packages too, except the importer's own enclosing packages (they are already being
  imported when the importer runs, so their ``__init__`` does not run again).
- A package whose ``__init__.py`` defines a module-level ``__getattr__`` re-exports lazily: it
  imports nothing when it runs, and its ``if TYPE_CHECKING:`` imports only tell type checkers
  where each name lives. So those imports are no edges of the package; they are its table of
  homes, and ``from pkg import Name`` is an edge to the submodule that defines ``Name`` (the
  one ``__getattr__`` imports on first use). Counting them as the package's own edges would
  make every user of one name depend on all of its siblings, and report circles that never
  happen; ignoring ``Name``'s home would miss real ones.

Private names: ``from a.b import _name`` (one leading underscore; dunders are public) from
another product module couples the importer to what its owner may change freely. A private
*module* (``a/_impl.py``) may be imported only from inside its own package. Private names of
third-party libraries are not checked here.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("recipe", "fully_async_policy", "one_step_off")


@dataclass(frozen=True)
class Import:
    """One import statement of a product module that names another product module."""

    importer: str
    module: str
    """The module the statement names (``from module import ...`` or ``import module``)."""
    names: tuple[str, ...]
    """The names of ``from module import ...`` (empty for ``import module``)."""
    file: Path
    line: int


@dataclass(frozen=True)
class Edge:
    """``importer`` depends on ``target`` because of ``by``."""

    importer: str
    target: str
    by: Import

    def __str__(self) -> str:
        return f"{self.by.file}:{self.by.line} ({self.importer} -> {self.target})"


Graph = dict[str, dict[str, Edge]]
"""importer -> {module it depends on -> the first import that makes it so}."""


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def find_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Module name -> source file (relative to ``root``) of every module of ``packages``."""
    files = (p for pkg in packages for p in (root / pkg).rglob("*.py"))
    return {_module_name(p, root): p.relative_to(root) for p in sorted(files)}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _lazy_table_nodes(file: Path, tree: ast.Module) -> set[ast.stmt]:
    """A lazy package's ``if TYPE_CHECKING:`` imports (none for any other module)."""
    lazy = file.name == "__init__.py" and any(
        isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in tree.body
    )
    if not lazy:
        return set()
    blocks = (n for n in tree.body if isinstance(n, ast.If) and _is_type_checking(n.test))
    return {stmt for block in blocks for stmt in block.body}


def _resolve_from(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def read_imports(
    root: Path, modules: dict[str, Path]
) -> tuple[list[Import], dict[str, dict[str, str]]]:
    """Every import of a product module, and each lazy package's homes (name -> module)."""
    imports: list[Import] = []
    lazy_homes: dict[str, dict[str, str]] = {}
    for importer, file in modules.items():
        tree = ast.parse((root / file).read_text(), str(file))
        is_package = file.name == "__init__.py"
        table = _lazy_table_nodes(file, tree)
        if table:
            lazy_homes[importer] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                named = [(alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = tuple(alias.name for alias in node.names)
                named = [(_resolve_from(importer, is_package, node), names)]
            else:
                continue
            for module, names in named:
                if module not in modules:
                    continue  # not ours
                if node in table:
                    lazy_homes[importer].update(dict.fromkeys(names, module))
                else:
                    imports.append(Import(importer, module, names, file, node.lineno))
    return imports, lazy_homes


def _enclosing_packages(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _targets(imp: Import, modules: dict[str, Path], lazy_homes: dict[str, dict[str, str]]):
    """The modules ``imp`` makes its importer depend on before enclosing packages."""
    if not imp.names:
        return [imp.module]
    targets = []
    for name in imp.names:
        home = lazy_homes.get(imp.module, {}).get(name, imp.module)
        submodule = f"{home}.{name}"
        targets.append(submodule if submodule in modules else home)
    return targets


def import_graph(
    imports: list[Import], modules: dict[str, Path], lazy_homes: dict[str, dict[str, str]]
) -> Graph:
    """The dependency graph of the module docstring."""
    graph: Graph = {m: {} for m in modules}
    for imp in imports:
        own = {imp.importer, *_enclosing_packages(imp.importer)}
        for target in _targets(imp, modules, lazy_homes):
            for module in [*_enclosing_packages(target), target]:
                if module not in own and module in modules:
                    graph[imp.importer].setdefault(module, Edge(imp.importer, module, imp))
    return graph


def import_circles(graph: Graph) -> list[list[Edge]]:
    """One shortest circle through each strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth <= number of modules (a few hundred)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = [stack.pop()]
            while group[-1] != node:
                group.append(stack.pop())
            on_stack.difference_update(group)
            groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_shortest_circle(graph, group) for group in groups if len(group) > 1]


def _shortest_circle(graph: Graph, group: list[str]) -> list[Edge]:
    """Breadth first from the group's first module back to it, inside the group."""
    start, members = group[0], set(group)
    reached_by: dict[str, Edge] = {}
    todo = deque([start])
    while todo:
        for edge in graph[todo.popleft()].values():
            if edge.target not in members or edge.target in reached_by:
                continue
            reached_by[edge.target] = edge
            if edge.target == start:
                circle = [edge]
                while circle[-1].importer != start:
                    circle.append(reached_by[circle[-1].importer])
                return circle[::-1]
            todo.append(edge.target)
    raise AssertionError(f"no circle through {group}")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(imports: list[Import], modules: dict[str, Path]) -> list[str]:
    """Imports of another module's private names, or of a private module from outside the
    package that holds it."""
    found = []
    for imp in imports:
        where = f"{imp.file}:{imp.line}: {imp.importer}"
        named = [imp.module] + [
            f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in modules
        ]
        for module in named:
            parts = module.split(".")
            outside = [
                part
                for i, part in enumerate(parts)
                if _private(part) and not f"{imp.importer}.".startswith(".".join(parts[:i]) + ".")
            ]
            if outside:
                found.append(f"{where} imports the private module {module}")
        names = [n for n in imp.names if _private(n) and f"{imp.module}.{n}" not in modules]
        if names and imp.module != imp.importer:
            found.append(f"{where} imports {names} from {imp.module}")
    return found


def _product() -> tuple[dict[str, Path], list[Import], Graph]:
    modules = find_modules(REPO, PRODUCT_PACKAGES)
    imports, lazy_homes = read_imports(REPO, modules)
    return modules, imports, import_graph(imports, modules, lazy_homes)


def test_the_product_packages_have_no_import_circle():
    _, imports, graph = _product()
    assert len(graph) > 50 and len(imports) > 100  # the guard read the real packages
    circles = import_circles(graph)
    report = "\n".join("- " + "\n  -> ".join(map(str, circle)) for circle in circles)
    assert not circles, f"import circles (file:line of each import):\n{report}"


def part_of(module: str) -> str:
    """The part of the layout a module belongs to: a top-level package, or one of
    ``recipe``'s direct children (a subpackage such as ``recipe.run``, or a module such as
    ``recipe.separate_trainer``), or one of ``recipe.tools``'s (``recipe.tools.plan``)."""
    parts = module.split(".")
    if parts[0] != "recipe":
        return parts[0]
    return ".".join(parts[:3] if parts[1:2] == ["tools"] else parts[:2])


def collapse(graph: Graph, part: Callable[[str], str] = part_of) -> Graph:
    """``graph`` between parts instead of modules (edges inside a part dropped); each edge
    keeps the first import that ties the two parts."""
    parts: Graph = {}
    for importer, targets in graph.items():
        mine = parts.setdefault(part(importer), {})
        for target, edge in targets.items():
            a, b = part(importer), part(target)
            parts.setdefault(b, {})
            if a != b:
                mine.setdefault(b, Edge(a, b, edge.by))
    return parts


def test_the_layout_parts_depend_on_each_other_one_way():
    """No two parts (``recipe/run/``, ``recipe/workers/``, ``recipe/faults.py``,
    ``fully_async_policy``, ...) import each other, even through different modules: the
    layers of docs/architecture.md's Layout section stay layers."""
    _, _, graph = _product()
    circles = import_circles(collapse(graph))
    report = "\n".join("- " + "\n  -> ".join(map(str, circle)) for circle in circles)
    assert not circles, f"parts of the layout that import each other:\n{report}"


def test_no_module_imports_a_private_name_of_another():
    modules, imports, _ = _product()
    found = private_imports(imports, modules)
    assert not found, "private names imported across modules:\n" + "\n".join(found)


# ---- the guard itself, on small trees ---------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> tuple[dict[str, Path], list[Import], Graph]:
    for name, source in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    modules = find_modules(root, ("pkg",))
    imports, lazy_homes = read_imports(root, modules)
    return modules, imports, import_graph(imports, modules, lazy_homes)


def _hops(circle: list[Edge]) -> list[tuple[str, str, int]]:
    return [(edge.importer, edge.target, edge.by.line) for edge in circle]


def test_the_guard_sees_a_circle_through_function_level_and_type_checking_imports(tmp_path):
    *_, graph = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def f():\n    from pkg import b\n",  # names the submodule pkg.b
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
            "pkg/c.py": "import pkg.a\n",
        },
    )
    assert [_hops(c) for c in import_circles(graph)] == [
        [("pkg.a", "pkg.b", 2), ("pkg.b", "pkg.a", 3)]
    ]


def test_the_guard_sees_a_circle_through_a_package_init_that_a_submodule_import_runs(tmp_path):
    *_, graph = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/store/__init__.py": "from pkg.store.disk import save\n",
            "pkg/store/disk.py": "from pkg.worker import run\n",
            "pkg/worker.py": "from pkg.store.names import NAME\n",  # runs pkg/store/__init__
            "pkg/store/names.py": "NAME = 1\n",
        },
    )
    assert [_hops(c) for c in import_circles(graph)] == [
        [("pkg.store", "pkg.store.disk", 1), ("pkg.store.disk", "pkg.worker", 1),
         ("pkg.worker", "pkg.store", 1)]
    ]  # fmt: skip


def test_a_lazy_package_sends_each_name_to_its_home_module(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/sync/__init__.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from pkg.sync.base import Error\n"
            "    from pkg.sync.engine import Engine\n"
            "def __getattr__(name): ...\n"
        ),
        "pkg/sync/base.py": "",
        "pkg/sync/engine.py": "from pkg.worker import run\n",
        "pkg/worker.py": "from pkg.sync import Error\n",
    }
    *_, graph = _tree(tmp_path, files)
    assert set(graph["pkg.worker"]) == {"pkg.sync", "pkg.sync.base"}
    assert graph["pkg.sync"] == {} and import_circles(graph) == []
    *_, graph = _tree(tmp_path, {"pkg/worker.py": "from pkg.sync import Engine\n"})
    assert [_hops(c) for c in import_circles(graph)] == [
        [("pkg.sync.engine", "pkg.worker", 1), ("pkg.worker", "pkg.sync.engine", 1)]
    ]


def test_the_guard_finds_private_names_and_modules_imported_from_elsewhere(tmp_path):
    modules, imports, _ = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import _helper, __version__, public\n",
            "pkg/b.py": "",
            "pkg/inner/__init__.py": "from pkg.inner._impl import thing\n",  # its own package
            "pkg/inner/_impl.py": "from . import _sibling\n",  # a private module beside it
            "pkg/inner/_sibling.py": "",
            "pkg/c.py": "import pkg.inner._impl\n",
        },
    )
    assert private_imports(imports, modules) == [
        "pkg/a.py:1: pkg.a imports ['_helper'] from pkg.b",
        "pkg/c.py:1: pkg.c imports the private module pkg.inner._impl",
    ]


def test_parts_that_import_each_other_through_different_modules_are_a_circle(tmp_path):
    *_, graph = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a/__init__.py": "",
            "pkg/a/one.py": "import pkg.b.two\n",
            "pkg/a/three.py": "",
            "pkg/b/__init__.py": "",
            "pkg/b/two.py": "",
            "pkg/b/four.py": "import pkg.a.three\n",
        },
    )
    assert import_circles(graph) == []  # no circle between modules ...
    parts = collapse(graph, part=lambda module: ".".join(module.split(".")[:2]))
    assert [_hops(c) for c in import_circles(parts)] == [  # ... but between the parts
        [("pkg.a", "pkg.b", 1), ("pkg.b", "pkg.a", 1)]
    ]
