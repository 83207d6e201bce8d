"""The local file system of a local session (``jobs.local_fs``): Hadoop's, with each new file's
permission set in the JVM instead of by a ``chmod`` process. The fork count itself is asserted
with the checkpoints (``test_session.py``); here, what it writes and how it is built."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs import local_fs


def test_a_local_session_uses_it_for_file_paths(spark: SparkSession, tmp_path: Path) -> None:
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(tmp_path.as_uri())
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    assert fs.getClass().getName() == local_fs.CLASS


def test_files_it_writes_get_the_permissions_hadoop_gives_them(spark: SparkSession, tmp_path: Path) -> None:
    """Hadoop creates files 0666 and folders 0777 less its umask (022 by default): so does
    the class, without Hadoop's ``chmod`` (an archive writes Parquet files this way)."""
    out = tmp_path / "parquet"
    spark.range(20).withColumn("part", F.col("id") % 2).write.partitionBy("part").parquet(str(out))
    files = [p for p in out.rglob("*") if p.is_file()]
    folders = [out, *(p for p in out.rglob("*") if p.is_dir())]
    assert any(p.suffix == ".parquet" for p in files) and any(p.name.endswith(".crc") for p in files), files
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o644}
    assert {stat.S_IMODE(p.stat().st_mode) for p in folders} == {0o755}


def test_it_is_built_once_into_the_jars_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APP_JARS_CACHE", str(tmp_path))
    built = local_fs.jar()
    assert built is not None and built.parent == tmp_path / "local-fs", built
    first = built.stat().st_mtime_ns
    assert local_fs.jar() == built and built.stat().st_mtime_ns == first  # found, not built again
    assert local_fs.conf() == {
        "spark.driver.extraClassPath": str(built),
        "spark.executor.extraClassPath": str(built),
        "spark.hadoop.fs.file.impl": local_fs.CLASS,
    }


def test_without_javac_spark_keeps_hadoops_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APP_JARS_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert local_fs.jar() is None
    assert local_fs.conf() == {}
    assert not list(tmp_path.rglob("*.jar"))
