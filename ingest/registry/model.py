"""Rows of the compacted reference tables, checked against the core's table schemas.

The columns of ``tables.devices`` and ``tables.watchlists`` are defined once,
in :mod:`app.tables` (the worker validates the rows it joins with the same
schema), so a row this loader publishes is always one the worker accepts.
A file row becomes a table record: ``key -> JSON object of the set columns``
(blank cells left out), or a tombstone (``None``) when its ``deleted`` column
is true.

A row is checked by :func:`app.tables.check_row`, the check of a backtest's table
file too, so both name a problem in the same words. File cells are text (CSV) or
typed (YAML); names and text are stripped, blank text is NULL, and text is converted
by the column's type. On top of the types, device rows must have latitudes in -90..90
and longitudes in -180..180 (the table's ``bounds``, the same as the events'), a key
of at most 256 characters, ``lat``/``lon`` and ``depot_lat``/``depot_lon`` in pairs,
and a positive ``geofence_km``. Every problem of a row is reported, not just the first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.tables import TABLES as SCHEMAS
from app.tables import TableSchema

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableSpec:
    """A reference table by its command-line name; ``source`` labels its metrics."""

    name: str
    schema: TableSchema
    source: str

    @property
    def topic(self) -> str:
        return self.schema.topic

    @property
    def key(self) -> str:
        return self.schema.key


TABLES: dict[str, TableSpec] = {
    "devices": TableSpec("devices", SCHEMAS["devices"], "sensors"),
    "watchlists": TableSpec("watchlists", SCHEMAS["watchlists"], "finance"),
}
