"""`python -m jobs [--master M] [--rules DIR] [--once]`: the Spark engine's streaming job.

The same as ``python -m app spark``; this is the entry point for
``spark-submit`` (pass ``--master submit`` there to keep spark-submit's master).
"""

from __future__ import annotations

import argparse
import sys

from app.config import Settings, setup_logging
from app.errors import AppError
from jobs.cli import add_spark_arguments, cmd_spark


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
