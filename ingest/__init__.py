"""Ingest: turn real recordings into validated events on Kafka.

- :mod:`ingest.adapters`: one converter per input format (NAB CSV, access logs,
  stock bars, JSON lines), each a generator of events or ConvertErrors;
- :mod:`ingest.publisher`: validated, bounded publishing with a dead-letter path;
- :mod:`ingest.pacing` and :mod:`ingest.replay`: event-time replays;
- :mod:`ingest.cli`: ``python -m ingest convert|replay``.

Imports flow one way: this package uses ``app`` (schemas, topics, settings),
never the other way round.
"""
