"""The evaluator's hot path compiled with mypyc, loaded only while it matches the sources.

The modules in :data:`MODULES` (the rule evaluator, its kinds, expressions,
aggregates, event decoding and alert building) are plain typed Python. ``make run``,
``make test`` and the Dockerfile compile them with mypyc (``python -m app native
build``) into ``build/native/<key>/``, with a manifest of the hash of every source
file the compiled code was built from: the modules themselves and every ``app``
module they import, transitively.

When ``app`` is imported, :func:`activate` checks that manifest against the files
on disk and the running interpreter. Only if all of them match does it install a
finder that loads the compiled modules in place of the ``.py`` files. Any edit to
one of those files, and the whole set runs as Python again until the next build,
so a stale build never runs. ``APP_NATIVE=0`` forces Python.

The compiled code gives the same results: the test suite runs on it, and the rule
and conformance tests run once more on plain Python (``make test``). Three things
differ in compiled code, and the code here is written for them:

* a ``float`` annotation converts an int to a float (mypy counts int as a float), so a
  value that must stay an int is annotated ``int | float`` or ``Any``;
* its classes take no Python subclasses, and patching one of their methods does not
  reach compiled callers;
* its closures cannot be pickled, so a rule travels to Spark's workers as its model
  and is compiled again there (``CompiledRule.__reduce__``).
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = "manifest.json"
#: the modules compiled together (one mypyc group: they call each other natively)
MODULES = (
    "app.alerts",
    "app.events",
    "app.placement",
    "app.rules.aggregates",
    "app.rules.evaluator",
    "app.rules.expr",
    "app.rules.lifecycle",
    "app.rules.functions",
    "app.rules.template",
    "app.rules.timebound",
    "app.rules.logic.base",
    "app.rules.logic.events",
    "app.rules.logic.reorder",
    "app.rules.logic.threshold",
    "app.rules.logic.windows",
    "app.rules.statekey",
)
#: the group's shared library is the top-level module ``app_native__mypyc``
GROUP = "app_native"
#: the extension modules a build holds, each loaded in place of its ``.py`` file
EXTENSIONS = (*MODULES, f"{GROUP}__mypyc")
ENV = "APP_NATIVE"

#: the build in use, or why there is none (see :func:`status`)
_active: Path | None = None
_reason = "not checked"


def _abi() -> str:
    """What a compiled module is bound to: the interpreter's ABI and the platform."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    return f"{sys.implementation.cache_tag} {suffix} {sysconfig.get_platform()}"


def _module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported(path: Path) -> set[str]:
    """The ``app`` modules a source file imports (absolute imports: the codebase's style)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n == "app" or n.startswith("app.")}


def sources(root: Path = ROOT) -> list[str]:
    """The files the compiled code depends on, relative to ``root``: the modules, every
    ``app`` module they import (transitively) and the packages holding them."""
    seen: set[str] = set()
    todo = list(MODULES)
    files: set[Path] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages above it
        path = _module_file(root, name)
        if path is not None and path not in files:
            files.add(path)
            todo += sorted(_imported(path))
    return sorted(str(p.relative_to(root)) for p in files)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest(root: Path = ROOT) -> dict[str, object]:
    """What a build is made from: the interpreter, the modules and each source file's hash."""
    return {
        "abi": _abi(),
        "modules": list(MODULES),
        "files": {rel: _digest(root / rel) for rel in sources(root)},
    }


def _key(found: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()[:16]


def extension_path(directory: Path, name: str) -> Path:
    """Where the build in ``directory`` keeps the compiled module ``name``: its package path
    with this interpreter's extension suffix (``app/rules/expr.cpython-312-x86_64-linux-gnu.so``)."""
    return directory.joinpath(*name.split(".")).with_name(
        name.rsplit(".", 1)[-1] + str(sysconfig.get_config_var("EXT_SUFFIX"))
    )


def _builds(root: Path) -> Path:
    return root / "build" / "native"


def current(root: Path = ROOT) -> tuple[Path | None, str]:
    """The build that matches the sources under ``root`` and this interpreter, or None and why."""
    builds = _builds(root)
    found = sorted(builds.glob(f"*/{MANIFEST}")) if builds.is_dir() else []
    if not found:
        return None, "not built (make native)"
    try:
        want = manifest(root)
    except (OSError, SyntaxError) as exc:
        return None, f"cannot read the sources: {exc}"
    for path in found:
        try:
            have = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(have, dict) or {k: v for k, v in have.items() if k != "key"} != want:
            continue
        directory = path.parent
        if all(extension_path(directory, m).is_file() for m in EXTENSIONS):
            return directory, f"compiled ({len(MODULES)} modules, build {directory.name})"
    return None, "out of date: the sources changed since the last build (make native)"


class _Finder(importlib.abc.MetaPathFinder):
    """Loads the compiled modules of one build in place of their ``.py`` files."""

    def __init__(self, directory: Path) -> None:
        self.files = {name: extension_path(directory, name) for name in EXTENSIONS}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def activate() -> bool:
    """Load the compiled modules from now on, if a build matches; called as ``app`` is imported."""
    global _active, _reason
    if _active is not None:
        return True
    if os.environ.get(ENV, "1").strip().lower() in {"0", "false", "no", "off"}:
        _reason = f"{ENV}=0"
        return False
    directory, why = current()
    _reason = why
    if directory is None:
        return False
    sys.meta_path.insert(0, _Finder(directory))
    _active = directory
    return True


def active() -> bool:
    """Whether the compiled modules load in place of the ``.py`` files in this process."""
    return _active is not None


def status() -> str:
    """One line for logs and benchmarks: whether the hot path runs compiled, and if not why.
    (``app`` activates before any of its modules loads, so the modules all come from one side.)"""
    return _reason if _active is not None else f"plain Python: {_reason}"


def build(root: Path = ROOT, *, quiet: bool = False) -> int:
    """Compile :data:`MODULES` into ``build/native/<key>`` unless that build exists (idempotent;
    concurrent builds wait for each other).

    Returns 0 when a current build exists afterwards or no C compiler is installed (the
    system then runs on plain Python, and says so); 1 when the compile itself failed.
    """
    (root / "build").mkdir(exist_ok=True)
    with (root / "build" / "native.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(root, quiet=quiet)


def _build(root: Path, *, quiet: bool) -> int:
    builds = _builds(root)
    want = manifest(root)
    key = _key(want)
    target = builds / key
    if (target / MANIFEST).is_file():
        if not quiet:
            print(f"native: build {key} is current")
        return 0
    compiler = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        print(f"native: no C compiler ({compiler}); the evaluator runs as plain Python", file=sys.stderr)
        return 0
    try:
        import mypyc  # noqa: F401 - a build-time tool, from requirements-dev.txt
    except ImportError:
        print("native: mypyc is not installed (requirements-dev.txt); plain Python", file=sys.stderr)
        return 0
    shutil.rmtree(builds, ignore_errors=True)  # older builds can never match again
    work = builds / f".{key}.tmp"
    work.mkdir(parents=True)
    script = (
        "import sys\n"
        "from setuptools import setup\n"
        "from mypyc.build import mypycify\n"
        "out, paths = sys.argv[1], sys.argv[2:]\n"
        "setup(name='app-native', packages=[], py_modules=[],\n"
        "      script_args=['build_ext', '--build-lib', out + '/lib', '--build-temp', out + '/temp'],\n"
        f"      ext_modules=mypycify(paths, group_name={GROUP!r}, target_dir=out + '/c'))\n"
    )
    paths = [str(_module_file(root, m).relative_to(root)) for m in MODULES]  # type: ignore[union-attr]
    log = builds / "build.log"
    if not quiet:
        print(f"native: compiling {len(MODULES)} modules with mypyc (about 1-2 minutes; log {log})")
    with log.open("wb") as out:
        done = subprocess.run(  # noqa: S603 - our interpreter on our own files
            # mypy's options ride with the paths: a cache of its own, so that `make test` can
            # type-check (.mypy_cache) while this builds
            [sys.executable, "-c", script, str(work), *paths, "--cache-dir", str(work / "mypy")],
            cwd=root, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-20:]
        print("native: the mypyc build failed; its log ends:\n" + "\n".join(tail), file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
        return 1
    (work / "lib" / MANIFEST).write_text(json.dumps({**want, "key": key}, indent=1, sort_keys=True))
    (work / "lib").rename(target)
    shutil.rmtree(work, ignore_errors=True)
    if not quiet:
        print(f"native: build {key} ready")
    return 0
