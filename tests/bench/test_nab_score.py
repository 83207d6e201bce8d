"""bench/nab_score.py on a hand-made corpus: the pack's firing transitions become detections,
written with the series' own timestamps and scored per profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.nab_score import main, metric_kind

PROFILES = {
    name: {"CostMatrix": {"tpWeight": 1.0, "fpWeight": fp, "fnWeight": fn, "tnWeight": 1.0}}
    for name, fp, fn in (
        ("standard", 0.11, 1.0),
        ("reward_low_FP_rate", 0.22, 1.0),
        ("reward_low_FN_rate", 0.11, 2.0),
    )
}


def corpus(root: Path) -> None:
    nab = root / "nab"
    (nab / "data" / "realTweets").mkdir(parents=True)
    (nab / "labels").mkdir()
    (nab / "config").mkdir()
    rows = ["timestamp,value"]
    for i in range(400):  # one reading an hour; the jump at row 300
        day, hour = divmod(i, 24)
        rows.append(f"2015-03-{1 + day:02d} {hour:02d}:00:00,{500.0 if i == 300 else 10.0 + i % 2}")
    (nab / "data" / "realTweets" / "Twitter_volume_X.csv").write_text("\n".join(rows) + "\n")
    windows = {
        "realTweets/Twitter_volume_X.csv": [["2015-03-13 00:00:00.000000", "2015-03-13 23:00:00.000000"]]
    }
    (nab / "labels" / "combined_windows.json").write_text(json.dumps(windows))
    (nab / "config" / "profiles.json").write_text(json.dumps(PROFILES))
    published = {key: {p: 50.0 for p in PROFILES} for key in ("ARTime", "numenta", "random")}
    (nab / "config" / "published_results.json").write_text(json.dumps(published))


def test_the_detections_are_the_firing_events_with_the_series_timestamps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus(tmp_path)
    rules = tmp_path / "pack.yaml"
    rules.write_text(
        "rules:\n  - id: burst\n    source: sensors\n    group_by: [device_id]\n"
        "    where: kind = 'tweets' and zscore(value, 1d) > 8\n"
    )
    out = tmp_path / "detections.json"
    assert main(["--rules", str(rules), "--datasets", str(tmp_path), "--detections", str(out)]) == 0
    # row 300 is 2015-03-13 12:00: inside the window, at its middle
    assert json.loads(out.read_text()) == {"realTweets/Twitter_volume_X.csv": ["2015-03-13 12:00:00"]}
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if "this pack" in x)
    assert line.split("|")[2].strip() == "93.0"  # halfway in: S(-0.5) / S(-1) = 0.86 -> (0.86 + 1) / 2
    assert "1 windows found, 0 missed, 0 false positives" in printed


def test_the_kind_comes_from_the_files_name_alone() -> None:
    assert metric_kind("realKnownCause/machine_temperature_system_failure.csv") == "temperature"
    assert metric_kind("realAWSCloudwatch/rds_cpu_utilization_cc0c53.csv") == "cpu"
    assert metric_kind("realTweets/Twitter_volume_AAPL.csv") == "tweets"
    assert metric_kind("artificialWithAnomaly/art_daily_jumpsup.csv") == "generic"
