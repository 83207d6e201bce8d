"""Score the anomaly rule pack on the whole Numenta Anomaly Benchmark corpus.

Each of NAB's 58 series is replayed, alone, through the production evaluator's backtest
(:func:`app.backtest.backtest`, the code behind ``python -m app backtest``) as ``sensors``
events ``{device_id, ts, value, kind}``. ``kind`` is what an operator knows about the
metric, from its file's name and folder only (:func:`metric_kind`), never from its labels.
Every ``firing`` transition of the pack is a detection, at the time of the event that
fired it (``event_ts``: what an operator would have been told then, not the episode's
``starts_at``). The detections are scored with :mod:`bench.nab_scoring` for NAB's three
profiles and printed beside NAB's published results.

    python bench/nab_score.py [--rules rules/anomaly.yaml] [--datasets ../shared/datasets]
                              [--detections detections.json]

``--detections FILE`` writes ``{"dir/file.csv": ["2013-12-02 21:15:00", ...]}`` with the
timestamps as they appear in the series, for any other NAB implementation to score.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.runtime import native

native.activate()  # before any evaluator module loads

from app.backtest import BacktestReport, backtest  # noqa: E402
from app.events import SCHEMAS, Event, parse_ts  # noqa: E402
from app.rules.loader import RuleSet, load_rules  # noqa: E402
from app.runtime.settings import PROJECT_ROOT  # noqa: E402
from bench.nab_scoring import (  # noqa: E402
    CorpusScore,
    load_profiles,
    normalise_window_bound,
    read_series_timestamps,
    score_corpus,
)

logger = logging.getLogger(__name__)

DEFAULT_DATASETS = PROJECT_ROOT / ".." / "shared" / "datasets"
DEFAULT_RULES = PROJECT_ROOT / "rules" / "anomaly.yaml"
#: NAB's names of its published detectors, as the issue's table names them
PUBLISHED_NAMES = {
    "ARTime": "ARTime",
    "numenta": "Numenta HTM",
    "contextOSE": "CAD OSE",
    "earthgeckoSkyline": "earthgecko Skyline",
    "knncad": "KNN CAD",
    "relativeEntropy": "Relative Entropy",
    "randomCutForest": "Random Cut Forest",
    "twitterADVec": "Twitter ADVec",
    "windowedGaussian": "Windowed Gaussian",
    "skyline": "Etsy Skyline",
    "random": "random",
}
PROFILES = ("standard", "reward_low_FP_rate", "reward_low_FN_rate")

#: (words in the file's folder/name, kind): the first that matches names the metric's kind
_KINDS = (
    (("temperature",), "temperature"),
    (("cpu",), "cpu"),
    (("latency", "rogue_agent_key"), "latency"),
    (("Twitter_volume",), "tweets"),
    (("realTraffic",), "traffic"),
    (("realAdExchange",), "ad_clicks"),
    (("network", "NetworkIn", "disk", "request_count", "taxi"), "throughput"),
)


def metric_kind(name: str) -> str:
    """The kind of metric a NAB series is, from its ``dir/file.csv`` name alone: what an
    operator configures for a device. Anything else is ``generic``."""
    for words, kind in _KINDS:
        if any(w in name for w in words):
            return kind
    return "generic"


@dataclass(frozen=True)
class Series:
    name: str  # dir/file.csv
    timestamps: list[str]
    values: list[float]


def read_corpus(datasets: Path) -> list[Series]:
    data = datasets / "nab" / "data"
    out = []
    for path in sorted(data.glob("*/*.csv")):
        stamps = read_series_timestamps(path)
        with path.open() as f:
            header = f.readline().strip().split(",")
            col = header.index("value")
            values = [float(line.split(",")[col]) for line in f if line.strip()]
        out.append(Series(f"{path.parent.name}/{path.name}", stamps, values))
    return out


def read_windows(datasets: Path) -> dict[str, list[tuple[str, str]]]:
    raw = json.loads((datasets / "nab" / "labels" / "combined_windows.json").read_text())
    return {
        name: [(normalise_window_bound(a), normalise_window_bound(b)) for a, b in spans]
        for name, spans in raw.items()
    }


def series_events(series: Series) -> Iterator[tuple[str, Event]]:
    """The series as sensors events, one device per series, in file order."""
    schema = SCHEMAS["sensors"]
    device = series.name.rsplit("/", 1)[-1].removesuffix(".csv")
    kind = metric_kind(series.name)
    for ts, value in zip(series.timestamps, series.values, strict=True):
        stamp = ts.replace(" ", "T") + "Z"
        yield "sensors", schema.validate({"device_id": device, "ts": stamp, "value": value, "kind": kind})


def detect(ruleset: RuleSet, series: Series) -> list[str]:
    """The series' timestamps at which the pack fired (each firing transition's event)."""
    by_ms: dict[int, str] = {}
    for ts in series.timestamps:
        by_ms.setdefault(parse_ts(ts.replace(" ", "T") + "Z"), ts)
    report = BacktestReport()
    alerts = backtest(ruleset, series_events(series), io.StringIO(), report)
    if report.problems:
        msg = f"{series.name}: {report.problems[:3]}"
        raise SystemExit(msg)
    found = [by_ms[parse_ts(a.event_ts)] for a in alerts if a.status == "firing"]
    return sorted(set(found), key=series.timestamps.index)


def score_all(
    ruleset: RuleSet, datasets: Path
) -> tuple[dict[str, CorpusScore], dict[str, list[str]], int, float]:
    corpus = read_corpus(datasets)
    windows = read_windows(datasets)
    missing = sorted(set(windows) - {s.name for s in corpus})
    if missing:
        msg = f"series missing from {datasets}: {missing[:5]}"
        raise SystemExit(msg)
    start = time.perf_counter()
    detections = {s.name: detect(ruleset, s) for s in corpus}
    took = time.perf_counter() - start
    series = {s.name: s.timestamps for s in corpus}
    profiles = {p.name: p for p in load_profiles(datasets / "nab" / "config" / "profiles.json")}
    scores = {name: score_corpus(series, windows, detections, profiles[name]) for name in PROFILES}
    return scores, detections, sum(len(s.timestamps) for s in corpus), took


def table(scores: dict[str, CorpusScore], published: dict[str, dict[str, float]]) -> str:
    rows = [("this pack (streamalert rules)", *(scores[p].score for p in PROFILES))]
    rows += [
        (label, *(published[key][p] for p in PROFILES))
        for key, label in PUBLISHED_NAMES.items()
        if key in published
    ]
    rows.sort(key=lambda r: -r[1])
    lines = ["| detector | standard | low FP | low FN |", "|---|---|---|---|"]
    for label, *vals in rows:
        mark = "**" if label.startswith("this pack") else ""
        lines.append(f"| {mark}{label}{mark} | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", type=Path, default=DEFAULT_RULES)
    ap.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    ap.add_argument("--detections", type=Path, help="write the detections as JSON here")
    args = ap.parse_args(argv)
    if not (args.datasets / "nab" / "data").is_dir():
        print(f"NAB corpus not found under {args.datasets} (../shared beside the project)", file=sys.stderr)
        return 2
    ruleset = load_rules([args.rules])
    scores, detections, events, took = score_all(ruleset, args.datasets)
    published = json.loads((args.datasets / "nab" / "config" / "published_results.json").read_text())
    if args.detections:
        args.detections.write_text(json.dumps(detections, indent=1) + "\n")
    print(table(scores, published))
    s = scores["standard"]
    print(
        f"\n{len(detections)} series, {events:,} events in {took:.1f} s; standard profile: "
        f"{s.tp} windows found, {s.fn} missed, {s.fp} false positives, "
        f"{sum(map(len, detections.values()))} detections"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
