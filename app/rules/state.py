"""Rule state records: their fields, their format version, and the migration of older formats.

Each rule kind keeps one record per group (``app.rules.logic``), a JSON-able dict whose
fields are declared by a ``TypedDict`` below; a stream partition's clock keeps a
:class:`ClockState` (:mod:`app.rules.timebound`). The records are dicts, not classes, so
that a Faust table's changelog and the Spark engine's state store keep them as JSON
without a conversion on every write, and the compiled evaluator reads and writes them as
native dict operations.

Every rule state carries an envelope (:class:`Envelope`): its group values, its timer
(``due``), the partition whose events own it, and ``version``: the state format and the
rule version, one string (:func:`stamp`) so that one comparison tells a current state from
one written by another build or another version of the rule (hot reload), which is
ignored as absent.

Format history (:data:`FORMAT`):

* 1 (unversioned): one- or two-letter field names (``n``, ``s``, ``t``, ``kf``, ``la``,
  ``nd``, ``q``, ...), ``v`` the bare rule version, ``p`` the partition.
* 2: the field names below; ``version`` = ``"2/<rule version>"``.

A format-1 state is migrated when the evaluator restores its partition
(:func:`migrate`): its fields are renamed, nothing else changes, so a worker upgraded
over its old changelog goes on with the same alerts. A state of a format this build does
not know (written by a newer build) is refused with :class:`StateFormatError`, which says
how to delete it.
"""

from __future__ import annotations

import logging
from typing import Any, Final, TypedDict

from app.errors import AppError

logger = logging.getLogger(__name__)

#: the state format this build writes
FORMAT: Final = 2
#: the head of a format-2 ``version``
_HEAD: Final = "2/"

#: how to delete rule state, by engine (for :class:`StateFormatError`)
DELETE_HOW: Final = (
    "the rule worker: stop it, delete its changelog topics (streamalert-rules-*-changelog) and "
    "start it again; the Spark engine: stop the query and delete its checkpoint directory "
    "(--checkpoint). Both then start the rules from empty state at the committed offsets"
)


class StateFormatError(AppError):
    """A persisted rule state whose format this build cannot read."""


def stamp(rule_version: str) -> str:
    """The ``version`` of a state of the current format for a rule at ``rule_version``."""
    return _HEAD + rule_version


class Envelope(TypedDict, total=False):
    """The fields every rule state has."""

    #: the group values (the state key's tail)
    group: list[str]
    #: the event time (ms) at which the partition clock runs the state's timer, None: none
    due: int | None
    #: :func:`stamp`: the state format and the rule version
    version: str
    #: the partition (of the stream) whose events own the state
    partition: int


class Lifecycle(TypedDict, total=False):
    """The pending/firing lifecycle of threshold and window rules (:mod:`app.rules.lifecycle`)."""

    #: consecutive matches (events, windows or change points) of the current streak
    streak: int
    #: when the streak began, None without one
    streak_since: int | None
    #: the firing alert's ``starts_at``, None when not firing
    firing_since: int | None


class EventAlert(TypedDict, total=False):
    """An event alert's lifecycle (:class:`app.rules.lifecycle.OneShot`)."""

    firing_since: int | None
    #: when the firing alert resolves (event time)
    resolves_at: int
    #: triggers since it fired
    triggers: int
    #: the values of the trigger that fired it
    firing_values: dict[str, Any]


class ThresholdState(Envelope, Lifecycle, total=False):
    last_event: int
    #: while firing after ``clear``: when ``keep_firing_for`` ends
    keep_firing_until: int | None
    #: the start of a ``no_data`` episode
    no_data_since: int | None
    #: per ``pct_change`` column: ``[ts, value]`` pairs in time order; per baseline call
    #: (:mod:`app.rules.baselines`), its own bounded state, under the call's column name
    pct_history: dict[str, Any]


class AbsenceState(Envelope, total=False):
    last_event: int
    #: the silence's start while firing
    firing_since: int | None


class ChangeState(Envelope, EventAlert, total=False):
    last_event: int
    previous_value: Any


class NewTermState(Envelope, EventAlert, total=False):
    last_event: int
    #: the group's first event (the end of learning is one horizon later)
    first_event: int
    #: each term and when it was last seen
    terms: dict[str, int]


class SequenceState(Envelope, EventAlert, total=False):
    last_event: int
    #: the step under way, and its matches so far
    step: int
    step_matches: int
    #: the first step's first event
    first_event: int | None
    #: the partition clock at the last event
    clock_at_last: int


class Window(TypedDict):
    """One open tumbling or hopping window."""

    #: the aggregates' accumulators
    accumulators: list[Any]
    #: evaluated already (``late_policy: amend`` keeps it until end + lateness)
    evaluated: bool


class TumblingState(Envelope, Lifecycle, total=False):
    #: open windows by start (as text)
    windows: dict[str, Window]
    #: the start of the last window that matched
    last_active: int | None
    #: ``[start, results]`` of the last window evaluated, when ``having`` reads ``prev()``
    previous_window: list[Any]
    #: per baseline call in ``having`` (:mod:`app.rules.baselines`): its bounded state
    baselines: dict[str, Any]


class SlidingState(Envelope, Lifecycle, total=False):
    #: ``[ts, aggregate inputs]`` in time order
    buffer: list[list[Any]]
    #: how far the buffer was evaluated (the watermark at the last timer)
    through: int | None
    #: written before 2026-11-27 to tell the window kept in memory apart; dropped at the
    #: group's next timer (``SlidingLogic`` keeps the window for the state object itself)
    generation: int


class SessionState(Envelope, EventAlert, total=False):
    buffer: list[list[Any]]
    through: int | None
    #: the open session: ``[start, last event, accumulators]``
    session: list[Any] | None


class OrderedState(Envelope, total=False):
    """A rule with ``order: event_time`` (``app.rules.logic.reorder``)."""

    #: the waiting ``[ts, row]`` pairs in time order
    queue: list[list[Any]]
    #: the wrapped kind's own state
    inner: dict[str, Any] | None
    #: the newest event evaluated
    newest: int | None


class ClockState(TypedDict, total=False):
    """A stream partition's clock record (:mod:`app.rules.timebound`)."""

    partition: int
    clock: int
    #: the key of the last admitted event
    last_key: str
    #: events held for their time
    held: list[list[Any]]
    #: events admitted since some were held
    admitted: int


#: format 1's field names, by record kind (:func:`record_kind`), and the envelope's
_ENVELOPE_1: Final = {"g": "group", "due": "due", "p": "partition"}
_EVENT_ALERT_1: Final = {
    "fire": "firing_since",
    "until": "resolves_at",
    "count": "triggers",
    "fv": "firing_values",
}
_LIFECYCLE_1: Final = {"n": "streak", "since": "streak_since", "fire": "firing_since"}
RENAMED_1: Final[dict[str, dict[str, str]]] = {
    "threshold": {
        **_LIFECYCLE_1, "last": "last_event", "kf": "keep_firing_until", "nd": "no_data_since",
        "h": "pct_history",
    },
    "absence": {"last": "last_event", "fire": "firing_since"},
    "change": {**_EVENT_ALERT_1, "last": "last_event", "val": "previous_value"},
    "new_term": {**_EVENT_ALERT_1, "last": "last_event", "first": "first_event", "terms": "terms"},
    "sequence": {
        **_EVENT_ALERT_1, "last": "last_event", "step": "step", "n": "step_matches", "first": "first_event",
        "c": "clock_at_last",
    },
    "tumbling": {**_LIFECYCLE_1, "w": "windows", "la": "last_active", "prev": "previous_window"},
    "sliding": {**_LIFECYCLE_1, "ev": "buffer", "t": "through", "gen": "generation"},
    "session": {**_EVENT_ALERT_1, "ev": "buffer", "t": "through", "s": "session"},
    "ordered": {"q": "queue", "s": "inner", "t": "newest"},
    "clock": {"p": "partition", "c": "clock", "k": "last_key", "h": "held", "n": "admitted"},
}  # fmt: skip


def record_kind(kind: str, window_type: str | None, ordered: bool) -> str:
    """The record a rule keeps: its kind, its window's type (hopping windows keep the
    tumbling record) or ``ordered`` for ``order: event_time``."""
    if ordered:
        return "ordered"
    if kind == "window":
        return "tumbling" if window_type in ("tumbling", "hopping") else str(window_type)
    return kind


def is_current(st: dict[str, Any]) -> bool:
    """Whether ``st`` is of the current format (any rule version)."""
    version = st.get("version")
    return isinstance(version, str) and version.startswith(_HEAD)


def partition_of(st: dict[str, Any]) -> int:
    """The partition a persisted state (rule or clock record, any known format) belongs to."""
    found = st.get("partition", st.get("p", 0))
    return int(found) if found is not None else 0


def format_of(st: dict[str, Any]) -> int:
    """The format of a persisted rule state: 1 (unversioned), or the head of its ``version``.

    A version whose head is not a number is not a format this build knows (0)."""
    version = st.get("version")
    if version is None:
        return 1 if "v" in st else 0
    head, sep, _ = str(version).partition("/")
    return int(head) if sep and head.isdigit() else 0


def _renamed(st: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in st.items():
        name = names.get(k) or _ENVELOPE_1.get(k)
        if name is None:
            msg = f"unknown field {k!r}"
            raise KeyError(msg)
        out[name] = v
    return out


def _windows(st: dict[str, Any]) -> None:
    """A tumbling state's windows renamed in place (format 1: ``a``, ``done``)."""
    windows = st.get("windows")
    if windows is not None:
        st["windows"] = {s: {"accumulators": w["a"], "evaluated": w["done"]} for s, w in windows.items()}


def migrate(key: str, st: dict[str, Any], kind: str, inner_kind: str | None = None) -> dict[str, Any]:
    """``st`` (a rule's state under ``key``, record ``kind``; ``inner_kind``: the wrapped
    kind's record when ``kind`` is ``ordered``) in the current format.

    Raises :class:`StateFormatError` for a format this build does not know, or a format-1
    state with a field its kind never had."""
    found = format_of(st)
    if found == FORMAT:
        return st
    if found != 1:
        msg = (
            f"rule state {key!r} has format {st.get('version')!r}, which this build (format {FORMAT}) "
            f"cannot read: it was written by a newer build. Run that build, or delete this state: "
            f"{DELETE_HOW}"
        )
        raise StateFormatError(msg)
    body = {k: v for k, v in st.items() if k != "v"}
    try:
        out = _renamed(body, RENAMED_1[kind])
        if kind == "ordered" and out.get("inner") is not None:
            out["inner"] = _renamed(out["inner"], RENAMED_1[inner_kind or ""])
            _windows(out["inner"])
        _windows(out)
    except KeyError as exc:
        msg = f"rule state {key!r} (format 1, {kind}) has {exc.args[0]}: delete this state: {DELETE_HOW}"
        raise StateFormatError(msg) from exc
    out["version"] = stamp(str(st["v"]))
    return out


def migrate_clock(st: dict[str, Any]) -> dict[str, Any]:
    """A clock record in the current format (format 1: short names, found by its ``c``)."""
    if "c" not in st:
        return st
    return {RENAMED_1["clock"].get(k, k): v for k, v in st.items()}
