"""The Numenta Anomaly Benchmark's scoring method, implemented from its documentation.

NAB (Lavin & Ahmad, 2015, "Evaluating Real-time Anomaly Detection Algorithms") scores a
detector on labelled anomaly windows with an application profile's weights (``tpWeight``,
``fpWeight``, ``fnWeight``):

- **Probation.** The first ``min(floor(0.15 * n), 750)`` rows of a series are for
  learning. Detections there are ignored, and a window lying wholly inside them is not
  scored.
- **Windows.** Only a window's best detection counts. A detection at row ``i`` of a
  window whose last row is ``r`` and whose width is ``w`` rows sits at the relative
  position ``p = -(r - i + 1) / w``: -1 at its left edge, near 0 at its right. It scores
  ``tpWeight * S(p) / S(-1)``, where ``S(p) = 2 * sigmoid(-5 p) - 1``, so an earlier
  detection scores more. A window without a detection scores ``-fnWeight``.
- **False positives.** A detection outside every window scores ``fpWeight * S(q)``.
  - After a window, ``q`` is the distance in rows past that window's right edge over its
    width less one, so ``S(q)`` falls from ~0 towards -1.
  - ``S(q)`` is -1 from ``q >= 3``, and before any window.
- **Normalisation.** Over the corpus, with the null detector (no detections) at 0 and the
  perfect one (every scored window at its first row) at 100:
  ``100 * (raw - null) / (perfect - null)``.

A detection is a timestamp that appears in its series. Detections are binary here (an alert
fired, or not), so no threshold is swept.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PROBATION_PERCENT = 0.15
PROBATION_CAP_ROWS = 0.15 * 5000


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def scaled_sigmoid(position: float) -> float:
    """NAB's ``S``: 2·sigmoid(-5p) - 1, and -1 from p >= 3 on."""
    return -1.0 if position >= 3.0 else 2.0 * sigmoid(-5.0 * position) - 1.0


@dataclass(frozen=True)
class Profile:
    name: str
    tp: float
    fp: float
    fn: float


def load_profiles(path: Path) -> list[Profile]:
    """NAB's ``config/profiles.json``: ``{name: {"CostMatrix": {"tpWeight": ...}}}``."""
    raw = json.loads(path.read_text())
    return [
        Profile(name, m["CostMatrix"]["tpWeight"], m["CostMatrix"]["fpWeight"], m["CostMatrix"]["fnWeight"])
        for name, m in raw.items()
    ]


@dataclass(frozen=True)
class FileScore:
    """One series' raw score for one profile, with its counts."""

    raw: float
    null: float
    perfect: float
    tp: int
    fp: int
    fn: int


def probation_rows(n: int) -> int:
    return int(min(math.floor(PROBATION_PERCENT * n), PROBATION_CAP_ROWS))


def score_file(
    timestamps: Sequence[str],
    windows: Iterable[tuple[str, str]],
    detections: Iterable[str],
    profile: Profile,
) -> FileScore:
    """Score ``detections`` on one series.

    ``timestamps`` are the series' rows in order. ``windows`` are ``(first, last)``
    timestamps of rows. A ``ValueError`` names a window bound or a detection that is not a
    row of the series.
    """
    index = {ts: i for i, ts in enumerate(timestamps)}
    spans: list[tuple[int, int]] = []
    for first, last in windows:
        for bound in (first, last):
            if bound not in index:
                msg = f"window bound {bound!r} is not a timestamp of the series"
                raise ValueError(msg)
        spans.append((index[first], index[last]))
    spans.sort()
    rows = set()
    for ts in detections:
        if ts not in index:
            msg = f"detection {ts!r} is not a timestamp of the series"
            raise ValueError(msg)
        rows.add(index[ts])
    probation = probation_rows(len(timestamps))
    # a window is scored when any of its rows lies past probation
    scored = [(a, b) for a, b in spans if b >= probation]
    best: dict[tuple[int, int], float] = {}
    fp_total, fp_count = 0.0, 0
    max_tp = scaled_sigmoid(-1.0)
    for i in sorted(r for r in rows if r >= probation):
        window = next(((a, b) for a, b in scored if a <= i <= b), None)
        if window is not None:
            a, b = window
            width = b - a + 1
            value = scaled_sigmoid(-(b - i + 1) / width) * profile.tp / max_tp
            best[window] = max(best.get(window, -math.inf), value)
            continue
        before = [(a, b) for a, b in spans if b < i]
        if before:
            a, b = before[-1]
            width = b - a + 1
            # a one-row window has no width to scale by: anything after it is far
            position = abs(b - i) / (width - 1) if width > 1 else 3.0
        else:
            position = 3.0
        fp_total += scaled_sigmoid(position) * profile.fp
        fp_count += 1
    missed = [w for w in scored if w not in best]
    raw = sum(best.values()) + fp_total - profile.fn * len(missed)
    return FileScore(
        raw=raw,
        null=-profile.fn * len(scored),
        perfect=profile.tp * len(scored),
        tp=len(best),
        fp=fp_count,
        fn=len(missed),
    )


@dataclass(frozen=True)
class CorpusScore:
    profile: str
    score: float  # normalised: null 0, perfect 100
    raw: float
    tp: int
    fp: int
    fn: int


def score_corpus(
    series: Mapping[str, Sequence[str]],
    windows: Mapping[str, Iterable[tuple[str, str]]],
    detections: Mapping[str, Iterable[str]],
    profile: Profile,
) -> CorpusScore:
    """The normalised score of ``detections`` over every series in ``series``."""
    parts = [
        score_file(stamps, windows.get(name, ()), detections.get(name, ()), profile)
        for name, stamps in series.items()
    ]
    raw = sum(p.raw for p in parts)
    null = sum(p.null for p in parts)
    perfect = sum(p.perfect for p in parts)
    score = 100.0 * (raw - null) / (perfect - null) if perfect != null else 0.0
    return CorpusScore(
        profile.name, score, raw, sum(p.tp for p in parts), sum(p.fp for p in parts), sum(p.fn for p in parts)
    )


def read_series_timestamps(csv_path: Path) -> list[str]:
    """The ``timestamp`` column of a NAB CSV, as written there (``2013-12-02 21:15:00``)."""
    with csv_path.open() as f:
        header = f.readline().strip().split(",")
        col = header.index("timestamp")
        return [line.split(",")[col].strip() for line in f if line.strip()]


def normalise_window_bound(bound: str) -> str:
    """NAB's label files write ``2014-02-19 10:50:00.000000``; the CSVs drop the fraction."""
    return bound.split(".")[0]
