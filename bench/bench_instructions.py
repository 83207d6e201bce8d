"""Instructions per event in the compiled evaluator, counted by valgrind's callgrind.

The host's timing drifts by 20-40 % within an hour, more than most single changes; the
count of instructions executed does not. This runs the bench pack through
``Engine.process_batch`` in batches of ``EVAL_BATCH`` (2,000, the worker's default), as
``bench_rules.py`` does, under callgrind with counting switched on only
inside that call, and prints instructions per event.
Compare two checkouts with the same command in each: two runs of the same code gave the
same count.

Run: ``.venv/bin/python bench/bench_instructions.py [sensors|mixed|fleet] [--events N]``
(defaults: sensors, 20,000 events; about 2 minutes). Needs valgrind (Debian package
``valgrind``) and the compiled build (``make native``): plain Python has no
``Engine.process_batch`` symbol to count in. Without either it says so and skips.
``--profile FILE`` keeps callgrind's output for ``callgrind_annotate --inclusive=yes FILE``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads
sys.path.insert(0, str(ROOT / "bench"))

#: the C symbol of the compiled ``Engine.process_batch``, where counting is on
SYMBOL = "CPyDef_evaluator___Engine___process_batch"


def workload(mode: str, n: int) -> tuple[list[tuple[str, object]], list[dict[str, object]]]:
    """The decoded events of one bench shape (the NAB sensor series, the three sources
    mixed, or a fleet of 1,000 devices) and the registry rows to load (the fleet's)."""
    import bench_rules as b
    import orjson

    from app.events import SCHEMAS

    if mode == "fleet":
        registry, readings = b.fleet(1000, n)
        return [("sensors", SCHEMAS["sensors"].decode(orjson.dumps(r))) for r in readings], registry
    items = b.events(3 * n if mode == "sensors" else n)
    if mode == "sensors":
        items = [i for i in items if i.source == "sensors"][:n]
    return [(i.source, SCHEMAS[i.source].decode(i.value)) for i in items], []


def run(mode: str, n: int) -> None:
    """The measured part, in the child under valgrind."""
    import bench_rules as b

    from app.rules.evaluator import Engine
    from app.rules.loader import load_rules
    from app.tables import Tables

    rules = load_rules([b.rule_pack(Path(tempfile.mkdtemp()) / "pack")])
    decoded, registry = workload(mode, n)
    tables = Tables()
    if registry:
        tables.load_rows("devices", registry)
    engine = Engine(rules, partitions=b.PARTITIONS, tables=tables)
    for i in range(0, len(decoded), b.EVAL_BATCH):
        engine.process_batch(decoded[i : i + b.EVAL_BATCH])  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=("sensors", "mixed", "fleet"), default="sensors")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--profile", type=Path, help="keep callgrind's output here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args.mode, args.events)
        return 0
    from app.runtime import native

    # skipped, not failed: make bench runs every bench, and this one needs what others do not
    if not native.status().startswith("compiled"):
        print(f"skipped: the evaluator is not compiled ({native.status()}); run make native")
        return 0
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("skipped: valgrind is not installed (Debian package valgrind)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = args.profile or Path(tmp) / "callgrind.out"
        cmd = [
            valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
            f"--toggle-collect={SYMBOL}", sys.executable, __file__, args.mode, "--events",
            str(args.events), "--child",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        totals = [line for line in out.read_text().splitlines() if line.startswith(("summary:", "totals:"))]
        instructions = int(totals[0].split()[1])
    import bench_rules as b

    print(f"{args.mode}: {instructions / args.events:,.0f} instructions per event in the evaluator "
          f"({args.events:,} events, batches of {b.EVAL_BATCH:,})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
