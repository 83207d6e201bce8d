"""`python -m agents worker -l info`: a Faust worker evaluating the rules.

Faust's own web server (its CLI turns it on unless told otherwise, on
0.0.0.0:6066) is not used: metrics are served by the worker on
APP_METRICS_PORT. ``--without-web`` is added unless ``--with-web`` is given.

CPython's cyclic collector is tuned for the worker (:mod:`app.runtime.heap`): higher
thresholds, and the start-up objects frozen once the app is built.

The worker waits for Kafka before it builds the app (which creates topics): one warning,
then quiet retries; a stop signal during the wait exits 0 (:mod:`app.kafka.wait`).
"""

import sys

from app.runtime import heap, native

native.activate()  # before any evaluator module loads

from agents.wiring import build_app  # noqa: E402
from app.errors import AppError  # noqa: E402
from app.kafka.wait import wait_for_broker_blocking  # noqa: E402
from app.runtime.settings import Settings  # noqa: E402

if len(sys.argv) > 1 and sys.argv[1] == "worker" and not {"--with-web", "--without-web"} & set(sys.argv):
    sys.argv.append("--without-web")
heap.tune_collector()
if sys.argv[1:2] == ["worker"] and not wait_for_broker_blocking(Settings.from_env()):
    raise SystemExit(0)
try:
    app = build_app()
except AppError as exc:  # a configuration the worker cannot run with: said once, exit 2
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None
heap.freeze_start_up()  # what Faust and the modules built at start
app.main()
