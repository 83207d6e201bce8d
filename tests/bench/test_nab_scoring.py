"""NAB's scoring method (bench/nab_scoring.py) on hand-made series with known answers."""

from __future__ import annotations

import pytest

from bench.nab_scoring import Profile, probation_rows, scaled_sigmoid, score_corpus, score_file

STANDARD = Profile("standard", tp=1.0, fp=0.11, fn=1.0)
LOW_FN = Profile("reward_low_FN_rate", tp=1.0, fp=0.11, fn=2.0)
LOW_FP = Profile("reward_low_FP_rate", tp=1.0, fp=0.22, fn=1.0)
ROWS = [f"t{i:04d}" for i in range(1000)]  # probation: the first 150 rows
WINDOW = ("t0400", "t0499")  # 100 rows


def test_the_scaled_sigmoid_matches_nabs_documented_points() -> None:
    assert scaled_sigmoid(-1.0) == pytest.approx(0.98661, abs=1e-5)
    assert scaled_sigmoid(-0.5) == pytest.approx(0.84828, abs=1e-5)
    assert scaled_sigmoid(0.0) == 0.0
    assert scaled_sigmoid(1.0) == pytest.approx(-0.98661, abs=1e-5)
    assert scaled_sigmoid(3.0) == -1.0
    assert probation_rows(1000) == 150 and probation_rows(22_695) == 750


def test_no_detection_is_the_null_detector_and_scores_zero() -> None:
    s = score_file(ROWS, [WINDOW], [], STANDARD)
    assert (s.raw, s.null, s.perfect, s.tp, s.fp, s.fn) == (-1.0, -1.0, 1.0, 0, 0, 1)
    assert score_corpus({"a": ROWS}, {"a": [WINDOW]}, {}, STANDARD).score == 0.0


def test_a_detection_at_the_windows_first_row_is_perfect() -> None:
    corpus = score_corpus({"a": ROWS}, {"a": [WINDOW]}, {"a": ["t0400"]}, STANDARD)
    assert corpus.score == pytest.approx(100.0)
    assert (corpus.tp, corpus.fp, corpus.fn) == (1, 0, 0)


def test_earlier_is_better_and_only_the_best_detection_of_a_window_counts() -> None:
    early = score_file(ROWS, [WINDOW], ["t0410"], STANDARD).raw
    middle = score_file(ROWS, [WINDOW], ["t0450"], STANDARD).raw
    late = score_file(ROWS, [WINDOW], ["t0499"], STANDARD).raw
    assert 1.0 > early > middle > late > 0.0
    assert middle == pytest.approx(scaled_sigmoid(-50 / 100) / scaled_sigmoid(-1.0))
    assert late == pytest.approx(scaled_sigmoid(-1 / 100) / scaled_sigmoid(-1.0))
    both = score_file(ROWS, [WINDOW], ["t0410", "t0490"], STANDARD)
    assert both.raw == pytest.approx(early) and both.tp == 1 and both.fp == 0


def test_false_positives_cost_fp_weight_and_less_right_after_a_window() -> None:
    far = score_file(ROWS, [WINDOW], ["t0300"], STANDARD)  # before any window: S = -1
    assert far.raw == pytest.approx(-1.0 - 0.11) and far.fp == 1 and far.fn == 1
    just_after = score_file(ROWS, [WINDOW], ["t0500"], STANDARD).raw + 1.0  # less the missed window
    long_after = score_file(ROWS, [WINDOW], ["t0800"], STANDARD).raw + 1.0
    assert just_after == pytest.approx(0.11 * scaled_sigmoid(1 / 99))
    assert -0.11 - 1e-12 <= long_after < just_after < 0.0


def test_probation_ignores_detections_and_windows_inside_it() -> None:
    s = score_file(ROWS, [("t0010", "t0020"), WINDOW], ["t0015", "t0100"], STANDARD)
    assert (s.tp, s.fp, s.fn, s.null) == (0, 0, 1, -1.0)


def test_profiles_weigh_false_positives_and_misses_differently_and_the_corpus_normalises() -> None:
    series, windows = {"a": ROWS, "b": ROWS}, {"a": [WINDOW], "b": [WINDOW]}
    half = {"a": ["t0400"]}  # one window found at its first row, one missed: half of perfect
    assert score_corpus(series, windows, half, STANDARD).score == pytest.approx(50.0)
    assert score_corpus(series, windows, half, LOW_FN).score == pytest.approx(50.0)
    with_fp = {"a": ["t0400", "t0300"]}  # plus a false positive before any window
    assert score_corpus(series, windows, with_fp, STANDARD).score == pytest.approx(
        100 * (1 - 1 - 0.11 + 2) / 4
    )
    assert score_corpus(series, windows, with_fp, LOW_FP).score == pytest.approx(100 * (1 - 1 - 0.22 + 2) / 4)
    late = {"a": ["t0450"]}  # found halfway in: the cost of the miss weighs more in low FN
    v = scaled_sigmoid(-0.5) / scaled_sigmoid(-1.0)
    assert score_corpus(series, windows, late, STANDARD).score == pytest.approx(100 * (v - 1 + 2) / 4)
    assert score_corpus(series, windows, late, LOW_FN).score == pytest.approx(100 * (v - 2 + 4) / 6)


def test_a_detection_or_window_off_the_series_is_refused_with_its_timestamp() -> None:
    with pytest.raises(ValueError, match="t9999"):
        score_file(ROWS, [WINDOW], ["t9999"], STANDARD)
    with pytest.raises(ValueError, match="x"):
        score_file(ROWS, [("x", "t0499")], [], STANDARD)
