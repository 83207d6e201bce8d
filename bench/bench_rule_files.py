"""What the worst rule files cost to check: the issue's bombs, and files of each costly
shape filled to just under the size cap (``app.rules.loader.MAX_FILE_BYTES``).

Run: ``.venv/bin/python bench/bench_rule_files.py``. Each file is loaded by
``load_rules`` in its own process (so that its peak memory is its own); prints the wall
and CPU seconds, the process's peak RSS, and the first problem or the rule count. The
process's own start (imports) is ~70 MB and ~0.5 s of it; ``rules check`` adds the same.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads

from app.rules.loader import MAX_FILE_BYTES  # noqa: E402

LIMIT = MAX_FILE_BYTES - 64


def _rules(rule: str) -> str:
    """``rules:`` followed by ``rule`` (formatted with ``i``) as often as fits."""
    parts, size, i = ["rules:\n"], 7, 0
    while size + len(rule) + 8 < LIMIT:
        text = rule.format(i=i)
        parts.append(text)
        size += len(text)
        i += 1
    return "".join(parts)


def _where(expression: str) -> str:
    quoted = expression.replace("\\", "\\\\").replace('"', '\\"')
    return (
        '  - id: r{i}\n    source: logs\n    where: "' + quoted.replace("{", "{{").replace("}", "}}") + '"\n'
    )


def _bomb(levels: int) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join([*lines, f"rules: *a{levels}"]) + "\n"


SHAPES: dict[str, Callable[[], str]] = {
    "alias bomb, 7 levels": lambda: _bomb(7),
    "alias bomb, 10 levels": lambda: _bomb(10),
    "2,000 nested parentheses": lambda: (
        "rules:\n  - id: deep\n    source: logs\n    where: '"
        + "(" * 2000
        + "status = 1"
        + ")" * 2000
        + "'\n"
    ),
    "10,000 nested lists": lambda: "rules: " + "[" * 10_000 + "]" * 10_000 + "\n",
    "valid rules, 3 conditions": lambda: _rules(
        _where("status = 403 and path like '/admin%' and message like '%x%y%'")
    ),
    "valid rules, 20 nested parens": lambda: _rules(_where("(" * 20 + "status = 1" + ")" * 20)),
    "expressions over the node cap": lambda: _rules(_where(" and ".join(["(status = 1)"] * 300)[:4090])),
    "quoted \\' runs": lambda: _rules(_where("'" + "\\'" * 2040)),
    "flow list of empty lists": lambda: "rules: [" + "[]," * (LIMIT // 3 - 10) + "]\n",
    "64 levels, then a wide list": lambda: "rules: " + "[" * 63 + "0," * (LIMIT // 2 - 100) + "0" + "]" * 63,
    "one mapping of many keys": lambda: "rules: []\n" + "".join(f"k{i}: 1\n" for i in range(LIMIT // 10)),
    "template of unclosed {{": lambda: (
        "rules:\n  - id: b\n    source: logs\n    where: status = 1\n"
        "    annotations:\n      summary: '" + "{{" * (LIMIT // 2 - 100) + "'\n"
    ),
    "unclosed flow list": lambda: "rules: " + "[" * (LIMIT - 20) + "\n",
}

_CHILD = """
import resource, sys, time
sys.path.insert(0, {root!r})
from app.errors import RuleConfigError
from app.rules.loader import load_rules
wall, cpu = time.perf_counter(), time.process_time()
try:
    result = f"{{len(load_rules([{path!r}]).rules)}} rules"
except RuleConfigError as exc:
    result = f"{{len(exc.problems)}} problem(s): {{exc.problems[0].message}}"
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(f"{{wall:.2f}}\\t{{cpu:.2f}}\\t{{peak}}\\t{{result}}")
"""


def main() -> int:
    print(f"{'file':32} {'bytes':>8} {'wall s':>7} {'cpu s':>6} {'peak MB':>8}  result")
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in SHAPES.items():
            path = Path(tmp) / "rules.yaml"
            path.write_text(make()[:LIMIT])
            code = _CHILD.format(root=str(ROOT), path=str(path))
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
            )
            if done.returncode != 0:
                print(f"{name}: the loader failed\n{done.stderr}", file=sys.stderr)
                return 1
            wall, cpu, peak, result = done.stdout.strip().split("\t")
            size = path.stat().st_size
            print(f"{name:32} {size:>8} {wall:>7} {cpu:>6} {peak:>8}  {result[:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
