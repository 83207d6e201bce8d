"""The compiled hot path (app/runtime/native.py): it loads only while it matches the sources, and
APP_NATIVE=0 runs plain Python. `make test` builds it before the suite, so the suite runs on
it; the rule and conformance tests then run once more on plain Python."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from app.runtime import native
from app.runtime.settings import PROJECT_ROOT


def fake_build(root: Path) -> Path:
    """A build directory for the sources under ``root``: the manifest, and empty files where
    the extension modules go (enough for :func:`native.current`, which never loads them)."""
    directory = root / "build" / "native" / "k"
    for name in native.EXTENSIONS:
        path = native.extension_path(directory, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    (directory / native.MANIFEST).write_text(json.dumps({**native.manifest(root), "key": "k"}))
    return directory


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    shutil.copytree(PROJECT_ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_manifest_covers_the_modules_and_what_they_import(sources: Path) -> None:
    files = native.sources(sources)
    for name in native.MODULES:
        assert name.replace(".", "/") + ".py" in files
    # imported by compiled modules without being compiled: a change there changes their types
    assert {"app/rules/loader.py", "app/rules/compile.py", "app/rules/model.py", "app/__init__.py"} <= set(
        files
    )
    assert "app/dispatch/dispatcher.py" not in files  # not reachable from the hot path


def test_a_build_is_used_only_while_every_source_matches(sources: Path) -> None:
    directory = fake_build(sources)
    assert native.current(sources)[0] == directory
    model = sources / "app" / "rules" / "model.py"  # a dependency, not itself compiled
    model.write_text(model.read_text() + "\n# edited\n")
    found, why = native.current(sources)
    assert found is None and "out of date" in why


def test_a_build_for_another_interpreter_is_not_used(sources: Path) -> None:
    directory = fake_build(sources)
    manifest = json.loads((directory / native.MANIFEST).read_text())
    (directory / native.MANIFEST).write_text(json.dumps({**manifest, "abi": "cpython-399 .so other"}))
    assert native.current(sources)[0] is None


def test_a_build_missing_a_module_is_not_used(sources: Path) -> None:
    directory = fake_build(sources)
    next(directory.rglob(f"evaluator{sysconfig.get_config_var('EXT_SUFFIX')}")).unlink()
    assert native.current(sources)[0] is None


def test_no_build_says_so(tmp_path: Path) -> None:
    found, why = native.current(tmp_path)
    assert found is None and "not built" in why


def probe(env: dict[str, str]) -> tuple[str, str]:
    """In a fresh interpreter: where the evaluator module was loaded from, and the status line."""
    code = (
        "from app.runtime import native; native.activate(); import app.rules.evaluator as e; "
        "print(e.__file__); print(native.status())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    file, status = done.stdout.strip().splitlines()
    return file, status


def test_app_native_0_runs_plain_python() -> None:
    file, status = probe({native.ENV: "0"})
    assert file.endswith("evaluator.py")
    assert status == f"plain Python: {native.ENV}=0"


def test_a_current_build_is_what_runs() -> None:
    """`make test` builds before the suite: this process and a fresh one run the build."""
    directory, why = native.current()
    if directory is None:
        pytest.skip(f"no current build here ({why}); `make native` makes one")
    assert native.active()
    file, status = probe({native.ENV: "1"})
    assert file.startswith(str(directory)) and file.endswith(str(sysconfig.get_config_var("EXT_SUFFIX")))
    assert status.startswith(f"compiled ({len(native.MODULES)} modules")
    import app.rules.logic.windows as windows

    assert str(windows.__file__).startswith(str(directory))


DECODE_PROBE = """
import json
from app.runtime import native
native.activate()
from app.errors import AppError
from app.events import SCHEMAS
cases = [
    {"device_id": "d1", "ts": 1700000000000, "temperature": 1},
    {"device_id": "d1", "ts": "2024-01-01T00:00:00Z", "temperature": "hot"},
    {"device_id": 5, "ts": "2024-01-01T00:00:00Z", "temperature": 1.5},
    {"device_id": "d1", "ts": None, "temperature": 1.5},
    {"device_id": "d1", "ts": "garbage", "temperature": 1},
    {"device_id": "d1", "ts": "2024-01-01T00:00:00Z", "temperature": 2**70},
    {"device_id": "d1", "ts": "2024-01-01T00:00:00Z", "temperature": {"a": 1}},
    {"device_id": "d1", "ts": "2024-01-01T00:00:00+02:00", "temperature": 7, "lat": "1.5"},
    {"device_id": "d1", "ts": "2024-01-01T00:00:00Z", "lat": 999, "lon": 10},
    {"device_id": "d1", "ts": "2024-01-01T00:00:00Z", "lat": 90, "lon": -180.0},
    [1, 2],
    {"host": "h", "ts": "2024-01-01T00:00:00Z", "status": "403", "client_ip": 7},
    {"host": "h", "ts": "2024-01-01T00:00:00Z", "status": 400.0, "bytes": 1.5},
    {"symbol": "A", "ts": "2024-01-01T00:00:00Z", "close": 1, "adj_close": None, "volume": 1.0},
]
out = []
for source in ("sensors", "logs", "finance"):
    for raw in [json.dumps(c).encode() for c in cases] + [b"{not json", b"\\xff"]:
        try:
            ev = SCHEMAS[source].decode(raw)
            out.append(["ok", ev.key, ev.ts_ms, sorted((k, repr(v)) for k, v in ev.fields.items())])
        except AppError as exc:
            out.append([type(exc).__name__, str(exc)])
print(json.dumps(out))
"""


def test_bad_events_get_the_same_errors_compiled_and_plain() -> None:
    """Compiled code checks argument types where Python would not: a device's odd values
    must still end as the same decoded event or the same clear error, never a crash."""
    if native.current()[0] is None:
        pytest.skip("no current build here; `make native` makes one")
    runs = {}
    for mode in ("1", "0"):
        done = subprocess.run(
            [sys.executable, "-c", DECODE_PROBE],
            cwd=PROJECT_ROOT,
            env={**os.environ, native.ENV: mode},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        runs[mode] = json.loads(done.stdout)
    assert runs["1"] == runs["0"]
    assert sum(r[0] == "ok" for r in runs["1"]) >= 2  # the good ones decode
    assert sum(r[0] == "IngestDecodeError" for r in runs["1"]) >= 20
