"""HTTP ingest endpoint: single events and NDJSON batches, answered after the broker's ack.

See :mod:`ingest.httpd.server` for the routes and answers.
"""
