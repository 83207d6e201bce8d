"""LIKE's worst cases, before and after: the regex LIKE used to compile to (the rule tests'
oracle, ``tests/rules/like_oracle.py``), and the run-by-run matcher that replaced it
(``app.rules.functions.like_matcher``).

Run: ``.venv/bin/python bench/bench_patterns.py`` (``--timeout S`` for the old regex,
10 s by default). Prints, for each pattern and value, the old regex's time (each in its
own process, stopped at the timeout: a backtracking regex cannot be interrupted) and the
new matcher's (best of 5), with both answers where the old one finished. Values are
64 KiB, the longest string field an event may carry (``app.events.MAX_STRING_LEN``); the
old regex is also timed on a few hundred characters, where it already takes seconds. A
run matched by a regex longer than ``MAX_LIKE_RUN`` is refused when the rule loads, so
the cases stop there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads

from app.events import MAX_STRING_LEN  # noqa: E402
from app.rules.functions import MAX_LIKE_RUN, like_matcher  # noqa: E402

PASSES = 5


#: (name, pattern, ignore_case, value as (text, repeat, tail)): the ReDoS the issue reported,
#: then the new matcher's own worst cases, whose runs match at the ends and search the
#: whole value in between; runs matched by a regex at their longest (MAX_LIKE_RUN)
RUN = MAX_LIKE_RUN // 2
A64 = ("a", MAX_STRING_LEN, "b")  # 64 KiB of a, then b
CASES: list[tuple[str, str, bool, tuple[str, int, str]]] = [
    ("issue's redos, 200 chars", "%a%a%a%a%b", False, ("a", 200, "")),
    ("issue's redos, 400 chars", "%a%a%a%a%b", False, ("a", 400, "")),
    ("issue's redos, 64 KiB", "%a%a%a%a%b", False, ("a", MAX_STRING_LEN, "")),
    ("5 runs, last one absent", "%a%a%a%c%b", False, A64),
    ("the same, ILIKE", "%A%A%A%C%B", True, A64),
    ("40 runs, last one absent", "%a" * 40 + "%c%b", False, A64),
    (f"run of {MAX_LIKE_RUN} (a_), absent", "%" + "a_" * (RUN - 1) + "ac%b", False, A64),
    (f"ILIKE run of {MAX_LIKE_RUN}, absent", "%" + "A" * (MAX_LIKE_RUN - 1) + "C%b", True, A64),
    ("literal run of 4,000, absent", "%" + "a" * 4000 + "c%b", False, A64),
    ("contains, absent", "%needle%", False, ("x", MAX_STRING_LEN, "")),
    ("prefix and suffix", "GET %HTTP/1.1", False, ("GET /", MAX_STRING_LEN // 5, "HTTP/1.1")),
]

_CHILD = """
import re, sys, time
sys.path.insert(0, {root!r})
from tests.rules.like_oracle import old_like_regex
rx = re.compile(old_like_regex({pattern!r}), re.DOTALL | (re.IGNORECASE if {ignore_case!r} else 0))
value = {text!r} * {repeat!r} + {tail!r}
started = time.perf_counter()
found = rx.fullmatch(value) is not None
print(time.perf_counter() - started, found)
"""


def old_time(
    pattern: str, ignore_case: bool, value: tuple[str, int, str], timeout: float
) -> tuple[str, bool | None]:
    text, repeat, tail = value
    code = _CHILD.format(
        root=str(ROOT), pattern=pattern, ignore_case=ignore_case, text=text, repeat=repeat, tail=tail
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=True
        )
    except subprocess.TimeoutExpired:
        return f"> {timeout:.0f} s (stopped)", None
    seconds, found = done.stdout.split()
    return f"{float(seconds):.4f} s", found == "True"


def new_time(pattern: str, ignore_case: bool, value: str) -> tuple[float, bool]:
    like = like_matcher(pattern, ignore_case)
    best, found = float("inf"), False
    for _ in range(PASSES):
        started = time.perf_counter()
        found = like(value)
        best = min(best, time.perf_counter() - started)
    return best, found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for each old regex")
    args = parser.parse_args()
    print(f"{'case':34} {'old regex':>22} {'new matcher':>14}  answer")
    worst = 0.0
    for name, pattern, ignore_case, value in CASES:
        old, old_found = old_time(pattern, ignore_case, value, args.timeout)
        text, repeat, tail = value
        seconds, found = new_time(pattern, ignore_case, text * repeat + tail)
        worst = max(worst, seconds)
        if old_found is not None and old_found != found:
            print(f"{name}: the old regex says {old_found}, the new matcher {found}", file=sys.stderr)
            return 1
        print(f"{name:34} {old:>22} {seconds:>12.6f} s  {found}")
    print(f"worst new matcher time on these cases: {worst * 1000:.1f} ms (values of {MAX_STRING_LEN} chars)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
