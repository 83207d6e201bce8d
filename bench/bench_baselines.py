"""Cost per event of each baseline function (app/rules/baselines.py), alone and in a rule.

Run: ``.venv/bin/python bench/bench_baselines.py [--datasets ../shared/datasets] [--repeat 3]``.
On the real machine-temperature series (22,695 readings, one per 5 minutes; a 1d lookback
holds 288 of them), CPU time, best of ``--repeat``:

* ``step``: the function's own update and answer per reading (``BaselineSpec.step``);
* ``rule``: a threshold rule ``where: <function> > 1e12`` (never fires) through the
  evaluator's backtest, less the same rule with ``where: value > 1e12``: what the call adds
  to a rule, per event.

Prints one line per function, ns/event, and the plain rule's own cost for scale.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.runtime import native

native.activate()  # before any evaluator module loads

from app.events import SCHEMAS, Event, format_ts, parse_ts  # noqa: E402
from app.rules.baselines import BaselineSpec  # noqa: E402
from app.rules.evaluator import run_backtest  # noqa: E402
from app.rules.loader import load_rules  # noqa: E402
from app.runtime.settings import PROJECT_ROOT  # noqa: E402

DAY = 86_400_000
CALLS = {
    "zscore": ("zscore(value, 1d)", BaselineSpec("z", "zscore", "value", DAY)),
    "robust_zscore": ("robust_zscore(value, 1d)", BaselineSpec("r", "robust_zscore", "value", DAY)),
    "ewma": ("ewma(value, 1h)", BaselineSpec("e", "ewma", "value", DAY // 24)),
    "holt_residual": (
        "holt_residual(value, 0.3, 0.1)",
        BaselineSpec("h", "holt_residual", "value", sf=0.3, tf=0.1),
    ),
    "seasonal": ("seasonal(value, 1d)", BaselineSpec("s", "seasonal", "value", DAY)),
    "predict_linear": (
        "predict_linear(value, 1h, 4h)",
        BaselineSpec("p", "predict_linear", "value", DAY // 24, 4 * DAY // 24),
    ),
}


def readings(datasets: Path) -> list[tuple[int, float]]:
    path = datasets / "nab/data/realKnownCause/machine_temperature_system_failure.csv"
    out, last = [], -1
    for line in path.read_text().splitlines()[1:]:
        ts, value = line.split(",")
        ms = parse_ts(ts.replace(" ", "T") + "Z")
        if ms >= last:  # the series jumps back 55 minutes once: a rule skips those as late
            out.append((ms, float(value)))
            last = ms
    return out


def best(repeat: int, run: object) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()  # type: ignore[operator]
        times.append(time.process_time() - start)
    return min(times)


def rule_cost(where: str, evs: list[tuple[str, Event]], repeat: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.yaml"
        path.write_text(
            f"rules:\n  - id: r\n    source: sensors\n    group_by: [device_id]\n    where: {where}\n"
        )
        rules = load_rules([path])
    return best(repeat, lambda: run_backtest(rules, evs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=Path, default=PROJECT_ROOT / ".." / "shared" / "datasets")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    pts = readings(args.datasets)
    schema = SCHEMAS["sensors"]
    evs = [("sensors", schema.validate({"device_id": "m", "ts": format_ts(ms), "value": v})) for ms, v in pts]
    n = len(pts)
    plain = rule_cost("value > 1e12", evs, args.repeat)
    print(f"{n:,} readings; a plain threshold rule (value > 1e12) costs {plain / n * 1e9:,.0f} ns/event")
    print(f"{'function':<16} {'step ns/event':>14} {'in a rule ns/event':>19}")
    for name, (call, spec) in CALLS.items():

        def steps(spec: BaselineSpec = spec) -> None:
            st = None
            for ms, v in pts:
                st, _ = spec.step(st, ms, v)

        alone = best(args.repeat, steps)
        added = rule_cost(f"{call} > 1e12", evs, args.repeat) - plain
        print(f"{name:<16} {alone / n * 1e9:>14,.0f} {added / n * 1e9:>19,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
