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
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from app.alerts import STATUSES, Alert
from app.errors import IngestDecodeError, RuleConfigError
from app.events import SCHEMAS, Event, format_ts, parse_ts
from app.rules.evaluator import Engine
from app.rules.loader import load_rules
from app.rules.yamlpos import YamlProblem, load_with_positions
from app.tables import TABLES, Tables

logger = logging.getLogger(__name__)


@dataclass
class CaseResult:
    file: str
    name: str
    ok: bool
    detail: str = ""


@dataclass
class TestReport:
    results: list[CaseResult] = field(default_factory=list)

    @property
    def failed(self) -> list[CaseResult]:
        return [r for r in self.results if not r.ok]


def _event(raw: dict[str, Any], where: str) -> tuple[str, Event]:
    data = dict(raw)
    source = data.pop("source", None)
    if source is None:
        source = next((s.source for s in SCHEMAS.values() if s.key in data), None)
    if source not in SCHEMAS:
        msg = f"{where}: cannot tell the event's source (give 'source: sensors|logs|finance')"
        raise ValueError(msg)
    try:
        return source, SCHEMAS[source].validate(data)
    except IngestDecodeError as exc:
        msg = f"{where}: {exc.reason}"
        raise ValueError(msg) from None


def _same_time(want: str, got: str | None) -> bool:
    return got is not None and parse_ts(want) == parse_ts(got)


def _matches(want: dict[str, Any], got: Alert) -> bool:
    for k, v in want.items():
        if k == "rule" and got.rule_id != v:
            return False
        if k in ("status", "severity") and getattr(got, k) != v:
            return False
        if k in ("starts_at", "ends_at", "event_ts") and not _same_time(str(v), getattr(got, k)):
            return False
        if k in ("labels", "annotations", "values"):
            have = getattr(got, k)
            if any(str(have.get(kk)) != str(vv) for kk, vv in v.items()):
                return False
    return True


_KEYS = ("rule", "status", "severity", "starts_at", "ends_at", "event_ts", "labels", "annotations", "values")


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
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
                {kk: v.get(kk) for kk in like[k]} if isinstance(like[k], dict) and isinstance(v, dict) else v
            )
    return " ".join(f"{k}={_fmt(v)}" for k, v in shown.items())


def run_file(path: Path) -> list[CaseResult]:
    """Run every case of one test file."""
    name = str(path)
    try:  # the rule files' bounded reader: no aliases, capped nesting and size (docs/rule-limits.md)
        spec = load_with_positions(path.read_text(encoding="utf-8"))[0] or {}
    except OSError as exc:
        return [CaseResult(name, "-", False, f"cannot read test file: {exc}")]
    except YamlProblem as exc:
        return [CaseResult(name, "-", False, f"{name}:{exc.line}:{exc.col}: {exc.message}")]
    if not isinstance(spec, dict):
        return [CaseResult(name, "-", False, f"{name}: a rule test file is a mapping (rule_files, tests)")]
    base = path.parent
    try:
        ruleset = load_rules([base / f for f in spec.get("rule_files", [])])
    except RuleConfigError as exc:
        return [CaseResult(name, "-", False, f"rule files are invalid:\n{exc}")]
    results = []
    for i, case in enumerate(spec.get("tests", [])):
        title = str(case.get("name", f"case {i + 1}"))
        try:
            results.append(_run_case(name, base, title, case, spec, ruleset))
        except (ValueError, KeyError, OSError) as exc:
            results.append(CaseResult(name, title, False, f"bad test case: {exc}"))
    return results


def _run_case(name: str, base: Path, title: str, case: dict, spec: dict, ruleset: Any) -> CaseResult:
    tables = Tables()
    for tname, rows in {**spec.get("tables", {}), **case.get("tables", {})}.items():
        if tname not in TABLES:
            msg = f"unknown table {tname!r}"
            raise ValueError(msg)
        tables.load_rows(tname, rows)
    events = [_event(e, f"{title}: input {j + 1}") for j, e in enumerate(case.get("input", []))]
    if "input_file" in case:
        with (base / case["input_file"]).open("rb") as f:
            events += [_event(orjson.loads(line), f"{case['input_file']}:{n}") for n, line in enumerate(f, 1)
                       if line.strip()]  # fmt: skip
    engine = Engine(ruleset, partitions=int(case.get("partitions", spec.get("partitions", 1))), tables=tables)
    only = set(case.get("rules", []))
    want = case.get("expect", [])
    shown = _statuses(case.get("statuses", spec.get("statuses")), want)
    got = [
        a
        for s, e in events
        for a in engine.process(s, e).alerts
        if (not only or a.rule_id in only) and a.status in shown
    ]
    if len(got) == len(want) and all(_matches(w, g) for w, g in zip(want, got, strict=True)):
        return CaseResult(name, title, True)
    actual = [_show(g, want[i] if i < len(want) else None) for i, g in enumerate(got)]
    diff = "\n".join(
        difflib.unified_diff([_show_want(w) for w in want], actual, "expected", "actual", lineterm="")
    )
    return CaseResult(name, title, False, diff or "transitions differ")


DEFAULT_STATUSES = frozenset({"firing", "resolved"})


def _statuses(given: Any, want: list[dict[str, Any]]) -> frozenset[str]:
    """The statuses a case compares; raises ValueError naming a bad one."""
    if given is None:
        return DEFAULT_STATUSES | {str(w["status"]) for w in want if "status" in w}
    if not isinstance(given, list) or any(s not in STATUSES for s in given):
        msg = f"'statuses' must be a list of {', '.join(STATUSES)} (got {given!r})"
        raise ValueError(msg)
    return frozenset(given)


def run_tests(paths: list[Path]) -> TestReport:
    report = TestReport()
    for p in paths:
        files = sorted(p.rglob("*.test.yaml")) if p.is_dir() else [p]
        for f in files:
            report.results += run_file(f)
    return report
