"""The routes file (``config/routes.yaml``, ``APP_ROUTES_FILE``): frozen, typed models and the loader.

The file has ``receivers`` (webhook, kafka or alertmanager, each with its own
secret, timeout and headers), a routing tree under ``route`` (matchers,
``continue``, grouping timers, escalation and storm threshold, inherited by
child routes), ``inhibit_rules``, ``flapping`` and ``delivery`` settings.
Unknown keys are errors; durations are written ``30s``, ``5m``, ``4h``.

:func:`load_routes` collects every problem, each as ``file:line:col: message``
in the words of ``rules check`` (:class:`app.rules.problems.Problems`: pydantic's
errors named by the key at fault and the value given, at most 100 listed), and raises
:class:`RoutesConfigError`. String values may name environment variables as
``${NAME}``; an unset variable of this application falls back to its documented
default (``app.runtime.settings.ENV_DOCS``), any other unset variable is an error.
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
from app.rules.problems import Problems, key_label
from app.rules.yamlpos import YamlProblem, load_with_positions
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


#: what pydantic puts after a receiver's index in an error's location: the receiver's ``type``
#: (the receivers are a union tagged by it), not a key of the file
_RECEIVER_TAGS = ("webhook", "kafka", "alertmanager")


def _file_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pydantic error location as a path in the file's data: without a receiver's union tag."""
    if len(loc) > 2 and loc[0] == "receivers" and loc[2] in _RECEIVER_TAGS:
        return (*loc[:2], *loc[3:])
    return loc


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
    problems = Problems(name, text, data, positions, lambda _: None, key_label)
    for where, var in missing:
        problems.add(where, f"environment variable {var} is not set")
    try:
        cfg = RoutesFile.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            problems.add_pydantic({**err, "loc": _file_loc(err["loc"])})
        cfg = None
    if cfg is not None:
        for where, message in semantic_problems(cfg):
            problems.add(where, message)
        for i, r in enumerate(cfg.receivers):
            for field, message in receivers(r) if receivers is not None else ():
                problems.add(("receivers", i, field), f"receiver '{r.name}': '{field}': {message}")
    if problems.count:
        problems.found.sort(key=lambda p: (p.line, p.col, p.message))
        raise RoutesConfigError(problems.lines())
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
