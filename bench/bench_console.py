"""The console's refresh cost with a large store: 10,000 current alerts, 100,000 transitions.

Run: ``.venv/bin/python bench/bench_console.py``. Builds the store in a temp dir (1,000
rules' worth of groups: 10,000 label sets with 10 transitions each, 60 % of them active,
a few hundred acks, silences and notifications; a registry of 60 devices for the map),
then times each console page's server-side work: the whole Streamlit script run of that
page, as the page itself measures it (run by Streamlit's ``AppTest``, which serializes
every element drawn, as a browser's refresh makes the server do), median of 7 runs after
one warm-up. Also the store queries alone.
The target is 300 ms or less per refresh; the last line prints the worst page's figure and
its ratio to the target.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.alerts import Alert  # noqa: E402
from app.console.queries import ConsoleQueries, silence_preview, split_matchers  # noqa: E402
from app.storage.alert_store import AlertStore  # noqa: E402

ALERTS = 10_000
PER_ALERT = 10
TARGET_MS = 300.0
RUNS = 7
SEVERITIES = ("critical", "warning", "info", "warning", "info")


def _ts(base: datetime, minutes: float) -> str:
    return (base + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")


def build(path: Path) -> None:
    base = datetime(2024, 5, 1, tzinfo=UTC)
    # recorded over the last hour of wall time, so the overview's rate chart has all of it
    now = datetime.now(tz=UTC)
    clock = iter(now - timedelta(minutes=59 - i * 59 / 100) for i in range(1000))
    with AlertStore(path, now=lambda: next(clock)) as store:
        batch: list[Alert] = []
        for i in range(ALERTS):
            rule = f"rule-{i % 1000:04d}"
            dev = f"pump-{i:05d}" if i % 2 else f"fan-{i:05d}"
            sev = SEVERITIES[i % len(SEVERITIES)]
            active = i % 5 < 3
            for k in range(PER_ALERT):
                # episodes of firing then resolved; the active tenth starts a new episode
                episode, phase = divmod(k, 2)
                if k == PER_ALERT - 1 and active:
                    episode, phase = PER_ALERT // 2, 0
                status = "firing" if phase == 0 else "resolved"
                if k == PER_ALERT - 1 and active and i % 5 == 2:
                    status = "pending"
                start = _ts(base, i % 500 + episode * 60)
                batch.append(
                    Alert.build(
                        rule_id=rule, rule_version="1", status=status,  # type: ignore[arg-type]
                        severity=sev, labels={"device_id": dev, "site": f"site-{i % 40}"},
                        annotations={"summary": f"{dev} is hot"}, starts_at=start,
                        ends_at=_ts(base, i % 500 + episode * 60 + 5) if status == "resolved" else None,
                        source="sensors", event_ts=_ts(base, i % 500 + episode * 60 + phase * 5),
                        values={"temperature": 100.0 + i % 7, "lat": 48.0 + i % 100 / 1000, "lon": 11.5},
                    )
                )  # fmt: skip
            if len(batch) >= 10_000:
                store.apply_many(batch)
                batch = []
        store.apply_many(batch)
        cmds = [
            {"type": "ack", "cmd_id": f"a{i}", "at": _ts(base, i), "fingerprint": f"{i:016x}",
             "starts_at": "", "by": "ann", "comment": "x"} for i in range(300)
        ] + [
            {"type": "silence", "cmd_id": f"s{i}", "at": _ts(base, i), "silence_id": f"s{i}",
             "matchers": [f'site="site-{i}"'], "starts_at": _ts(base, 0), "ends_at": "2999-01-01T00:00:00Z",
             "by": "ann", "comment": ""} for i in range(50)
        ]  # fmt: skip
        notes = [
            {"event": "delivered", "msg_id": f"m{i}", "receiver": "ops", "group_key": "g", "at": float(i),
             "alert_ids": [f"{i:032x}"], "attempts": 1} for i in range(5000)
        ]  # fmt: skip
        store.apply_batch(commands=cmds, notifications=notes)


def timed(fn: Callable[[], object]) -> float:
    """Median milliseconds of ``fn()`` over RUNS runs after a warm-up."""
    fn()
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    from streamlit.testing.v1 import AppTest

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        os.environ["APP_DATA_DIR"] = str(data)
        os.environ.pop("KAFKA_BOOTSTRAP_SERVERS", None)
        os.environ.pop("APP_STATE_URLS", None)
        store = data / "alerts.sqlite3"
        t0 = time.perf_counter()
        build(store)
        registry = ["device_id,kind,lat,lon,depot_lat,depot_lon,geofence_km"]
        registry += [f"pump-{i:05d},thermometer,{48 + i / 1000},11.5,,," for i in range(1, 100, 2)]
        registry += [f"vehicle-{i:02d},vehicle,,,{48.1 + i / 100},11.6,5" for i in range(10)]
        (data / "fleet-devices.csv").write_text("\n".join(registry) + "\n")
        with ConsoleQueries(store) as q:
            n_alerts = sum(sum(r.values()) for r in q.counts().values())
            n_trans = sum(a.transitions for a in q.rule_activity().values())
            active = q.alerts().total
            (one,) = q.alerts(split_matchers('device_id="pump-00001"')).rows
        print(f"store: {n_alerts} current alerts ({active} active), {n_trans} transitions, "
              f"built in {time.perf_counter() - t0:.1f} s")  # fmt: skip

        print("store queries (median ms):")
        matchers = split_matchers('severity="critical", device_id=~"pump-.*"')
        ids = [line.split(",")[0] for line in registry[1:]]
        with ConsoleQueries(store) as q:
            now = datetime.now(tz=UTC)
            queries = {
                "counts": q.counts,
                "rate (last hour)": lambda: q.rate(now),
                "alerts, no filter": lambda: q.alerts(),
                "alerts, matcher filter": lambda: q.alerts(matchers),
                "one alert's transitions": lambda: q.transitions(one.rule_id, one.fingerprint),
                "its notifications": lambda: q.notifications_for([one.alert_id]),
                "rule activity": q.rule_activity,
                "silence preview": lambda: silence_preview(q, matchers),
                "devices (map, 60 ids)": lambda: q.devices(ids),
            }
            for name, fn in queries.items():
                print(f"  {name:<26} {timed(fn):7.1f}")

        print("page refresh, the whole script run, server side (median ms):")
        pages = {
            "overview": {},
            "alerts": {},
            "alerts, filtered": {"filter": 'severity="critical", device_id=~"pump-.*"'},
            "alert detail": {"alert": f"{one.rule_id}/{one.fingerprint}"},
            "rules": {},
            "map": {},
            "silences": {},
        }
        worst = 0.0
        for name, params in pages.items():
            page = name.split(",")[0].split(" ")[0]
            at = AppTest.from_file(str(ROOT / "dashboard" / "streamlit_app.py"), default_timeout=120)
            at.query_params["page"] = page
            for k, v in params.items():
                if k == "alert":
                    at.query_params[k] = v
            at.run()
            if "filter" in params:
                at.text_input(key="filter").input(params["filter"]).run()
            if at.exception:
                msg = f"{name}: {at.exception[0].value}"
                raise SystemExit(msg)
            wall = timed(at.run)
            script = []
            for _ in range(RUNS):
                at.run()
                script.append(at.session_state["refresh_ms"])
            ms = statistics.median(script)
            worst = max(worst, ms)
            print(f"  {name:<26} {ms:7.1f}   (AppTest wall {wall:6.1f}, with its polling)")
        print(f"worst refresh: {worst:.0f} ms (target <= {TARGET_MS:.0f} ms: {worst / TARGET_MS:.2f} of it)")


if __name__ == "__main__":
    main()
