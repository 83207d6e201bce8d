"""The rule worker's Prometheus metrics (served on ``APP_METRICS_PORT``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

EVENTS = Counter("worker_events_total", "Events consumed by the rule worker", ["source"])
RULE_EVENTS = Counter(
    "worker_rule_events_total",
    "Events a rule evaluated: its source's valid events that reached it (not held or refused for "
    "their time, not skipped for a missing registry row), before its where",
    ["rule"],
)
RULE_MATCHED = Counter(
    "worker_rule_matched_total",
    "Events a rule evaluated whose where was TRUE (all of them without where)",
    ["rule"],
)
RULE_ERRORS = Counter(
    "worker_rule_errors_total",
    "Evaluations of a rule that raised (a bug, or a state it cannot read): each is logged with its "
    "traceback, and the rule goes on with the next event",
    ["rule"],
)
DLQ_EVENTS = Counter("worker_dlq_total", "Invalid events sent to the dead-letter topic", ["source"])
ALERTS_OUT = Counter("worker_alerts_total", "Alert transitions produced", ["rule", "status"])
LATE = Counter("worker_late_events_total", "Events a stateful rule could not use (late)", ["source"])
ROUTED = Counter("worker_routed_total", "Events routed by branch rules", ["topic"])
RELOADS = Counter("worker_rule_reloads_total", "Rule reloads", ["outcome"])
RULES = Gauge("worker_rules", "Rules loaded")
MERGE_WAITING = Gauge(
    "worker_merge_waiting_records",
    "Fetched records of a source topic, or forwards of a regroup topic, waiting for the lagging "
    "source partitions (agents.merge)",
    ["topic"],
)
MERGE_FORCED = Counter(
    "worker_merge_forced_total",
    "Records a source topic's merge (or forwards a regroup topic's) let go before the lagging "
    "partitions showed their time (held 1 s, 30 s on the regroup side, or past 50,000 waiting): "
    "a regrouped stream may meet them out of order",
    ["topic"],
)
MERGE_PAUSED = Gauge(
    "worker_merge_paused_partitions",
    "Partitions of a source topic whose fetch is paused: too many of their forwards wait on a "
    "regroup partition for a lagging source partition (agents.merge, APP_REGROUP_MAX_WAITING)",
    ["topic"],
)
TABLE_ROWS_REFUSED = Counter(
    "worker_table_rows_refused_total",
    "Records of a registry table's topic the worker refused (not JSON, a row the registry loader "
    "would refuse, or a record key that is not the row's key): the table keeps its earlier row "
    "for that key, and the log names the record's offset and the problem",
    ["table"],
)
MERGE_UNCONFIRMED = Counter(
    "worker_merge_unconfirmed_total",
    "Source partitions another worker last told caught up whose end the regroup side found beyond "
    "the offset it had told, or never told of whose end was beyond where the group starts them "
    "(their worker stopped or hung with records waiting): the forwards after their time wait for "
    "them (agents.merge.RegroupMerge.confirm)",
    ["topic"],
)
REFORWARDED = Counter(
    "worker_regroup_replayed_total",
    "Events a regrouped stream dropped because it had evaluated or taken them in already: "
    "forwarded again when their source batch was read again after a crash (agents.wiring)",
    ["source"],
)
REREAD = Counter(
    "worker_replayed_total",
    "Source records the rules on a source's own partitions had evaluated already, dropped: read "
    "again after a crash between a commit's states and its offsets (agents.wiring)",
    ["source"],
)
CONSUME_LAG = Histogram(
    "worker_consume_lag_seconds", "From a record's timestamp to the start of its batch's evaluation",
    ["source"], buckets=(1e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)  # fmt: skip
STATE_TOO_LARGE = Counter(
    "worker_state_too_large_total",
    "State writes kept out of the changelog: larger than a Kafka record may be",
    ["rule"],
)
RETIRED = Counter(
    "worker_retired_states_total",
    "States of rules no longer running (removed or edited) deleted at a rule change, by what "
    "became of their open episode: ended (its alert ended), quiet (none open), unended (open, "
    "but the rule's record was missing: end it by hand)",
    ["outcome"],
)
BATCH_SECONDS = Histogram(
    "worker_batch_seconds", "Time to decode and evaluate one batch of events with every rule", ["source"],
    buckets=(1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.5),
)  # fmt: skip
REBALANCES = Counter(
    "worker_rebalances_total",
    "Rebalances of the worker group that revoked this worker's partitions, after its first join "
    "(a static member's restart causes none: docs/worker.md)",
)
REBALANCE_SECONDS = Histogram(
    "worker_rebalance_seconds",
    "From a revocation of this worker's partitions to their new assignment: a time it evaluates nothing",
    buckets=(0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0),
)
