"""The registry follower: every worker reads the registry tables (``tables.devices``,
``tables.watchlists``) whole before it evaluates any event, then keeps following them."""

from __future__ import annotations

import logging

from agents.metrics import TABLE_ROWS_REFUSED
from agents.runtime import Runtime
from app.errors import IngestDecodeError
from app.kafka.clients import high_watermarks, make_consumer
from app.runtime.settings import Settings
from app.tables import TABLES, refused_row

logger = logging.getLogger(__name__)


async def follow_tables(settings: Settings, rt: Runtime) -> None:
    """Read every registry table topic from the start, then keep following it."""
    topics = [t.topic for t in TABLES.values()]
    by_topic = {t.topic: t.name for t in TABLES.values()}
    logger.info("loading registry tables from %s", ", ".join(topics))
    marks = await high_watermarks(settings, topics)
    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        consumer.assign(list(marks))
        await consumer.seek_to_beginning(*marks)
        pending = {tp for tp, end in marks.items() if end > 0}
        if not pending:
            logger.info("registry tables are empty; evaluating")
            rt.tables_ready.set()
        while True:
            batch = await consumer.getmany(timeout_ms=500)
            for tp, records in batch.items():
                for r in records:
                    try:
                        rt.tables.apply(by_topic[tp.topic], (r.key or b"").decode(), r.value)
                    except (IngestDecodeError, ValueError) as exc:
                        TABLE_ROWS_REFUSED.labels(by_topic[tp.topic]).inc()
                        logger.warning(refused_row(tp.topic, tp.partition, r.offset, exc))
            for tp in list(pending):  # the position: it passes transaction markers, never returned
                if await consumer.position(tp) >= marks[tp]:
                    pending.discard(tp)
            if not pending and not rt.tables_ready.is_set():
                logger.info("registry tables loaded: %s", {n: len(v) for n, v in rt.tables.rows.items()})
                rt.tables_ready.set()
    finally:
        await consumer.stop()
