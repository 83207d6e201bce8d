"""Faust's aiokafka transport with exact high watermarks for changelog recovery.

Faust recovers a table by reading its changelog up to the high watermark it
gets from ListOffsets(latest). The embedded Tansu broker answers that with
the base offset of the last record batch plus one, so when several state
updates went out in one batch, recovery stopped early and a restarted worker
lost window and lifecycle state. This consumer thread also reads the true
high watermark from a Fetch response (:func:`app.kafka.high_watermarks`)
and uses the larger value; on Apache Kafka both agree.

These are subclasses wired in by :class:`RulesApp`; nothing in Faust is patched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer, Transport
from faust.types import TP, TransportT

from app.kafka import high_watermarks

logger = logging.getLogger(__name__)


class ExactHighwaterConsumerThread(AIOKafkaConsumerThread):
    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        listed = dict(await super()._highwaters(partitions))
        if not partitions:
            return listed
        bootstrap = ",".join(f"{u.host}:{u.port}" for u in self.app.conf.broker_consumer)
        marks = await high_watermarks(bootstrap, sorted({tp.topic for tp in partitions}))
        for tp in partitions:
            exact = marks.get(tp)
            if exact is not None and exact > (listed.get(tp) or 0):
                logger.debug("high watermark of %s: %d (ListOffsets said %s)", tp, exact, listed.get(tp))
                listed[tp] = exact
        return listed


class ExactHighwaterConsumer(Consumer):
    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return ExactHighwaterConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ExactHighwaterTransport(Transport):
    Consumer = ExactHighwaterConsumer


class RulesApp(faust.App):
    """The rule worker's Faust app: standard, except the consumer transport above."""

    def _new_transport(self) -> TransportT:
        transport: TransportT = ExactHighwaterTransport(self.conf.broker_consumer, self)
        return transport
