"""`python -m jobs [--master M] [--rules DIR] [--once]`: the Spark engine's streaming job.

The same as ``python -m app spark``; this is the entry point for
``spark-submit`` (pass ``--master submit`` there to keep spark-submit's master).
"""

from __future__ import annotations

import argparse
import sys

from app.runtime import native

native.activate()  # before any evaluator module loads

from app.errors import AppError  # noqa: E402
from app.runtime.settings import Settings, setup_logging  # noqa: E402
from jobs.cli import add_spark_arguments, cmd_spark  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs", description=__doc__)
    add_spark_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        setup_logging(settings.log_level)
        return cmd_spark(args, settings)
    except AppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
