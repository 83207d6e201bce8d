"""The alert lifecycle every stateful kind shares (Prometheus' ``rules/alerting.go``, per group).

**Streak alerts** (threshold, tumbling/hopping and sliding windows) follow one state machine
over a group's *matches* (an event whose condition holds, a window whose ``having`` holds,
a sliding change point whose ``having`` holds), kept in the :class:`~app.rules.state.Lifecycle`
fields of the group's state::

    quiet --match--> pending --(consecutive and for: met)--> firing
      ^                 |                                      |
      +---- inactive ---+ (a non-match ends the streak)        |
      +------------------------- resolved ---------------------+

* :func:`match`: a match at ``start`` grows the streak (``streak``, from
  ``streak_since``). The alert fires once the streak has ``consecutive`` matches and
  has lasted ``for_ms`` (measured to ``ready_at``): :data:`FIRES`, ``starts_at`` =
  ``streak_since``. A streak that does not fire at its first match is pending:
  :data:`PENDS` (a ``pending`` transition, never notified). While firing, matches only
  count.
* :func:`ending` / :func:`started` / :func:`reset`: a non-match ends the episode: a
  firing alert resolves (``resolved``), a pending one ends (``inactive``), from
  :func:`started`.

What a kind adds stays in the kind: ``clear`` (hysteresis) and ``keep_firing_for``
decide *when* a threshold alert's episode ends, and ``no_data`` moves it on a timer
(:mod:`app.rules.logic.threshold`); windows decide what a match is.

**Event alerts** (change, new term, sequence, session) use :class:`OneShot`: they fire on
a trigger and resolve ``resolve_after`` (event time) after the last trigger.

Every time here is event time in ms, so transitions and ids are the same on every engine.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from app.alerts import Alert, Status
from app.rules.loader import CompiledRule
from app.rules.logic.base import State, build_alert, group_row

logger = logging.getLogger(__name__)

#: :func:`match`: nothing to announce (still pending, or firing already)
NOTHING: Final = 0
#: :func:`match`: a streak began that does not fire at once: a ``pending`` transition at ``start``
PENDS: Final = 1
#: :func:`match`: the alert fires now, ``starts_at`` = ``streak_since``
FIRES: Final = 2


def match(st: State, start: int, ready_at: int, consecutive: int, for_ms: int, force: bool = False) -> int:
    """A match at ``start`` (``ready_at``: the time ``for`` is measured to): NOTHING,
    PENDS or FIRES (``force``: fire now whatever ``consecutive`` and ``for`` say)."""
    n = st["streak"] + 1
    st["streak"] = n
    since = st["streak_since"]
    if since is None:
        since = st["streak_since"] = start
    if st["firing_since"] is not None:
        return NOTHING
    if force or (n >= consecutive and ready_at - since >= for_ms):
        st["firing_since"] = since
        return FIRES
    return PENDS if n == 1 else NOTHING


def in_episode(st: State) -> bool:
    """Firing or pending."""
    return st["firing_since"] is not None or bool(st["streak"])


def ending(st: State) -> Status | None:
    """The transition that ends the current episode: ``resolved`` (firing), ``inactive``
    (pending), None (quiet)."""
    if st["firing_since"] is not None:
        return "resolved"
    return "inactive" if st["streak"] else None


def started(st: State) -> int:
    """The ``starts_at`` of the current episode (firing: when it fired from; pending: the streak's start)."""
    found = st["firing_since"] if st["firing_since"] is not None else st["streak_since"]
    return int(found)


def reset(st: State) -> None:
    """Quiet again: no streak, not firing."""
    st["firing_since"], st["streak"], st["streak_since"] = None, 0, None


class OneShot:
    """Event alerts (change, new term, sequence, session): fire on a trigger,
    resolve ``resolve_after`` (event time) after the last trigger. A trigger
    while firing extends it and counts, without a second notification. Fields:
    :class:`~app.rules.state.EventAlert`."""

    def __init__(self, rule: CompiledRule) -> None:
        self.rule = rule
        self.resolve_after = rule.rule.resolve_after

    def trigger(
        self, st: State, group: tuple[str, ...], row: Mapping[str, Any], start_ms: int, at_ms: int,
        values: Mapping[str, Any],
    ) -> list[Alert]:  # fmt: skip
        until = at_ms + self.resolve_after
        if st.get("firing_since") is not None:
            st["resolves_at"] = max(st["resolves_at"], until)
            st["triggers"] = st.get("triggers", 1) + 1
            return []
        st["firing_since"], st["resolves_at"], st["triggers"] = start_ms, until, 1
        st["firing_values"] = dict(values)
        return [build_alert(self.rule, "firing", group, row, start_ms, None, at_ms, values)]

    def expire(self, st: State, group: tuple[str, ...], clock_ms: int) -> list[Alert]:
        if st.get("firing_since") is None or clock_ms < st["resolves_at"]:
            return []
        began, until = st["firing_since"], st["resolves_at"]
        values = {**st.get("firing_values", {}), "count": st.get("triggers", 1)}
        st["firing_since"] = None
        st.pop("firing_values", None)
        return [
            build_alert(
                self.rule, "resolved", group, group_row(self.rule, group), began, until, until, values
            )
        ]

    @staticmethod
    def due(st: State) -> int | None:
        """When the firing alert resolves, None when not firing."""
        return st["resolves_at"] if st.get("firing_since") is not None else None
