"""Settings read once from the environment into a frozen, typed pydantic model.

Every variable is documented in docs/configuration.md; ``ENV_DOCS`` below holds each
one's default and meaning, and tests/test_docs.py checks that the page lists every variable
the code reads. Parse errors name the variable and the expected form. Secrets are
:class:`pydantic.SecretStr`: they never appear in a repr, a log line or an error, and a
caller reads one with ``.get_secret_value()`` where it signs or verifies.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from app.errors import ConfigError
from app.kafka.auth import AUTH_ENV_DOCS, KafkaAuth
from app.rules.durations import parse_duration

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: Public demo values: fine on one machine, refused with APP_ENV=production.
DEMO_WEBHOOK_SECRET = "whsec_ZGVtby1zZWNyZXQtY2hhbmdlLW1lLWluLXByb2R1Y3Rpb24="  # noqa: S105 - public demo value
DEMO_COMMAND_SECRET = "demo-command-secret-change-me-in-production"  # noqa: S105 - public demo value

#: a value of APP_WORKER_INSTANCE_ID (Kafka's own limit on a group member's name is wider;
#: this keeps it to what a log line, a file name and a pod name all take)
INSTANCE_ID = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: the values of APP_PROCESSING_GUARANTEE
PROCESSING_GUARANTEES = ("at_least_once", "exactly_once")

# name -> (default, description). The default "" means unset.
ENV_DOCS: dict[str, tuple[str, str]] = {
    "KAFKA_BOOTSTRAP_SERVERS": (
        "",
        "Kafka cluster to use. Unset: `make run` starts the embedded Apache Kafka broker "
        "(single-node KRaft, log dir under APP_DATA_DIR) on loopback and passes its address to every role.",
    ),
    **AUTH_ENV_DOCS,
    "APP_PARTITIONS": (
        "4",
        "Partitions for each event and alert topic created. The rule worker refuses to start when "
        "an existing source topic has another count.",
    ),
    "APP_REPLICATION_FACTOR": ("1", "Replication factor for created topics."),
    "APP_WORKER_BATCH": (
        "2000",
        "Most records the rule worker evaluates in one call before it sends their alerts: of one "
        "fetched partition batch, or of a source's partitions merged by time (a fetch can hold "
        "thousands; smaller keeps alert latency lower under backlog, larger costs less per event: "
        "500 took 5-20 % more CPU per event than 2,000).",
    ),
    "APP_REGROUP_MAX_WAITING": (
        "50000",
        "Most forwards a regroup partition holds while it merges the source partitions' events "
        "by time (rules grouped by another field than the topic key, after a backlog or with "
        "several workers). From 40 % of it the worker pauses the source partitions that race "
        "ahead, until under 20 %; past it the oldest go on out of order. At least 2 x "
        "APP_WORKER_BATCH.",
    ),
    "APP_STATE_RECORD_MAX_BYTES": (
        "998976",
        "Largest rule state (one rule and group, as JSON) the rule worker writes to its changelog; "
        "a larger one stays in memory only and is logged. At most the producer's request size "
        "(1,000,000) less 1,024.",
    ),
    "APP_KAFKA_IDEMPOTENCE": (
        "on",
        "`on` or `off`: the idempotent producer (with acks=all) in every role. Off only for a "
        "cluster that refuses InitProducerId (an ACL without IdempotentWrite).",
    ),
    "APP_PROCESSING_GUARANTEE": (
        "at_least_once",
        "`at_least_once` or `exactly_once`: the rule worker's delivery guarantee. `exactly_once` "
        "commits each second's alerts, DLQ and routed records, rule state and input offsets in one "
        "Kafka transaction per input partition (readers of `alerts` read committed records only); it "
        "needs the idempotent producer. See docs/exactly-once.md for the cost and the default.",
    ),
    "APP_WORKER_INSTANCE_ID": (
        "",
        "This rule worker's static member id in its Kafka consumer group (letters, digits, `.`, "
        "`_`, `-`; at most 249), unique per worker and kept across its restarts (a StatefulSet's "
        "pod name). Set, a restarted worker takes its predecessor's partitions at once and the "
        "other workers go on: no rebalance; a stopped one keeps its partitions for the session "
        "timeout (APP_WORKER_SESSION_TIMEOUT). Unset: dynamic membership. `make run` sets it. "
        "See docs/worker.md.",
    ),
    "APP_WORKER_SESSION_TIMEOUT": (
        "10s",
        "How long the rule worker's consumer group waits for a silent worker before it gives its "
        "partitions to the others (a duration, 6s to 30m: the broker's default bounds). With "
        "APP_WORKER_INSTANCE_ID, make it longer than a worker's restart takes (a pod's, with its "
        "image pull), so that the restart costs no rebalance; a dead worker that no one restarts "
        "then leaves its partitions unread that long, and regrouped rules wait for it as long.",
    ),
    "APP_DATA_DIR": (".data", "Where durable local state lives: alert store, Faust data, checkpoints."),
    "APP_RULES_DIR": ("rules", "Directory of rule files (`*.yaml` or `*.yml`, in any case)."),
    "APP_ROUTES_FILE": (
        "config/routes.yaml",
        "The dispatcher's routes and receivers file (routing tree, grouping, inhibition, delivery).",
    ),
    "APP_DATASETS_DIR": ("../shared/datasets", "The real datasets used by the demo replays."),
    "APP_WEBHOOK_URL": (
        "",
        "Where alert webhooks go. Unset under `make run`: the local demo receiver.",
    ),
    "APP_WEBHOOK_SECRET": (
        DEMO_WEBHOOK_SECRET,
        "Standard Webhooks signing secret (`whsec_` + base64). `make run` makes one per data dir; "
        "APP_ENV=production refuses this demo default.",
    ),
    "APP_COMMAND_SECRET": (
        DEMO_COMMAND_SECRET,
        "Key of the HMAC that signs operator commands (acks, silences); the dispatcher and the alert "
        "store apply only commands signed with it. `make run` makes one per data dir; "
        "APP_ENV=production refuses this demo default.",
    ),
    "APP_ENV": (
        "development",
        "`development` or `production`. Production refuses the demo webhook and command secrets.",
    ),
    "APP_WEBHOOK_ALLOW_PRIVATE": (
        "",
        "Comma-separated hosts, `host:port`s or CIDRs a webhook may reach although private or loopback "
        "(a bare host or CIDR allows every port; see docs/security.md).",
    ),
    "APP_EXTERNAL_URL": (
        "",
        "Base URL of the dashboard, for absolute links in webhooks (`generatorURL`, `externalURL`). "
        "Unset under `make run`: the local dashboard.",
    ),
    "APP_DASHBOARD_PORT": ("8501", "Streamlit dashboard port (0 picks a free one)."),
    "APP_RECEIVER_PORT": ("0", "Demo webhook receiver port (0 picks a free one)."),
    "APP_REPLAY_SPEEDUP": (
        "3000",
        "Event-time speed-up of the demo replays and simulators (3000: five minutes of data every 100 ms).",
    ),
    "APP_REPLAY_LIMIT": ("25000", "Upper bound on events per demo replay."),
    "APP_MAX_EVENT_SKEW": (
        "5m",
        "How far ahead an event's time may be (a duration, or `off`): of the wall clock at live ingest, "
        "of its partition's clock in the rule worker and backtests, unless a second event confirms the "
        "jump. Beyond it the event goes to `dlq.events` with the reason (docs/event-time.md).",
    ),
    "APP_MAX_EVENT_AGE": (
        "off",
        "How far behind the wall clock an event's time may be at live ingest (a duration such as `7d`, "
        "or `off`); older events go to `dlq.events`. Off: each rule's `allowed_lateness` decides.",
    ),
    "APP_METRICS_PORT": ("0", "Prometheus /metrics port of a role (0: none; the supervisor assigns one)."),
    "APP_LOG_LEVEL": ("INFO", "Log level of every role."),
    "APP_SPARK_KAFKA_FORMAT": (
        "kafka",
        "Spark engine's Kafka source: `kafka` (Spark's connector, `make jars`) or `kafka_py` (built in).",
    ),
    "APP_SPARK_DECODE": (
        "python",
        "Spark engine's decoding: `python` (the worker's decoder, compiled) or `jvm` (records it keeps "
        "unchanged decoded in Spark SQL; measured no faster on two cores, docs/spark.md).",
    ),
    "APP_SPARK_BACKTEST_PLANS": (
        "evaluator",
        "Spark backtests' plans: `evaluator` (every rule through the evaluator's own code per stream "
        "partition) or `native` (the kinds Spark SQL reproduces exactly computed in the JVM, over every "
        "core; measured 1.5 times as long on two cores, docs/spark.md).",
    ),
    "APP_SPARK_STREAM_SPLIT": (
        "1",
        "Parts each stream partition of the Spark engine's query is split in (1 to 16; 1: not split), so "
        "that a stream runs on more cores than its topic has partitions. A new checkpoint records it; an "
        "existing one keeps its own. Measured no faster on two cores (docs/spark.md).",
    ),
    "APP_SPARK_LOG_LEVEL": ("WARN", "Log level of the Spark JVM."),
}


def _get(env: Mapping[str, str], name: str) -> str:
    return env.get(name, ENV_DOCS[name][0])


def env_choice(name: str, choices: Mapping[str, str], env: Mapping[str, str] | None = None) -> str:
    """``name``'s value in ``env`` (default: the process environment; unset or blank: its
    documented default), one of ``choices`` (value -> what it means); any other is refused
    with a :class:`ConfigError` naming the variable and each choice."""
    value = (os.environ if env is None else env).get(name, "").strip() or ENV_DOCS[name][0]
    if value not in choices:
        expected = " or ".join(f"{choice} ({meaning})" for choice, meaning in choices.items())
        msg = f"{name}={value!r}: expected {expected}"
        raise ConfigError(msg)
    return value


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    raw = _get(env, name)
    try:
        value = int(raw)
    except ValueError:
        msg = f"{name}={raw!r}: expected a whole number"
        raise ConfigError(msg) from None
    if value < minimum:
        msg = f"{name}={raw!r}: expected a number >= {minimum}"
        raise ConfigError(msg)
    return value


def _float(env: Mapping[str, str], name: str) -> float:
    raw = _get(env, name)
    try:
        value = float(raw)
    except ValueError:
        msg = f"{name}={raw!r}: expected a number"
        raise ConfigError(msg) from None
    if value <= 0:
        msg = f"{name}={raw!r}: expected a number > 0"
        raise ConfigError(msg)
    return value


def _duration_ms(env: Mapping[str, str], name: str) -> int:
    """A duration (``5m``, ``7d``) in milliseconds, or -1 for ``off``."""
    raw = _get(env, name).strip()
    if raw.lower() == "off":
        return -1
    try:
        return parse_duration(raw)
    except ValueError as exc:
        msg = f"{name}={raw!r}: {exc}, or off"
        raise ConfigError(msg) from None


#: the broker's default bounds of a group member's session (group.min/max.session.timeout.ms)
SESSION_BOUNDS_MS = (6_000, 1_800_000)


def _session_ms(env: Mapping[str, str]) -> int:
    name, (low, high) = "APP_WORKER_SESSION_TIMEOUT", SESSION_BOUNDS_MS
    raw = _get(env, name).strip()
    try:
        ms = parse_duration(raw)
    except ValueError as exc:
        msg = f"{name}={raw!r}: {exc}"
        raise ConfigError(msg) from None
    if not low <= ms <= high:
        msg = f"{name}={raw!r}: expected 6s to 30m (the broker's bounds of a member's session)"
        raise ConfigError(msg)
    return ms


def _path(env: Mapping[str, str], name: str) -> Path:
    p = Path(_get(env, name))
    return p if p.is_absolute() else (PROJECT_ROOT / p).resolve()


class Settings(BaseModel):
    """Process-wide settings. Build with :meth:`from_env`; frozen (``model_copy(update=...)``
    makes a changed copy)."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    bootstrap_servers: str
    partitions: int
    replication_factor: int
    worker_batch: int
    state_record_max_bytes: int
    idempotence: str
    regroup_max_waiting: int = 50_000
    processing_guarantee: str
    #: APP_WORKER_INSTANCE_ID; "" is dynamic membership
    worker_instance_id: str = ""
    #: APP_WORKER_SESSION_TIMEOUT in milliseconds
    worker_session_ms: int = 10_000
    data_dir: Path
    rules_dir: Path
    routes_file: Path
    datasets_dir: Path
    webhook_url: str
    webhook_secret: SecretStr
    webhook_allow_private: tuple[str, ...]
    external_url: str
    dashboard_port: int
    receiver_port: int
    replay_speedup: float
    replay_limit: int
    metrics_port: int
    log_level: str
    kafka_auth: KafkaAuth = Field(default_factory=KafkaAuth)
    command_secret: SecretStr = SecretStr(DEMO_COMMAND_SECRET)
    env: str = "development"
    #: APP_MAX_EVENT_SKEW and APP_MAX_EVENT_AGE in milliseconds; -1: off
    max_event_skew_ms: int = -1
    max_event_age_ms: int = -1

    @property
    def embedded(self) -> bool:
        """True when no external cluster is configured."""
        return not self.bootstrap_servers

    @property
    def enable_idempotence(self) -> bool:
        """Idempotent producer on (the default) or off."""
        return self.idempotence == "on"

    @property
    def exactly_once(self) -> bool:
        """The rule worker commits its outputs, state and offsets in Kafka transactions."""
        return self.processing_guarantee == "exactly_once"

    @property
    def store_path(self) -> Path:
        return self.data_dir / "alerts.sqlite3"

    @property
    def dispatch_path(self) -> Path:
        """The dispatcher's state file (groups, notification log, silences, acks, outbox)."""
        return self.data_dir / "dispatch.sqlite3"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        idem = _get(env, "APP_KAFKA_IDEMPOTENCE").lower()
        if idem not in {"on", "off"}:
            msg = f"APP_KAFKA_IDEMPOTENCE={idem!r}: expected on or off"
            raise ConfigError(msg)
        guarantee = _get(env, "APP_PROCESSING_GUARANTEE").strip().lower()
        if guarantee not in PROCESSING_GUARANTEES:
            msg = f"APP_PROCESSING_GUARANTEE={guarantee!r}: expected at_least_once or exactly_once"
            raise ConfigError(msg)
        if guarantee == "exactly_once" and idem != "on":
            msg = "APP_PROCESSING_GUARANTEE=exactly_once needs APP_KAFKA_IDEMPOTENCE=on"
            raise ConfigError(msg)
        level = _get(env, "APP_LOG_LEVEL").upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            msg = f"APP_LOG_LEVEL={level!r}: expected DEBUG, INFO, WARNING, ERROR or CRITICAL"
            raise ConfigError(msg)
        allow = tuple(h.strip() for h in _get(env, "APP_WEBHOOK_ALLOW_PRIVATE").split(",") if h.strip())
        batch, waiting = (
            _int(env, "APP_WORKER_BATCH", minimum=1),
            _int(env, "APP_REGROUP_MAX_WAITING", minimum=1),
        )
        if waiting < 2 * batch:  # a round forwards up to a batch before its progress markers
            msg = (
                f"APP_REGROUP_MAX_WAITING={waiting}: expected at least 2 x APP_WORKER_BATCH ({2 * batch}); "
                "a regroup partition holds a round's forwards before its markers"
            )
            raise ConfigError(msg)
        instance = _get(env, "APP_WORKER_INSTANCE_ID").strip()
        if instance and not INSTANCE_ID.fullmatch(instance):
            msg = (
                f"APP_WORKER_INSTANCE_ID={instance!r}: expected letters, digits, '.', '_' or '-', "
                "at most 249 characters"
            )
            raise ConfigError(msg)
        return cls(
            bootstrap_servers=_get(env, "KAFKA_BOOTSTRAP_SERVERS").strip(),
            partitions=_int(env, "APP_PARTITIONS", minimum=1),
            replication_factor=_int(env, "APP_REPLICATION_FACTOR", minimum=1),
            worker_batch=batch,
            state_record_max_bytes=_int(env, "APP_STATE_RECORD_MAX_BYTES", minimum=1024),
            regroup_max_waiting=waiting,
            idempotence=idem,
            processing_guarantee=guarantee,
            worker_instance_id=instance,
            worker_session_ms=_session_ms(env),
            data_dir=_path(env, "APP_DATA_DIR"),
            rules_dir=_path(env, "APP_RULES_DIR"),
            routes_file=_path(env, "APP_ROUTES_FILE"),
            datasets_dir=_path(env, "APP_DATASETS_DIR"),
            webhook_url=_get(env, "APP_WEBHOOK_URL").strip(),
            webhook_secret=SecretStr(_get(env, "APP_WEBHOOK_SECRET")),
            webhook_allow_private=allow,
            external_url=_get(env, "APP_EXTERNAL_URL").strip().rstrip("/"),
            dashboard_port=_int(env, "APP_DASHBOARD_PORT"),
            receiver_port=_int(env, "APP_RECEIVER_PORT"),
            replay_speedup=_float(env, "APP_REPLAY_SPEEDUP"),
            replay_limit=_int(env, "APP_REPLAY_LIMIT", minimum=1),
            metrics_port=_int(env, "APP_METRICS_PORT"),
            log_level=level,
            kafka_auth=KafkaAuth.from_env(env),
            command_secret=SecretStr(_get(env, "APP_COMMAND_SECRET")),
            env=_environment(env),
            max_event_skew_ms=_duration_ms(env, "APP_MAX_EVENT_SKEW"),
            max_event_age_ms=_duration_ms(env, "APP_MAX_EVENT_AGE"),
        )


def _environment(env: Mapping[str, str]) -> str:
    """``APP_ENV``; in production, the demo secrets are refused with the variable named."""
    name = _get(env, "APP_ENV").strip().lower()
    if name not in {"development", "production"}:
        msg = f"APP_ENV={name!r}: expected development or production"
        raise ConfigError(msg)
    if name == "production":
        for var, demo in (
            ("APP_WEBHOOK_SECRET", DEMO_WEBHOOK_SECRET),
            ("APP_COMMAND_SECRET", DEMO_COMMAND_SECRET),
        ):
            value = _get(env, var)
            if value == demo or len(value) < 16:
                msg = (
                    f"{var}: APP_ENV=production needs a secret of your own (at least 16 characters), "
                    "not the demo value"
                )
                raise ConfigError(msg)
    return name


#: libraries whose INFO lines may say what they must not: httpx's "HTTP Request: POST <url>"
#: per request is the whole URL of a webhook whose secret is in its path (Slack's, Teams',
#: Discord's). The project logs each delivery itself, with the receiver's name
#: (``app.roles.delivery``). Their warnings and errors still show
CHATTY_LOGGERS = ("httpx", "httpcore")
#: loggers whose INFO lines are said once per process: aiokafka's "Authenticated as <user> via
#: <mechanism>" at every connection (a dozen per role at a start, more at each reconnection);
#: the first one names the role's principal
ONCE_LOGGERS = ("aiokafka.conn",)
#: the most distinct lines :class:`FirstTimeOnly` remembers (past it, it forgets them all)
ONCE_MAX = 1000


class FirstTimeOnly(logging.Filter):
    """Lets an INFO line or below through the first time its text is said; warnings and
    errors always."""

    def __init__(self) -> None:
        super().__init__()
        self._said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        text = record.getMessage()
        if text in self._said:
            return False
        if len(self._said) >= ONCE_MAX:
            self._said.clear()
        self._said.add(text)
        return True


def quiet_libraries(level: int | str) -> None:
    """Raise :data:`CHATTY_LOGGERS` to WARNING, and say the INFO lines of :data:`ONCE_LOGGERS`
    once; at DEBUG, let them say everything (as before any call)."""
    numeric = level if isinstance(level, int) else logging.getLevelName(level.upper())
    debug = isinstance(numeric, int) and numeric <= logging.DEBUG
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if debug else logging.WARNING)
    for name in ONCE_LOGGERS:
        chosen = logging.getLogger(name)
        once = [f for f in chosen.filters if isinstance(f, FirstTimeOnly)]
        if debug:
            for f in once:
                chosen.removeFilter(f)
        elif not once:
            chosen.addFilter(FirstTimeOnly())


def setup_logging(level: str = "INFO") -> None:
    """Configure the root logger once per process, one line per record."""
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s",
    )
    quiet_libraries(level)
