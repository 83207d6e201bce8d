"""Where Spark's Kafka connector (``format("kafka")``) comes from: local jars, never Maven at run time.

``scripts/fetch-jars.sh spark-kafka`` (``make jars``) copies the connector of
``deps/spark-kafka/pom.xml`` and what the pyspark wheel lacks of its runtime
dependencies into ``.cache/jars/spark-kafka``: ``spark-sql-kafka-0-10``,
``spark-token-provider-kafka-0-10``, ``kafka-clients`` and ``commons-pool2``.
``APP_SPARK_KAFKA_JARS`` names another folder. :func:`jobs.session.build_session`
passes the files to Spark in ``spark.jars`` (docs/spark-kafka.md).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from app.errors import ConfigError
from app.runtime.settings import PROJECT_ROOT

logger = logging.getLogger(__name__)

JARS_ENV = "APP_SPARK_KAFKA_JARS"
CONNECTOR_JAR = "spark-sql-kafka-0-10_2.13-*.jar"
FORMAT_ENV = "APP_SPARK_KAFKA_FORMAT"


class ConnectorMissingError(ConfigError):
    """``format("kafka")`` is wanted but Spark's Kafka connector jars are not there."""


def jars_dir() -> Path:
    """The folder of the connector's jars (``APP_SPARK_KAFKA_JARS``, else ``.cache/jars/spark-kafka``)."""
    raw = os.environ.get(JARS_ENV)
    return Path(raw) if raw else PROJECT_ROOT / ".cache" / "jars" / "spark-kafka"


def jars() -> list[Path]:
    """The connector's jars, sorted; empty when the connector itself is not among them."""
    folder = jars_dir()
    if not any(folder.glob(CONNECTOR_JAR)):
        return []
    return sorted(folder.glob("*.jar"))


def require(fmt: str) -> None:
    """Refuse the ``kafka`` format without the jars, before a JVM is started for nothing."""
    if fmt == "kafka" and not jars():
        raise missing()


def missing() -> ConnectorMissingError:
    """The error for a ``kafka`` read without the jars: what is missing and the command to fetch it."""
    return ConnectorMissingError(
        f"{FORMAT_ENV}=kafka needs Spark's Kafka connector, and there is no {CONNECTOR_JAR} in "
        f"{jars_dir()}: run `scripts/fetch-jars.sh spark-kafka` (or `make jars`), point {JARS_ENV} "
        f"at a folder that holds it, or set {FORMAT_ENV}=kafka_py"
    )
