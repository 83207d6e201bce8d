"""Ingest: turn real sources and recordings into validated events on Kafka.

- :mod:`ingest.adapters`: one converter per input format (NAB CSV, access and
  error logs, the application log, syslog, stock bars, JSON lines), each a
  generator of events or ConvertErrors, plus stack-trace joining;
- :mod:`ingest.publisher`: validated, bounded publishing with a dead-letter path
  and per-record acknowledgements; :mod:`ingest.runtime`: signals and summaries;
- :mod:`ingest.pacing` and :mod:`ingest.replay`: event-time replays;
- one sub-package per live source: :mod:`ingest.tail` (log files),
  :mod:`ingest.syslogd` (UDP/TCP), :mod:`ingest.httpd` (HTTP endpoint),
  :mod:`ingest.mqtt` (MQTT bridge), :mod:`ingest.sim` (fleet and market
  simulators), :mod:`ingest.registry` (device registry and watchlists);
- :mod:`ingest.cli`: ``python -m ingest COMMAND``, the wiring of them all.

Imports flow one way: this package uses ``app`` (schemas, topics, settings),
never the other way round.
"""
