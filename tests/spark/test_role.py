"""`python -m app spark` as a `make run` role: SIGTERM to its process group (what the
supervisor sends) stops it cleanly, and without Spark rules it idles without a JVM."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from app.broker import EmbeddedBroker
from tests.conftest import child_env
from tests.procs import processes_with_env, role, wait_for
from tests.spark.test_engine import RULES

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.parametrize(
    ("engine", "ready"),
    [("both", "spark query 'rules' started"), ("faust", "the Spark engine has nothing to do")],
)
def test_sigterm_to_the_group_exits_zero_and_leaves_nothing(
    broker: EmbeddedBroker, tmp_path: Path, engine: str, ready: str
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.read_text().replace("engine: both", f"engine: {engine}"))
    data = tmp_path / "data"
    env = child_env(
        KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_DATA_DIR=str(data), APP_KAFKA_IDEMPOTENCE="off"
    )
    log = tmp_path / "spark.log"
    with role(["app", "spark", "--master", "local[2]", "--rules", str(rules)], env, log) as proc:
        wait_for(lambda: ready in log.read_text(errors="replace"), timeout_s=120, what=ready)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)  # as the supervisor stops a role
        assert proc.wait(10) == 0, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() - started < 10
    assert processes_with_env(str(data)) == []
    if engine == "faust":
        assert "spark session ready" not in log.read_text(errors="replace")  # no JVM was started
