"""Options and offset arithmetic of the Kafka source, with the semantics of Spark's ``kafka`` source.

Pure code (no Spark, no network), so it is unit-tested on its own.

Offsets are per topic-partition *end-exclusive* positions: ``{"topic": {"0":
42}}`` means "partition 0 of ``topic`` is consumed up to offset 41", the same
JSON shape Spark's own Kafka source writes to its checkpoints. In a specification
(``startingOffsets``/``endingOffsets``) ``-2`` means earliest and ``-1`` latest.

Every problem with an option raises :class:`KafkaOptionError`, whose message
names the option and the accepted forms.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from app.errors import ConfigError
from app.kafka.auth import KafkaAuth, from_spark_options

logger = logging.getLogger(__name__)

EARLIEST, LATEST = -2, -1
TP = tuple[str, int]
Offsets = dict[TP, int]
Spec = str | Offsets  # "earliest" | "latest" | explicit per-partition offsets (may hold -1/-2)

ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
UNSUPPORTED = (
    "startingoffsetsbytimestamp",
    "endingoffsetsbytimestamp",
    "startingtimestamp",
    "includeheaders",
)


class KafkaOptionError(ConfigError):
    """An option of the Kafka source is missing, unknown or malformed."""


@dataclass(frozen=True)
class KafkaSourceOptions:
    """The parsed options. Exactly one of ``subscribe``, ``pattern``, ``assign`` is set."""

    bootstrap: str
    #: TLS/SASL, from the same ``kafka.*`` options as Spark's connector takes
    auth: KafkaAuth = dataclasses.field(default_factory=KafkaAuth)
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[TP, ...] = ()
    starting: Spec = "latest"
    ending: Spec = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    timeout_ms: int = 60_000
    #: ``read_committed``: aborted transactions are skipped, reads stop at the last stable offset
    isolation: str = "read_uncommitted"

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> KafkaSourceOptions:
        """Parse Spark-style options (keys case-insensitive) for a streaming or a batch read."""
        opts = {k.lower(): str(v) for k, v in options.items()}
        base = cls.subscription(opts)
        for key in UNSUPPORTED:
            if key in opts:
                msg = f"option '{key}' is not supported by the kafka_py source; use format 'kafka' for it"
                raise KafkaOptionError(msg)
        starting = parse_spec(
            opts.get("startingoffsets", "latest" if streaming else "earliest"), "startingOffsets"
        )
        ending = parse_spec(opts.get("endingoffsets", "latest"), "endingOffsets")
        if streaming and "endingoffsets" in opts:
            msg = "option 'endingOffsets' is for batch reads only (spark.read), not for readStream"
            raise KafkaOptionError(msg)
        if not streaming and (
            starting == "latest" or (isinstance(starting, dict) and LATEST in starting.values())
        ):
            msg = "option 'startingOffsets' cannot be latest (-1) in a batch read"
            raise KafkaOptionError(msg)
        if ending == "earliest" or (isinstance(ending, dict) and EARLIEST in ending.values()):
            msg = "option 'endingOffsets' cannot be earliest (-2)"
            raise KafkaOptionError(msg)
        isolation = opts.get("kafka.isolation.level", "read_uncommitted").strip().lower()
        if isolation not in ISOLATION_LEVELS:
            levels = " or ".join(ISOLATION_LEVELS)
            msg = f"option 'kafka.isolation.level' must be {levels}, got {isolation!r}"
            raise KafkaOptionError(msg)
        return dataclasses.replace(
            base,
            starting=starting,
            ending=ending,
            max_offsets_per_trigger=_positive(opts, "maxoffsetspertrigger"),
            fail_on_data_loss=_bool(opts.get("failondataloss", "true"), "failOnDataLoss"),
            isolation=isolation,
        )

    @classmethod
    def subscription(cls, options: Mapping[str, str]) -> KafkaSourceOptions:
        """Only the broker, the subscription and the timeout of ``options`` (the rest is ignored):
        what :func:`jobs.kafka_client.check_subscription` needs for either format."""
        opts = {k.lower(): str(v) for k, v in options.items()}
        bootstrap = opts.get("kafka.bootstrap.servers", "").strip()
        if not bootstrap:
            msg = "option 'kafka.bootstrap.servers' is required (host:port[,host:port...])"
            raise KafkaOptionError(msg)
        given = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k, "").strip()]
        if len(given) != 1:
            msg = "exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must be set"
            raise KafkaOptionError(msg)
        subscribe = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        pattern = opts.get("subscribepattern") or None
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                msg = f"option 'subscribePattern' is not a valid regex: {exc}"
                raise KafkaOptionError(msg) from None
        try:
            auth = from_spark_options(opts)
        except ConfigError as exc:
            raise KafkaOptionError(str(exc)) from None
        return cls(
            bootstrap=bootstrap,
            auth=auth,
            subscribe=subscribe,
            pattern=pattern,
            assign=_parse_assign(opts["assign"]) if "assign" in given else (),
            timeout_ms=_positive(opts, "kafka.default.api.timeout.ms") or 60_000,
        )


def _positive(opts: Mapping[str, str], key: str) -> int | None:
    raw = opts.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        msg = f"option '{key}' must be a whole number > 0, got {raw!r}"
        raise KafkaOptionError(msg)
    return value


def _bool(raw: str, key: str) -> bool:
    if raw.lower() not in ("true", "false"):
        msg = f"option '{key}' must be true or false, got {raw!r}"
        raise KafkaOptionError(msg)
    return raw.lower() == "true"


def _parse_assign(text: str) -> tuple[TP, ...]:
    try:
        data = orjson.loads(text)
        tps = tuple((str(t), int(p)) for t, parts in data.items() for p in parts)
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        msg = f"option 'assign' must be JSON like {{\"topicA\":[0,1]}}, got {text!r}"
        raise KafkaOptionError(msg) from None
    return tps


def parse_spec(text: str, option: str) -> Spec:
    """``earliest`` | ``latest`` | ``{"topic":{"0":23,"1":-2}}`` -> a :data:`Spec`."""
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word
    try:
        data = orjson.loads(text)
        out = {(str(t), int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        msg = f'option \'{option}\' must be earliest, latest or JSON like {{"topic":{{"0":23,"1":-2}}}}'
        raise KafkaOptionError(msg) from None
    if any(o < EARLIEST for o in out.values()):
        msg = f"option '{option}': offsets must be >= 0, or -2 (earliest) / -1 (latest)"
        raise KafkaOptionError(msg)
    return out


def resolve(spec: Spec, earliest: Offsets, latest: Offsets, option: str) -> Offsets:
    """Turn a specification into concrete offsets for the partitions in ``latest``.

    Like Spark, a JSON specification must name every assigned partition.
    """
    if spec == "earliest":
        return dict(earliest)
    if spec == "latest":
        return dict(latest)
    if not isinstance(spec, dict):  # pragma: no cover - parse_spec returns only these forms
        msg = f"option '{option}': unexpected specification {spec!r}"
        raise KafkaOptionError(msg)
    if set(spec) != set(latest):
        missing = sorted(set(latest) - set(spec))
        extra = sorted(set(spec) - set(latest))
        msg = (
            f"option '{option}' must give an offset for every assigned partition "
            f"(use -2 for earliest, -1 for latest); missing {show_tps(missing)}, unknown {show_tps(extra)}"
        )
        raise KafkaOptionError(msg)
    return {tp: earliest[tp] if o == EARLIEST else latest[tp] if o == LATEST else o for tp, o in spec.items()}


def rate_limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """End offsets that read at most ``max_rows`` records past ``start`` in total.

    The budget is shared in proportion to each partition's backlog, like
    Spark's ``maxOffsetsPerTrigger``; every partition with a backlog advances by
    at least one record, so no partition starves.
    """
    lag = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(lag.values())
    if total <= max_rows:
        return dict(latest)
    out: Offsets = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        share = max_rows * lag[tp] / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(end, begin + step)
    return out


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    """The checkpoint form: ``{"topic": {"0": 42}}`` with sorted keys."""
    out: dict[str, dict[str, int]] = {}
    for (topic, part), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(part)] = int(off)
    return out


def from_json(data: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {(t, int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}


def show_tps(tps: list[TP]) -> str:
    return "[" + ", ".join(f"{t}-{p}" for t, p in tps) + "]"
