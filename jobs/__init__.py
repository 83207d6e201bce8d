"""The Spark engine: the same rules as the Faust worker, on Structured Streaming.

Wiring only. Rule logic lives in :mod:`app.rules`; this package turns it into
DataFrame plans (:mod:`jobs.compile`), reads Kafka with a Python data source
(:mod:`jobs.kafka_source`), runs the per-group threshold lifecycle with the
pure evaluator (:mod:`jobs.state`) and writes alerts idempotently
(:mod:`jobs.sink`). Nothing in :mod:`app` imports this package at import time.
"""
