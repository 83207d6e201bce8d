"""Shared fixtures: one real Apache Kafka broker for the whole session, reset to the app's
empty topics before each test that uses it, settings pointed at it, and bounded helpers to
read topics. Nothing here mocks Kafka. Tests that stop, kill or restart a broker start their
own with :func:`own_broker`."""

from __future__ import annotations

from app.runtime import native

native.activate()  # the suite runs on the compiled hot path when a current build exists

import asyncio  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient  # noqa: E402
from aiokafka.errors import GroupCoordinatorNotAvailableError, GroupLoadInProgressError  # noqa: E402

from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.broker import KafkaBroker  # noqa: E402
from app.runtime.settings import CHATTY_LOGGERS, ONCE_LOGGERS, PROJECT_ROOT, Settings  # noqa: E402

DATASETS = (PROJECT_ROOT / "../shared/datasets").resolve()
NAB_MACHINE_TEMP = DATASETS / "nab/data/realKnownCause/machine_temperature_system_failure.csv"
APACHE_LOG = DATASETS / "apache_logs/apache_logs"


def require_dataset(path: Path) -> Path:
    """Skip (with the reason) when ../shared is not beside the project."""
    if not path.exists():
        pytest.skip(f"real dataset missing: {path} (../shared must sit beside the project)")
    return path


@pytest.fixture(scope="session")
def session_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The session's Apache Kafka broker (single-node KRaft, its log dir in a temp dir)."""
    with KafkaBroker(tmp_path_factory.mktemp("kafka"), heap="1g") as b:
        yield b


async def reset_topics(bootstrap: str, partitions: int = 2) -> None:
    """Delete every topic but Kafka's internal ones, then create the app's topics anew: each
    test starts on an empty cluster, as with a broker of its own. The group coordinator drops
    the committed offsets of deleted topics, so no group resumes from an earlier test's offsets
    (``test_a_reset_forgets_committed_offsets``)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20_000)
    await admin.start()
    try:
        topics = [t for t in await admin.list_topics() if not t.startswith("__")]
        if topics:
            await admin.delete_topics(topics, timeout_ms=20_000)
        deadline = time.monotonic() + 20
        while topics and set(topics) & set(await admin.list_topics()):
            if time.monotonic() > deadline:
                raise AssertionError(f"topics not deleted within 20 s: {topics}")
            await asyncio.sleep(0.05)
        # the coordinator drops the deleted topics' offsets a moment later (after transactional
        # offset commits, up to a second later): wait for it, or a group could resume from them
        while left := [g for g in await _groups(admin) if await _committed(admin, g)]:
            if time.monotonic() > deadline:
                raise AssertionError(f"committed offsets of deleted topics still there after 20 s: {left}")
            await asyncio.sleep(0.05)
    finally:
        await admin.close()
    await ensure_topics(bootstrap, partitions=partitions)


async def _groups(admin: AIOKafkaAdminClient) -> list[str]:
    """The groups, asked again while the coordinator loads (a broker the last test restarted)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            listed = await admin.list_consumer_groups()
            return [g[0] if isinstance(g, tuple) else g.group_id for g in listed]
        except (GroupLoadInProgressError, GroupCoordinatorNotAvailableError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _committed(admin: AIOKafkaAdminClient, group: str) -> bool:
    return any(meta.offset >= 0 for meta in (await admin.list_consumer_group_offsets(group)).values())


@pytest.fixture
def broker(session_broker: KafkaBroker) -> KafkaBroker:
    """The session's broker, emptied: only the app's topics (2 partitions each), no groups."""
    if not session_broker.running():
        session_broker.start()  # a test stopped it by mistake: the rest of the session still runs
    asyncio.run(reset_topics(session_broker.bootstrap))
    return session_broker


@contextmanager
def own_broker(home: Path, *, topics: bool = True) -> Iterator[KafkaBroker]:
    """A broker of the test's own, for tests that stop, kill or restart it; stopped at the end."""
    b = KafkaBroker(home, heap="512m").start()
    try:
        if topics:
            asyncio.run(ensure_topics(b.bootstrap, partitions=2))
        yield b
    finally:
        b.stop()


@pytest.fixture
def settings(broker: KafkaBroker, tmp_path: Path) -> Settings:
    return make_settings(tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap)


def make_settings(tmp_path: Path, **env: str) -> Settings:
    base = {
        "APP_DATA_DIR": str(tmp_path / "data"),
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


@pytest.fixture
def library_logging() -> Iterator[None]:
    """The loggers ``quiet_libraries`` changes as a process starts them (an earlier test in
    this process may have set up a role's logging); as they were, after."""
    chosen = [logging.getLogger(name) for name in (*CHATTY_LOGGERS, *ONCE_LOGGERS)]
    before = [(lg, lg.level, list(lg.filters)) for lg in chosen]
    for lg in chosen:
        lg.setLevel(logging.NOTSET)
        lg.filters[:] = []
    yield
    for lg, level, filters in before:
        lg.setLevel(level)
        lg.filters[:] = filters
