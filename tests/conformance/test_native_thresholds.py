"""Two-engine conformance of the native threshold path (``jobs.thresholds``): the threshold
rules of ``thresholds.yaml``, which a Spark backtest runs natively (conditions, lateness and
the rows that cannot change an alert in the JVM, the evaluator's ``ThresholdLogic`` on the
rest), must give exactly the Faust backtest's output lines (every status), per-fingerprint id
sequences and report counts on

* the suite's whole input (real NAB, access log and OHLC rows) plus crafted threshold events
  over 2 partitions, and the crafted events alone on 1 partition: late and out-of-order
  events, exact duplicates, tied times, NULL and missing fields, a ``where``/``clear``
  overlap, ``consecutive`` with and without ``for``, ``for`` met exactly at its boundary,
  groups on the topic key, on another field and none, registry columns (``enrich``, a
  missing row skipping the event or giving NULLs, a geo function over them);
* the real NAB series for 3 devices (with its 55-minute jump back) with the time bound on
  (APP_MAX_EVENT_SKEW 5m), where nothing is held, so every partition is native, and with a
  future-dated event, whose partitions keep the rules on the stream path.

Without the time bound the rules are planned on both the keyed path and the stream path; the
native plan replaces both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import SparkSession

from app.alerts import Alert
from app.backtest import BacktestReport
from app.rules.loader import load_rules
from app.tables import Tables
from jobs import thresholds
from jobs.compile import plan_rules
from tests.conformance.kind_cases import lines_for_test
from tests.conformance.native_compare import compare_backtests, nab_devices
from tests.conformance.threshold_cases import at

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a real Spark

RULES = Path(__file__).with_name("thresholds.yaml")
SKEW_MS = 5 * 60_000
#: the registry: d-1, b-1, v-1 and two of the three NAB devices (nab-2 and d-2 have no row)
DEVICES = [
    {"device_id": "d-1", "site": "plant-a", "kind": "machine", "max_temp": 100.5},
    {"device_id": "b-1", "site": "yard"},
    {"device_id": "v-1", "kind": "van", "depot_lat": 52.52, "depot_lon": 13.405, "geofence_km": 2.0},
    {"device_id": "nab-0", "site": "plant-b", "max_temp": 95.0},
    {"device_id": "nab-1", "site": "plant-c", "max_temp": 90.0},
]


def tables() -> Tables:
    t = Tables()
    t.load_rows("devices", DEVICES)
    return t


def crafted_thresholds() -> Iterator[dict[str, Any]]:
    """Sensor and log events for ``thresholds.yaml``; every odd case is commented."""

    def s(device: str, minute: float, temp: float | None, **extra: Any) -> dict[str, Any]:
        return {"device_id": device, "ts": at(900 + minute), "temperature": temp, **extra}

    for m in range(5):
        yield s("d-1", m, 101.0)  # thr-overheat and thr-exactly-5m pend at 0
    yield s("d-1", 5, 101.0)  # thr-exactly-5m: for is met exactly here (5m)
    yield s("d-1", 3, 50.0)  # late: must not end the streak
    for m in range(6, 10):
        yield s("d-1", m, 101.0)
    yield s("d-1", 8, 101.0)  # late (older than minute 9)
    yield s("d-1", 9, 101.0)  # exact duplicate, tied with the newest time: not late
    yield s("d-1", 10, 101.5)  # thr-overheat fires exactly at 10m
    yield s("d-1", 10, 102.0)  # tied time, still firing
    yield s("d-1", 12, 98.0)  # between clear and where: thr-overheat stays firing, thr-exactly-5m resolves
    yield from (s("d-1", m, 98.0) for m in (13, 14, 15))  # repeats that change nothing
    yield s("d-1", 16, 96.0)  # below clear: thr-overheat resolves
    yield from (
        s("d-1", m, 104.0) for m in (17, 18, 19)
    )  # where and clear of thr-overlap: fire, resolve, fire
    yield s("d-1", 19, 104.0)  # tied: resolves again
    yield s("d-1", 20, 101.0)  # thr-overlap: fires; thr-overheat pends
    yield s("d-1", 21, None)  # NULL is not TRUE: every streak ends
    yield {"device_id": "d-1", "ts": at(922)}  # no temperature at all
    for m in range(23, 41):
        yield s("d-1", m, 101.0)  # thr-overheat fires at 33, then only counts
        if m == 30:
            yield s("d-1", 24, 20.0)  # late inside the run
    yield s("d-1", 40, 97.0)  # not below clear: still firing
    yield s("d-1", 41, 96.9)  # resolves
    # v-1 (registry: a 2 km geofence around its depot): leaves, comes back, NULL position
    for m, (lat, lon) in enumerate([(52.52, 13.405), (52.60, 13.405), (52.61, 13.41), (None, 13.4)]):
        yield {"device_id": "v-1", "ts": at(950 + m), "lat": lat, "lon": lon}
    yield {"device_id": "v-1", "ts": at(955), "lat": 52.521, "lon": 13.405}  # back within 1.5 km: clears
    yield from (s("u-1", 60, 101.0), s("u-1", 61, 102.0), s("u-1", 62, 99.0))  # no registry row
    # thr-cold: three in a row, a NULL breaks the streak, ties count
    for t in (5.0, 5.0, None, 5.0, 5.0, 5.0, 5.0, 50.0, 5.0):
        yield s("d-2", 100 + len(str(t)), t)  # several share a time
    yield from (s("d-2", 120, 4.0), s("d-2", 120, 4.0), s("d-2", 120, 4.0))  # tied: fires at the third
    # thr-hot-status: grouped by status, consecutive 3 and for 2m
    for i, m in enumerate((200.0, 200.5, 201.0, 201.5, 202.0, 202.5)):
        yield s(f"h-{i % 3}", m, 96.0, status="busy")  # third at 201 (not 2m yet), fires at 202
    yield s("h-0", 203, 96.0)  # no status: the "" group
    yield s("h-1", 203, 96.0, status="maintenance")  # thr-fleet skips it
    yield s("h-2", 204, 94.0, status="busy")  # resolves the busy group
    # thr-battery: for 10m with clear above 20, out of order within it
    for m in (300, 302, 301, 305, 310, 311, 309, 312):
        yield {"device_id": "b-1", "ts": at(900 + m), "battery": 10.0}
    yield {"device_id": "b-1", "ts": at(1213), "battery": 18.0}  # between: still firing
    yield {"device_id": "b-1", "ts": at(1214), "battery": 25.0}  # resolves
    yield {"device_id": "b-1", "ts": at(1215), "battery": 25.0}

    def log(client: str, minute: float, status: int, path: str = "/x") -> dict[str, Any]:
        return {"host": "www-9", "ts": at(900 + minute), "client_ip": client, "path": path, "status": status}

    yield from (log("10.0.0.7", 400, 500), log("10.0.0.7", 401, 503))  # fires at the second
    yield from (log("10.0.0.7", 402, 503), log("10.0.0.7", 403, 404))  # 404 on no .php: between, firing
    yield log("10.0.0.7", 404, 302)  # below clear: resolves
    yield from (log("10.0.0.6", 400, 404, "/a.php"), log("10.0.0.6", 399, 500), log("10.0.0.6", 401, 500))


def compare(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, path: Path, partitions: int, max_skew_ms: int = -1
) -> tuple[list[Alert], BacktestReport, dict[str, int], bool]:
    """Both backtests of ``thresholds.yaml`` over ``path``; asserts that they are identical
    and returns the Spark one's alerts, report, per rule how many partitions it left to the
    stream path, and whether the output's line order is the Faust backtest's too."""
    ruleset = load_rules([RULES])
    ids = {r.id for r in ruleset.rules}
    assert {r.id for r in thresholds.native_rules(plan_rules(ruleset, every_rule=True))} == ids
    found = compare_backtests(
        spark, caplog, ruleset, path, partitions=partitions, said="native thresholds",
        max_skew_ms=max_skew_ms, tables=tables(),
    )  # fmt: skip
    return found.alerts, found.report, found.fell_back, found.same_order


def write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_both_paths_are_planned_natively() -> None:
    ruleset = load_rules([RULES])
    keyed = plan_rules(ruleset, every_rule=True)
    native = {r.id for r in thresholds.native_rules(keyed)}
    assert {r.rule.id for r in keyed.rules} & native, "no keyed-path rule runs natively"
    assert {r.id for r in keyed.stream_rules} & native, "no stream-path rule runs natively"
    bounded = plan_rules(ruleset, keyed_path=False, every_rule=True)
    assert {r.id for r in thresholds.native_rules(bounded)} == {r.id for r in ruleset.rules}


def test_the_suite_input_and_crafted_events_on_two_partitions(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = write(
        tmp_path / "events.jsonl", lines_for_test() + [orjson.dumps(e) for e in crafted_thresholds()]
    )
    alerts, _, fell_back, same_order = compare(spark, caplog, path, partitions=2)
    assert set(fell_back.values()) == {0}  # the time bound is off: no partition is held
    assert {a.rule_id for a in alerts} == set(fell_back), "a rule that never fires makes the comparison weak"
    assert {a.status for a in alerts} == {"pending", "firing", "resolved", "inactive"}
    assert same_order  # every rule is native: the evaluator's order at each event too


def test_crafted_events_on_one_partition(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = write(tmp_path / "crafted.jsonl", [orjson.dumps(e) for e in crafted_thresholds()])
    alerts, _, _, same_order = compare(spark, caplog, path, partitions=1)
    assert same_order

    def seen(rule: str, group: str) -> list[tuple[str, str, str | None]]:
        return [
            (a.status, a.starts_at, a.ends_at)
            for a in alerts
            if a.rule_id == rule and group in a.labels.values()
        ]

    t = lambda m: at(900 + m)  # noqa: E731
    assert seen("thr-exactly-5m", "d-1")[:3] == [
        ("pending", t(0), None), ("firing", t(0), None), ("resolved", t(0), t(12)),
    ]  # fmt: skip
    fired = [
        a.event_ts for a in alerts if a.rule_id in ("thr-exactly-5m", "thr-overheat") and a.status == "firing"
    ]
    assert fired[:2] == [t(5), t(10)]  # for met exactly at its boundary
    assert seen("thr-overheat", "d-1") == [
        ("pending", t(0), None), ("firing", t(0), None), ("resolved", t(0), t(16)),
        ("pending", t(17), None), ("inactive", t(17), t(21)),
        ("pending", t(23), None), ("firing", t(23), None), ("resolved", t(23), t(41)),
    ]  # fmt: skip
    overlap = [s for s, _, _ in seen("thr-overlap", "d-1")]
    assert overlap[:6] == ["firing", "resolved", "firing", "resolved", "firing", "resolved"]
    assert [s for s, _, _ in seen("thr-hot-status", "busy")] == ["pending", "firing", "resolved"]
    assert [s for s, _, _ in seen("thr-battery", "b-1")] == ["pending", "firing", "resolved"]
    assert [s for s, _, _ in seen("thr-server-errors", "10.0.0.7")] == ["pending", "firing", "resolved"]
    assert [s for s, _, _ in seen("thr-left-depot", "v-1")] == ["firing", "resolved"]
    assert [s for s, _, _ in seen("thr-unknown-device-hot", "u-1")] == ["pending", "firing", "resolved"]
    assert not seen("thr-unknown-device-hot", "d-1")  # its registry row has a site
    assert [s for s, _, _ in seen("thr-too-hot-for-its-site", "d-1")][:3] == ["pending", "firing", "resolved"]


def test_the_real_nab_series_with_the_time_bound_on(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = tmp_path / "nab.jsonl"
    nab_devices(path, 3, [])
    alerts, report, fell_back, _ = compare(spark, caplog, path, partitions=2, max_skew_ms=SKEW_MS)
    assert report.events == 3 * 22_695
    assert set(fell_back.values()) == {0}  # the series never jumps ahead by 5m: nothing is held
    fired = {a.rule_id for a in alerts if a.status == "firing"}
    assert fired >= {"thr-overheat", "thr-cold", "thr-exactly-5m", "thr-overlap", "thr-fleet"}


def test_partitions_where_the_time_bound_holds_events_run_on_the_stream_path(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = tmp_path / "nab-future.jsonl"
    future = {"ts": "2099-12-31T00:00:00Z", "temperature": 200.0}
    nab_devices(path, 3, [{**future, "device_id": "nab-0"}])
    _, report, fell_back, _ = compare(spark, caplog, path, partitions=2, max_skew_ms=SKEW_MS)
    assert report.refused == 3  # once per sensors stream: by device, by status, by nothing
    assert fell_back["thr-overheat"] == 1 and fell_back["thr-fleet"] == 1  # nab-0's partitions only
    assert fell_back["thr-server-errors"] == 0  # no log event at all
