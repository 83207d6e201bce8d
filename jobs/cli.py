"""Command-line entry points of the Spark engine, registered in ``app/cli/main.py``.

- ``python -m app spark [--master local[*]] [--rules DIR ...] [--once]``: the
  streaming job (a ``make run`` role); ``python -m jobs`` is the same and is
  what ``spark-submit`` runs.
- ``python -m app backtest --engine spark --rules R (--input FILE | --topic T ...)``:
  a batch backtest with the Faust-engine backtest's output; ``--archive PATH`` reads the
  Parquet archive instead (``--from``/``--to`` prune its date partitions).
- ``python -m app archive [--once] [--path P]``: the archive query (a ``make run`` role).

This module imports pyspark only inside the commands, so registering it costs
nothing when another command runs.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.errors import ConfigError, RuleConfigError
from app.runtime.settings import Settings

if TYPE_CHECKING:
    from app.backtest import BacktestReport
    from app.rules.loader import RuleSet

logger = logging.getLogger(__name__)


def add_spark_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``python -m app spark``."""
    p.add_argument(
        "--master",
        default="local[*]",
        help="Spark master (default local[*]; e.g. spark://host:7077). "
        "Use 'submit' to keep what spark-submit configured",
    )
    p.add_argument("--rules", nargs="+", type=Path, help="rule files or directories (default APP_RULES_DIR)")
    p.add_argument("--once", action="store_true", help="process what is in the topics now, then exit")
    p.add_argument("--trigger", default="1 second", help="micro-batch interval (default '1 second')")
    p.add_argument(
        "--starting-offsets",
        default="earliest",
        help="where a NEW checkpoint starts: earliest (default), latest or Spark's JSON; a checkpoint wins",
    )
    p.add_argument(
        "--max-offsets-per-trigger", type=int, default=200_000, help="records per micro-batch, at most"
    )


Command = Callable[[argparse.Namespace, Settings], int]


def register(sub: Any, backtest: argparse.ArgumentParser) -> None:
    """Add ``spark`` to ``python -m app``, and ``--engine``/``--master`` to its ``backtest``
    (whose ``--input``/``--topic`` choice the core parser owns)."""
    spark = sub.add_parser("spark", help="run the Spark engine (rules with engine: spark or both)")
    add_spark_arguments(spark)
    spark.set_defaults(func=cmd_spark)

    archive = sub.add_parser("archive", help="archive every event topic to Parquet (jobs/archive.py)")
    archive.add_argument("--master", default="local[1]", help="Spark master (default local[1]; 'submit')")
    archive.add_argument("--once", action="store_true", help="archive what is in the topics now, then exit")
    archive.add_argument("--trigger", default="10 seconds", help="micro-batch interval")
    archive.add_argument("--path", help="where (default APP_ARCHIVE_PATH, else $APP_DATA_DIR/archive)")
    archive.set_defaults(func=cmd_archive)

    backtest.add_argument("--engine", choices=["faust", "spark"], default="faust", help="which engine runs")
    backtest.add_argument("--master", default="local[*]", help="with --engine spark: the Spark master")
    faust: Command = backtest.get_default("func")

    def dispatch(args: argparse.Namespace, settings: Settings) -> int:
        if args.engine == "spark":
            return cmd_backtest(args, settings)
        if getattr(args, "archive", None):
            print("error: --archive needs --engine spark", file=sys.stderr)
            return 2
        return faust(args, settings)

    backtest.set_defaults(func=dispatch)


def cmd_spark(args: argparse.Namespace, settings: Settings) -> int:
    """Run the streaming job until SIGINT/SIGTERM (or caught up, with ``--once``)."""
    from app.runtime import metrics
    from app.runtime.supervisor import stop_on_signals
    from jobs.engine import EngineOptions, run

    stop = stop_on_signals("the spark query")
    metrics.serve(settings.metrics_port)
    opts = EngineOptions(
        master=None if args.master == "submit" else args.master,
        rules=tuple(args.rules or ()),
        once=args.once,
        trigger=args.trigger,
        starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
    )
    return run(settings, opts, stop)  # rule files it cannot load are logged, never its end


def cmd_archive(args: argparse.Namespace, settings: Settings) -> int:
    """Run the archive query until SIGINT/SIGTERM (or caught up, with ``--once``)."""
    from app.runtime import metrics
    from app.runtime.supervisor import stop_on_signals
    from jobs.archive import ArchiveOptions, run

    stop = stop_on_signals("the archive query")
    metrics.serve(settings.metrics_port)
    opts = ArchiveOptions(
        master=None if args.master == "submit" else args.master,
        once=args.once,
        trigger=args.trigger,
        path=args.path,
    )
    return run(settings, opts, stop)


def cmd_backtest(args: argparse.Namespace, settings: Settings) -> int:
    """``backtest --engine spark``: same arguments and output as the Faust-engine backtest,
    plus ``--topic`` (repeatable) to read a topic range instead of ``--input``."""
    from pyspark.sql import SparkSession

    from app.backtest import BacktestReport, input_file, load_tables, parse_statuses
    from app.errors import IngestDecodeError
    from app.rules.loader import load_rules
    from jobs.archive import archive_records
    from jobs.backtest import (
        KeptInput,
        file_records,
        ordered_records,
        plans_mode,
        record_places,
        run_backtest,
        topic_records,
        unreadable_file,
    )
    from jobs.compile import plan_rules
    from jobs.fastdecode import decode_mode
    from jobs.session import build_session

    topics = list(getattr(args, "topic", None) or [])
    archive = getattr(args, "archive", None)
    if [bool(getattr(args, "input", None)), bool(topics), bool(archive)].count(True) != 1:
        print("error: give exactly one of --input FILE, --topic TOPIC or --archive PATH", file=sys.stderr)
        return 2
    try:
        tables = load_tables(getattr(args, "table", None) or ())
        if getattr(args, "input", None):
            input_file(Path(args.input))  # before a JVM starts, as the Faust backtest checks it
    except (ValueError, IngestDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if topics:
        from app.runtime.credentials import operator_settings

        try:  # KAFKA_BOOTSTRAP_SERVERS, or the running `make run` of APP_DATA_DIR (as its console)
            settings = operator_settings(settings)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    def refused(rules: RuleSet) -> bool:
        """Every rule given runs, whatever its engine: says; what Spark cannot run is refused,
        by rule and reason, before it runs (never a silent "0 alert transitions")."""
        try:
            if plan_rules(rules, every_rule=True).rule_count:
                return False
            print(f"error: no rule in {' '.join(map(str, args.rules))}", file=sys.stderr)
        except RuleConfigError as exc:
            for problem in exc.problems:
                print(problem, file=sys.stderr)
        return True

    try:
        ruleset = load_rules(args.rules)
    except RuleConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    if refused(ruleset):  # before a JVM starts
        return 1
    decode_mode()  # a wrong APP_SPARK_DECODE is refused before a JVM starts (ConfigError: exit 2)
    native = plans_mode() == "native"  # a wrong APP_SPARK_BACKTEST_PLANS too
    owned = SparkSession.getActiveSession() is None  # stop only a session this command started
    spark = build_session(getattr(args, "master", None) or "local[*]", app_name="streamalert-backtest")
    watching = bool(getattr(args, "watch", False))
    # a watched file's records and decoded rows stay in the session between runs (KeptInput);
    # a topic or an archive is read again at each run: it may have grown
    kept = KeptInput(Path(args.input)) if watching and not (topics or archive) else None

    def once(rules: RuleSet) -> tuple[int, BacktestReport | None]:
        """One backtest of ``rules`` in this session: its exit code and report (None: not run)."""
        if rules is not ruleset:  # a watched edit: checked as the first set was
            if refused(rules):
                return 1, None
            if kept is not None:
                try:  # and the input again, as the Faust engine's watch does: it may have gone
                    input_file(kept.path)
                except ValueError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    return 2, None
        report = BacktestReport(statuses=parse_statuses(getattr(args, "statuses", None)))
        out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
        try:
            places = None
            if archive or topics:
                if archive:
                    records, name = archive_records(spark, archive, args.time_from, args.time_to), archive
                else:
                    security = settings.kafka_auth.spark_options()
                    records = topic_records(spark, settings.bootstrap_servers, topics, security)
                    name = ",".join(topics)
                raw = ordered_records(spark, records)
                # an invalid record's topic, partition and offset
                places = functools.partial(record_places, records)
            elif kept is not None:
                raw, name = kept.records(spark), str(args.input)
            else:
                raw, name = file_records(spark, Path(args.input)), str(args.input)
            run_backtest(
                spark,
                rules,
                raw,
                name,
                out,
                report,
                source=args.source,
                time_from=args.time_from,
                time_to=args.time_to,
                lines=not (topics or archive),
                partitions=getattr(args, "partitions", 0) or settings.partitions,
                tables=tables,
                max_skew_ms=settings.max_event_skew_ms,
                native_windows=native,
                native_thresholds=native,
                native_absence=native,
                native_event_alerts=native,
                places=places,
                kept=kept,
            )
        except Exception as exc:
            cause = unreadable_file(exc) if not (topics or archive) else None
            if cause is None:
                raise
            print(f"error: --input {args.input}: unreadable: {cause}", file=sys.stderr)  # nothing was written
            return 2, None
        finally:
            if out is not sys.stdout:
                out.close()
        report.print_summary("backtest (spark)")
        return (0 if report.complete else 1), report

    try:
        if watching:  # the session stays up: a run after the first starts warm
            from app.cli.watch import watch

            return watch(args.rules, ruleset, once, label="backtest (spark)")
        return once(ruleset)[0]
    finally:
        if kept is not None:
            kept.release()
        if owned:
            spark.stop()
