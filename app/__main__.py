"""`python -m app ...`: see app/cli.py."""

from app.cli import main

raise SystemExit(main())
