"""The notification log's silence is explained: when it holds back every alert of a flush as
already sent, one INFO line per group and receiver per interval says how many and why."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.dispatch.nflog import NotificationLog, log_key
from app.dispatch.pipeline import DedupStage, FlushContext
from app.dispatch.routes import build_tree
from tests.dispatch.helpers import T0, alert, routes


def test_held_back_alerts_are_logged_with_the_count_and_reason_once_per_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = routes(tmp_path, "route:\n  receiver: ops\n  repeat_interval: 4h\n")
    route, receiver = build_tree(cfg), cfg.receiver("ops")
    nflog = NotificationLog()
    stage = DedupStage(nflog, log_every_s=300)
    hot = alert("d1")

    def flush(at: float) -> list[object]:
        return list(stage.run(FlushContext(route, receiver, "g1", {}, at), [hot]))

    assert flush(T0) == [hot]  # never told: passes, nothing to explain
    nflog.record(log_key("g1", "ops"), [hot.alert_id], [], T0)
    with caplog.at_level(logging.INFO, logger="app.dispatch.pipeline"):
        assert flush(T0 + 10) == [] and flush(T0 + 20) == [] and flush(T0 + 400) == []
    lines = [r.getMessage() for r in caplog.records if "held back" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].startswith(
        "not notifying ops of group g1: 1 alert(s) held back by the notification log: "
    )
    assert "notification 1 at 2023-11-14T22:13:20Z" in lines[0]
    assert "repeat_interval 14400s, at 2023-11-15T02:13:20Z" in lines[0]
    assert "2 alert(s) held back" in lines[1]  # the one at +20 and the one at +400
