"""Syslog receiver: RFC 3164 and RFC 5424 over UDP and TCP onto ``events.logs``.

- :mod:`ingest.syslogd.framing`: TCP framing, octet counting and newline (RFC 6587);
- :mod:`ingest.syslogd.server`: the UDP and TCP listeners and the publishing loop.

The message parser is :mod:`ingest.adapters.syslog`, shared with the tailer.
"""
