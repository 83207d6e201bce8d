"""`python -m ingest ...`: see ingest/cli.py."""

from app.runtime import native

native.activate()  # before the event decoder loads

from ingest.cli import main  # noqa: E402

raise SystemExit(main())
