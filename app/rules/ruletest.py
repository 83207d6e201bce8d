"""Rule unit tests, in the spirit of ``promtool test rules``.

A test file (``*.test.yaml`` or ``*.test.yml``, in any case) names rule files, optional
registry rows, and test cases. Each case feeds events (inline, or a JSON-lines file) through
the production engine and compares the alert transitions with the expected ones::

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

A test file is parsed whole before any of its cases runs (its shape,
:class:`app.rules.testfile.RuleTestFile`, then the rules, rows, events and rule ids each case
names): ``rule_files`` (loading at least one rule), ``tests`` and each case's ``expect`` are
required, an unknown key is refused, and every id in ``rules:`` or an expectation's ``rule``
must be a loaded rule's. Every problem found is listed as ``file:line:col: case N 'name':
what``, in a rule file's words (:mod:`app.rules.problems`), and the file is an *error*
(:attr:`CaseResult.error`), not a failure: none of its cases runs, and the files after it
still do.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from app.alerts import Alert
from app.errors import AppError, IngestDecodeError, RuleConfigError
from app.events import SCHEMAS, Event, format_ts, parse_ts
from app.rules.evaluator import Engine
from app.rules.loader import RuleSet, is_rule_test_file, load_rules
from app.rules.problems import Problems, describe, field_label
from app.rules.testfile import KEYS, Rows, RuleTestCase, RuleTestFile, yaml_time
from app.rules.yamlpos import Positions, YamlProblem, load_with_positions
from app.tables import TABLES, Tables

logger = logging.getLogger(__name__)


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


def _event(raw: Any) -> tuple[str, Event]:
    """A source and its validated event; IngestDecodeError (naming the field) when invalid."""
    if not isinstance(raw, dict):
        msg = f"an event is a mapping of its fields, got {describe(raw)}"
        raise IngestDecodeError(msg)
    data = {k: yaml_time(v) for k, v in raw.items()}
    source = data.pop("source", None)
    if source is None:
        source = next((s.source for s in SCHEMAS.values() if s.key in data), None)
    if source not in SCHEMAS:
        msg = f"cannot tell the event's source (give 'source: {'|'.join(SCHEMAS)}')"
        raise IngestDecodeError(msg, "source")
    return source, SCHEMAS[source].validate(data)


def _in_case(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    return loc[2:] if len(loc) >= 2 and loc[0] == "tests" and isinstance(loc[1], int) else loc


def _case_label(data: Any, loc: tuple[str | int, ...]) -> str | None:
    """``case 2 'name'`` for a path in a test case, None outside one."""
    if len(loc) < 2 or loc[0] != "tests" or not isinstance(loc[1], int):
        return None
    cases = data.get("tests") if isinstance(data, dict) else None
    case = cases[loc[1]] if isinstance(cases, list) and loc[1] < len(cases) else None
    name = case.get("name") if isinstance(case, dict) else None
    return f"case {loc[1] + 1}" + (f" {name!r}" if isinstance(name, str) else "")


def _problems(path: str, text: str, data: Any, positions: Positions) -> Problems:
    """A test file's problems, each as ``file:line:col: case N 'name': field: message``."""

    def case(loc: tuple[str | int, ...]) -> str | None:
        return _case_label(data, loc)

    return Problems(path, text, data, positions, case, lambda loc: field_label(_in_case(loc)))


def _add_decode(
    problems: Problems, at: tuple[str | int, ...], exc: IngestDecodeError, raw: Mapping[str, Any]
) -> None:
    """An event's or row's problem, at the field it names when ``raw`` has it."""
    if exc.field is not None and exc.field in raw:
        problems.add_at((*at, exc.field), exc.reason, named=1)
    else:
        problems.add_at(at, exc.reason)


def _report(problems: Problems) -> str:
    return "\n".join(problems.lines())


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

    def __init__(self, spec: RuleTestFile, base: Path, ruleset: RuleSet, problems: Problems) -> None:
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
                    _add_decode(self.problems, (*at, "tables", tname, k), exc, row)
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
            self.problems.add_at(at, f"{path}: {why}")
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
                        self.problems.add_at(at, f"{path}:{n}: not UTF-8: {exc.reason} at byte {exc.start}")
                    except orjson.JSONDecodeError as exc:
                        self.problems.add_at(at, f"{path}:{n}: not valid JSON: {exc.msg}")
                    except IngestDecodeError as exc:
                        self.problems.add_at(at, f"{path}:{n}: {exc.reason}")
        except OSError as exc:
            self.problems.add_at(at, f"{path}: cannot read: {exc.strerror or exc}")
        return events

    def rule_ids(self, i: int, case: RuleTestCase) -> None:
        for j, rid in enumerate(case.rules or ()):
            why = _rule_problem(rid, self.ruleset)
            if why:
                self.problems.add_at(("tests", i, "rules", j), why)
        for j, w in enumerate(case.expect):
            if w.rule is None:
                continue
            why = _rule_problem(w.rule, self.ruleset)
            if why is None and case.rules and w.rule not in case.rules:
                why = f"rule {w.rule!r} is not in the case's 'rules', so none of its transitions is compared"
            if why:
                self.problems.add_at(("tests", i, "expect", j, "rule"), why)

    def case(self, i: int, case: RuleTestCase, file_rows: Mapping[str, Rows]) -> PreparedCase:
        before = self.problems.count
        events = []
        for j, raw in enumerate(case.input):
            try:
                events.append(_event(raw))
            except IngestDecodeError as exc:
                _add_decode(self.problems, ("tests", i, "input", j), exc, raw)
        if case.input_file is not None:
            events += self.input_file(i, case.input_file)
        if not events and self.problems.count == before:
            msg = "no input events, so nothing to test: give 'input' (events) or 'input_file' (JSON lines)"
            self.problems.add_at(("tests", i), msg)
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
    return " ".join(f"{k}={_fmt(w[k])}" for k in KEYS if k in w)


def _show(a: Alert, like: dict[str, Any] | None) -> str:
    """An actual transition, projected on the keys (and sub-keys) its expectation names."""
    full = {"rule": a.rule_id, **{k: getattr(a, k) for k in KEYS[1:]}}
    if like is None:
        like = {"rule": 1, "status": 1, "starts_at": 1, "ends_at": 1, "labels": a.labels}
    shown = {}
    for k in KEYS:
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
        text = path.read_bytes().decode("utf-8")
        data, positions = load_with_positions(text)
    except OSError as exc:
        return f"{name}:1:1: cannot read test file: {exc.strerror or exc}"
    except UnicodeDecodeError as exc:
        return f"{name}:1:1: test file is not UTF-8: {exc.reason} at byte {exc.start}"
    except YamlProblem as exc:
        return f"{name}:{exc.line}:{exc.col}: {exc.message}"
    except (RecursionError, MemoryError) as exc:  # past every limit of the reader: still the file's
        return f"{name}:1:1: test file is too large or nests too deeply to load ({type(exc).__name__})"
    if not isinstance(data, dict):
        return f"{name}:1:1: a rule test file is a mapping (rule_files, tests), got {describe(data)}"
    problems = _problems(name, text, data, positions)
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
        return _report(problems)
    try:
        ruleset = load_rules([path.parent / f for f in spec.rule_files])
    except RuleConfigError as exc:
        problems.add_at(("rule_files",), f"the rule files are invalid:\n{exc}")
        return _report(problems)
    if not ruleset.rules:
        problems.add_at(("rule_files",), "the rule files hold no rule: a test needs at least one")
        return _report(problems)
    cases = _Preparer(spec, path.parent, ruleset, problems).cases()
    if problems.count:
        return _report(problems)
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
        files = sorted(f for f in p.rglob("*") if is_rule_test_file(f)) if p.is_dir() else [p]
        for f in files:
            report.results += run_file(f)
    return report
