"""The one place where Faust agents, topics and tables are registered.

One agent per source topic decodes each record with the source schema
(invalid records go to ``dlq.events`` with the reason, and the agent goes
on), runs the pure :class:`~app.rules.evaluator.Evaluator`, and produces every
alert transition to ``alerts`` keyed by fingerprint.

Per-key rule state lives in one Faust table per source topic, so the
table's changelog partitions line up with the topic's partitions and a
restarted or rebalanced worker resumes the state of the partitions it owns.

Delivery guarantee: at least once. Faust commits a source offset only after
the agent has finished with the record, and alert ids are deterministic, so
a replay after a crash re-emits the same ids, which downstream dedups.
"""

from __future__ import annotations

import logging
from typing import Any

import faust
from faust.types import TableT
from prometheus_client import Counter, Histogram

from app import metrics
from app.config import Settings
from app.errors import IngestDecodeError
from app.events import dlq_record, schema_for
from app.rules.evaluator import Evaluator, State
from app.rules.loader import RuleSet, load_rules
from app.topics import ALERTS, DLQ, SOURCE_TOPICS

logger = logging.getLogger(__name__)

# Group membership timings. The embedded broker holds a new group's first
# JoinGroup for the whole rebalance timeout, so a short one makes start-up fast;
# a failed worker's partitions move after SESSION_TIMEOUT_S.
REBALANCE_TIMEOUT_S = 3.0
SESSION_TIMEOUT_S = 10.0
HEARTBEAT_S = 1.0

EVENTS = Counter("worker_events_total", "Events consumed by the rule worker", ["source"])
DLQ_EVENTS = Counter("worker_dlq_total", "Invalid events sent to the dead-letter topic", ["source"])
ALERTS_OUT = Counter("worker_alerts_total", "Alert transitions produced", ["rule", "status"])
LATE = Counter("worker_late_events_total", "Events skipped as late by a stateful rule", ["source"])
EVAL_SECONDS = Histogram(
    "worker_eval_seconds",
    "Time to evaluate all rules on one event",
    ["source"],
    buckets=(1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2),
)


class TableStore:
    """A :class:`~app.rules.evaluator.StateStore` over a Faust table.

    ``put`` must run inside stream iteration: Faust writes the changelog to
    the partition of the event being processed.
    """

    def __init__(self, table: TableT[str, State]) -> None:
        self.table = table

    def get(self, key: str) -> State | None:
        value: State | None = self.table.get(key)
        return value

    def put(self, key: str, value: State) -> None:
        self.table[key] = value


def _broker_urls(bootstrap: str) -> list[str]:
    return [f"kafka://{h.strip()}" for h in bootstrap.split(",") if h.strip()]


def _register_source(
    app: faust.App, settings: Settings, source: str, topic_name: str, ruleset: RuleSet
) -> None:
    schema = schema_for(source)
    topic = app.topic(topic_name, key_serializer="raw", value_serializer="raw")
    alerts = app.topic(ALERTS, key_serializer="raw", value_serializer="raw")
    dlq = app.topic(DLQ, key_serializer="raw", value_serializer="raw")
    table = app.Table(
        f"rule-state-{source}",
        default=None,
        partitions=settings.partitions,
        key_type=str,
        help="per-(rule, group) evaluator state; JSON values, changelog-backed",
    )
    evaluator = Evaluator(ruleset, TableStore(table), engine="faust")
    events_c, dlq_c, late_c = EVENTS.labels(source), DLQ_EVENTS.labels(source), LATE.labels(source)
    timer = EVAL_SECONDS.labels(source)

    async def evaluate(stream: Any) -> None:
        async for raw in stream:
            events_c.inc()
            try:
                event = schema.decode(raw)
            except IngestDecodeError as exc:
                dlq_c.inc()
                record = dlq_record(source, exc.reason, raw, adapter="rule-worker", field=exc.field)
                await dlq.send(key=source.encode(), value=record)
                continue
            late_before = evaluator.stats.late
            with timer.time():
                transitions = evaluator.process(source, event)
            if evaluator.stats.late != late_before:
                late_c.inc()
            for alert in transitions:
                ALERTS_OUT.labels(alert.rule_id, alert.status).inc()
                await alerts.send(key=alert.fingerprint.encode(), value=alert.to_json())

    app.agent(topic, name=f"evaluate-{source}")(evaluate)


def build_app(settings: Settings | None = None, ruleset: RuleSet | None = None) -> faust.App:
    """A Faust app evaluating ``ruleset`` (default: the rules in ``settings.rules_dir``)."""
    settings = settings or Settings.from_env()
    if not settings.bootstrap_servers:
        msg = "KAFKA_BOOTSTRAP_SERVERS is not set; start the system with `make run` or point it at a cluster"
        raise SystemExit(msg)
    if ruleset is None:
        ruleset = load_rules([settings.rules_dir])
    logger.info("loaded %d rules from %s", len(ruleset.rules), settings.rules_dir)
    (settings.data_dir / "faust").mkdir(parents=True, exist_ok=True)
    app = faust.App(
        "streamalert-rules",
        broker=_broker_urls(settings.bootstrap_servers),
        store="memory://",
        datadir=str(settings.data_dir / "faust"),
        web_enabled=False,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_linger_ms=1,
        broker_commit_interval=1.0,
        broker_rebalance_timeout=REBALANCE_TIMEOUT_S,
        broker_session_timeout=SESSION_TIMEOUT_S,
        broker_heartbeat_interval=HEARTBEAT_S,
    )
    for source, topic_name in SOURCE_TOPICS.items():
        _register_source(app, settings, source, topic_name, ruleset)

    @app.task
    async def _serve_metrics() -> None:
        metrics.serve(settings.metrics_port)

    return app
