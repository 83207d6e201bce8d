"""Shared fixtures: a real embedded Kafka broker per test, settings pointed at it,
and bounded helpers to read topics. Nothing here mocks Kafka."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.broker import EmbeddedBroker
from app.config import PROJECT_ROOT, Settings
from app.topics import ensure_topics

DATASETS = (PROJECT_ROOT / "../shared/datasets").resolve()
NAB_MACHINE_TEMP = DATASETS / "nab/data/realKnownCause/machine_temperature_system_failure.csv"
APACHE_LOG = DATASETS / "apache_logs/apache_logs"


def require_dataset(path: Path) -> Path:
    """Skip (with the reason) when ../shared is not beside the project."""
    if not path.exists():
        pytest.skip(f"real dataset missing: {path} (../shared must sit beside the project)")
    return path


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A fresh in-memory Tansu broker on a free loopback port, with the app's topics."""
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as b:
        asyncio.run(ensure_topics(b.bootstrap, partitions=2))
        yield b


@pytest.fixture
def settings(broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    return make_settings(tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap)


def make_settings(tmp_path: Path, **env: str) -> Settings:
    base = {
        "APP_DATA_DIR": str(tmp_path / "data"),
        "APP_KAFKA_IDEMPOTENCE": "off",
        "APP_PARTITIONS": "2",
    }
    base.update(env)
    return Settings.from_env(base)


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess under test: the venv's python, unbuffered output."""
    env = dict(os.environ)
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env
