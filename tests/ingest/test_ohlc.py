"""Daily bars from bokeh_sampledata.stocks: adjusted and raw closes around a split."""

from __future__ import annotations

import pytest

from app.events import FINANCE
from ingest.adapters import ohlc_events
from ingest.model import ConvertError, IngestArgError


def _bars(symbol: str) -> list[dict[str, object]]:
    out = []
    for r in ohlc_events(symbol):
        assert not isinstance(r, ConvertError)
        out.append(r)
    return out


def test_aapl_bars_are_daily_sorted_and_valid() -> None:
    bars = _bars("AAPL")
    assert len(bars) == 3270
    assert bars[0]["ts"] == "2000-03-01T00:00:00.000Z"
    assert [b["ts"] for b in bars] == sorted(b["ts"] for b in bars)
    assert len({b["ts"] for b in bars}) == len(bars)
    for bar in bars:
        assert set(bar) == {"symbol", "ts", "open", "high", "low", "close", "adj_close", "volume"}
        assert FINANCE.validate(bar).fields == bar
        assert isinstance(bar["volume"], int)


def test_june_2000_split_shows_in_raw_close_only() -> None:
    bars = {b["ts"][:10]: b for b in _bars("aapl")}
    before, split = bars["2000-06-20"], bars["2000-06-21"]
    raw_change = split["close"] / before["close"] - 1
    adj_change = split["adj_close"] / before["adj_close"] - 1
    assert raw_change < -0.40
    assert abs(adj_change) < 0.15


def test_unknown_symbol_is_an_argument_error() -> None:
    with pytest.raises(IngestArgError, match="AAPL"):
        ohlc_events("TSLA")
