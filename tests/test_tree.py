"""The shape of tests/ (docs/testing.md): no test module imports another test module or a
private name of the project, and a top-level ``tests/test_*.py`` tests a module at the top of
``app/``; tests of a module in a sub-package of app live in the mirroring folder
(``app/kafka/wait.py`` -> ``tests/kafka/test_wait.py``). Shared pieces live in ``conftest.py``
files (fixtures) and helper modules (``helpers.py``, ``harness.py``, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

from app.runtime.settings import PROJECT_ROOT


def _is_test_module(dotted: str) -> bool:
    return dotted.split(".")[0] == "tests" and dotted.rsplit(".", 1)[-1].startswith("test_")


def _project_module(root: Path, dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of the project under ``root`` (not tests)."""
    if dotted.split(".")[0] == "tests":
        return False
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _absolute(file: Path, root: Path, node: ast.ImportFrom) -> str:
    """The absolute module of a ``from ... import`` in ``file`` (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = list(file.relative_to(root).with_suffix("").parts[:-1])
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _private_read(node: ast.AST) -> tuple[ast.expr, str] | None:
    """What ``node`` reads a private name off, and the name: ``x._name``, or
    ``setattr(x, "_name", ...)`` (also ``getattr``, ``delattr`` and ``monkeypatch.setattr``)."""
    if isinstance(node, ast.Attribute) and _private(node.attr):
        return node.value, node.attr
    if isinstance(node, ast.Call) and len(node.args) >= 2:
        func, name = node.func, node.args[1]
        called = (
            func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        )
        if called in {"setattr", "getattr", "delattr"} and isinstance(name, ast.Constant):
            if isinstance(name.value, str) and _private(name.value):
                return node.args[0], name.value
    return None


def import_problems(root: Path) -> list[str]:
    """``path:line: what`` for each import of a test module, and each private name of the
    project imported or read off a project module, in the Python files under ``root/tests``."""
    problems: list[str] = []
    for file in sorted((root / "tests").rglob("*.py")):
        tree = ast.parse(file.read_text(), str(file))
        where = file.relative_to(root)
        modules: dict[str, str] = {}  # local name -> project module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_test_module(alias.name):
                        problems.append(f"{where}:{node.lineno}: imports the test module {alias.name}")
                    if _project_module(root, alias.name):
                        local = alias.asname or alias.name.split(".")[0]
                        modules[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom):
                module = _absolute(file, root, node)
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    if _is_test_module(module) or _is_test_module(full):
                        problems.append(f"{where}:{node.lineno}: imports the test module {full}")
                    elif _project_module(root, module) and _private(alias.name):
                        problems.append(f"{where}:{node.lineno}: imports the private name {full}")
                    if _project_module(root, full):
                        modules[alias.asname or alias.name] = full
        for node in ast.walk(tree):
            found = _private_read(node)
            if found is None:
                continue
            owner, name = found
            dotted = []
            while isinstance(owner, ast.Attribute):
                dotted.append(owner.attr)
                owner = owner.value
            if isinstance(owner, ast.Name) and owner.id in modules:
                full = ".".join([modules[owner.id], *reversed(dotted)])
                if _project_module(root, full):
                    problems.append(f"{where}:{node.lineno}: reads the private name {full}.{name}")
    return sorted(set(problems))


def placement_problems(root: Path) -> list[str]:
    """Top-level ``tests/test_<name>.py`` files whose name (or a ``_``-separated start of it)
    is a module or package inside a sub-package of ``root/app`` and not a module at the top
    of ``app/``: their tests belong in the folder that mirrors that sub-package."""
    app = root / "app"
    top = {p.stem for p in app.glob("*.py")}
    nested: dict[str, Path] = {}
    for package in sorted(p.parent for p in app.glob("*/**/__init__.py")):
        nested.setdefault(package.name, package)
        for module in package.glob("*.py"):
            if not module.stem.startswith("__"):
                nested.setdefault(module.stem, module)
    problems = []
    for test in sorted((root / "tests").glob("test_*.py")):
        words = test.stem.removeprefix("test_").split("_")
        starts = ["_".join(words[:n]) for n in range(1, len(words) + 1)]
        if any(s in top for s in starts):
            continue
        for s in starts:
            if s in nested:
                home = nested[s].relative_to(app)
                folder = "/".join(home.parts[:-1] if home.suffix else home.parts)
                problems.append(f"tests/{test.name} names app/{home}: it belongs under tests/{folder}/")
                break
    return problems


def test_no_test_module_imports_another_or_a_private_name() -> None:
    assert import_problems(PROJECT_ROOT) == []


def test_top_level_tests_are_about_the_top_of_app() -> None:
    assert placement_problems(PROJECT_ROOT) == []


def test_the_checks_find_what_they_forbid(tmp_path: Path) -> None:
    for path, text in {
        "app/__init__.py": "",
        "app/alerts.py": "_CACHE = {}\n",
        "app/kafka/__init__.py": "",
        "app/kafka/wait.py": "def _probe(): ...\n",
        "app/cli/__init__.py": "",
        "app/cli/alerts.py": "",
        "tests/__init__.py": "",
        "tests/helpers.py": "X = 1\n",
        "tests/test_alerts.py": "import app.alerts as alerts\nassert alerts._CACHE == {}\n",
        "tests/test_kafka_wait.py": "from app.kafka.wait import _probe\nfrom tests.helpers import X\n",
        "tests/kafka/__init__.py": "",
        "tests/kafka/test_wait.py": "from tests.test_kafka_wait import X\nfrom . import test_other\n",
        "tests/kafka/test_other.py": (
            "from app.kafka import wait\nimport tests.test_alerts\n"
            "def f(monkeypatch):\n    monkeypatch.setattr(wait, '_probe', None)\n"
        ),
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert import_problems(tmp_path) == [
        "tests/kafka/test_other.py:2: imports the test module tests.test_alerts",
        "tests/kafka/test_other.py:4: reads the private name app.kafka.wait._probe",
        "tests/kafka/test_wait.py:1: imports the test module tests.test_kafka_wait.X",
        "tests/kafka/test_wait.py:2: imports the test module tests.kafka.test_other",
        "tests/test_alerts.py:2: reads the private name app.alerts._CACHE",
        "tests/test_kafka_wait.py:1: imports the private name app.kafka.wait._probe",
    ]
    assert placement_problems(tmp_path) == [
        "tests/test_kafka_wait.py names app/kafka: it belongs under tests/kafka/"
    ]
