"""The Spark engine's decoder alone (``jobs.decode.Decoder``, the ``mapInArrow`` function that
decodes every record by default, ``APP_SPARK_DECODE=python``): CPU per record, without Spark.

Usage: ``python bench/bench_decoder.py [--records 200000] [--rounds 5]``

The records are ``bench/bench_spark.py``'s (1,000 devices, sensors), in Arrow batches of
10,000 as the query hands them over, over 2 partitions; routed for one stream on the topic
key, as the streaming query routes them (the record's own partition) and as a backtest does
(Kafka's partition of the key). Best of ``--rounds`` passes, process CPU time. Compare
checkouts by running it in each, alternately, on one host.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from app.runtime import native  # noqa: E402

native.activate()  # as the Spark workers do (jobs.pydaemon)

import pyarrow as pa  # noqa: E402
from bench_spark import events  # noqa: E402

from app.topics import SOURCE_OF_TOPIC, SOURCE_TOPICS  # noqa: E402
from jobs.decode import Decoder  # noqa: E402
from jobs.streams import StreamRouter  # noqa: E402

BATCH = 10_000


def batches(n: int) -> list[pa.RecordBatch]:
    records = events(n, 1000)
    out = []
    for start in range(0, n, BATCH):
        chunk = records[start : start + BATCH]
        out.append(
            pa.RecordBatch.from_pydict(
                {
                    "topic": [SOURCE_TOPICS["sensors"]] * len(chunk),
                    "partition": [i % 2 for i in range(len(chunk))],
                    "offset": list(range(start, start + len(chunk))),
                    "value": [value for _key, value in chunk],
                }
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    given = batches(args.records)
    print(f"the Spark engine's Python decoder, {args.records:,} records, {native.status()}")
    for live in (True, False):
        router = StreamRouter({"sensors": (("sensors", None),)}, 2, record_partitions=live)
        decoder = Decoder(topics=SOURCE_OF_TOPIC, router=router)
        best = float("inf")
        for _ in range(args.rounds):
            t0 = time.process_time()
            decoded = sum(b.num_rows for b in decoder(iter(given)))
            best = min(best, time.process_time() - t0)
        assert decoded == args.records
        label = "streaming (record's partition)" if live else "backtest (key's partition)"
        print(f"  {label:31s} {best / args.records * 1e6:5.2f} µs per record")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
