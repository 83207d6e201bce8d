"""A worker handed an assignment that names it at another URL takes its partitions
(``agents.assignor``): Faust's own assignor asserts, inside aiokafka's group routine, and the
worker read nothing (a static member back on another state port before its session ended).
It then asks the group to join again, for the others to learn its URL
(tests/agents/test_static_membership.py shows the rebalance and the forwarded queries)."""

from __future__ import annotations

import logging
import zlib

import faust
import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from faust.assignor import PartitionAssignor
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata

from agents.assignor import OwnURLAssignor, assigned_url

OLD, NEW = "http://127.0.0.1:40001", "http://127.0.0.1:40002"
TOPIC = "rule-state-changelog"


def handed(url: str) -> ConsumerProtocolMemberAssignment:
    """An assignment of no partition that names its member at ``url``, with a second member."""
    meta = ClientMetadata(
        assignment=ClientAssignment(actives={}, standbys={}),
        url=url,
        changelog_distribution={url: {TOPIC: [0, 1]}, "http://peer:1": {TOPIC: [2]}},
    )
    return ConsumerProtocolMemberAssignment(0, [], zlib.compress(meta.dumps()))


class Asking(OwnURLAssignor):
    """The worker's assignor, counting its requests to join the group again (no consumer here)."""

    asked = 0

    def ask_the_group_again(self) -> None:
        self.asked += 1


def assignor(kind: type[PartitionAssignor]) -> PartitionAssignor:
    app = faust.App("test-assignor", broker="kafka://127.0.0.1:1", web_enabled=False, canonical_url=NEW)
    return kind(app, replicas=0)


def test_an_assignment_naming_the_worker_elsewhere_is_taken_under_its_own_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(AssertionError):  # Faust's own: what stopped the group routine
        assignor(PartitionAssignor).on_assignment(handed(OLD))
    mine = assignor(Asking)
    assert isinstance(mine, Asking)
    with caplog.at_level(logging.WARNING, logger="agents.assignor"):
        mine.on_assignment(handed(OLD))
    assert mine.table_metadata(TOPIC) == {NEW: {TOPIC: [0, 1]}, "http://peer:1": {TOPIC: [2]}}
    assert f"names it at {OLD}, not {NEW}" in caplog.text
    assert ClientMetadata.loads(mine.metadata(set()).user_data).url == NEW  # what it tells the group
    assert mine.asked == 1  # and it asks the group to join again, for the others to learn it
    caplog.clear()
    mine.on_assignment(handed(NEW))  # its own URL: as Faust's, and nothing said
    assert assigned_url(handed(NEW)) == NEW and caplog.text == ""
    assert mine.asked == 1
