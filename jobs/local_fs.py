"""A local file system for Spark's JVM that sets permissions without a ``chmod`` process.

Without Hadoop's native library (the pyspark wheel ships none), Hadoop's local file system
sets the permission of each file it creates and each folder it makes by forking the JVM to
run ``chmod``. A streaming micro-batch creates several: its offset-log and commit-log
entries, a delta file and its checksum per state-store partition; the archive each Parquet
file. ``deps/local-fs/NioLocalFileSystem.java`` is Hadoop's ``LocalFileSystem`` with those
permissions set through ``java.nio`` in the JVM instead: the same bits, no process.

:func:`jar` compiles it once against the Hadoop client of the pyspark wheel (``javac``,
which Java 17's JDK has) into ``.cache/jars/local-fs/``, under a name that holds the
source's and that client's hash, so a new pyspark or a changed source builds it again.
``make jars`` builds it ahead (``python -m jobs.local_fs``); a session finds it there.
Without ``javac`` there is no jar, and Spark keeps Hadoop's own file system: correct, with a
process per file (said at INFO when a session starts).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from app.runtime.settings import PROJECT_ROOT

logger = logging.getLogger(__name__)

SOURCE = PROJECT_ROOT / "deps" / "local-fs" / "NioLocalFileSystem.java"
#: the class Hadoop's ``fs.file.impl`` names
CLASS = "streamalert.hadoop.NioLocalFileSystem"
FILE_IMPL = "spark.hadoop.fs.file.impl"
COMPILE_TIMEOUT_S = 120


def cache_dir() -> Path:
    """Where the jar goes: beside the other JVM artifacts (``APP_JARS_CACHE``, as ``make jars``)."""
    raw = os.environ.get("APP_JARS_CACHE")
    return (Path(raw) if raw else PROJECT_ROOT / ".cache" / "jars") / "local-fs"


def hadoop_client() -> Path | None:
    """The Hadoop client jar of the installed pyspark, which the class is compiled against."""
    import pyspark

    found = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    return found[-1] if found else None


def _target(client: Path) -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + client.name.encode()).hexdigest()[:12]
    return cache_dir() / f"nio-local-fs-{digest}.jar"


def jar(build: bool = True) -> Path | None:
    """The compiled jar, built first when it is not there and ``build``; None when it cannot
    be (no ``javac``, no Hadoop client in pyspark, or the compiler failed: logged)."""
    client = hadoop_client()
    if client is None or not SOURCE.is_file():
        return None
    target = _target(client)
    if target.is_file() or not build:
        return target if target.is_file() else None
    javac = shutil.which("javac")
    if javac is None:
        logger.info("no javac: Spark's local file system starts a chmod process per file it creates")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        classes = Path(tmp) / "classes"
        done = subprocess.run(  # noqa: S603 - our own source, no shell
            [javac, "--release", "17", "-nowarn", "-d", str(classes), "-cp", str(client), str(SOURCE)],
            capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            logger.warning("cannot compile %s: %s", SOURCE, done.stderr.strip()[-2000:])
            return None
        staged = Path(tmp) / target.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as out:
            for path in sorted(classes.rglob("*.class")):
                out.write(path, path.relative_to(classes).as_posix())
        os.replace(staged, target)  # atomic: a concurrent build leaves one whole jar
    for old in target.parent.glob("nio-local-fs-*.jar"):
        if old != target:
            old.unlink(missing_ok=True)
    return target


def conf() -> dict[str, str]:
    """The session settings that put the jar on the class path of the driver and of the
    executors and make it the ``file:`` scheme's file system; empty without the jar."""
    built = jar()
    if built is None:
        return {}
    return {
        "spark.driver.extraClassPath": str(built),
        "spark.executor.extraClassPath": str(built),
        FILE_IMPL: CLASS,
    }


def main() -> int:
    """``python -m jobs.local_fs``: build the jar (``make jars``); say where it is."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if jar(build=False) is not None:
        return 0  # built before: nothing to say, like the fetch of the other jars
    built = jar()
    print(f"built {built}" if built else "the local file system's jar is not built (see above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
