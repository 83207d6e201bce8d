"""A seeded intraday trade simulator: GBM prices with jumps -> finance events.

Each trade is ``{symbol, ts, price, size, amount, side, trade_id}`` with
``amount = price * size`` (rounded to cents), ``side`` ``buy`` or ``sell`` and
a ``trade_id`` that is the same on every run with the same seed, so replays
and restarts can be deduplicated downstream.

Per symbol, trades arrive as a Poisson process (mean gap ``mean_gap_s``). Between
two trades the price follows geometric Brownian motion with drift ``mu`` and
volatility ``sigma`` (annualised over 252 trading days of 6.5 hours), plus
Poisson jumps (``jumps_per_day``, log-size normal with ``jump_sigma``), so
there are sudden moves for "gained 5% in ten minutes" rules. Sizes are
lognormal around 100 shares; with probability ``huge_p`` a trade is 50-200
times larger: the "major buy or sell" case. The side follows the price move
(up: buy), with noise. The market never closes. Given the same
:class:`TickConfig` the events are identical and ordered by ``ts``.
"""

from __future__ import annotations

import heapq
import logging
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from app.events import format_ts
from ingest.model import Record

logger = logging.getLogger(__name__)

TRADING_YEAR_S = 252 * 6.5 * 3600
START_PRICES = {"AAPL": 190.0, "MSFT": 420.0, "GOOG": 170.0, "IBM": 180.0, "FB": 480.0, "AMZN": 180.0}


@dataclass(frozen=True)
class TickConfig:
    """The whole description of a simulated market; equal configs give equal trades."""

    seed: int
    symbols: tuple[str, ...]
    start_ms: int
    mean_gap_s: float = 1.0
    mu: float = 0.05
    sigma: float = 0.3
    jumps_per_day: float = 2.0
    jump_sigma: float = 0.03
    huge_p: float = 0.002


class _Symbol:
    def __init__(self, cfg: TickConfig, symbol: str) -> None:
        self.cfg, self.symbol = cfg, symbol
        self.rng = random.Random(f"{cfg.seed}/{symbol}")  # noqa: S311 - simulation, not security
        self.exact = START_PRICES.get(symbol, self.rng.uniform(20.0, 500.0))
        self.ts_ms, self.seq = cfg.start_ms, 0

    def next_trade(self) -> Record:
        cfg, r = self.cfg, self.rng
        gap_s = r.expovariate(1.0 / cfg.mean_gap_s)
        self.ts_ms += max(1, round(gap_s * 1000))
        dt = gap_s / TRADING_YEAR_S
        shock = r.gauss(0.0, 1.0)
        log_return = (cfg.mu - cfg.sigma**2 / 2) * dt + cfg.sigma * math.sqrt(dt) * shock
        if r.random() < 1.0 - math.exp(-cfg.jumps_per_day * gap_s / (6.5 * 3600)):
            log_return += r.gauss(0.0, cfg.jump_sigma)
        self.exact *= math.exp(log_return)
        price = max(0.01, round(self.exact, 2))
        size = max(1, round(r.lognormvariate(math.log(100), 1.0)))
        if r.random() < cfg.huge_p:
            size *= r.randint(50, 200)
        up = log_return + r.gauss(0.0, abs(log_return) + 1e-9) > 0
        self.seq += 1
        return {
            "symbol": self.symbol,
            "ts": format_ts(self.ts_ms),
            "price": price,
            "size": float(size),
            "amount": round(price * size, 2),
            "side": "buy" if up else "sell",
            "trade_id": f"{self.symbol}-{cfg.seed}-{self.seq:09d}",
        }


def tick_events(cfg: TickConfig) -> Iterator[Record]:
    """Trades of every symbol merged in ``ts`` order (ties: symbol order), endless."""
    heap: list[tuple[int, int, Record, _Symbol]] = []
    for i, symbol in enumerate(cfg.symbols):
        sym = _Symbol(cfg, symbol)
        trade = sym.next_trade()
        heapq.heappush(heap, (sym.ts_ms, i, trade, sym))
    while heap:
        _ts, i, trade, sym = heapq.heappop(heap)
        yield trade
        following = sym.next_trade()
        heapq.heappush(heap, (sym.ts_ms, i, following, sym))
