"""``backtest --watch``: the same backtest again each time its rule files change, in one process.

For tuning a rule against history. The input, the tables and every option stay as given;
each save of a rule file that loads runs the backtest again with the rules as they are
then, rewrites ``--out`` (or prints to stdout again), and says, per rule, how many
transitions it wrote before and now. A save that does not load is reported (file, line,
column, rule) and changes nothing: the last results stand, and the watch goes on. With
``--engine spark`` the Spark session stays up between runs, so a run after the first pays
neither Spark's start nor a cold JIT, nor, for an edit that leaves the decoder as it was, a
read and decode of a file input (``jobs.backtest.KeptInput``; docs/spark.md, "A backtest
that watches its rules").
Ctrl-C stops the watch, and so does SIGTERM (a supervisor's stop); the exit code is the
last run's.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from app.backtest import BacktestReport
from app.errors import RuleConfigError
from app.rules.loader import RuleSet, check_rule_files

#: how often the rule files are hashed again (seconds); a save is picked up within this
POLL_S = 0.5

#: one backtest over the given rules: its exit code, and its report, or None when it did not
#: run (the rules were refused as a whole, or the input is unusable: exit code 2)
Run = Callable[[RuleSet], tuple[int, BacktestReport | None]]


def watch(
    paths: list[Path],
    ruleset: RuleSet,
    run: Run,
    *,
    label: str = "backtest",
    poll_s: float = POLL_S,
    stop: threading.Event | None = None,
) -> int:
    """Run ``run(ruleset)``, then again with the rules of ``paths`` each time they change and
    load, until Ctrl-C (or ``stop``). An input or option error on the first run (exit code 2,
    no report) ends it at once: no edit of a rule can mend that."""
    code, report = run(ruleset)
    if report is None and code == 2:
        return code
    stop = stop or threading.Event()
    rejected: dict[str, str] | None = None
    runs = 1
    print(f"{label}: watching the rule files for changes (Ctrl-C stops)", file=sys.stderr)
    undo = _stop_on_sigterm()
    try:
        while not stop.wait(poll_s):
            check = check_rule_files(paths, ruleset, rejected)
            rejected = check.rejected
            if check.error is not None:
                _print_rejection(label, check.error)
                continue
            if check.ruleset is None:
                continue
            ruleset, runs = check.ruleset, runs + 1
            print(f"{label}: the rule files changed: run {runs}", file=sys.stderr)
            started = time.monotonic()
            code, new = run(ruleset)
            took = time.monotonic() - started
            if new is None:
                print(f"{label}: run {runs} did not run ({took:.1f} s); watching", file=sys.stderr)
                continue
            if report is not None:
                for line in changes(report.by_rule, new.by_rule):
                    print(f"{label}: {line}", file=sys.stderr)
            print(f"{label}: run {runs} took {took:.1f} s; watching", file=sys.stderr)
            report = new
    except KeyboardInterrupt:
        pass
    finally:
        undo()
    print(f"{label}: stopped watching after {runs} run{'' if runs == 1 else 's'}", file=sys.stderr)
    return code


def changes(before: Mapping[str, int], after: Mapping[str, int]) -> Iterator[str]:
    """Per rule whose count of written transitions moved, ``rule: a -> b transitions (+d)``, in
    rule order; ``no rule's transitions changed`` when none did. A rule absent on one side
    counts 0 there."""
    moved = False
    for rule in sorted(set(before) | set(after)):
        a, b = before.get(rule, 0), after.get(rule, 0)
        if a != b:
            moved = True
            yield f"{rule}: {a} -> {b} transitions ({b - a:+d})"
    if not moved:
        yield "no rule's transitions changed"


def _stop_on_sigterm() -> Callable[[], None]:
    """SIGTERM ends the watch as Ctrl-C does (the session stopped, the last run's exit code);
    returns what puts the previous handler back. Only the main thread can set one."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, on_term)

    def undo() -> None:
        signal.signal(signal.SIGTERM, before)

    return undo


def _print_rejection(label: str, error: Exception) -> None:
    problems = error.problems if isinstance(error, RuleConfigError) else [f"error: {error}"]
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{label}: rule files rejected: the last results stand; watching", file=sys.stderr)
