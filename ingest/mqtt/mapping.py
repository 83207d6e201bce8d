"""MQTT topic patterns -> sensors events: the bridge's mapping, parsed once at start.

A rule's ``topic`` is an MQTT topic filter whose wildcards may be named:
``+name`` matches one level and captures it, ``#name`` (last level only)
captures the rest; plain ``+`` and ``#`` capture nothing. From a match:

- ``device`` (default ``{device_id}``) is the device id: a template over the
  captured names, e.g. ``{site}-{device_id}``;
- ``field`` names the sensors field for a bare payload, literally
  (``temperature``) or from the topic (``{field}``).

Payloads: a bare number (``21.5``) or bare text for a string field (``ok``)
becomes ``{field: value}``; a JSON number likewise; a JSON object is taken
field by field, with ``value`` renamed to ``field`` when the rule has one. The
object's ``ts`` is the event time when present (RFC 3339, or epoch seconds,
or epoch milliseconds when above 1e11); otherwise the receive time. A
``device_id`` in the object must equal the topic's. Whatever else the sensors
schema says about the fields is checked by the publisher.

On the command line a rule is ``PATTERN[=FIELD]``, e.g.
``sensors/+device_id/temperature=temperature`` or ``plant/+device_id/+field={field}``;
a YAML file holds ``mappings: [{topic, device, field}, ...]``. Rules are tried
in order; the first whose pattern matches a topic wins.
"""

from __future__ import annotations

import logging
import math
import re
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from app.errors import IngestDecodeError
from app.events import SENSORS, check_unique_keys, format_ts, parse_ts
from app.rules.yamlpos import YamlProblem, load_with_positions
from ingest.model import IngestArgError, Record

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z_]\w*")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_EPOCH_MS_ABOVE = 1e11
_MAX_TS_MS = 4_102_444_800_000  # 2100-01-01, as app.events


class MappingRule(BaseModel):
    """One topic pattern and how its messages become events."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    device: str = "{device_id}"
    field: str | None = None

    @model_validator(mode="after")
    def _check(self) -> MappingRule:
        levels = self.topic.split("/")
        names: list[str] = []
        for i, level in enumerate(levels):
            if level[:1] in ("+", "#"):
                if level[0] == "#" and i != len(levels) - 1:
                    msg = f"'#' may only be the last level of {self.topic!r}"
                    raise ValueError(msg)
                if level[1:] and not _NAME.fullmatch(level[1:]):
                    msg = f"wildcard name {level[1:]!r} in {self.topic!r} is not an identifier"
                    raise ValueError(msg)
                names += [level[1:]] if level[1:] else []
            elif "+" in level or "#" in level:
                msg = f"level {level!r} of {self.topic!r} mixes text and a wildcard"
                raise ValueError(msg)
        if len(set(names)) != len(names):
            msg = f"wildcard names repeat in {self.topic!r}"
            raise ValueError(msg)
        for template in (self.device, self.field or ""):
            for used in _PLACEHOLDER.findall(template):
                if used not in names:
                    msg = f"{{{used}}} in {template!r} is not a named wildcard of {self.topic!r}"
                    raise ValueError(msg)
        if self.field and "{" not in self.field and self.field not in SENSORS.fields:
            msg = f"field {self.field!r} is not a sensors field; expected one of {', '.join(SENSORS.fields)}"
            raise ValueError(msg)
        return self

    @property
    def subscription(self) -> str:
        """The MQTT topic filter to subscribe to (names removed)."""
        return "/".join(level[0] if level[:1] in ("+", "#") else level for level in self.topic.split("/"))

    @cached_property
    def _regex(self) -> re.Pattern[str]:
        parts = []
        for level in self.topic.split("/"):
            if level[:1] == "+":
                parts.append(f"(?P<{level[1:]}>[^/]+)" if level[1:] else "[^/]+")
            elif level[:1] == "#":
                parts.append(f"(?P<{level[1:]}>.+)" if level[1:] else ".+")
            else:
                parts.append(re.escape(level))
        return re.compile("/".join(parts))

    def match(self, topic: str) -> dict[str, str] | None:
        """The captured names when ``topic`` matches, else None."""
        m = self._regex.fullmatch(topic)
        return None if m is None else m.groupdict()

    def to_record(self, names: dict[str, str], payload: bytes, received_ms: int) -> Record:
        """The sensors record of one message; IngestDecodeError naming what is wrong."""
        device = _fill(self.device, names)
        field = _fill(self.field, names) if self.field else None
        record: Record = {"device_id": device}
        value = _decode(payload, field)
        if isinstance(value, dict):
            if value.get("device_id", device) != device:
                msg = f"payload device_id {value['device_id']!r} differs from the topic's {device!r}"
                raise IngestDecodeError(msg, "device_id")
            if field and "value" in value:
                value[field] = value.pop("value")
            record.update(value)
        elif field is None:
            msg = "a bare value needs a rule with a field (PATTERN=FIELD)"
            raise IngestDecodeError(msg)
        else:
            record[field] = value
        record["ts"] = _event_time(record.get("ts"), received_ms)
        return record


def _fill(template: str, names: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: names[m.group(1)], template)


def _decode(payload: bytes, field: str | None) -> Any:
    text = payload.decode("utf-8", errors="strict").strip() if payload else ""
    if field and SENSORS.fields.get(field) == "string" and not text.startswith(("{", '"')):
        return text
    try:
        value = orjson.loads(text)
        check_unique_keys(text, value)
    except orjson.JSONDecodeError:
        msg = f"payload is neither a number nor a JSON object: {text[:60]!r}"
        raise IngestDecodeError(msg, field) from None
    if isinstance(value, bool) or not isinstance(value, int | float | dict | str):
        msg = f"payload must be a number or a JSON object, got {type(value).__name__}"
        raise IngestDecodeError(msg, field)
    if isinstance(value, float) and not math.isfinite(value):
        msg = "payload is not a finite number"
        raise IngestDecodeError(msg, field)
    return value


def _event_time(ts: object, received_ms: int) -> str:
    if ts is None:
        return format_ts(received_ms)
    if isinstance(ts, bool) or not isinstance(ts, int | float | str):
        msg = f"payload ts must be RFC 3339 or epoch seconds/milliseconds, got {type(ts).__name__}"
        raise IngestDecodeError(msg, "ts")
    if isinstance(ts, str):
        return format_ts(parse_ts(ts))
    ms = int(ts) if ts > _EPOCH_MS_ABOVE else int(ts * 1000)
    if not 0 <= ms < _MAX_TS_MS:
        msg = f"payload ts {ts!r} is outside 1970..2100 as epoch seconds or milliseconds"
        raise IngestDecodeError(msg, "ts")
    return format_ts(ms)


def parse_map_option(text: str) -> MappingRule:
    """``PATTERN[=FIELD]`` from the command line; IngestArgError when invalid."""
    topic, _, field = text.partition("=")
    try:
        return MappingRule(topic=topic.strip(), field=field.strip() or None)
    except ValidationError as exc:
        msg = f"--map {text!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}"
        raise IngestArgError(msg) from None


def load_mapping_file(path: Path) -> list[MappingRule]:
    """The rules of a YAML file ``{mappings: [...]}``; IngestArgError listing
    every invalid rule as ``FILE:LINE: message``."""
    try:
        data, positions = load_with_positions(path.read_text())
    except YamlProblem as exc:
        msg = f"{path}:{exc.line}:{exc.col}: {exc.message}"
        raise IngestArgError(msg) from None
    if not isinstance(data, dict) or not isinstance(data.get("mappings"), list) or set(data) != {"mappings"}:
        msg = f"{path}: expected a mapping with one key, 'mappings', holding a list of rules"
        raise IngestArgError(msg)
    rules, problems = [], []
    for i, item in enumerate(data["mappings"]):
        try:
            rules.append(MappingRule.model_validate(item))
        except ValidationError as exc:
            line = positions.get(("mappings", i), (0, 0))[0]
            for err in exc.errors():
                where = ".".join(str(p) for p in err["loc"]) or "rule"
                problems.append(f"{path}:{line}: {where}: {err['msg'].removeprefix('Value error, ')}")
    if problems:
        raise IngestArgError("\n".join(problems))
    if not rules:
        msg = f"{path}: no mappings"
        raise IngestArgError(msg)
    return rules
