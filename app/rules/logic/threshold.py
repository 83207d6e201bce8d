"""Threshold rules: ``where`` with ``for``, ``consecutive``, ``keep_firing_for`` and ``clear``.

Per group, in event time:

* the condition holds on an event: the streak starts (``since``) or grows;
  once it has held for ``consecutive`` events and for ``for`` (event time
  since the streak began), the alert fires with ``starts_at = since``;
* while firing, the alert resolves on the first event where ``clear`` is
  TRUE (hysteresis) or, without ``clear``, where the condition is not TRUE;
  with ``keep_firing_for`` it stays firing that much longer and resolves at
  ``cleared + keep_firing_for`` unless the condition returns first.

Late events (older than the newest event seen for the rule and group) are
skipped. ``pct_change`` columns are computed here, per group, before the
condition runs.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Any

from app.alerts import Alert
from app.events import Event
from app.rules.compile import PctChange
from app.rules.loader import CompiledRule
from app.rules.logic.base import Result, State, StateStore, build_alert, group_row


def pct_value(hist: list[list[float]], pc: PctChange, ts: int, value: Any) -> float | None:
    """Percent change of ``value`` against the newest entry at least the lookback older."""
    if value is None:
        return None
    times = [h[0] for h in hist]
    i = bisect.bisect_right(times, ts - pc.lookback_ms) - 1
    if i < 0:
        return None
    old = hist[i][1]
    if old is None or old == 0:
        return None
    return float((value - old) / abs(old) * 100.0)


def remember(hist: list[list[float]], pc: PctChange, ts: int, value: Any) -> list[list[float]]:
    """Add (ts, value) and drop entries no future lookup can need."""
    if value is not None:
        hist.append([ts, value])
    times = [h[0] for h in hist]
    keep_from = max(0, bisect.bisect_right(times, ts - pc.lookback_ms) - 1)
    return hist[keep_from:]


class ThresholdLogic:
    def __init__(self, rule: CompiledRule) -> None:
        self.rule = rule
        r = rule.rule
        self.for_ms = r.for_ms
        self.consecutive = r.consecutive
        self.keep_ms = r.keep_firing_for
        self.clear = rule.parts.clear if rule.parts else None
        self.pct = rule.parts.pct_changes if rule.parts else ()
        self.columns = sorted((rule.where.columns | rule.where.synthetic) if rule.where else ())

    def _with_pct(
        self, st: State | None, ev: Event, row: Mapping[str, Any]
    ) -> tuple[Mapping[str, Any], dict]:
        hist = dict(st.get("h", {})) if st else {}
        if not self.pct:
            return row, hist
        extra = {}
        for pc in self.pct:
            h = [list(x) for x in hist.get(pc.column, [])]
            value = row.get(pc.field)
            extra[pc.column] = pct_value(h, pc, ev.ts_ms, value)
            hist[pc.column] = remember(h, pc, ev.ts_ms, value)
        return {**row, **extra}, hist

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any]
    ) -> Result:
        st = store.get(key)
        if st is not None and ev.ts_ms < st["last"]:
            return [], True
        row, hist = self._with_pct(st, ev, row)
        assert self.rule.where is not None  # noqa: S101 - threshold rules always have one
        holds = self.rule.where(row) is True
        if st is None:
            if not holds and not hist:
                return [], False  # nothing to remember for a quiet key
            st = {"n": 0, "since": None, "fire": None, "last": ev.ts_ms, "g": list(group)}
        st["last"] = ev.ts_ms
        changed = bool(self.pct)
        if self.pct:
            st["h"] = hist
        values = {c: row.get(c) for c in self.columns}
        if self.pct:
            values["pct_change"] = row.get(self.pct[0].column)
        alerts: list[Alert] = []
        if st["fire"] is not None and st.get("kf") is not None and ev.ts_ms >= st["kf"]:
            # kept firing long enough: it ended at kf, before this event
            alerts.append(self._resolve(st, group, row, st["kf"], values))
            changed = True
        if st["fire"] is not None:
            cleared = (self.clear(row) is True) if self.clear is not None else not holds
            if st.get("kf") is not None:
                if holds:  # the condition came back before kf: keep firing
                    st["kf"], changed = None, True
            elif not cleared:
                pass
            elif self.keep_ms:
                st["kf"], changed = ev.ts_ms + self.keep_ms, True
            else:
                alerts.append(self._resolve(st, group, row, ev.ts_ms, values))
                changed = True
            if holds and st["fire"] is not None:
                st["n"] += 1
        elif holds:
            if st["n"] == 0:
                st["since"] = ev.ts_ms
            st["n"] += 1
            changed = changed or st["n"] <= self.consecutive
            if st["n"] >= self.consecutive and ev.ts_ms - st["since"] >= self.for_ms:
                st["fire"] = st["since"]
                alerts.append(
                    build_alert(self.rule, "firing", group, row, st["since"], None, ev.ts_ms, values)
                )
                changed = True
        elif st["n"]:
            st["n"], st["since"], changed = 0, None, True
        st["due"] = st.get("kf")
        if changed:
            store.put(key, st)
        return alerts, False

    def _resolve(
        self, st: State, group: tuple[str, ...], row: Mapping[str, Any], at: int, values: dict
    ) -> Alert:
        started = st["fire"]
        st["fire"], st["kf"], st["n"], st["since"] = None, None, 0, None
        return build_alert(self.rule, "resolved", group, row, started, at, at, values)

    def on_clock(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        st = store.get(key)
        if st is None or st.get("kf") is None or clock_ms < st["kf"] or st["fire"] is None:
            return []
        group = tuple(st["g"])
        alert = self._resolve(st, group, group_row(self.rule, group), st["kf"], {})
        st["due"] = None
        store.put(key, st)
        return [alert]
