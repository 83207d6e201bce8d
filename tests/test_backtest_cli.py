"""`python -m app backtest` as an operator runs it: from a file, from a topic range on the
real broker, with registry tables, with partition emulation."""

from __future__ import annotations

import re
import subprocess
import sys
from itertools import islice
from pathlib import Path

import orjson
import pytest

from app.kafka.broker import KafkaBroker
from app.runtime.settings import PROJECT_ROOT
from ingest.adapters.nab import nab_events
from tests.conftest import NAB_MACHINE_TEMP, child_env, require_dataset
from tests.kafka_helpers import produce

pytestmark = [pytest.mark.slow]


def run_backtest(*args: str, **env: str) -> tuple[int, list[dict], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "app", "backtest", *args],
        cwd=PROJECT_ROOT,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, [orjson.loads(x) for x in proc.stdout.splitlines() if x.strip()], proc.stderr


@pytest.mark.integration
def test_topic_range_gives_the_same_transitions_as_the_file(broker: KafkaBroker, tmp_path: Path) -> None:
    rows = [
        r
        for r in islice(
            nab_events(str(require_dataset(NAB_MACHINE_TEMP)), device="m1", field="temperature"), 4000
        )
    ]
    events = tmp_path / "m.jsonl"
    events.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    produce(
        broker.bootstrap, "events.sensors", [(b"m1", orjson.dumps(r)) for r in rows] + [(b"m1", b"{oops")]
    )
    code, from_file, _ = run_backtest(
        "--rules", "rules/iot.yaml", "--input", str(events), "--partitions", "2"
    )
    assert code == 0 and from_file
    code, from_topic, err = run_backtest(
        "--rules",
        "rules/iot.yaml",
        "--topic",
        "events.sensors",
        "--partitions",
        "2",
        KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
    )
    assert code == 0, err
    assert [a["alert_id"] for a in from_topic] == [a["alert_id"] for a in from_file]
    # the invalid record named where a consumer finds it: one key, so the partition of the others
    assert "1 invalid lines skipped" in err
    assert re.search(r"^events\.sensors partition [0-9]+ offset 4000: ", err, re.MULTILINE), err
    assert {"alert_id", "rule", "status", "labels", "starts_at", "ends_at", "values"} <= set(from_file[0])


def test_registry_tables_from_csv_and_bad_table_arguments(tmp_path: Path) -> None:
    rules = tmp_path / "r.yaml"
    rules.write_text(
        "rules:\n  - id: too-hot\n    source: sensors\n"
        "    enrich: [{table: devices, on: device_id, as: device}]\n"
        "    where: temperature > device.max_temp\n    group_by: [device_id]\n"
    )
    devices = tmp_path / "devices.csv"
    devices.write_text("device_id,site,max_temp\nd1,lab-2,30\nd2,lab-3,\n")
    events = tmp_path / "e.jsonl"
    events.write_text(
        "\n".join(
            orjson.dumps({"device_id": d, "ts": "2024-01-01T00:00:00Z", "temperature": 35.0}).decode()
            for d in ("d1", "d2")
        )
    )
    code, out, _ = run_backtest(
        "--rules", str(rules), "--input", str(events), "--table", f"devices={devices}"
    )
    assert code == 0
    assert [(a["labels"]["device_id"], a["status"]) for a in out] == [("d1", "firing")]  # d2: NULL max_temp
    code, _, err = run_backtest("--rules", str(rules), "--input", str(events), "--table", "nope=x.csv")
    assert code == 2 and "expected NAME=FILE" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("device_id,max_temp\nd1,hot\n")
    code, _, err = run_backtest("--rules", str(rules), "--input", str(events), "--table", f"devices={bad}")
    assert code == 2 and "bad.csv:2: column 'max_temp' must be a number" in err
    # a file it cannot read, or not UTF-8: one line naming it (tracebacks before)
    missing = tmp_path / "missing.csv"
    code, _, err = run_backtest(
        "--rules", str(rules), "--input", str(events), "--table", f"devices={missing}"
    )
    assert (code, err) == (
        2,
        f"error: --table devices={missing}: cannot read {missing}: No such file or directory\n",
    )
    latin = tmp_path / "latin.csv"
    latin.write_bytes("device_id,site\nd1,Düsseldorf\n".encode("latin-1"))
    code, _, err = run_backtest("--rules", str(rules), "--input", str(events), "--table", f"devices={latin}")
    assert code == 2 and f"error: --table devices={latin}: {latin} is not UTF-8 (invalid" in err
