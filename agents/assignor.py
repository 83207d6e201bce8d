"""Faust's partition assignor, taking one assignment Faust's refuses: one that names this
worker at another URL than its own.

The assignment Faust's assignor hands each member carries every member's URL (its
``canonical_url``: the interactive-query server's, ``agents.state_server``) beside its
partitions, and the member asserts that the URL is its own. A static member
(``APP_WORKER_INSTANCE_ID``) that joins again before its session ends gets its last
assignment back with no rebalance: if it came back on another URL, the assertion failed in
aiokafka's group routine, which stopped, and the worker ran on with no partition, reading
nothing (docs/worker.md, "Static membership"). Here the worker takes the partitions, which
are its own, and its own entry of the URL map moves to its URL; it says so once in its log.
Then it joins the group again (:meth:`OwnURLAssignor.ask_the_group_again`). Its metadata now
differs from the join's (it names the partitions it holds), and the broker rebalances a
stable group when a member's metadata changed (Kafka's classic group coordinator): the
leader hands every member the map with the new URL. Before, the other members kept the old
URL until some later rebalance, and their forwarded state queries to it failed until then."""

from __future__ import annotations

import logging
import zlib
from typing import Any, cast

from faust.assignor import PartitionAssignor
from faust.assignor.client_assignment import ClientMetadata
from yarl import URL

logger = logging.getLogger(__name__)


def assigned_url(assignment: Any) -> str:
    """The URL an assignment (aiokafka's ``ConsumerProtocolMemberAssignment``) names its member at."""
    return str(ClientMetadata.loads(zlib.decompress(assignment.user_data)).url)


class OwnURLAssignor(PartitionAssignor):
    #: the URL of the assignment being taken, when it is not this worker's (else None)
    _handed: str | None = None

    @property
    def _url(self) -> URL:  # Faust's own reads it: for the assignment being taken, its URL
        return URL(self._handed) if self._handed else self.app.conf.canonical_url

    def on_assignment(self, assignment: Any) -> None:
        mine, given = str(self.app.conf.canonical_url), assigned_url(assignment)
        if given == mine:
            super().on_assignment(assignment)
            return
        logger.warning(
            "the group handed this worker the assignment of its last join, which names it at %s, "
            "not %s (a static member back on another URL before its session ended): its partitions "
            "are taken, and it joins the group again for the others to learn its URL",
            given, mine,
        )  # fmt: skip
        self._handed = given
        try:
            super().on_assignment(assignment)
        finally:
            self._handed = None
        hosts = dict(self.changelog_distribution)
        if given in hosts:
            hosts[mine] = hosts.pop(given)
            self.changelog_distribution = hosts
        self.ask_the_group_again()

    def ask_the_group_again(self) -> None:
        """Have the worker's consumer join the group again at its group routine's next turn
        (``agents.transport.BatchConsumer.rejoin_group``): a rebalance, for the other members
        to be handed this worker's URL."""
        cast(Any, self.app.consumer).rejoin_group()
