"""One group's rule state as the interactive queries' stable JSON (docs/interactive-queries.md).

:func:`describe` is the only place that reads the evaluator's state records, so their inner
layout (being refactored into typed records) can change without changing the API: a
record is read through :func:`_fields`, which takes a plain dict, a dataclass or any object
with attributes, and every field is optional. Times are RFC 3339 (UTC, milliseconds);
``None`` when unset.

Forms, by the rule's kind (every form has ``kind``, ``status`` and ``partition``):

- ``threshold``: ``status`` (``firing``, ``pending``, ``no_data`` or ``ok``), ``condition``
  (``matches`` in a row, ``since`` the first of them, ``firing_since``), ``last_event``,
  ``keep_firing_until``, ``no_data_since``, ``due`` (its next timer);
- ``window``: ``status`` (``firing`` or ``ok``), ``firing_since``, ``open_windows``: each
  ``start``, ``end`` (None for a session) and ``aggregates`` (name -> current value), and
  ``closed`` (closed, kept for late events), oldest first;
- ``absence``: ``status`` (``firing`` or ``ok``), ``last_seen``, ``due`` (when it fires
  unless an event comes), ``firing_since``;
- ``sequence``: ``status``, ``step`` (index of the step under way), ``step_name``,
  ``matches_in_step``, ``first_at``, ``last_event``, ``due``;
- any other kind (``change``, ``new_term``): ``status``, ``last_event``, ``due``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

logger = logging.getLogger(__name__)


def iso(ms: Any) -> str | None:
    """Epoch milliseconds as RFC 3339 (UTC), None for anything that is not a number."""
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _fields(record: Any) -> Mapping[str, Any]:
    if isinstance(record, Mapping):
        return record
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    to_dict = getattr(record, "to_dict", None)
    if callable(to_dict):
        out = to_dict()
        if isinstance(out, Mapping):
            return out
    return (
        {k: v for k, v in vars(record).items() if not k.startswith("_")}
        if hasattr(record, "__dict__")
        else {}
    )


def _plain(value: Any) -> Any:
    """JSON-safe: numbers, strings, booleans, None, lists and string-keyed dicts."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_plain(v) for v in value]
    return str(value)


def describe(
    kind: str,
    record: Any,
    *,
    window_ms: int | None = None,
    results: Callable[[Any], Mapping[str, Any]] | None = None,
    step_names: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The JSON form of one group's state for a rule of ``kind`` (see the module docstring).
    ``results`` turns a window's accumulators into its aggregates' values."""
    st = _fields(record)

    def get(name: str, old: str) -> Any:
        """A field by its name (state format 2, app.rules.state), or its format-1 name."""
        return st[name] if name in st else st.get(old)

    fire = get("firing_since", "fire")
    out: dict[str, Any] = {"kind": kind, "partition": get("partition", "p")}
    if kind == "threshold":
        n = int(get("streak", "n") or 0)
        no_data = get("no_data_since", "nd")
        status = (
            "firing" if fire is not None else "no_data" if no_data is not None else "pending" if n else "ok"
        )
        out |= {
            "status": status,
            "condition": {
                "matches": n,
                "since": iso(get("streak_since", "since")),
                "firing_since": iso(fire),
            },
            "last_event": iso(get("last_event", "last")),
            "keep_firing_until": iso(get("keep_firing_until", "kf")),
            "no_data_since": iso(no_data),
            "due": iso(st.get("due")),
        }
    elif kind == "window":
        windows = []
        found = get("windows", "w") or {}
        opened = [(k, w) for k, w in _fields(found).items() if str(k).lstrip("-").isdigit()]
        for start, w in sorted(opened, key=lambda kv: int(kv[0])):
            wf = _fields(w)
            accumulators = wf["accumulators"] if "accumulators" in wf else wf.get("a")
            try:
                aggs = dict(results(accumulators)) if results is not None else {}
            except Exception:  # an accumulator this build cannot read: say so, keep the rest
                logger.debug("window aggregates of %s unreadable", start, exc_info=True)
                aggs = {}
            begin = int(start)
            windows.append({
                "start": iso(begin),
                "end": iso(begin + window_ms) if window_ms else None,
                "aggregates": _plain(aggs),
                "closed": bool(wf["evaluated"] if "evaluated" in wf else wf.get("done")),
            })  # fmt: skip
        out |= {
            "status": "firing" if fire is not None else "ok",
            "firing_since": iso(fire),
            "open_windows": windows,
        }
    elif kind == "absence":
        out |= {
            "status": "firing" if fire is not None else "ok",
            "last_seen": iso(get("last_event", "last")),
            "due": iso(st.get("due")),
            "firing_since": iso(fire),
        }
    elif kind == "sequence":
        step = int(st.get("step") or 0)
        first = get("first_event", "first")
        out |= {
            "status": "firing" if fire is not None else "in_progress" if first is not None else "ok",
            "step": step,
            "step_name": step_names[step] if step < len(step_names) else None,
            "matches_in_step": int(get("step_matches", "n") or 0),
            "first_at": iso(first),
            "last_event": iso(get("last_event", "last")),
            "due": iso(st.get("due")),
        }
    else:
        out |= {
            "status": "firing" if fire is not None else "ok",
            "last_event": iso(get("last_event", "last")),
            "due": iso(st.get("due")),
        }
    return out
