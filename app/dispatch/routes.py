"""The routing tree: which routes (receiver, grouping, timers) an alert's labels reach.

Matching follows Alertmanager: an alert enters a route when the route's
matchers match its labels; then the children are tried in order, and the
first child that matches takes the alert unless it has ``continue: true``,
in which case the following siblings are tried too. When no child matches,
the route itself is the result. Children inherit every unset option from
their parent; the root's defaults are Alertmanager's (group_wait 30s,
group_interval 5m, repeat_interval 4h).

``group_by: ["..."]`` groups by every label (one group per alert).
A route's ``key`` names its position in the tree (stable while the tree's
shape and matchers stay the same) and prefixes its groups' keys.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from app.dispatch.config import EscalationConfig, RouteConfig, RoutesFile
from app.dispatch.matchers import Matcher, format_labels, format_matchers, matches_all

logger = logging.getLogger(__name__)

ALL_LABELS = "..."
DEFAULT_GROUP_BY: tuple[str, ...] = ()
DEFAULT_GROUP_WAIT = 30.0
DEFAULT_GROUP_INTERVAL = 300.0
DEFAULT_REPEAT_INTERVAL = 4 * 3600.0


@dataclass(frozen=True)
class Route:
    """A route with every option resolved (inherited values filled in). Times in seconds."""

    key: str
    name: str
    receiver: str
    matchers: tuple[Matcher, ...]
    continue_: bool
    group_by: tuple[str, ...]
    group_wait: float
    group_interval: float
    repeat_interval: float
    escalate: EscalationConfig | None
    storm_threshold: int
    children: tuple[Route, ...] = ()

    @property
    def group_all(self) -> bool:
        return ALL_LABELS in self.group_by

    def match(self, labels: Mapping[str, str]) -> list[Route]:
        """The routes that take an alert with ``labels``, in tree order (may be empty)."""
        if not matches_all(self.matchers, labels):
            return []
        found: list[Route] = []
        for child in self.children:
            hits = child.match(labels)
            if hits:
                found.extend(hits)
                if not child.continue_:
                    break
        return found or [self]

    def group_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        """The labels that pick the alert's group on this route."""
        if self.group_all:
            return dict(labels)
        return {k: labels[k] for k in self.group_by if k in labels}

    def group_key(self, labels: Mapping[str, str]) -> str:
        """``<route key>:{label="value",...}``: one aggregation group per distinct key."""
        return f"{self.key}:{format_labels(self.group_labels(labels))}"

    def walk(self) -> list[Route]:
        """This route and all its descendants, depth first."""
        out = [self]
        for child in self.children:
            out.extend(child.walk())
        return out


def build_tree(cfg: RoutesFile) -> Route:
    """Resolve inheritance; the config must have passed :func:`~app.dispatch.config.load_routes`."""
    root = cfg.route
    base = Route(
        key="{}",
        name=root.name or "root",
        receiver=root.receiver or "",
        matchers=(),
        continue_=False,
        group_by=root.group_by if root.group_by is not None else DEFAULT_GROUP_BY,
        group_wait=root.group_wait if root.group_wait is not None else DEFAULT_GROUP_WAIT,
        group_interval=root.group_interval or DEFAULT_GROUP_INTERVAL,
        repeat_interval=root.repeat_interval or DEFAULT_REPEAT_INTERVAL,
        escalate=root.escalate,
        storm_threshold=root.storm_threshold or 0,
    )
    return _with_children(base, root)


def _with_children(parent: Route, node: RouteConfig) -> Route:
    children = []
    for i, c in enumerate(node.routes):
        resolved = Route(
            key=f"{parent.key}/{c.name or format_matchers(c.matchers)}[{i}]",
            name=c.name or f"{parent.name}.{i}",
            receiver=c.receiver or parent.receiver,
            matchers=c.matchers,
            continue_=c.continue_,
            group_by=c.group_by if c.group_by is not None else parent.group_by,
            group_wait=c.group_wait if c.group_wait is not None else parent.group_wait,
            group_interval=c.group_interval or parent.group_interval,
            repeat_interval=c.repeat_interval or parent.repeat_interval,
            escalate=c.escalate if c.escalate is not None else parent.escalate,
            storm_threshold=c.storm_threshold if c.storm_threshold is not None else parent.storm_threshold,
        )
        children.append(_with_children(resolved, c))
    return Route(**{**parent.__dict__, "children": tuple(children)})
