"""A stream on more cores than its topic has partitions (``APP_SPARK_STREAM_SPLIT``): the
Spark engine's windowed pack on a topic of ONE partition, on ``local[2]``, each stream
partition whole (split 1: one task evaluates the stream) and split in two parts (each part
evaluates half of the devices and takes the other half's events for their time only).

Usage: ``python bench/bench_spark_split.py [--events N] [--devices D] [--batch B] [--split S]``

One run, one JVM, one broker: a warm-up query (its own checkpoint, every event), then the
stream whole, then split in ``S`` parts, then whole again, each an ``availableNow`` query with
its own checkpoint over the same records (the two runs of the whole stream bracket the split
one: the host is shared and noisy). It prints each one's events/s over its warm micro-batches,
the split's ratio to the whole, and whether the split query wrote the same alert ids as the
whole one (it must; the bench fails otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads

import orjson  # noqa: E402
from bench_spark import WINDOWED, events, finished, produce  # noqa: E402

from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.broker import KafkaBroker  # noqa: E402
from app.kafka.clients import topic_records  # noqa: E402
from app.rules.loader import load_rules  # noqa: E402
from app.runtime.settings import Settings  # noqa: E402
from app.topics import ALERTS  # noqa: E402


def run(spark: Any, settings: Settings, per_batch: int, name: str, split: int) -> list[dict[str, Any]]:
    from jobs.compile import plan_rules
    from jobs.engine import SPLIT_ENV, EngineOptions, start, state_layout

    os.environ[SPLIT_ENV] = str(split)
    plan = plan_rules(load_rules([settings.data_dir / "rules.yaml"]))
    query, sink = start(
        spark, plan, settings, EngineOptions(once=True, max_offsets_per_trigger=per_batch, query=name)
    )
    try:
        progress = finished(query, name)
    finally:
        sink.close()
    assert state_layout(settings, name).split == split
    return progress


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the host since boot, all CPUs (/proc/stat): two readings give the
    cores a run kept busy, whoever ran on them."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def alert_ids(bootstrap: str) -> list[str]:
    """Every alert id on the alerts topic, in order."""

    async def read() -> list[str]:
        return [orjson.loads(r.value)["alert_id"] async for r in topic_records(bootstrap, [ALERTS])]

    return asyncio.run(read())


def rate(progress: list[dict[str, Any]]) -> float:
    warm = progress[1:] or progress
    return sum(p["numInputRows"] for p in warm) / sum(
        p["durationMs"]["triggerExecution"] / 1000 for p in warm
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=120_000)
    ap.add_argument("--devices", type=int, default=1_000)
    ap.add_argument("--batch", type=int, default=20_000, help="events per micro-batch")
    ap.add_argument("--split", type=int, default=2, help="parts of the stream partition")
    args = ap.parse_args(argv)

    from jobs.session import build_session

    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-split-"))
    figures: dict[str, float] = {}
    ids: dict[str, list[str]] = {}
    busy: dict[str, float] = {}
    try:
        with KafkaBroker(scratch / "kafka") as broker:
            asyncio.run(ensure_topics(broker.bootstrap, partitions=1))
            items = events(args.events, args.devices)
            asyncio.run(produce(broker.bootstrap, items))
            env = {
                "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
                "APP_DATA_DIR": str(scratch),
                "APP_PARTITIONS": "1",
            }
            settings = Settings.from_env(env)
            (scratch / "rules.yaml").write_text(WINDOWED)
            spark = build_session("local[2]", app_name="bench-spark-split", shuffle_partitions=2)
            try:
                run(spark, settings, args.batch, "split-warm-up", 1)
                seen = len(alert_ids(broker.bootstrap))
                for name, split in (("whole", 1), ("split", args.split), ("whole-again", 1)):
                    before = cpu_ticks()
                    figures[name] = rate(run(spark, settings, args.batch, f"split-{name}", split))
                    after = cpu_ticks()
                    busy[name] = (after[0] - before[0]) / max(1, after[1] - before[1]) * (os.cpu_count() or 1)
                    got = alert_ids(broker.bootstrap)
                    ids[name], seen = got[seen:], len(got)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    whole = statistics.mean([figures["whole"], figures["whole-again"]])
    same = sorted(ids["split"]) == sorted(ids["whole"]) == sorted(ids["whole-again"])
    print(f"spark engine on local[2] ({os.cpu_count()} CPUs), 4 windowed + 1 threshold rules,"
          f" {args.events:,} events from {args.devices:,} devices on ONE topic partition,"
          f" batches of <= {args.batch:,}")  # fmt: skip
    print(f"  native: {native.status()}")
    for name in ("whole", "split", "whole-again"):
        parts = args.split if name == "split" else 1
        print(f"  {name:<12} {figures[name]:>10,.0f} events/s  the stream partition in {parts} part(s);"
              f" {len(ids[name]):,} alert transitions; {busy[name]:.2f} cores busy on average")  # fmt: skip
    print(f"  ratio        {figures['split'] / whole:.2f}x  the split against the mean of the two whole runs;"
          f" the same alert ids: {same}")  # fmt: skip
    summary = {
        "events": args.events,
        "devices": args.devices,
        "batch": args.batch,
        "split": args.split,
        "whole_events_per_s": round(figures["whole"]),
        "split_events_per_s": round(figures["split"]),
        "whole_again_events_per_s": round(figures["whole-again"]),
        "ratio": round(figures["split"] / whole, 2),
        "same_alert_ids": same,
        "alerts": len(ids["whole"]),
        "cores_busy": {k: round(v, 2) for k, v in busy.items()},
    }
    print(orjson.dumps(summary).decode())
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
