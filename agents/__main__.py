"""`python -m agents worker -l info`: a Faust worker evaluating the rules.

Faust's own web server (its CLI turns it on unless told otherwise, on
0.0.0.0:6066) is not used: metrics are served by the worker on
APP_METRICS_PORT. ``--without-web`` is added unless ``--with-web`` is given.
"""

import sys

from agents.wiring import build_app

if len(sys.argv) > 1 and sys.argv[1] == "worker" and not {"--with-web", "--without-web"} & set(sys.argv):
    sys.argv.append("--without-web")
build_app().main()
