"""Seeded, reproducible simulators: an IoT fleet and an intraday market.

- :mod:`ingest.sim.fleet`: sensors with drift and faults, vehicles leaving their geofence;
- :mod:`ingest.sim.ticks`: GBM prices with jumps, trades with size, side and amount.

Both are pure generators of event records; ``python -m ingest simulate`` publishes
them through :func:`ingest.replay.replay` (pacing, limits, clean stop).
"""
