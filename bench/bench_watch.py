"""A watched Spark backtest's runs after an edit (``backtest --engine spark --watch``): the
input kept between runs (``jobs.backtest.KeptInput``: no read, no decode when the edit leaves
the decoder as it was) against read and decoded again, in one session, alternating.

Usage: ``python bench/bench_watch.py [--devices 20] [--master local[2]] [--runs 3]``

The input, pack and registry are the backtest bench's (``bench_spark_backtest.py``: the real
NAB machine-temperature series for 20 devices, 453,900 events, the shipped IoT pack). The
edit is an operator's tuning of a condition: ``machine-overheat``'s ``temperature > 100``
becomes ``> 99``, then back, and so on. Each run is what the command's run does
(``run_backtest`` with the command's arguments, on the command's default plans); the first
run in the session (cold JIT, the decode cached) is printed apart. Then the Faust engine's
backtest of the same pack, in this process, for the ratio. Each pair's outputs must be
identical, and equal to the Faust engine's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from bench_spark_backtest import (  # noqa: E402  (it puts the project on sys.path, activates native)
    NAB,
    build_input,
    build_registry,
    spark_runnable_pack,
)

from app.backtest import BacktestReport, load_tables  # noqa: E402
from app.cli.main import main as app_main  # noqa: E402
from app.rules.loader import load_rules  # noqa: E402
from app.runtime.settings import Settings  # noqa: E402

TUNED = ("temperature > 100", "temperature > 99")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=20)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--runs", type=int, default=3, help="runs of each kind after the first")
    args = ap.parse_args(argv)
    if not NAB.exists():
        msg = f"bench: the NAB dataset is missing: {NAB} (../shared must sit beside the project)"
        raise SystemExit(msg)
    os.environ.setdefault("KAFKA_BOOTSTRAP_SERVERS", "")
    from jobs.backtest import KeptInput, file_records, plans_mode, run_backtest
    from jobs.session import build_session

    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        scratch = Path(tmp)
        events, registry, pack = scratch / "nab20.jsonl", scratch / "devices.csv", scratch / "iot.yaml"
        n = build_input(events, args.devices)
        build_registry(registry, args.devices)
        spark_runnable_pack(pack)
        # the runs read and decoded again read a copy: Spark's cache matches plans, and one over
        # the same file would take the kept rows (and release them at its end)
        copy = scratch / "nab20-copy.jsonl"
        shutil.copyfile(events, copy)
        text = pack.read_text()
        assert TUNED[0] in text, f"bench: {TUNED[0]!r} is no longer in the IoT pack"
        tables = load_tables([f"devices={registry}"])
        settings = Settings.from_env()
        native = plans_mode() == "native"
        spark = build_session(args.master, app_name="bench-watch")

        def run(i: int, kept: KeptInput | None) -> tuple[float, str]:
            """The command's run after the i-th edit: its time and output."""
            pack.write_text(text.replace(*TUNED) if i % 2 else text)
            out = scratch / "out.jsonl"
            t0 = time.monotonic()
            with out.open("w") as f:
                raw = kept.records(spark) if kept is not None else file_records(spark, copy)
                run_backtest(
                    spark, load_rules([pack]), raw, "input", f, BacktestReport(),
                    partitions=settings.partitions, tables=tables, max_skew_ms=settings.max_event_skew_ms,
                    native_windows=native, native_thresholds=native, native_absence=native,
                    native_event_alerts=native, kept=kept,
                )  # fmt: skip
            return time.monotonic() - t0, out.read_text()

        kept = KeptInput(events)
        try:
            print(f"a watched Spark backtest of the IoT pack over {n:,} NAB events, {args.master}, "
                  f"{os.cpu_count()} CPUs, plans: {plans_mode()}")  # fmt: skip
            first, _ = run(0, kept)
            fresh: list[float] = []
            warm: list[float] = []
            same = True
            for i in range(1, args.runs + 1):  # alternating, so that drift on the host hits both
                t_fresh, out_fresh = run(i, None)
                t_kept, out_kept = run(i, kept)
                fresh.append(t_fresh)
                warm.append(t_kept)
                same &= out_fresh == out_kept
            decodes = kept.decodes
        finally:
            kept.release()
            spark.stop()
        pack.write_text(text.replace(*TUNED) if args.runs % 2 else text)
        faust_out = scratch / "faust.jsonl"
        t0 = time.monotonic()
        given = ["--rules", str(pack), "--input", str(events), "--table", f"devices={registry}"]
        if app_main(["backtest", *given, "--out", str(faust_out)]) != 0:
            msg = "bench: the Faust engine's backtest failed"
            raise SystemExit(msg)
        faust_s = time.monotonic() - t0
        same &= faust_out.read_text() == out_kept

    def said(ts: list[float]) -> str:
        return ", ".join(f"{t:.1f}" for t in ts)

    best_fresh, best_kept = statistics.median(fresh), statistics.median(warm)
    print(f"  first run in the session       {first:6.1f} s   (cold JIT; the decoded input cached)")
    print(f"  read and decoded again         {best_fresh:6.1f} s   median of {said(fresh)} s")
    print(f"  the input kept                 {best_kept:6.1f} s   median of {said(warm)} s;"
          f" {best_fresh / best_kept:.2f}x; decoded {decodes} time(s) in all")  # fmt: skip
    print(f"  faust engine, same pack        {faust_s:6.1f} s   kept: {faust_s / best_kept:.2f}x of it")
    print(f"  outputs identical: {same}")
    return 0 if same and decodes == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
