"""The console in a real browser (headless Chromium over CDP) against a real Streamlit server,
a seeded alert store and the session's Kafka broker: sign in, filter, open an alert's
detail with its chart, ack, preview and create a silence, see the map's markers.

Screenshots go to the test's temp dir, and to ``APP_SCREENSHOTS_DIR`` too when it is set
(``APP_SCREENSHOTS_DIR=docs/img`` refreshes the README's pictures).
"""

from __future__ import annotations

import io
import os
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import orjson
import pytest
from PIL import Image

from app.dispatch.commands import AckCommand, SilenceCommand, parse_command
from app.kafka.broker import KafkaBroker
from app.topics import COMMANDS
from tests.agents.worker_helpers import nab_lines
from tests.browser.cdp import Tab, browser, chromium_path
from tests.browser.console_server import go_to, run_console
from tests.console_helpers import PASSWORD, add_user, seed
from tests.kafka_helpers import consume_json, produce

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed"),
]

REGISTRY = (
    "device_id,kind,lat,lon,depot_lat,depot_lon,geofence_km\n"
    "pump-7,thermometer,48.137,11.575,,,\n"
    "pump-9,thermometer,48.16,11.52,,,\n"
    "fan-1,thermometer,48.12,11.60,,,\n"
    "vehicle-01,vehicle,,,48.15,11.65,5\n"
)


def pump_readings() -> list[tuple[bytes, bytes]]:
    """pump-7's readings for the input chart: the real NAB series' first overheat (rows 2376 to
    2399), every 5 minutes from 2024-05-01T08:15 to 10:10 (the seeded alert fired at 10:00)."""
    start = datetime(2024, 5, 1, 8, 15, tzinfo=UTC)
    rows = [orjson.loads(v) for v in nab_lines(2400)[2376:]]
    return [
        (b"pump-7", orjson.dumps({**row, "device_id": "pump-7",
                                  "ts": (start + timedelta(minutes=5 * i)).isoformat()}))
        for i, row in enumerate(rows)
    ]  # fmt: skip


@pytest.fixture
def console(tmp_path: Path, broker: KafkaBroker) -> Iterator[str]:
    """A Streamlit console on loopback over a seeded store; its URL."""
    data = tmp_path / "data"
    data.mkdir()
    seed(data / "alerts.sqlite3")
    produce(broker.bootstrap, "events.sensors", pump_readings())
    add_user(data)
    (data / "fleet-devices.csv").write_text(REGISTRY)
    with run_console(tmp_path, data, broker.bootstrap) as url:
        yield url


def _shot(tab: Tab, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    tab.screenshot(path, width=1100)
    # palette PNG: a fifth of the size, and the README's pictures stay small
    img = Image.open(path).convert("RGB").quantize(colors=128)
    img.save(path, optimize=True)
    keep = os.environ.get("APP_SCREENSHOTS_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / name)
    return path


def _markers(png: bytes) -> set[str]:
    """Which marker colours a picture of the map holds: reddish (critical) and greenish (no
    alert) pixels, by hue, since the dots are blended."""
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    found = set()
    if ((r > 180) & (g < 110) & (b < 110)).any():
        found.add("red")
    if ((g > 130) & (r < 120) & (g > b + 10)).any():
        found.add("green")
    return found


def _wait_markers(tab: Tab, canvas: str, wanted: set[str], timeout_s: float = 30.0) -> set[str]:
    """The marker colours on the map's canvas once ``wanted`` are all drawn (deck.gl draws on
    later frames), or the last colours seen after ``timeout_s``. Each look is a picture of the
    canvas alone, taken at that moment at full colour (no palette reduction)."""
    rect = (
        f"(() => {{ const r = {canvas}.getBoundingClientRect(); return {{x: r.left + window.scrollX,"
        " y: r.top + window.scrollY, width: r.width, height: r.height, scale: 1}; })()"
    )
    deadline = time.monotonic() + timeout_s
    while True:
        found = _markers(tab.png(clip=tab.eval(rect)))
        if wanted <= found or time.monotonic() >= deadline:
            return found
        time.sleep(0.3)


def test_operator_signs_in_filters_opens_detail_acks_silences_and_sees_the_map(
    console: str, broker: KafkaBroker, tmp_path: Path
) -> None:
    with browser(height=2600) as tab:  # tall: each picture holds its whole page (Tab.screenshot)
        tab.open(f"{console}/?page=overview")
        tab.wait_text("Latest firing")
        tab.wait_text("consumer lag")  # the pipeline's first sample, from the broker

        # acting needs a user: the buttons are disabled until one signs in
        tab.type_into("user", "ann", enter=False)
        tab.type_into("password", PASSWORD, enter=False)
        tab.click_button("Sign in")
        tab.wait_text("signed in as ann")

        go_to(tab, "Alerts")
        tab.wait_text("alert(s) match")
        tab.type_into("filter", 'severity="critical", device_id=~"pump-.*"')
        tab.wait_text("1 alert(s) match")
        tab.choose("open alert", "critical machine-overheat")
        tab.wait_text("Runbook")
        tab.wait_text("Input: temperature")
        charts = "document.querySelectorAll('.vega-embed').length >= 2"
        tab.wait_for(charts, "the transitions and input charts")
        tab.wait_text("reading(s) of temperature for device_id=pump-7")  # the raw line, from the topic
        tab.wait_text("wh-123")  # the notification's webhook id
        tab.type_into("ack comment", "on it", enter=False)
        tab.click_button("Ack")
        tab.wait_text("ack sent by ann")
        _shot(tab, tmp_path, "console-alert-detail.png")

        go_to(tab, "Silences")
        tab.type_into("matchers", 'device_id=~"pump-.*"')
        tab.wait_text("would mute 2 current alert(s)")
        _shot(tab, tmp_path, "console-silence.png")
        tab.click_button("Create silence")
        tab.wait_text("silence sent by ann")

        go_to(tab, "Map")
        tab.wait_text("Click a device to see its alerts")
        canvas = "document.querySelector('[data-testid=\"stDeckGlJsonChart\"] canvas')"
        tab.wait_for(f"!!{canvas}", "the map's canvas")
        # the markers are drawn: pump-7's critical red and the healthy fan's green
        markers = _wait_markers(tab, canvas, {"red", "green"})
        _shot(tab, tmp_path, "console-map.png")
        tab.choose("device", "pump-7")
        tab.wait_text("Alerts of pump-7")

        go_to(tab, "Overview")  # its picture last: the sidebar is settled by now
        tab.wait_text("consumer lag")
        _shot(tab, tmp_path, "console-overview.png")

    assert markers == {"red", "green"}
    commands = [parse_command(orjson.dumps(c)) for c in consume_json(broker.bootstrap, COMMANDS, min_count=2)]
    ack = next(c for c in commands if isinstance(c, AckCommand))
    silence = next(c for c in commands if isinstance(c, SilenceCommand))
    assert (ack.by, ack.comment) == ("ann", "on it")
    assert (silence.by, silence.matchers) == ("ann", ('device_id=~"pump-.*"',))
