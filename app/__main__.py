"""`python -m app ...`: see app/cli/main.py."""

from app.runtime import native

native.activate()  # before any evaluator module loads

from app.cli.main import main  # noqa: E402

raise SystemExit(main())
