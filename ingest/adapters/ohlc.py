"""Daily OHLC stock bars from ``bokeh_sampledata.stocks`` -> finance events.

The package ships its data inside the wheel (``stocks.csv.gz``), so this works
offline. Each bar becomes ``{symbol, ts, open, high, low, close, adj_close,
volume}`` with ``ts`` at 00:00 UTC of the trading day, in date order. ``close``
is the raw (unadjusted) close, so splits show as crashes in it (AAPL
2000-06-21: -45%); ``adj_close`` is split- and dividend-adjusted.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime
from typing import Any

import orjson

from app.events import FINANCE, format_ts
from ingest.model import Converter, IngestArgError, checked, epoch_ms

logger = logging.getLogger(__name__)

ADAPTER = "ohlc"
SYMBOLS = ("AAPL", "FB", "GOOG", "IBM", "MSFT")
_COLUMNS = ("open", "high", "low", "close", "adj_close", "volume")


def ohlc_events(symbol: str) -> Converter:
    """Bars of ``symbol`` (one of :data:`SYMBOLS`, case-insensitive), sorted by date.

    Raises IngestArgError for another symbol. A bar the finance schema rejects
    yields a ConvertError whose ``line`` is the bar's 1-based position in the
    sorted series and whose ``raw`` is the bar as JSON.
    """
    upper = symbol.strip().upper()
    if upper not in SYMBOLS:
        msg = f"--symbol {symbol!r} is not in bokeh_sampledata.stocks; expected one of: {', '.join(SYMBOLS)}"
        raise IngestArgError(msg)
    return _convert(upper)


def _convert(symbol: str) -> Converter:
    from bokeh_sampledata import stocks  # reads the bundled gzip once, on first use

    series: dict[str, list[Any]] = getattr(stocks, symbol)
    rows = sorted(zip(series["date"], *(series[c] for c in _COLUMNS), strict=True))
    for number, (day, *values) in enumerate(rows, start=1):
        midnight = datetime.combine(date.fromisoformat(day), datetime.min.time(), tzinfo=UTC)
        record: dict[str, Any] = {"symbol": symbol, "ts": format_ts(epoch_ms(midnight))}
        record.update(zip(_COLUMNS, values, strict=True))
        yield checked(FINANCE, ADAPTER, number, orjson.dumps(record), record)
