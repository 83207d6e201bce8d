"""Static membership's one hazard: two live workers with one ``APP_WORKER_INSTANCE_ID``.

The broker gives a static member's place to the last worker that joined with its id, and tells
the one it replaced that it is no longer a member. aiokafka then joins again, with the same id,
and takes the place back: two workers with one id fenced each other about once a second, each
restoring its partitions every time, with no error anywhere (measured: 3,700 log lines per
worker in 45 s). The worker that finds its place taken stops instead, saying why
(:meth:`agents.transport.BatchConsumer.on_partitions_revoked`): the newest keeps the place.

A static member's id in the group is its instance id, ``-``, then a UUID (the broker's own
naming); aiokafka's DescribeGroups (up to v3) does not carry the instance id itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, NamedTuple

#: what the broker appends to a static member's instance id to name the member
MEMBER_SUFFIX = re.compile(r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Member(NamedTuple):
    member_id: str
    client_host: str


def members_of(described: Iterable[Any], group: str) -> list[Member]:
    """The members of ``group`` in DescribeGroups responses (aiokafka's raw ones)."""
    return [
        Member(str(m[0]), str(m[2]))
        for response in described
        for g in response.groups
        if g[1] == group
        for m in g[5]
    ]


def twin(instance: str, mine: str, members: Iterable[Member]) -> Member | None:
    """A member that holds ``instance`` under another member id than ``mine`` (this worker's
    at its last join), if one does."""
    for m in members:
        if (
            m.member_id != mine
            and m.member_id.startswith(instance)
            and MEMBER_SUFFIX.fullmatch(m.member_id[len(instance) :])
        ):
            return m
    return None


def twin_message(instance: str, other: Member) -> str:
    return (
        f"APP_WORKER_INSTANCE_ID={instance!r}: another worker joined the group with this id "
        f"(member {other.member_id} from {other.client_host}) and took this worker's place; "
        "each worker needs an id of its own (docs/worker.md). This worker stops."
    )
