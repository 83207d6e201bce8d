"""`python -m ingest ...`: see ingest/cli.py."""

from ingest.cli import main

raise SystemExit(main())
