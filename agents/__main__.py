"""`python -m agents worker -l info`: a Faust worker evaluating the rules.

Faust's own web server (its CLI turns it on unless told otherwise, on
0.0.0.0:6066) is not used: metrics are served by the worker on
APP_METRICS_PORT. ``--without-web`` is added unless ``--with-web`` is given.

CPython's cyclic collector is tuned for the worker (see :data:`GC_THRESHOLDS`).

The worker waits for Kafka before it builds the app (which creates topics): one warning,
then quiet retries; a stop signal during the wait exits 0 (:mod:`app.kafka.wait`).
"""

import gc
import sys

from app.runtime import native

native.activate()  # before any evaluator module loads

from agents.wiring import build_app  # noqa: E402
from app.errors import AppError  # noqa: E402
from app.kafka.wait import wait_for_broker_blocking  # noqa: E402
from app.runtime.settings import Settings  # noqa: E402

#: The collector's thresholds. By default (700, 10, 10) its youngest generation runs
#: after 700 net new containers, about every 150 events under load, each time walking
#: the batch's live events and states; and every ~20,000 events a full collection
#: walked everything Faust and the modules had built, ~75 ms each time. At 20,000 a
#: young collection runs about every 15,000 events (5-11 ms). With the start-up objects
#: frozen (``gc.freeze``: no collection walks them again) a full one took ~14 ms.
#: Figures in the README's table of changes (taken with a temporary ``gc.callbacks`` timer).
GC_THRESHOLDS = (20_000, 20, 20)

if len(sys.argv) > 1 and sys.argv[1] == "worker" and not {"--with-web", "--without-web"} & set(sys.argv):
    sys.argv.append("--without-web")
gc.set_threshold(*GC_THRESHOLDS)
if sys.argv[1:2] == ["worker"] and not wait_for_broker_blocking(Settings.from_env()):
    raise SystemExit(0)
try:
    app = build_app()
except AppError as exc:  # a configuration the worker cannot run with: said once, exit 2
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None
gc.freeze()
app.main()
