"""Spark's Python worker daemon for this project (``spark.python.daemon.module``).

It activates the compiled hot path (:func:`app.runtime.native.activate`) and then runs
pyspark's own daemon, whose forked workers inherit it: the rules that run inside
Spark's Python workers use the same compiled evaluator as the Faust worker.
"""

from __future__ import annotations

from pyspark import daemon

from app.runtime import native


def main() -> None:
    native.activate()
    daemon.manager()


if __name__ == "__main__":
    main()
