"""The operator console's non-UI parts: users, store queries, pipeline health, state queries."""
