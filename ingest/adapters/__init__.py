"""Input adapters: one module per real-world format, each a generator.

- :mod:`ingest.adapters.nab`: NAB ``timestamp,value`` CSV -> sensors events
- :mod:`ingest.adapters.apache`: Apache/nginx combined access log -> logs events
- :mod:`ingest.adapters.ohlc`: ``bokeh_sampledata.stocks`` daily bars -> finance events
- :mod:`ingest.adapters.jsonl`: JSON lines, passed raw to the publisher
- :mod:`ingest.adapters.apache_error`, :mod:`ingest.adapters.applog`,
  :mod:`ingest.adapters.syslog`: more log line parsers, registered by name in
  :mod:`ingest.adapters.logformats`; :mod:`ingest.adapters.multiline` joins
  stack traces and :mod:`ingest.adapters.logfile` reads a whole file

Converters yield :data:`ingest.model.ConvertResult` values: validated event
dicts, or :class:`ingest.model.ConvertError` for lines that could not be used.
"""

from __future__ import annotations

from ingest.adapters.apache import apache_events
from ingest.adapters.jsonl import jsonl_lines
from ingest.adapters.nab import nab_events
from ingest.adapters.ohlc import ohlc_events

#: Replay input format -> the event source it produces (None: any source).
FORMAT_SOURCES: dict[str, str | None] = {
    "jsonl": None,
    "nab": "sensors",
    "apache": "logs",
    "nginx": "logs",
    "apache-error": "logs",
    "applog": "logs",
    "syslog": "logs",
}

__all__ = ["FORMAT_SOURCES", "apache_events", "jsonl_lines", "nab_events", "ohlc_events"]
