"""Guard: nothing in a run imports the tools (``recipe/tools/``); read from the source with ``ast``.

The library is every module of ``recipe/`` outside ``recipe/tools/``, of ``fully_async_policy/``
and of ``one_step_off/``. A tool (a benchmark, the planner, a report, a study, a data or model
preparation command, the export) may import the library; the library never imports a tool, so a
reader of a run skips ``recipe/tools/`` and a tool can change without touching a run.

Every import counts: at module level, inside functions and under ``if TYPE_CHECKING:``. So does
a string constant that is a tool's import path (``"recipe.tools.x"`` or ``"recipe.tools.x:name"``,
the form the library's registries and ``importlib`` take); prose that mentions a tool's command
(``python -m recipe.tools.models``) is no import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = "recipe.tools"
LIBRARY_PACKAGES = ("recipe", "fully_async_policy", "one_step_off")
_IMPORT_PATH = re.compile(r"recipe\.tools(\.\w+)*(:\w+(\.\w+)*)?")


def library_files(root: Path) -> list[Path]:
    """Every module of the library under ``root`` (the tools' folder left out)."""
    files = (p for pkg in LIBRARY_PACKAGES for p in sorted((root / pkg).rglob("*.py")))
    tools = root / TOOLS.replace(".", "/")
    return [p for p in files if not p.is_relative_to(tools)]


def _module_name(file: Path, root: Path) -> str:
    parts = file.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_tool(module: str) -> bool:
    return module == TOOLS or module.startswith(TOOLS + ".")


def _imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> list[str]:
    """The modules ``node`` names: ``from a import b`` names ``a``, and ``a.b`` too when it
    may be a submodule (``from recipe import tools``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        parts = importer.split(".") if is_package else importer.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, node.module] if node.module else parts)
    return [base] if _is_tool(base) else [base, *(f"{base}.{a.name}" for a in node.names)]


def tool_imports(root: Path) -> list[str]:
    """``file:line: what`` for each import of a tool by a library module under ``root``."""
    found = []
    for file in library_files(root):
        importer = _module_name(file, root)
        where = file.relative_to(root)
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = _imported(node, importer, file.name == "__init__.py")
                tools = sorted({n for n in names if _is_tool(n)})
                if tools:
                    found.append(f"{where}:{node.lineno}: {importer} imports {', '.join(tools)}")
            elif isinstance(node, ast.Constant) and _IMPORT_PATH.fullmatch(str(node.value)):
                found.append(f"{where}:{node.lineno}: {importer} names {node.value!r}")
    return found


def test_no_library_module_imports_a_tool():
    files = library_files(REPO)
    assert len(files) > 100  # the guard read the real packages
    assert not any(f.is_relative_to(REPO / "recipe" / "tools") for f in files)
    found = tool_imports(REPO)
    assert not found, "the library imports the tools (recipe/tools/):\n" + "\n".join(found)


def test_the_tools_folder_holds_the_commands():
    """The commands docs/architecture.md lists under ``recipe/tools/`` are there, and none is
    left at its old place in the library."""
    tools = REPO / "recipe" / "tools"
    for name in ("bench", "plan", "report", "study", "prepare"):
        assert (tools / name / "__init__.py").is_file(), name
    assert (tools / "models.py").is_file() and (tools / "export.py").is_file()
    old = ["recipe/bench", "recipe/plan", "recipe/report", "recipe/study", "recipe/data/prepare"]
    old += ["recipe/export.py", "recipe/models/__main__.py"]
    assert [p for p in old if (REPO / p).exists()] == []


# ---- the guard itself, on a small tree -------------------------------------------------------


def test_the_guard_sees_every_form_of_import_of_a_tool(tmp_path):
    files = {
        "recipe/__init__.py": "",
        "recipe/tools/__init__.py": "",
        "recipe/tools/bench.py": "from recipe.run import go\n",  # a tool may import the library
        "recipe/run/__init__.py": "from ..tools import bench\n",
        "recipe/run/lazy.py": "def f():\n    import recipe.tools.bench\n",
        "recipe/run/typed.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from recipe import tools\n"
        ),
        "recipe/run/registry.py": 'PLUGINS = {"b": "recipe.tools.bench:Bench"}\n',
        "recipe/run/prose.py": '"""Run ``python -m recipe.tools.bench`` to measure."""\n',
        "fully_async_policy/__init__.py": "from recipe.tools.bench import X\n",
        "one_step_off/__init__.py": "import recipe.run\n",
    }
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    assert sorted(tool_imports(tmp_path)) == [
        "fully_async_policy/__init__.py:1: fully_async_policy imports recipe.tools.bench",
        "recipe/run/__init__.py:1: recipe.run imports recipe.tools",
        "recipe/run/lazy.py:2: recipe.run.lazy imports recipe.tools.bench",
        "recipe/run/registry.py:1: recipe.run.registry names 'recipe.tools.bench:Bench'",
        "recipe/run/typed.py:3: recipe.run.typed imports recipe.tools",
    ]
