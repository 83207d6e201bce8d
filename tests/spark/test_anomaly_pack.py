"""The anomaly pack (rules/anomaly.yaml) on the Spark engine: ``python -m app backtest --engine
spark`` prints the Faust engine's lines for a few real NAB series. Its baseline functions are
not Spark SQL, so these rules take the stream path and the evaluator computes them there."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pyspark.sql import SparkSession

from app.cli.main import main
from app.runtime.settings import PROJECT_ROOT
from bench.nab_score import read_corpus, series_events
from tests.conftest import DATASETS, require_dataset

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SERIES = (
    "realAdExchange/exchange-2_cpc_results.csv",
    "realTraffic/speed_7578.csv",
    "realKnownCause/ec2_request_latency_system_failure.csv",
)


def backtest(tmp_path: Path, name: str, rules: Path, data: Path, *args: str) -> list[str]:
    out = tmp_path / f"{name}.jsonl"
    assert main(["backtest", "--rules", str(rules), "--input", str(data), "--out", str(out), *args]) == 0
    return out.read_text().splitlines()


def test_the_anomaly_pack_gives_the_same_alerts_on_spark(spark: SparkSession, tmp_path: Path) -> None:
    require_dataset(DATASETS / "nab" / "data")
    rules = tmp_path / "anomaly.yaml"  # the pack as shipped, on both engines
    rules.write_text("engine: both\n" + (PROJECT_ROOT / "rules" / "anomaly.yaml").read_text())
    corpus = {s.name: s for s in read_corpus(DATASETS)}
    lines = [
        orjson.dumps({k: v for k, v in ev.fields.items() if v is not None})
        for name in SERIES
        for _, ev in series_events(corpus[name])
    ]
    data = tmp_path / "nab.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    faust = backtest(tmp_path, "faust", rules, data)
    on_spark = backtest(tmp_path, "spark", rules, data, "--engine", "spark")
    fired = {orjson.loads(line)["labels"]["device_id"] for line in faust if '"firing"' in line}
    assert len(fired) == len(SERIES)  # every series raised an alert: the comparison means something
    assert on_spark == faust
