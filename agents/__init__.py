"""Faust wiring: thin agents that decode events, call the pure evaluator and produce.

Every agent is registered in :mod:`agents.wiring`, the one visible place."""
