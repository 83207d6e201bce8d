"""streamalert: streaming alerting on Kafka.

Importing this package (or any of its modules) has no side effects. The entry points
(``python -m app``, ``python -m agents``, ``python -m jobs``, ``python -m ingest``, the
Spark workers' daemon) call :func:`app.runtime.native.activate` first, which loads the
compiled hot path when a current build exists.
"""
