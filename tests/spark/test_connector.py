"""Where Spark's Kafka connector comes from: the fetched jars match the pinned pyspark and
add nothing pyspark already ships, and a missing connector is a clear error (no Spark here)."""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest

from jobs import connector

#: what deps/spark-kafka/pom.xml must leave after its exclusions: what pyspark/jars lacks
EXPECTED = {
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
}


def artifact(jar: Path) -> tuple[str, str]:
    """``kafka-clients-3.9.2.jar`` -> ``("kafka-clients", "3.9.2")``."""
    m = re.fullmatch(r"(.+?)-(\d+\.[\w.\-]*)\.jar", jar.name)
    assert m, jar.name
    return m.group(1), m.group(2)


@pytest.fixture
def fetched() -> list[Path]:
    jars = connector.jars()
    if not jars:
        pytest.skip(f"connector jars not fetched into {connector.jars_dir()}: run `make jars`")
    return jars


def test_the_fetched_jars_are_the_connector_in_pysparks_version_and_only_what_pyspark_lacks(
    fetched: list[Path],
) -> None:
    names = dict(artifact(j) for j in fetched)
    assert set(names) == EXPECTED
    assert names["spark-sql-kafka-0-10_2.13"] == pyspark.__version__  # requirements.txt's pin
    assert names["kafka-clients"].startswith("3.")  # the connector's client; speaks to Kafka 4.x brokers
    shipped = {artifact(j)[0] for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert shipped & set(names) == set()
    assert "scala-library" in shipped and "hadoop-client-api" in shipped  # the exclusions' reason


def test_the_jars_folder_can_be_overridden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(connector.JARS_ENV, str(tmp_path))
    (tmp_path / "kafka-clients-3.9.2.jar").touch()
    assert connector.jars_dir() == tmp_path
    assert connector.jars() == []  # without the connector itself the folder does not count
    (tmp_path / "spark-sql-kafka-0-10_2.13-4.2.0.jar").touch()
    assert [j.name for j in connector.jars()] == [
        "kafka-clients-3.9.2.jar",
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    ]


def test_the_kafka_format_without_the_jars_says_how_to_fetch_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(connector.JARS_ENV, str(tmp_path / "none"))
    connector.require("kafka_py")  # the fallback needs no jar
    with pytest.raises(connector.ConnectorMissingError) as err:
        connector.require("kafka")
    assert "scripts/fetch-jars.sh spark-kafka" in str(err.value) and str(tmp_path / "none") in str(err.value)
    assert "APP_SPARK_KAFKA_FORMAT=kafka_py" in str(err.value)
