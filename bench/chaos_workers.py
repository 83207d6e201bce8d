"""Rule workers under faults, on live traffic: do they give the backtest's alerts?

Three workers share ``events.logs`` (4 partitions) and the regroup topic of rules grouped by
client IP over lines keyed by host, so every group takes events from every source partition.
A producer sends time-ordered access-log lines at a steady rate while a seeded schedule of
faults hits a random worker every few seconds:

- ``kill``: SIGKILL, and a new worker starts at once (the group gives the dead one's
  partitions over after its session timeout, 10 s; with ``--static`` the new one takes the
  dead one's member id, and its place, at once);
- ``stop``: SIGSTOP for 2 to 6 s (within the session timeout: no rebalance), then SIGCONT;
- ``restart``: SIGTERM (a clean stop, its offsets committed), and a new worker.

Then the input stops, the faults stop, and once the ``alerts`` topic has been quiet for a
while, the alert ids are compared with the backtest's over the same lines on the same
partitions: missing ids are alerts lost, extra ids are alerts the backtest never gives. At
least once a killed worker's last round is evaluated again, so an id may come twice; the
comparison is of the id sets. With ``--exactly-once`` the workers run exactly-once, the
alerts are read committed, and an id twice fails the run too.

    .venv/bin/python bench/chaos_workers.py [--seconds 90] [--rate 150] [--seed 1]

Prints each fault as it happens, then one JSON line, with what the group's rebalances cost
(from the worker logs: :func:`rebalances`). Exit 0 when the sets are equal, 1 when
not. Bounded: every worker is stopped (then killed) at the end, and the broker with them.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads

import orjson  # noqa: E402
from aiokafka import AIOKafkaProducer  # noqa: E402
from worker_runs import end_offset, read_all, settle  # noqa: E402

from app.backtest import BacktestReport, backtest, read_events  # noqa: E402
from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.broker import KafkaBroker  # noqa: E402
from app.rules.loader import load_rules  # noqa: E402

PARTITIONS = 4
WORKERS = 3
KINDS = ("kill", "stop", "restart")
#: every rule with some lateness, as an operator sets it on a live stream (the shipped packs'
#: are 1 to 15 minutes): live, a partition whose worker stalls is trusted "caught up" for up to
#: 2 s after its last word (``agents.merge.CONFIRM_S``), so its records can come that late
RULES = """\
rules:
  - id: burst-403
    source: logs
    where: status = 403
    group_by: [client_ip]
    window: {type: tumbling, size: 10s}
    aggregate: {n: count(*)}
    having: n >= 150
    allowed_lateness: 5s
  - id: per-ip-minute
    source: logs
    group_by: [client_ip]
    window: {type: tumbling, size: 1m}
    aggregate: {n: count(*)}
    having: n >= 1500
    allowed_lateness: 5s
  - id: forbidden-streak
    source: logs
    where: status = 403
    group_by: [client_ip]
    consecutive: 40
    order: event_time
    allowed_lateness: 5s
  - id: host-errors
    source: logs
    where: status >= 500
    group_by: [host]
    consecutive: 2
"""


def lines(n: int, rate: float, seed: int) -> list[bytes]:
    """``n`` access-log lines, ``rate`` per second of event time (the time they are sent at), from
    12 hosts and 5 client IPs, one of which sends most lines for 9 s at a time, and 403s for a
    quarter of the time."""
    rng = random.Random(seed)
    hosts = [f"web-{i}" for i in range(12)]
    ips = [f"10.0.0.{i}" for i in range(1, 6)]
    out = []
    for i in range(n):
        ms = int(i * 1000 / rate)
        s = ms // 1000
        ip = ips[(s // 9) % 5] if rng.random() < 0.7 else rng.choice(ips)
        status = 403 if (s // 25) % 4 == 0 and rng.random() < 0.8 else (503 if rng.random() < 0.02 else 200)
        ts = f"2026-03-01T{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{ms % 1000:03d}Z"
        out.append(orjson.dumps({"host": rng.choice(hosts), "ts": ts, "client_ip": ip, "status": status}))
    return out


class Workers:
    """The worker processes, each logging to a file of its own."""

    def __init__(self, env: dict[str, str], logs: Path, static: bool = False) -> None:
        self.env, self.logs, self.count, self.static = env, logs, 0, static
        self.procs: list[subprocess.Popen[bytes]] = []
        #: each process's slot; with ``static`` a slot's worker has the same member id in
        #: the group across its replacements (``APP_WORKER_INSTANCE_ID``)
        self.slots: list[int] = []

    def start(self, slot: int | None = None) -> None:
        self.count += 1
        slot = len(self.procs) if slot is None else slot
        env = {**self.env, "APP_WORKER_INSTANCE_ID": f"chaos-{slot}"} if self.static else self.env
        with (self.logs / f"worker-{self.count}.log").open("wb") as out:
            cmd = [sys.executable, "-m", "agents", "worker", "-l", "info"]
            proc = subprocess.Popen(
                cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(proc)
        self.slots.append(slot)

    def signal(self, i: int, sig: int) -> None:
        os.killpg(self.procs[i].pid, sig)

    def replace(self, i: int, sig: int) -> None:
        self.signal(i, sig)
        try:
            self.procs[i].wait(20)
        except subprocess.TimeoutExpired:
            self.signal(i, signal.SIGKILL)
            self.procs[i].wait(5)
        del self.procs[i]
        self.start(self.slots.pop(i))

    def stop_all(self) -> None:
        procs, self.procs, self.slots = self.procs, [], []
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


#: the timestamp of a Faust log line: ``[2026-12-01 16:05:05,899] [pid] [INFO] ...``
LOG_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def rebalances(logs: list[Path]) -> dict[str, Any]:
    """What the group's rebalances cost, from the workers' logs: each rebalance after a worker's
    first join, from ``Revoking previously assigned`` to ``Setting newly assigned partitions``
    (the worker evaluates nothing in between), and each worker's first Faust line (its start)
    to its first assignment."""
    paused: list[float] = []
    joining: list[float] = []
    for log in logs:
        first = revoked = None
        joined = False
        for line in log.read_text(errors="replace").splitlines():
            m = LOG_TIME.match(line)
            if m is None:
                continue
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC).timestamp()
            first = at if first is None else first
            if "Revoking previously assigned" in line:
                revoked = at
            elif "Setting newly assigned" in line and revoked is not None:
                if joined:
                    paused.append(at - revoked)
                else:
                    joining.append(at - first)
                joined, revoked = True, None
    return {
        "rebalances": len(paused),
        "rebalance_s_median": round(statistics.median(paused), 2) if paused else None,
        "rebalance_s_total": round(sum(paused), 1),
        "start_to_assigned_s_median": round(statistics.median(joining), 2) if joining else None,
        "start_to_assigned_s_max": round(max(joining), 2) if joining else None,
    }


async def produce(bootstrap: str, records: list[bytes], rate: float, faults: asyncio.Task[None]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        started = time.monotonic()
        for i, value in enumerate(records):
            due = started + i / rate
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            await producer.send("events.logs", value, key=orjson.loads(value)["host"].encode())
        await producer.flush()
    finally:
        await producer.stop()
        faults.cancel()


async def fault_loop(
    workers: Workers, rng: random.Random, said: list[str], started: float, kinds: list[str],
    every: tuple[float, float],
) -> None:  # fmt: skip
    await asyncio.sleep(15)  # every worker ready and assigned first
    while kinds:
        await asyncio.sleep(rng.uniform(*every))
        i, kind = rng.randrange(len(workers.procs)), rng.choice(kinds)
        at = f"{time.monotonic() - started:6.1f} s"
        if kind == "stop":
            pause = rng.uniform(2, 6)
            said.append(f"{at} stop worker {i} for {pause:.1f} s")
            print(said[-1], flush=True)
            workers.signal(i, signal.SIGSTOP)
            try:
                await asyncio.sleep(pause)
            finally:
                workers.signal(i, signal.SIGCONT)
        else:
            said.append(f"{at} {kind} worker {i}")
            print(said[-1], flush=True)
            await asyncio.to_thread(workers.replace, i, signal.SIGKILL if kind == "kill" else signal.SIGTERM)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=90, help="how long the input and the faults go on")
    ap.add_argument("--rate", type=float, default=150, help="lines per second")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-faults", action="store_true", help="the same run with no fault: the baseline")
    ap.add_argument("--only", choices=KINDS, action="append", help="faults of this kind only (repeatable)")
    ap.add_argument("--every", type=float, nargs=2, default=(6.0, 14.0), metavar=("MIN", "MAX"),
                    help="seconds between two faults, drawn between MIN and MAX (default 6 14)")  # fmt: skip
    ap.add_argument("--exactly-once", action="store_true",
                    help="workers run exactly_once: an id sent twice fails the run")  # fmt: skip
    ap.add_argument("--static", action="store_true",
                    help="static membership: a slot keeps its member id across replacements")  # fmt: skip
    ap.add_argument("--keep", default=f"{tempfile.gettempdir()}/chaos-workers", help="where logs are kept")
    args = ap.parse_args()
    guarantee = "exactly_once" if args.exactly_once else "at_least_once"
    rng = random.Random(args.seed)
    records = lines(int(args.seconds * args.rate), args.rate, args.seed)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        rules = home / "rules"
        rules.mkdir()
        (rules / "chaos.yaml").write_text(RULES)
        report = BacktestReport()
        want = backtest(load_rules([rules]), read_events(records, "in", report), io.StringIO(), report,
                        partitions=PARTITIONS)  # fmt: skip
        expected = {a.alert_id: a.rule_id for a in want}
        broker = stack.enter_context(KafkaBroker(home / "kafka", heap="512m"))
        asyncio.run(ensure_topics(broker.bootstrap, partitions=PARTITIONS))
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "APP_DATA_DIR": str(home / "data"),
               "APP_PARTITIONS": str(PARTITIONS), "APP_RULES_DIR": str(rules),
               "APP_PROCESSING_GUARANTEE": guarantee}  # fmt: skip
        workers = Workers(env, home, static=args.static)
        stack.callback(workers.stop_all)
        for _ in range(WORKERS):
            workers.start()
        said: list[str] = []
        started = time.monotonic()

        async def run() -> None:
            kinds = [] if args.no_faults else args.only or list(KINDS)
            faults = asyncio.create_task(fault_loop(workers, rng, said, started, kinds, args.every))
            await asyncio.sleep(10)
            await produce(broker.bootstrap, records, args.rate, faults)
            try:
                await faults
            except asyncio.CancelledError:
                pass
            for p in workers.procs:  # a stop cut short by the end: woken
                os.killpg(p.pid, signal.SIGCONT)

        asyncio.run(run())
        settle(end_offset(broker.bootstrap, "alerts"), quiet_s=25, timeout_s=240)
        got = [orjson.loads(v) for v in asyncio.run(read_all(broker.bootstrap, "alerts"))]
        workers.stop_all()
        logs = sorted(home.glob("worker-*.log"))
        crashed = [p.name for p in logs if "Crashed reason" in p.read_text(errors="replace")]
        kept = Path(args.keep) / f"seed-{args.seed}"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(home, kept, ignore=shutil.ignore_patterns("kafka", "data"))
        (kept / "alerts.jsonl").write_bytes(b"".join(orjson.dumps(a) + b"\n" for a in got))
        (kept / "expected.jsonl").write_bytes(b"".join(orjson.dumps(a.to_dict()) + b"\n" for a in want))
        (kept / "lines.jsonl").write_bytes(b"".join(v + b"\n" for v in records))
    ids = {str(a["alert_id"]): str(a["rule_id"]) for a in got}
    missing, extra = expected.keys() - ids.keys(), ids.keys() - expected.keys()
    twice = len(got) - len(ids)  # at least once, a killed worker's last round may be sent again
    print(orjson.dumps({
        "seed": args.seed, "lines": len(records), "faults": said, "expected": len(expected), "got": len(ids),
        "guarantee": guarantee, "static": args.static, "records": len(got), "sent_again": twice,
        "crashed": crashed, **rebalances(sorted(kept.glob("worker-*.log"))),
        "missing": dict(Counter(expected[i] for i in missing)), "extra": dict(Counter(ids[i] for i in extra)),
        "logs": str(kept),
    }).decode())  # fmt: skip
    return 0 if not missing and not extra and not crashed and not (args.exactly_once and twice) else 1


if __name__ == "__main__":
    raise SystemExit(main())
