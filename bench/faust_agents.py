"""The plain Faust agents the rule worker is measured beside: the issue's minimal agent and a
no-op one, each a script run as its own Faust worker over a pre-filled topic.

Used by ``bench_rules.py``. Both read ``events.sensors`` from its start with Faust's default
settings and count what they handle in a Prometheus counter on ``APP_METRICS_PORT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from worker_runs import Progress, metric, progress_rate

from app.kafka.broker import free_port

#: plain Faust apps (Faust's default timings) join their group and then read the whole topic
PLAIN_FAUST_TIMEOUT_S = 60.0

#: the minimal agent's rate where the issue set the targets (events/s)
MINIMAL_BASELINE = 14_000

#: the issue's minimal agent: decode, one threshold (its first example's), send on a match
MINIMAL_AGENT = """
import faust, orjson, os
from prometheus_client import Counter, start_http_server
seen = Counter("minimal_events_total", "events handled")
app = faust.App("bench-minimal", broker="kafka://" + os.environ["KAFKA_BOOTSTRAP_SERVERS"], web_enabled=False,
                consumer_auto_offset_reset="earliest", store="memory://",
                datadir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench-minimal-data"))
src = app.topic("events.sensors", key_serializer="raw", value_serializer="raw")
out = app.topic("bench.minimal", key_serializer="raw", value_serializer="raw")
@app.agent(src)
async def threshold(stream):
    async for raw in stream:
        ev = orjson.loads(raw)
        t = ev.get("temperature")
        if t is not None and t > 100:
            await out.send(key=ev["device_id"].encode(), value=raw)
        seen.inc()
@app.task
async def serve():
    start_http_server(int(os.environ["APP_METRICS_PORT"]), addr="127.0.0.1")
app.main()
"""


NOOP_AGENT = """
import faust, os
from prometheus_client import Counter, start_http_server
seen = Counter("noop_events_total", "events iterated")
app = faust.App("bench-noop", broker="kafka://" + os.environ["KAFKA_BOOTSTRAP_SERVERS"], web_enabled=False,
                consumer_auto_offset_reset="earliest", store="memory://",
                datadir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench-noop-data"))
src = app.topic("events.sensors", key_serializer="raw", value_serializer="raw")
@app.agent(src)
async def noop(stream):
    async for _raw in stream:
        seen.inc()
@app.task
async def serve():
    start_http_server(int(os.environ["APP_METRICS_PORT"]), addr="127.0.0.1")
app.main()
"""


def plain_agent(
    tmp: Path, name: str, source: str, env: dict[str, str], counter: str, expect: int
) -> Progress:
    """A plain Faust app (``MINIMAL_AGENT``, ``NOOP_AGENT``) over the pre-filled topic: its rate."""
    script = tmp / f"{name}.py"
    script.write_text(source)
    own = {**env, "APP_METRICS_PORT": str(free_port())}
    return progress_rate(
        [sys.executable, str(script), "worker", "-l", "warn", "--without-web"],
        own,
        tmp / f"{name}.log",
        metric(own["APP_METRICS_PORT"], counter),
        expect,
        timeout_s=PLAIN_FAUST_TIMEOUT_S,
    )
