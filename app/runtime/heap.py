"""CPython's cyclic garbage collector, tuned for the processes that hold the evaluator's
state: the Faust worker (``agents/__main__.py``), the Faust-engine backtest
(``python -m app backtest``) and Spark's Python workers (``jobs/pydaemon.py``), which
restore a stream partition's state from JSON at every micro-batch.

With Python's default thresholds (700, 10, 10) a young collection runs after every 700
net new containers, and a full one, which walks every live object, whenever the
long-lived ones grew by a quarter. The evaluator keeps its states (windows' buffers,
clocks, timers) in live lists and dicts, and a batch of events makes many more: the
collector walked them over and over, and each full collection paused the process for
tens of milliseconds. Higher thresholds leave the reference counts to free what they
free anyway (the evaluator makes few cycles). The measurements are in
``docs/PERFORMANCE-HISTORY.md``.
"""

from __future__ import annotations

import gc

#: a young collection after 20,000 net new containers, a middle one after 20 young ones,
#: a full one after 20 middle ones (and only when the long-lived objects grew by a quarter)
GC_THRESHOLDS = (20_000, 20, 20)


def tune_collector() -> None:
    """Set :data:`GC_THRESHOLDS` for this process (and the processes it forks)."""
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_start_up() -> None:
    """Move every object alive now (modules, the app built at start) to the collector's
    permanent generation: no later collection walks them."""
    gc.freeze()
