"""The routes file (``config/routes.yaml``, ``APP_ROUTES_FILE``): frozen, typed models and the loader.

The file has ``receivers`` (webhook, kafka or alertmanager, each with its own
secret, timeout and headers), a routing tree under ``route`` (matchers,
``continue``, grouping timers, escalation and storm threshold, inherited by
child routes), ``inhibit_rules``, ``flapping`` and ``delivery`` settings.
Unknown keys are errors; durations are written ``30s``, ``5m``, ``4h``.

:func:`load_routes` collects every problem, each as ``file:line:col: message``
(like ``rules check``), and raises :class:`RoutesConfigError`. String values
may name environment variables as ``${NAME}``; an unset variable of this
application falls back to its documented default (``app.runtime.settings.ENV_DOCS``),
any other unset variable is an error.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError

from app.dispatch.matchers import Matcher, parse_matcher
from app.errors import ConfigError
from app.notify.config import (
    AlertmanagerReceiverConfig,
    FrozenModel,
    KafkaReceiverConfig,
    Receivers,
    Seconds,
    WebhookReceiverConfig,
    non_empty,
)
from app.rules.yamlpos import YamlProblem, load_with_positions, position_of
from app.runtime.settings import ENV_DOCS

logger = logging.getLogger(__name__)

_NAME = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _matcher(value: object) -> Matcher:
    if isinstance(value, Matcher):
        return value
    return parse_matcher(value)  # type: ignore[arg-type]


MatcherField = Annotated[Matcher, BeforeValidator(_matcher)]


class EscalationConfig(FrozenModel):
    """Notify ``to`` about a firing alert nobody acknowledged ``after`` its first notification."""

    after: Seconds
    to: str


class RouteConfig(FrozenModel):
    """One node of the routing tree. Unset fields are inherited from the parent."""

    name: str | None = Field(default=None, pattern=_NAME)
    receiver: str | None = None
    matchers: tuple[MatcherField, ...] = ()
    continue_: bool = Field(default=False, alias="continue")
    group_by: tuple[str, ...] | None = None
    group_wait: Seconds | None = None
    group_interval: Seconds | None = Field(default=None, gt=0)
    repeat_interval: Seconds | None = Field(default=None, gt=0)
    escalate: EscalationConfig | None = None
    storm_threshold: int | None = Field(default=None, ge=0)
    routes: tuple[RouteConfig, ...] = ()


class InhibitRuleConfig(FrozenModel):
    """Firing alerts matching ``source_matchers`` mute alerts matching ``target_matchers``
    that have equal values for every label in ``equal``."""

    source_matchers: Annotated[tuple[MatcherField, ...], non_empty("matcher")]
    target_matchers: Annotated[tuple[MatcherField, ...], non_empty("matcher")]
    equal: tuple[str, ...] = ()


class FlappingConfig(FrozenModel):
    """An alert with ``changes`` or more state changes within ``window`` (event time) is flapping."""

    window: Seconds = 3600.0
    changes: int = Field(default=6, ge=0)  # 0 disables detection


class DeliveryConfig(FrozenModel):
    """Outbox delivery: retry backoff and the age after which a message is dead-lettered."""

    max_age: Seconds = 3600.0
    retry_base: Seconds = 1.0
    retry_cap: Seconds = 60.0
    keep_delivered: Seconds = 7 * 86400.0


class RoutesFile(FrozenModel):
    receivers: Receivers
    route: RouteConfig
    inhibit_rules: tuple[InhibitRuleConfig, ...] = ()
    flapping: FlappingConfig = FlappingConfig()
    delivery: DeliveryConfig = DeliveryConfig()

    def receiver(self, name: str) -> WebhookReceiverConfig | AlertmanagerReceiverConfig | KafkaReceiverConfig:
        return next(r for r in self.receivers if r.name == name)


class RoutesConfigError(ConfigError):
    """The routes file is invalid; ``problems`` holds every ``file:line:col: message``."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def expand_env(
    data: Any, env: Mapping[str, str], where: tuple[str | int, ...] = ()
) -> tuple[Any, list[tuple[tuple[str | int, ...], str]]]:
    """``data`` with ``${NAME}`` replaced in every string; returns (data, [(path, name)] unset)."""
    missing: list[tuple[tuple[str | int, ...], str]] = []  # (path, variable)
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out[k], sub = expand_env(v, env, (*where, k))
            missing += sub
        return out, missing
    if isinstance(data, list):
        items = []
        for i, v in enumerate(data):
            item, sub = expand_env(v, env, (*where, i))
            items.append(item)
            missing += sub
        return items, missing
    if isinstance(data, str) and "${" in data:

        def expand(m: re.Match[str]) -> str:
            name = m.group(1)
            if name in env:
                return env[name]
            if name in ENV_DOCS:
                return ENV_DOCS[name][0]
            missing.append((where, name))
            return ""

        return _ENV_REF.sub(expand, data), missing
    return data, missing


def _loc(data: Any, loc: tuple[Any, ...]) -> tuple[str | int, ...]:
    """The data path of a pydantic error location, without union tags and with aliases."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part == "continue_":
            part = "continue"
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            out.append(part)
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and not out[-1:] == [part]:
            if part not in ("webhook", "kafka", "alertmanager"):
                out.append(part)
                break
    return tuple(out)


def _message(err: Mapping[str, Any]) -> str:
    kind, loc = err.get("type", ""), err.get("loc", ())
    last = next((p for p in reversed(loc) if isinstance(p, str)), "")
    last = "continue" if last == "continue_" else last
    if kind == "extra_forbidden":
        return f"unknown key '{last}'"
    if kind == "missing":
        return f"missing required key '{last}'"
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"'{last}': {msg}" if last else msg


#: ``(field, message)`` for each reason a receiver cannot deliver (:func:`app.notify.check.receiver_problems`)
ReceiverCheck = Callable[[Any], list[tuple[str, str]]]


def load_routes(
    path: Path | str, env: Mapping[str, str] | None = None, *, receivers: ReceiverCheck | None = None
) -> RoutesFile:
    """Parse and check the routes file; raise :class:`RoutesConfigError` listing every problem.

    With ``receivers``, each receiver's problems by that check are problems of the file
    too (``routes check``); without, they are left to the dispatcher, which disables such
    a receiver alone."""
    name = str(path)
    env = os.environ if env is None else env
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RoutesConfigError([f"{name}:1:1: cannot read routes file: {exc}"]) from None
    try:
        raw, positions = load_with_positions(text)
    except YamlProblem as exc:
        raise RoutesConfigError([f"{name}:{exc.line}:{exc.col}: {exc.message}"]) from None
    if not isinstance(raw, dict):
        raise RoutesConfigError([f"{name}:1:1: a routes file is a mapping with receivers: and route:"])
    data, missing = expand_env(raw, env)
    problems: list[tuple[tuple[int, int], str]] = []
    for where, var in missing:
        problems.append((position_of(positions, where), f"environment variable {var} is not set"))
    try:
        cfg = RoutesFile.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append((position_of(positions, _loc(data, err["loc"])), _message(err)))
        cfg = None
    if cfg is not None:
        problems += [(position_of(positions, p), m) for p, m in semantic_problems(cfg)]
        for i, r in enumerate(cfg.receivers):
            for field, message in receivers(r) if receivers is not None else ():
                where = position_of(positions, ("receivers", i, field))
                problems.append((where, f"receiver '{r.name}': '{field}': {message}"))
    if problems:
        raise RoutesConfigError([f"{name}:{ln}:{col}: {msg}" for (ln, col), msg in sorted(problems)])
    return cfg  # type: ignore[return-value]


def semantic_problems(cfg: RoutesFile) -> list[tuple[tuple[str | int, ...], str]]:
    """Checks across sections: unique receiver names, known receivers, a complete root route."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    names: set[str] = set()
    for i, r in enumerate(cfg.receivers):
        if r.name in names:
            out.append((("receivers", i, "name"), f"duplicate receiver name '{r.name}'"))
        names.add(r.name)
    root = cfg.route
    if root.receiver is None:
        out.append((("route",), "the root route needs a receiver (the default for every alert)"))
    if root.matchers:
        out.append((("route", "matchers"), "the root route matches every alert; it takes no matchers"))

    def walk(node: RouteConfig, at: tuple[str | int, ...]) -> None:
        if node.receiver is not None and node.receiver not in names:
            out.append(((*at, "receiver"), f"unknown receiver '{node.receiver}'"))
        if node.escalate is not None and node.escalate.to not in names:
            out.append(((*at, "escalate", "to"), f"unknown receiver '{node.escalate.to}'"))
        for i, child in enumerate(node.routes):
            walk(child, (*at, "routes", i))

    walk(root, ("route",))
    return out
