"""A live worker ends the alerts of the rules it no longer runs (:mod:`app.rules.retire`): an
edit during the run, a removal while it was stopped. The real broker, the worker a real
process, exactly-once; no event comes after the rule changes (the sweep runs on quiet
partitions too)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from app.alerts import alert_id
from app.kafka.broker import KafkaBroker
from tests.agents.worker_helpers import role_env
from tests.kafka_helpers import produce, wait_for_json
from tests.procs import role

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RULE = """rules:
  - id: too-hot
    source: sensors
    where: temperature > {limit}
    group_by: [device_id]
    severity: critical
    annotations: {{summary: "{{{{ device_id }}}} at {{{{ temperature }}}}"}}
"""


def reading(device: str, minute: int, temperature: float) -> tuple[bytes, bytes]:
    body = {"device_id": device, "ts": f"2024-01-01T00:{minute:02d}:00Z", "temperature": temperature}
    return device.encode(), orjson.dumps(body)


def test_the_worker_resolves_the_alerts_of_an_edited_and_of_a_removed_rule(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "hot.yaml").write_text(RULE.format(limit=100))
    env = role_env(broker, tmp_path, APP_RULES_DIR=str(rules), APP_PROCESSING_GUARANTEE="exactly_once")

    def alerts(n: int, what: str) -> list[dict]:
        return wait_for_json(broker.bootstrap, "alerts", n, timeout_s=90, what=what)

    with role(["agents", "worker", "--loglevel", "info"], env, tmp_path / "worker-1.log"):
        produce(broker.bootstrap, "events.sensors", [reading("d1", 0, 101.0)])
        (fired,) = alerts(1, "the first version's alert")
        assert fired["status"] == "firing"
        (rules / "hot.yaml").write_text(RULE.format(limit=200))  # an edit: a new rule version
        ended = alerts(2, "its resolution after the edit")[1]
        produce(broker.bootstrap, "events.sensors", [reading("d2", 5, 250.0)])
        again = alerts(3, "the edited rule's own alert")[2]

    (rules / "hot.yaml").unlink()  # removed while the worker is down
    with role(["agents", "worker", "--loglevel", "info"], env, tmp_path / "worker-2.log"):
        gone = alerts(4, "the resolution of the removed rule's alert")[3]

    for end, began in ((ended, fired), (gone, again)):
        assert end["status"] == "resolved" and end["fingerprint"] == began["fingerprint"]
        assert end["starts_at"] == began["starts_at"] and end["rule_version"] == began["rule_version"]
        assert end["alert_id"] == alert_id("too-hot", began["fingerprint"], began["starts_at"], "resolved")
    assert (again["status"], again["labels"]["device_id"]) == ("firing", "d2")
    assert again["rule_version"] != fired["rule_version"]
    assert "edited" in ended["annotations"]["retired"]
    assert "no longer runs" in gone["annotations"]["retired"]
    assert ended["ends_at"] == "2024-01-01T00:00:00.000Z"  # the partition's clock: d1's reading
    assert len(alerts(4, "no more")) == 4
