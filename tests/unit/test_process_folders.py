"""``fully_async_policy/`` is a folder per process, read from the source with ``ast``:

    driver/      the trainer's process (FullyAsyncTrainer and what it composes)
    rollouter/   the rollouter actor's process (FullyAsyncRollouter and what it composes)
    *.py         shared by both: messages, the message queue, admission, deadlines, the run plan
    main.py      the launcher (with __main__.py): the one place that builds both sides

The driver and the rollouter never import each other, and a shared module imports neither (nor
the launcher), so each process loads its own folder and the shared modules only, and a change on
one side reaches the other only through the shared messages. Every import statement counts: at
module level, inside functions and under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "fully_async_policy"
LAUNCHER = frozenset({f"{PACKAGE}.main", f"{PACKAGE}.__main__"})
SIDES = ("driver", "rollouter")
MAY_IMPORT = {
    "driver": {"driver", "shared"},
    "rollouter": {"rollouter", "shared"},
    "shared": {"shared"},
    "launcher": {"launcher", "driver", "rollouter", "shared"},
}
"""Which sides a module of each side may import."""


@dataclass(frozen=True)
class PackageImport:
    """One import statement of a ``fully_async_policy`` module naming another of its modules."""

    importer: str
    module: str
    file: Path
    line: int


def side_of(module: str) -> str:
    """``driver``, ``rollouter``, ``launcher`` or ``shared`` (the package's top level)."""
    if module in LAUNCHER:
        return "launcher"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in SIDES else "shared"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(importer: str, is_package: bool, node: ast.stmt) -> list[str]:
    """The package's modules ``node`` names (``from a import b``: ``a.b`` if it is one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        here = importer.split(".") if is_package else importer.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        base = ".".join([*here, base] if base else here)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def package_imports(root: Path) -> list[PackageImport]:
    """Every import of a ``PACKAGE`` module (under ``root``) that names another of them."""
    files = {_module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}
    found = []
    for importer, file in files.items():
        tree = ast.parse(file.read_text(), str(file))
        for node in ast.walk(tree):
            for module in _imported(importer, file.name == "__init__.py", node):
                if module in files and module != PACKAGE:
                    where = file.relative_to(root)
                    found.append(PackageImport(importer, module, where, node.lineno))
    return found


def crossings(imports: list[PackageImport]) -> list[str]:
    """The imports that cross from one process's folder into the other's (``MAY_IMPORT``)."""
    bad = []
    for imp in imports:
        mine, theirs = side_of(imp.importer), side_of(imp.module)
        if theirs not in MAY_IMPORT[mine]:
            bad.append(f"{imp.file}:{imp.line} {imp.importer} ({mine}) -> {imp.module} ({theirs})")
    return bad


def test_the_driver_and_the_rollouter_never_import_each_other():
    imports = package_imports(REPO)
    sides = {side_of(imp.importer) for imp in imports}
    assert sides == set(MAY_IMPORT) and len(imports) > 40  # the guard read the real package
    found = crossings(imports)
    assert not found, "imports across the process folders:\n" + "\n".join(found)


def test_the_guard_sees_every_kind_of_crossing_and_lets_the_launcher_import_both(tmp_path):
    files = {
        "__init__.py": "",
        "main.py": "from fully_async_policy.driver.trainer import T\n"
        "from fully_async_policy.rollouter import actor\n",
        "messages.py": "from fully_async_policy.driver import trainer\n",
        "deadlines.py": "from fully_async_policy import main\n",
        "driver/__init__.py": "",
        "driver/trainer.py": "from fully_async_policy import messages\n"
        "def f():\n    from ..rollouter.actor import A\n",
        "rollouter/__init__.py": "",
        "rollouter/actor.py": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import fully_async_policy.driver.trainer\n",
    }
    for name, text in files.items():
        (tmp_path / PACKAGE / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / PACKAGE / name).write_text(text)
    found = sorted(line.split(" ", 1)[1] for line in crossings(package_imports(tmp_path)))
    assert found == [
        "fully_async_policy.deadlines (shared) -> fully_async_policy.main (launcher)",
        "fully_async_policy.driver.trainer (driver) -> fully_async_policy.rollouter.actor "
        "(rollouter)",
        "fully_async_policy.messages (shared) -> fully_async_policy.driver (driver)",
        "fully_async_policy.messages (shared) -> fully_async_policy.driver.trainer (driver)",
        "fully_async_policy.rollouter.actor (rollouter) -> fully_async_policy.driver.trainer "
        "(driver)",
    ]
