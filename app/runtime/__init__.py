"""The runtime around the roles: settings, the supervisor and the system layout (``make run``),
per-data-dir credentials, metrics and the compiled build."""
