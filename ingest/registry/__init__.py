"""Reference tables on compacted topics: the device registry and the watchlists.

- :mod:`ingest.registry.model`: rows checked against the core table schemas of :mod:`app.tables`;
- :mod:`ingest.registry.load`: CSV/YAML files -> validated records, all or nothing;
- :mod:`ingest.registry.publish`: upserts, tombstones, pruning, and reading a table back.
"""
