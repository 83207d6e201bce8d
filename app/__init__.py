"""streamalert: streaming alerting on Kafka. Importing it loads the compiled hot path when a
current build exists (see :mod:`app.native`)."""

from app import native as _native

_native.activate()
