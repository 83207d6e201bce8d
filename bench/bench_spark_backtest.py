"""Backtest time: the shipped IoT pack over the real NAB machine-temperature series for 20
devices (453,900 events), ``python -m app backtest`` against ``--engine spark`` on
``local[2]``, in one run, with the ratio (target: Spark at least 5x faster).

Usage: ``python bench/bench_spark_backtest.py [--devices 20] [--master local[2]] [--keep DIR]
[--kept-jvm N]``

The input: every row of ``nab/.../machine_temperature_system_failure.csv`` (22,695 rows,
in file order, with its real 55-minute jump back) once per device ``machine-NN``, the
devices interleaved row by row, with a registry file for the pack's ``enrich`` rules.
Rules the Spark engine refuses would be left out of *both* runs, and named (the two
engines must run the same rules); none is since ``expect_from`` runs on Spark, so the
whole pack (8 rules) runs. Both runs are separate processes started the
way a user starts them (so each pays its own start-up: Python imports for the Faust
engine, Python plus the JVM for Spark); the bench prints both wall times, the ratio,
and whether the two outputs are identical (they must be). The Spark command runs with
its default plans (``APP_SPARK_BACKTEST_PLANS=evaluator``), then once more with the native
ones (``native``), whose time and output are printed beside. Then Spark's floor: the same
Spark command over the same input with one rule that reads every event and never fires
(the session, the read, the decode, the output): what no pack can beat. Each Spark
command's time to its session (its ``spark session ready`` log line) is printed as Spark's
start. Last (``--kept-jvm N``, default 3; 0 skips it), a JVM kept between backtests: the
pack, then the floor's rule, N times each in one process on one session, warm after the
first: what even a backtest service that kept Spark running could reach.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # as both engines' processes do (`python -m app`): its status is theirs

import orjson  # noqa: E402

from app.errors import RuleConfigError  # noqa: E402
from app.rules.loader import load_rules  # noqa: E402
from ingest.adapters.nab import nab_events  # noqa: E402

TARGET_RATIO = 5.0
NAB = (ROOT / "../shared/datasets/nab/data/realKnownCause/machine_temperature_system_failure.csv").resolve()
PACK = ROOT / "rules" / "iot.yaml"
#: the floor's pack: one rule that reads every event and never fires on this input
FLOOR_PACK = """\
rules:
  - {id: bench-floor, source: sensors, where: temperature > 1000000, group_by: [device_id]}
"""


def build_input(path: Path, devices: int) -> int:
    """The 20-device file: each NAB row once per device, interleaved; returns the event count."""
    rows = [r for r in nab_events(str(NAB), device="x", field="temperature") if isinstance(r, dict)]
    names = [f"machine-{d:02d}" for d in range(1, devices + 1)]
    n = 0
    with path.open("wb") as f:
        for r in rows:
            for name in names:
                f.write(orjson.dumps({**r, "device_id": name}) + b"\n")
                n += 1
    return n


def build_registry(path: Path, devices: int) -> None:
    lines = ["device_id,site,kind,max_temp"]
    lines += [f"machine-{d:02d},plant-{d % 3},machine,{95 + d % 5}" for d in range(1, devices + 1)]
    path.write_text("\n".join(lines) + "\n")


def spark_runnable_pack(path: Path) -> list[str]:
    """Write the IoT pack without the rules the Spark engine refuses; return their reasons."""
    from jobs.compile import plan_rules

    try:
        plan_rules(load_rules([PACK]), every_rule=True)
        refused: list[str] = []
    except RuleConfigError as exc:
        refused = [str(p) for p in exc.problems]
    drop = {p.split(": ", 2)[1] for p in refused}
    # cut the refused rules' blocks out of the text (a YAML round trip would turn `on:` into `true:`)
    blocks = re.split(r"(?m)^(?=  - id: )", PACK.read_text())
    kept = [b for b in blocks if not (m := re.match(r"  - id: (\S+)", b)) or m.group(1) not in drop]
    path.write_text("".join(kept))
    return refused


#: the Spark command's log line once its session is up (jobs.session.build_session)
SESSION_READY = re.compile(r"^(\S+ \d\d:\d\d:\d\d),(\d{3}) INFO \d+ jobs\.session: spark session ready")
#: what a Spark command took to its session, per run (:func:`timed`)
STARTS: list[float] = []


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``cmd`` to its end, its output captured; the bench stops with its last errors if it fails."""
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        msg = f"bench: {' '.join(cmd)} exited {done.returncode}"
        raise SystemExit(msg)
    return done


def timed(cmd: list[str], env: dict[str, str]) -> float:
    """The command's wall time; a Spark command's time to its session goes to STARTS."""
    wall, t0 = time.time(), time.monotonic()
    done = run(cmd, env)
    took = time.monotonic() - t0
    summary = [line for line in done.stderr.splitlines() if line.startswith("backtest")]
    print(f"  {summary[-1] if summary else '(no summary)'}")
    ready = [m for line in done.stderr.splitlines() if (m := SESSION_READY.match(line))]
    if ready:  # the log's time is local time, as mktime reads it
        second, ms = ready[0].groups()
        STARTS.append(time.mktime(time.strptime(second, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000 - wall)
    return took


def kept_jvm(commands: list[list[str]], master: str) -> list[float]:
    """Each backtest command (``python -m app`` arguments) run in this process, in turn, on one
    session started first (a backtest stops only a session it started): the times of a JVM
    kept between backtests, warm after the first."""
    from app.cli.main import main as app_main
    from jobs.session import build_session

    spark = build_session(master, app_name="bench-kept-jvm")
    took = []
    try:
        for command in commands:
            t0 = time.monotonic()
            if app_main(command) != 0:
                msg = f"bench: {' '.join(command)} failed in the kept JVM"
                raise SystemExit(msg)
            took.append(time.monotonic() - t0)
    finally:
        spark.stop()
    return took


def kept_jvm_run(commands: list[list[str]], master: str, env: dict[str, str]) -> list[float]:
    """:func:`kept_jvm` in a process of its own (this bench with ``--kept-jvm-child``)."""
    given = orjson.dumps(commands).decode()
    child = [sys.executable, __file__, "--kept-jvm-child", given, "--master", master]
    took: list[float] = orjson.loads(run(child, env).stdout.splitlines()[-1])
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=20)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--keep", type=Path, help="build the input here and keep it (default: a temp dir)")
    ap.add_argument(
        "--kept-jvm", type=int, default=3, metavar="N",
        help="then the pack and the floor's rule N times each in one process, on one session (0: skip)",
    )  # fmt: skip
    ap.add_argument("--kept-jvm-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.kept_jvm_child:
        print(orjson.dumps(kept_jvm(orjson.loads(args.kept_jvm_child), args.master)).decode())
        return 0
    if not NAB.exists():
        msg = f"bench: the NAB dataset is missing: {NAB} (../shared must sit beside the project)"
        raise SystemExit(msg)
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="bench-spark-bt-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        events, registry, rules = scratch / "nab20.jsonl", scratch / "devices.csv", scratch / "iot.yaml"
        n = build_input(events, args.devices)
        build_registry(registry, args.devices)
        refused = spark_runnable_pack(rules)
        env = {**os.environ, "APP_DATA_DIR": str(scratch / "data"), "KAFKA_BOOTSTRAP_SERVERS": ""}

        def backtest(pack: Path, out: str, *engine: str) -> list[str]:
            given = ["--input", str(events), "--table", f"devices={registry}", "--out", str(scratch / out)]
            return [sys.executable, "-m", "app", "backtest", "--rules", str(pack), *given, *engine]

        spark = ("--engine", "spark", "--master", args.master)
        print(f"backtest of the IoT pack ({len(load_rules([rules]).rules)} rules) over "
              f"{n:,} NAB events ({args.devices} devices), {os.cpu_count()} CPUs")  # fmt: skip
        print(f"  evaluator (both engines' processes): {native.status()}")
        for p in refused:
            print(f"  left out of both runs (Spark refuses it): {p}")
        faust_s = timed(backtest(rules, "faust.jsonl"), env)
        spark_s = timed(backtest(rules, "spark.jsonl", *spark), env)
        native_env = {**env, "APP_SPARK_BACKTEST_PLANS": "native"}
        native_s = timed(backtest(rules, "native.jsonl", *spark), native_env)
        (scratch / "floor.yaml").write_text(FLOOR_PACK)
        floor_s = timed(backtest(scratch / "floor.yaml", "floor.jsonl", *spark), env)
        kept: list[float] = []
        if args.kept_jvm > 0:
            packs = [(rules, f"kept{i}.jsonl") for i in range(args.kept_jvm)]
            packs += [(scratch / "floor.yaml", f"kept-floor{i}.jsonl") for i in range(args.kept_jvm)]
            kept = kept_jvm_run([backtest(p, out, *spark)[3:] for p, out in packs], args.master, env)
            kept_same = all(
                (scratch / f"kept{i}.jsonl").read_text() == (scratch / "faust.jsonl").read_text()
                for i in range(args.kept_jvm)
            )
        faust_lines = (scratch / "faust.jsonl").read_text().splitlines()
        spark_lines = (scratch / "spark.jsonl").read_text().splitlines()
        native_lines = (scratch / "native.jsonl").read_text().splitlines()
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)
    # the same lines in the same order (the evaluator's at each event), with both plans
    same = faust_lines == spark_lines == native_lines and (not kept or kept_same)
    ratio = faust_s / spark_s
    print(f"  faust engine    {faust_s:8.1f} s")
    print(f"  spark {args.master:<9} {spark_s:8.1f} s   speed-up {ratio:.2f}x (target {TARGET_RATIO:.0f}x)")
    print(f"  spark, native   {native_s:8.1f} s   speed-up {faust_s / native_s:.2f}x"
          " (APP_SPARK_BACKTEST_PLANS=native: the kinds Spark SQL reproduces, in the JVM)")  # fmt: skip
    print(f"  spark's floor   {floor_s:8.1f} s   the same command and input with one rule that never fires:"
          f" no pack can beat {faust_s / floor_s:.2f}x here")  # fmt: skip
    if STARTS:
        start = min(STARTS)
        print(f"  spark's start   {start:8.1f} s   each Spark command's, to its session (Python, the JVM,"
              f" the session; {', '.join(f'{s:.1f}' for s in STARTS)} s): with no start at all, the pack's"
              f" {spark_s - start:.1f} s would be {faust_s / (spark_s - start):.2f}x")  # fmt: skip
    if kept:
        runs, floors = kept[: args.kept_jvm], kept[args.kept_jvm :]
        said, floors_said = (", ".join(f"{t:.1f}" for t in ts) for ts in (runs, floors))
        print(f"  a kept JVM      {min(runs):8.1f} s   the pack in one process on one session, warm after"
              f" its first run ({said} s; identical: {kept_same}): {faust_s / min(runs):.2f}x; the floor's"
              f" rule {floors_said} s: at best {faust_s / min(floors):.2f}x")  # fmt: skip
    print(f"  outputs identical, line by line: {same} ({len(faust_lines):,} transitions)")
    if not same and sorted(faust_lines) == sorted(spark_lines) == sorted(native_lines):
        print("  (the same lines in another order)")
    summary = {"events": n, "faust_s": round(faust_s, 2), "spark_s": round(spark_s, 2),
               "ratio": round(ratio, 3), "target_ratio": TARGET_RATIO, "identical": same,
               "native_s": round(native_s, 2), "floor_s": round(floor_s, 2),
               "spark_start_s": round(min(STARTS), 2) if STARTS else None,
               "kept_jvm_s": [round(t, 2) for t in kept]}  # fmt: skip
    print(orjson.dumps(summary).decode())
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
