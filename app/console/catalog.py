"""The rules as the console shows them: every loaded rule, every rejected file, and what to
draw on an alert's chart (the input field and the threshold or the window).

Each rule file is compiled on its own (:func:`app.rules.loader.load_text`), so a bad file
is listed with its problems while the good files' rules are still shown, as the worker
keeps running its last good rules. The result is cached by the files' (name, mtime, size).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_COMPARISON = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(>=|<=|>|<|==)\s*(-?\d+(?:\.\d+)?)\s*$")
_FIELD_IN_CALL = re.compile(r"\(\s*([A-Za-z_][A-Za-z0-9_.]*)\s*\)")


@dataclass(frozen=True)
class RuleRow:
    """One loaded rule: where it is written and what it is."""

    id: str
    path: str
    line: int
    engine: str
    version: str
    kind: str
    source: str
    severity: str
    group_by: tuple[str, ...]
    where: str | None
    window_ms: int | None
    field: str | None
    threshold: float | None
    op: str | None


@dataclass(frozen=True)
class Catalog:
    rules: tuple[RuleRow, ...]
    rejected: tuple[tuple[str, str], ...]  # (file, problems, one per line)

    def get(self, rule_id: str) -> RuleRow | None:
        return next((r for r in self.rules if r.id == rule_id), None)


def chart_spec(where: str | None, aggregate: dict[str, str]) -> tuple[str | None, float | None, str | None]:
    """(input field, threshold, operator) for a rule: ``temperature > 100`` gives
    ("temperature", 100.0, ">"); a window's first aggregate argument gives its field."""
    if where:
        m = _COMPARISON.match(where)
        if m:
            return m.group(1), float(m.group(3)), m.group(2)
        first = re.match(r"\s*([A-Za-z_][A-Za-z0-9_.]*)", where)
        if first:
            return first.group(1), None, None
    for expr in aggregate.values():
        m = _FIELD_IN_CALL.search(expr)
        if m:
            return m.group(1), None, None
    return None, None, None


def _row(r: Any) -> RuleRow:
    rule = r.rule
    window = rule.window.size or rule.window.gap if rule.window is not None else None
    field, threshold, op = chart_spec(rule.where, dict(rule.aggregate))
    return RuleRow(
        r.id, r.path, r.line, r.engine, r.version, rule.kind, rule.source, rule.severity,
        tuple(rule.group_by), rule.where, window, field, threshold, op,
    )  # fmt: skip


def load_catalog(rules_dir: Path) -> Catalog:
    """Every rule file under ``rules_dir``, each compiled alone."""
    from app.rules.loader import MAX_FILE_BYTES, load_text, read_rule_file, rule_files

    rows: list[RuleRow] = []
    rejected: list[tuple[str, str]] = []
    for f in rule_files([rules_dir]):
        try:
            raw = read_rule_file(f)
            if len(raw) > MAX_FILE_BYTES:
                rejected.append((str(f), f"larger than {MAX_FILE_BYTES} bytes"))
                continue
            good, problems = load_text(raw.decode("utf-8"), str(f))
        except (OSError, UnicodeDecodeError) as exc:
            rejected.append((str(f), f"cannot read: {exc}"))
            continue
        if problems:
            rejected.append((str(f), "\n".join(str(p) for p in problems)))
            continue
        rows.extend(_row(r) for r in good)
    return Catalog(tuple(rows), tuple(rejected))


def files_key(rules_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a rule file changes: (name, mtime ns, size) of each file
    :func:`load_catalog` reads."""
    from app.rules.loader import rule_files

    out = []
    for f in rule_files([rules_dir]) if rules_dir.is_dir() else []:
        try:
            st = f.stat()
        except OSError:
            continue
        out.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(out)
