"""``jobs.state.change_points``: a backtest's keyed rows, less those that cannot change an
alert (the outputs are compared with the Faust engine's by ``tests/conformance``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.rules.loader import load_rules
from jobs.compile import plan_rules
from jobs.state import change_points

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RULE = """\
rules:
  - {id: twice, source: sensors, where: temperature > 100, consecutive: 2, group_by: [device_id]}
"""


def test_only_the_rows_that_can_change_an_alert_are_kept(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "rule.yaml"
    path.write_text(RULE)
    plan = plan_rules(load_rules([path]), every_rule=True)
    assert [r.rule.id for r in plan.rules] == ["twice"]
    rows = [  # (offset, ts, condition)
        (0, 0, False),  # before the first TRUE: a quiet key stays quiet
        (1, 10, True),  # the run starts (pending)
        (2, 20, True),  # the second in a row: fires
        (3, 30, True),  # still firing: nothing changes
        (4, 5, False),  # late (5 < 30): skipped
        (5, 40, False),  # ends the run: resolves
        (6, 50, False),  # quiet after quiet
        (7, 45, True),  # late (45 < 50)
        (8, 60, True),  # a new run
        (9, 70, None),  # NULL is not TRUE: ends it
    ]
    other = [(10, 5, True), (11, 6, False), (12, 7, False)]  # another group: its own clock
    df = spark.createDataFrame(
        [("k1", 0, h, 0, o, t) for o, t, h in rows] + [("k2", 0, h, 0, o, t) for o, t, h in other],
        "__key string, __idx int, __holds boolean, __part int, __offset long, __ts_ms long",
    )
    kept = sorted(r["__offset"] for r in change_points(df, plan).collect())
    assert kept == [1, 2, 5, 8, 9, 10, 11]
