"""The archive's cost of filing each record under the date a time range places it at.

The archive (``jobs.archive``) files a record under the UTC date of its ``ts`` as the decoder
reads it (:func:`app.events.record_time_ms`, in Python: ``jobs.archive.record_dates``), so
that a backtest's ``--from``/``--to`` finds in the date partitions it reads every record it
selects from a topic. Before, it filed by Spark's own reading (``try_to_timestamp``), in the
JVM. This bench writes the same records to Parquet both ways on the archive's master
(``local[1]``), alternating, in one run, and prints each one's time, records per second,
the ratio, and whether the two filed every record under the same date (they must, on the
canonical times the publishers write).

Usage: ``python bench/bench_archive.py [--devices 5] [--rounds 3] [--master local[1]]``

The records: every row of NAB's ``machine_temperature_system_failure.csv`` once per device
(22,695 rows each), as the sensors topic holds them, with Kafka's columns.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # as the archive's process does (`python -m app archive`)

import orjson  # noqa: E402
import pandas as pd  # noqa: E402
from pyspark.sql import DataFrame  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from ingest.adapters.nab import nab_events  # noqa: E402
from jobs.archive import PARTITION_COLUMNS, archive_rows  # noqa: E402
from jobs.session import build_session  # noqa: E402

NAB = (ROOT / "../shared/datasets/nab/data/realKnownCause/machine_temperature_system_failure.csv").resolve()


def records(devices: int) -> pd.DataFrame:
    rows = [r for r in nab_events(str(NAB), device="x", field="temperature") if isinstance(r, dict)]
    values = [orjson.dumps({**r, "device_id": f"machine-{d:02d}"}) for r in rows for d in range(devices)]
    now = pd.Timestamp.now(tz="UTC")
    return pd.DataFrame(
        {
            "topic": "events.sensors",
            "partition": [i % 4 for i in range(len(values))],
            "offset": list(range(len(values))),
            "timestamp": now,
            "key": [v[15:27] for v in values],
            "value": values,
        }
    )


def spark_dates(raw: DataFrame) -> DataFrame:
    """The archive's rows as it filed them before: the date by Spark's reading of ``ts``."""
    ts = F.get_json_object(F.col("value").cast("string"), "$.ts")
    event_date = F.to_date(F.try_to_timestamp(ts))
    return raw.select(
        "topic", "partition", "offset", "timestamp", "key", "value",
        F.lit("sensors").alias("source"),
        F.coalesce(event_date, F.to_date("timestamp")).cast("string").alias("date"),
    )  # fmt: skip


def write(rows: DataFrame, path: Path) -> float:
    shutil.rmtree(path, ignore_errors=True)
    start = time.perf_counter()
    rows.write.partitionBy(*PARTITION_COLUMNS).parquet(str(path))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--master", default="local[1]")
    args = ap.parse_args(argv)
    spark = build_session(args.master, app_name="bench-archive")
    raw = (
        spark.createDataFrame(records(args.devices))
        .withColumns({"partition": F.col("partition").cast("int"), "source": F.lit("sensors")})
        .cache()
    )  # Kafka's column types
    n = raw.count()
    work = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    ways = {
        "spark's reading (before)": spark_dates,
        "the decoder's (now)": lambda df: archive_rows(df.drop("source")),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for _ in range(args.rounds):
            for i, (name, rows) in enumerate(ways.items()):
                times[name].append(write(rows(raw), work / str(i)))
        filed = [
            spark.read.parquet(str(work / str(i))).select("offset", F.col("date").cast("string")).collect()
            for i in range(len(ways))
        ]
        same = {tuple(r) for r in filed[0]} == {tuple(r) for r in filed[1]}
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"archive bench: {n:,} records, {args.master}, {args.rounds} rounds alternating")
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"  {name}: median {medians[name]:.2f} s ({n / medians[name]:,.0f} records/s); " +
              ", ".join(f"{x:.2f}" for x in t))  # fmt: skip
    before, now = medians.values()
    print(f"  ratio now/before: {now / before:.2f}x; every record under the same date: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
