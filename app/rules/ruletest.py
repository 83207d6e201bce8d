"""Rule unit tests, in the spirit of ``promtool test rules``.

A test file (``*.test.yaml``) names rule files, optional registry rows, and
test cases. Each case feeds events (inline, or a JSON-lines file) through the
production engine and compares the alert transitions with the expected ones::

    rule_files: [../iot.yaml]
    tables:
      devices: [{device_id: d1, max_temp: 30}]
    tests:
      - name: overheating machine fires once, then resolves
        rules: [machine-overheat]          # only these rules' transitions count
        input:
          - {source: sensors, device_id: m1, ts: "2024-01-01T00:00:00Z", temperature: 101}
        expect:
          - {rule: machine-overheat, status: firing, starts_at: "2024-01-01T00:00:00Z",
             labels: {device_id: m1}, annotations: {summary: "..."}}

Expected transitions are matched in order, one for one; each names only the
fields it cares about (``labels``, ``annotations`` and ``values`` are
subsets). A failure prints a readable diff of expected and actual lines.

Which statuses take part: ``statuses: [pending, firing, ...]`` on the case
(or the file); by default firing and resolved plus every status the case's
``expect`` names, so a test that expects ``pending`` sees every pending
transition and older tests are not disturbed by it.

A test file is parsed whole before any of its cases runs (:class:`RuleTestFile`, then
the rules, rows, events and rule ids each case names): ``rule_files`` (loading at least
one rule), ``tests`` and each case's ``expect`` are required, an unknown key is refused,
and every id in ``rules:`` or an expectation's ``rule`` must be a loaded rule's. Every
problem found is listed as ``file:line:col: case N 'name': what``, and the file is an
*error* (:attr:`CaseResult.error`), not a failure: none of its cases runs, and the files
after it still do.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import orjson
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from app.alerts import Alert, Status
from app.errors import AppError, IngestDecodeError, RuleConfigError
from app.events import SCHEMAS, Event, format_ts, parse_ts
from app.rules.evaluator import Engine
from app.rules.loader import RuleSet, load_rules
from app.rules.model import Severity
from app.rules.yamlpos import Positions, YamlProblem, load_with_positions, position_of
from app.tables import TABLES, Tables

logger = logging.getLogger(__name__)

#: problems listed per test file; past it, one more line counts the rest
MAX_PROBLEMS = 100


@dataclass
class CaseResult:
    """One case's outcome. ``error``: the file or case could not be run as written (an
    invalid test file: ``name`` is ``-``), as opposed to transitions that differ."""

    file: str
    name: str
    ok: bool
    detail: str = ""
    error: bool = False


@dataclass
class TestReport:
    results: list[CaseResult] = field(default_factory=list)

    @property
    def failed(self) -> list[CaseResult]:
        """Every result that did not pass: failures and errors."""
        return [r for r in self.results if not r.ok]

    @property
    def errors(self) -> list[CaseResult]:
        """The results that are errors (invalid test files), a subset of :attr:`failed`."""
        return [r for r in self.results if r.error]


def _yaml_time(value: Any) -> Any:
    """A time or date YAML read unquoted as the text it was (``2024-01-01T00:00:00+00:00``),
    so that it is checked as a time written in quotes is; any other value as it is."""
    return value.isoformat() if isinstance(value, date) else value


def _timestamp(value: str) -> str:
    try:
        parse_ts(value)
    except IngestDecodeError:
        msg = f"expected an RFC 3339 time with an offset, such as 2024-01-01T00:00:00Z, got {value[:64]!r}"
        raise ValueError(msg) from None
    return value


def _scalar(value: Any) -> Any:
    if isinstance(value, dict | list):
        msg = f"expected a plain value (text or a number), got {_what(value)}"
        raise ValueError(msg)
    return value


def _table_name(name: str) -> str:
    if name not in TABLES:
        msg = f"unknown table {name!r}; the tables are {', '.join(TABLES)}"
        raise ValueError(msg)
    return name


def _not_null(value: Any) -> Any:
    if value is None:
        msg = "must not be null (leave the key out to accept any)"
        raise ValueError(msg)
    return value


#: an expected time: RFC 3339 text with an offset (checked when the file is read)
Timestamp = Annotated[str, BeforeValidator(_yaml_time), AfterValidator(_timestamp)]
#: an expected label, annotation or value (compared as text)
Scalar = Annotated[Any, AfterValidator(_scalar)]
#: a table's rows, each checked against its table's columns once the file validates
Rows = tuple[dict[str, Any], ...]
TableName = Annotated[str, AfterValidator(_table_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Expectation(_Strict):
    """One expected transition; only the keys given are compared (:meth:`given`).
    ``ends_at: null`` expects a transition that has not ended."""

    rule: Annotated[str | None, BeforeValidator(_not_null)] = None
    status: Annotated[Status | None, BeforeValidator(_not_null)] = None
    severity: Annotated[Severity | None, BeforeValidator(_not_null)] = None
    starts_at: Timestamp | None = None
    ends_at: Timestamp | None = None
    event_ts: Timestamp | None = None
    labels: Mapping[str, Scalar] = Field(default_factory=dict)
    annotations: Mapping[str, Scalar] = Field(default_factory=dict)
    values: Mapping[str, Scalar] = Field(default_factory=dict)

    def given(self) -> dict[str, Any]:
        """The keys the test file gave, with their values, in :data:`_KEYS` order."""
        return {k: getattr(self, k) for k in _KEYS if k in self.model_fields_set}


class RuleTestCase(_Strict):
    """One case: events in (``input``, then ``input_file``'s lines), transitions out."""

    name: str | None = None
    rules: tuple[str, ...] | None = Field(default=None, min_length=1)
    input: tuple[dict[str, Any], ...] = ()
    input_file: str | None = None
    tables: Mapping[TableName, Rows] = Field(default_factory=dict)
    partitions: int | None = Field(default=None, ge=1, strict=True)
    statuses: tuple[Status, ...] | None = Field(default=None, min_length=1)
    expect: tuple[Expectation, ...]


class RuleTestFile(_Strict):
    """A ``*.test.yaml`` file; ``tables``, ``partitions`` and ``statuses`` are each case's
    defaults (a case's ``tables`` replace the file's table by table)."""

    rule_files: tuple[str, ...] = Field(min_length=1)
    tables: Mapping[TableName, Rows] = Field(default_factory=dict)
    partitions: int | None = Field(default=None, ge=1, strict=True)
    statuses: tuple[Status, ...] | None = Field(default=None, min_length=1)
    tests: tuple[RuleTestCase, ...] = Field(min_length=1)


@dataclass(frozen=True)
class PreparedCase:
    """A case ready to run: its events decoded, its rows checked, its statuses chosen."""

    title: str
    events: tuple[tuple[str, Event], ...]
    tables: Mapping[str, Rows]
    partitions: int
    only: frozenset[str]
    want: tuple[dict[str, Any], ...]
    shown: frozenset[str]


def _what(value: Any) -> str:
    """A YAML value's kind, in the file's words (with the value when it is short)."""
    if isinstance(value, bool):
        return "true/false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str | int | float):
        return f"{'text' if isinstance(value, str) else 'a number'} {value!r:.40}"
    return type(value).__name__


#: pydantic's error types that say a value has the wrong shape, as the shape expected
_EXPECTED = {
    "dict_type": "a mapping",
    "mapping_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
    "string_type": "text",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
}


def _event(raw: Any) -> tuple[str, Event]:
    """A source and its validated event; IngestDecodeError (naming the field) when invalid."""
    if not isinstance(raw, dict):
        msg = f"an event is a mapping of its fields, got {_what(raw)}"
        raise IngestDecodeError(msg)
    data = {k: _yaml_time(v) for k, v in raw.items()}
    source = data.pop("source", None)
    if source is None:
        source = next((s.source for s in SCHEMAS.values() if s.key in data), None)
    if source not in SCHEMAS:
        msg = f"cannot tell the event's source (give 'source: {'|'.join(SCHEMAS)}')"
        raise IngestDecodeError(msg, "source")
    return source, SCHEMAS[source].validate(data)


class _Problems:
    """Every problem of one test file, as ``file:line:col: case N 'name': message``."""

    def __init__(self, path: str, positions: Positions, data: Any) -> None:
        self.path = path
        self.positions = positions
        self.data = data
        self.lines: list[str] = []
        self.unlisted = 0

    def case_label(self, loc: tuple[str | int, ...]) -> str:
        if len(loc) < 2 or loc[0] != "tests" or not isinstance(loc[1], int):
            return ""
        cases = self.data.get("tests") if isinstance(self.data, dict) else None
        case = cases[loc[1]] if isinstance(cases, list) and loc[1] < len(cases) else None
        name = case.get("name") if isinstance(case, dict) else None
        return f"case {loc[1] + 1}" + (f" {name!r}" if isinstance(name, str) else "")

    def add(self, loc: tuple[str | int, ...], message: str, *, named: int = 0) -> None:
        """``message`` at ``loc`` (the data path: its position, its case when in one, and the
        field, less the last ``named`` parts when ``message`` names them)."""
        if len(self.lines) >= MAX_PROBLEMS:
            self.unlisted += 1
            return
        line, col = position_of(self.positions, loc)
        label = _field_label(_in_case(loc[: len(loc) - named]))
        where = ": ".join(p for p in (self.case_label(loc), label) if p)
        self.lines.append(f"{self.path}:{line}:{col}: {where + ': ' if where else ''}{message}")

    def add_decode(self, at: tuple[str | int, ...], exc: IngestDecodeError, raw: Mapping[str, Any]) -> None:
        """An event's or row's problem, at the field it names when ``raw`` has it."""
        if exc.field is not None and exc.field in raw:
            self.add((*at, exc.field), exc.reason, named=1)
        else:
            self.add(at, exc.reason)

    def add_pydantic(self, err: Mapping[str, Any]) -> None:
        loc = _data_path(self.data, tuple(err["loc"]))
        kind = err.get("type", "")
        if kind in ("extra_forbidden", "missing"):
            key = err["loc"][-1]
            what = "unknown key" if kind == "extra_forbidden" else "missing required key"
            self.add(loc, f"{what} '{key}'", named=1)
            return
        if kind in _EXPECTED:
            self.add(loc, f"expected {_EXPECTED[kind]}, got {_what(err.get('input'))}")
            return
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if kind == "too_short":
            msg = "must not be empty"
        elif kind.startswith("literal_error") or kind == "greater_than_equal":
            msg = f"{msg} (got {err.get('input')!r})"
        self.add(loc, msg)

    def report(self) -> str:
        more = f"\n{self.unlisted} more problem(s); only the first {MAX_PROBLEMS} are listed"
        return "\n".join(self.lines) + (more if self.unlisted else "")


def _data_path(data: Any, loc: tuple[Any, ...]) -> tuple[str | int, ...]:
    """The part of a pydantic error location that is a path in the file's data (without
    pydantic's ``[key]`` and validator steps), plus a missing key's name."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and part != "[key]":
            out.append(part)  # a missing key
            break
        else:
            break
        out.append(part)
    return tuple(out)


def _in_case(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    return loc[2:] if len(loc) >= 2 and loc[0] == "tests" and isinstance(loc[1], int) else loc


def _field_label(loc: tuple[str | int, ...]) -> str:
    """``('expect', 0, 'starts_at')`` as ``expect 1: 'starts_at'`` (list items from 1)."""
    parts: list[str] = []
    for i, p in enumerate(loc):
        if isinstance(p, int):
            continue
        nxt = loc[i + 1] if i + 1 < len(loc) else None
        parts.append(f"{p} {nxt + 1}" if isinstance(nxt, int) else f"'{p}'")
    return ": ".join(parts)


def _rule_problem(rid: str, ruleset: RuleSet) -> str | None:
    """Why ``rid`` names no rule of ``ruleset`` (None when it names one)."""
    if ruleset.get(rid) is not None:
        return None
    ids = [r.id for r in ruleset.rules]
    close = difflib.get_close_matches(rid, ids, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"the rule files define {', '.join(ids[:10])}"
    return f"no rule {rid!r} in the rule files; {hint}"


class _Preparer:
    """Checks a validated test file against its rules and turns each case into a
    :class:`PreparedCase`, telling ``problems`` whatever it cannot use."""

    def __init__(self, spec: RuleTestFile, base: Path, ruleset: RuleSet, problems: _Problems) -> None:
        self.spec = spec
        self.base = base
        self.ruleset = ruleset
        self.problems = problems

    def rows(self, tables: Mapping[str, Rows], at: tuple[str | int, ...]) -> dict[str, Rows]:
        out = {}
        for tname, rows in tables.items():
            good = []
            for k, row in enumerate(rows):
                try:
                    good.append(TABLES[tname].validate(row))
                except IngestDecodeError as exc:
                    self.problems.add_decode((*at, "tables", tname, k), exc, row)
            out[tname] = tuple(good)
        return out

    def input_file(self, i: int, name: str) -> list[tuple[str, Event]]:
        at: tuple[str | int, ...] = ("tests", i, "input_file")
        path = self.base / name
        if not path.is_file():
            why = (
                "no such file"
                if not path.exists()
                else "a directory, not a file of JSON lines"
                if path.is_dir()
                else "not a regular file"
            )
            self.problems.add(at, f"{path}: {why}")
            return []
        events = []
        try:
            with path.open("rb") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        raw = orjson.loads(line.decode("utf-8"))
                        events.append(_event(raw))
                    except UnicodeDecodeError as exc:
                        self.problems.add(at, f"{path}:{n}: not UTF-8: {exc.reason} at byte {exc.start}")
                    except orjson.JSONDecodeError as exc:
                        self.problems.add(at, f"{path}:{n}: not valid JSON: {exc.msg}")
                    except IngestDecodeError as exc:
                        self.problems.add(at, f"{path}:{n}: {exc.reason}")
        except OSError as exc:
            self.problems.add(at, f"{path}: cannot read: {exc.strerror or exc}")
        return events

    def rule_ids(self, i: int, case: RuleTestCase) -> None:
        for j, rid in enumerate(case.rules or ()):
            why = _rule_problem(rid, self.ruleset)
            if why:
                self.problems.add(("tests", i, "rules", j), why)
        for j, w in enumerate(case.expect):
            if w.rule is None:
                continue
            why = _rule_problem(w.rule, self.ruleset)
            if why is None and case.rules and w.rule not in case.rules:
                why = f"rule {w.rule!r} is not in the case's 'rules', so none of its transitions is compared"
            if why:
                self.problems.add(("tests", i, "expect", j, "rule"), why)

    def case(self, i: int, case: RuleTestCase, file_rows: Mapping[str, Rows]) -> PreparedCase:
        before = len(self.problems.lines) + self.problems.unlisted
        events = []
        for j, raw in enumerate(case.input):
            try:
                events.append(_event(raw))
            except IngestDecodeError as exc:
                self.problems.add_decode(("tests", i, "input", j), exc, raw)
        if case.input_file is not None:
            events += self.input_file(i, case.input_file)
        if not events and len(self.problems.lines) + self.problems.unlisted == before:
            msg = "no input events, so nothing to test: give 'input' (events) or 'input_file' (JSON lines)"
            self.problems.add(("tests", i), msg)
        self.rule_ids(i, case)
        want = tuple(w.given() for w in case.expect)
        return PreparedCase(
            title=case.name or f"case {i + 1}",
            events=tuple(events),
            tables={**file_rows, **self.rows(case.tables, ("tests", i))},
            partitions=case.partitions or self.spec.partitions or 1,
            only=frozenset(case.rules or ()),
            want=want,
            shown=_statuses(case.statuses if case.statuses is not None else self.spec.statuses, want),
        )

    def cases(self) -> list[PreparedCase]:
        file_rows = self.rows(self.spec.tables, ())
        return [self.case(i, c, file_rows) for i, c in enumerate(self.spec.tests)]


def _same_time(want: str, got: str | None) -> bool:
    return got is not None and parse_ts(want) == parse_ts(got)


def _matches(want: dict[str, Any], got: Alert) -> bool:
    for k, v in want.items():
        if k == "rule" and got.rule_id != v:
            return False
        if k in ("status", "severity") and getattr(got, k) != v:
            return False
        if k in ("starts_at", "ends_at", "event_ts"):
            have = getattr(got, k)
            if (have is not None) if v is None else not _same_time(str(v), have):
                return False
        if k in ("labels", "annotations", "values"):
            have = getattr(got, k)
            if any(str(have.get(kk)) != str(vv) for kk, vv in v.items()):
                return False
    return True


_KEYS = ("rule", "status", "severity", "starts_at", "ends_at", "event_ts", "labels", "annotations", "values")


def _fmt(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, str) and value.endswith("Z"):
        try:
            return format_ts(parse_ts(value))
        except IngestDecodeError:
            return value
    return str(value)


def _show_want(w: dict[str, Any]) -> str:
    return " ".join(f"{k}={_fmt(w[k])}" for k in _KEYS if k in w)


def _show(a: Alert, like: dict[str, Any] | None) -> str:
    """An actual transition, projected on the keys (and sub-keys) its expectation names."""
    full = {"rule": a.rule_id, **{k: getattr(a, k) for k in _KEYS[1:]}}
    if like is None:
        like = {"rule": 1, "status": 1, "starts_at": 1, "ends_at": 1, "labels": a.labels}
    shown = {}
    for k in _KEYS:
        if k in like:
            v = full[k]
            shown[k] = (
                {kk: v.get(kk) for kk in like[k]}
                if isinstance(like[k], Mapping) and isinstance(v, dict)
                else v
            )
    return " ".join(f"{k}={_fmt(v)}" for k, v in shown.items())


def _load(path: Path) -> tuple[RuleSet, list[PreparedCase]] | str:
    """A test file parsed and checked whole: its cases ready to run, or every problem found."""
    name = str(path)
    try:  # the rule files' bounded reader: no aliases, capped nesting and size (docs/rule-limits.md)
        if path.exists() and not path.is_file():
            return f"{name}:1:1: not a regular file"
        data, positions = load_with_positions(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        return f"{name}:1:1: cannot read test file: {exc.strerror or exc}"
    except UnicodeDecodeError as exc:
        return f"{name}:1:1: test file is not UTF-8: {exc.reason} at byte {exc.start}"
    except YamlProblem as exc:
        return f"{name}:{exc.line}:{exc.col}: {exc.message}"
    except (RecursionError, MemoryError) as exc:  # past every limit of the reader: still the file's
        return f"{name}:1:1: test file is too large or nests too deeply to load ({type(exc).__name__})"
    if not isinstance(data, dict):
        return f"{name}:1:1: a rule test file is a mapping (rule_files, tests), got {_what(data)}"
    problems = _Problems(name, positions, data)
    try:
        spec = RuleTestFile.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        for err in errors:
            # pydantic counts a list's valid items against min_length even when some are invalid
            if err["type"] == "too_short" and any(
                e["loc"][: len(err["loc"])] == err["loc"] and e is not err for e in errors
            ):
                continue
            problems.add_pydantic(err)
        return problems.report()
    try:
        ruleset = load_rules([path.parent / f for f in spec.rule_files])
    except RuleConfigError as exc:
        problems.add(("rule_files",), f"the rule files are invalid:\n{exc}")
        return problems.report()
    if not ruleset.rules:
        problems.add(("rule_files",), "the rule files hold no rule: a test needs at least one")
        return problems.report()
    cases = _Preparer(spec, path.parent, ruleset, problems).cases()
    if problems.lines:
        return problems.report()
    # every rule runs, whatever its ``engine:``: both engines run this evaluator and give the
    # same alerts, and a rule on Spark alone ran nothing here, so its tests checked nothing
    return RuleSet(tuple(replace(r, engine="both") for r in ruleset.rules), ruleset.files), cases


def run_file(path: Path) -> list[CaseResult]:
    """Run every case of one test file; an invalid file is one error result (``name`` ``-``)
    listing every problem, and none of its cases runs."""
    name = str(path)
    loaded = _load(path)
    if isinstance(loaded, str):
        return [CaseResult(name, "-", False, loaded, error=True)]
    ruleset, cases = loaded
    results = []
    for i, case in enumerate(cases):
        try:
            results.append(_run_case(name, case, ruleset))
        except AppError as exc:  # the engine refused the case: the case's error, the next one runs
            detail = f"{name}: case {i + 1} {case.title!r}: {exc}"
            results.append(CaseResult(name, case.title, False, detail, error=True))
    return results


def _run_case(name: str, case: PreparedCase, ruleset: RuleSet) -> CaseResult:
    tables = Tables()
    for tname, rows in case.tables.items():
        tables.load_rows(tname, rows)
    engine = Engine(ruleset, partitions=case.partitions, tables=tables)
    got = [
        a
        for s, e in case.events
        for a in engine.process(s, e).alerts
        if (not case.only or a.rule_id in case.only) and a.status in case.shown
    ]
    want = case.want
    if len(got) == len(want) and all(_matches(w, g) for w, g in zip(want, got, strict=True)):
        return CaseResult(name, case.title, True)
    actual = [_show(g, want[i] if i < len(want) else None) for i, g in enumerate(got)]
    diff = "\n".join(
        difflib.unified_diff([_show_want(w) for w in want], actual, "expected", "actual", lineterm="")
    )
    return CaseResult(name, case.title, False, diff or "transitions differ")


DEFAULT_STATUSES = frozenset({"firing", "resolved"})


def _statuses(given: tuple[str, ...] | None, want: tuple[dict[str, Any], ...]) -> frozenset[str]:
    """The statuses a case compares: ``given``, else the defaults and those ``want`` names."""
    if given is None:
        return DEFAULT_STATUSES | {str(w["status"]) for w in want if "status" in w}
    return frozenset(given)


def run_tests(paths: list[Path]) -> TestReport:
    report = TestReport()
    for p in paths:
        files = sorted(p.rglob("*.test.yaml")) if p.is_dir() else [p]
        for f in files:
            report.results += run_file(f)
    return report
