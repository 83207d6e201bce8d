"""The embedded broker's KRaft cluster id: what ``kafka-storage format -t`` accepts."""

from __future__ import annotations

import base64

from app.kafka.broker import new_cluster_id


def test_a_cluster_id_never_reads_as_an_option() -> None:
    # one plain draw in 64 starts with "-", which kafka-storage's argument parser takes for an option
    ids = [new_cluster_id() for _ in range(5000)]
    assert [i for i in ids if i.startswith("-")] == []
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
