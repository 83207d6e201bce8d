"""`python -m app <command>`: the operator's command line.

Commands:
  run          start the whole system (broker, ingest, worker, delivery, dashboard)
  rules check  validate rule files, printing every problem as file:line:col
  rules test   run rule unit tests (*.test.yaml)
  backtest     run rules over recorded events and print the alert transitions (--engine spark too)
  spark        run the Spark engine: rules with engine spark/both on Structured Streaming
  dispatch | store-sync | receiver   run one role alone (as the supervisor does)
  users        add or list the console's users (python -m app users add NAME)
  state        a rule's live state from the rule workers (interactive queries)
  alerts       list, show, ack, silence, unsilence, resolve alerts; silences; dead-letters
  routes       test which receivers labels reach; show or check the routes file
  topics       create the topics on KAFKA_BOOTSTRAP_SERVERS (idempotent)
  acls         write the per-role ACLs on KAFKA_BOOTSTRAP_SERVERS (idempotent)
  broker       run the embedded Apache Kafka broker alone and print its address
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.errors import AppError, ConfigError, RuleConfigError
from app.roles import ROLES, RoleEntry
from app.runtime.settings import Settings, setup_logging

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from app.backtest import BacktestReport
    from app.rules.loader import RuleSet

Command = Callable[[argparse.Namespace, Settings], int]


def _cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.system import RunOptions, run

    return run(
        settings,
        RunOptions(
            duration_s=args.duration,
            dashboard=not args.no_dashboard,
            quiet=args.quiet,
            fresh=args.fresh,
            auth=not args.no_auth,
        ),
    )


def _cmd_rules_check(args: argparse.Namespace, _settings: Settings) -> int:
    from app.rules.loader import is_yaml_file, load_rules, rule_files

    # a directory with no rule file is an error, not "0 rule(s) in 0 file(s): all valid"
    empty = [p for p in args.paths if p.is_dir() and not rule_files([p])]
    for directory in empty:
        tests = any(is_yaml_file(f) for f in directory.rglob("*"))
        note = "; rule tests (*.test.yaml, or in a tests folder) are not rule files" if tests else ""
        print(
            f"error: no rule files found in {directory} (rule files end in .yaml or .yml{note})",
            file=sys.stderr,
        )
    if empty:
        return 2
    try:
        ruleset = load_rules(args.paths)
    except RuleConfigError as exc:
        for problem in exc.problems:
            print(problem)
        print(f"{len(exc.problems)} problem(s) found", file=sys.stderr)
        return 1
    for r in ruleset.rules:
        print(
            f"{r.path}:{r.line}: {r.id}: ok (source {r.rule.source}, engine {r.engine}, version {r.version})"
        )
    print(f"{len(ruleset.rules)} rule(s) in {len(ruleset.files)} file(s): all valid", file=sys.stderr)
    return 0


def _cmd_rules_test(args: argparse.Namespace, _settings: Settings) -> int:
    from app.rules.ruletest import run_tests

    report = run_tests(args.paths)
    for r in report.results:
        mark = "ok  " if r.ok else "ERR " if r.error else "FAIL"
        print(f"{mark} {r.file}" + (f": {r.name}" if r.name != "-" or not r.error else ""))
        if not r.ok:
            print("\n".join(f"     {line}" for line in r.detail.splitlines()))
    n, errors = len(report.results), len(report.errors)
    bad = len(report.failed) - errors
    more = f", {errors} error(s) (invalid test files, not run)" if errors else ""
    print(f"{n - bad - errors} passed, {bad} failed{more}", file=sys.stderr)
    return 2 if errors else 1 if bad or not n else 0


def _statuses_arg(text: str) -> str:
    """argparse check of ``backtest --statuses`` (both engines parse the string again)."""
    from app.backtest import parse_statuses

    try:
        parse_statuses(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _partitions_arg(text: str) -> int:
    """argparse check of ``backtest --partitions``: a whole number, 1 or more."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        msg = f"{text!r}: expected a whole number of partitions, 1 or more (default APP_PARTITIONS)"
        raise argparse.ArgumentTypeError(msg)
    return n


def _backtest_inputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """What a backtest reads from files, as ``(option, path)``: its ``--out`` must be none of them."""
    from app.rules.loader import rule_files

    given: list[tuple[str, str]] = [("--rules", str(f)) for f in rule_files(args.rules)]
    if args.input:
        given.append(("--input", args.input))
    given += [("--table", spec.partition("=")[2]) for spec in args.table or ()]
    return given


def _checked_backtest(cmd: Command) -> Command:
    """``cmd`` (the backtest of either engine) after the checks of arguments that need no
    engine, each an error naming the options, exit 2, before anything is read or written:
    ``--out`` is not a directory, its directory exists and it is no input
    (:func:`app.runtime.outfile.check_output`), and ``--from`` is before ``--to``."""

    def checked(args: argparse.Namespace, settings: Settings) -> int:
        from app.backtest import TimeRange
        from app.errors import IngestDecodeError
        from app.runtime.outfile import check_output

        try:
            if args.out:
                check_output(args.out, _backtest_inputs(args))
            TimeRange.of(args.time_from, args.time_to)
        except (ValueError, IngestDecodeError, ConfigError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return cmd(args, settings)

    return checked


def _cmd_backtest(args: argparse.Namespace, settings: Settings) -> int:
    from app.rules.loader import load_rules
    from app.runtime.heap import tune_collector

    tune_collector()  # the evaluator runs here, as in the worker
    try:
        ruleset = load_rules(args.rules)
    except RuleConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    if getattr(args, "watch", False):
        from app.cli.watch import watch

        return watch(args.rules, ruleset, lambda rules: _faust_backtest(args, settings, rules))
    return _faust_backtest(args, settings, ruleset)[0]


def _faust_backtest(
    args: argparse.Namespace, settings: Settings, ruleset: RuleSet
) -> tuple[int, BacktestReport | None]:
    """One Faust-engine backtest of ``ruleset`` as ``args`` say: its exit code, and its report
    (None when it did not run: no rule for this engine, or an unusable input)."""
    from app.backtest import (
        BacktestReport,
        InputError,
        TimeRange,
        backtest,
        backtest_file,
        input_file,
        load_tables,
        parse_statuses,
        read_topic_events,
    )
    from app.errors import IngestDecodeError

    # the worker's rules: ``faust`` and ``both``. The others are named, never skipped silently,
    # and a set with none of them is refused (no silent "0 alert transitions")
    elsewhere = [r.id for r in ruleset.rules if not r.runs_on("faust")]
    if len(elsewhere) == len(ruleset.rules):
        what = f"{len(elsewhere)} rule(s) with engine: spark" if elsewhere else "no rule"
        print(
            f"error: no rule to run on the faust engine in {' '.join(map(str, args.rules))} ({what}); "
            "--engine spark runs every rule",
            file=sys.stderr,
        )
        return 1, None
    if elsewhere:
        print(
            f"backtest: not run on the faust engine (engine: spark): {', '.join(elsewhere)}; "
            "--engine spark runs every rule",
            file=sys.stderr,
        )
    report = BacktestReport(statuses=parse_statuses(args.statuses))
    try:
        tables = load_tables(args.table or ())
        if args.input:
            input_file(Path(args.input))
        if args.topic:
            from app.runtime.credentials import operator_settings

            # KAFKA_BOOTSTRAP_SERVERS, or the running `make run` of APP_DATA_DIR (as its console)
            within = TimeRange.of(args.time_from, args.time_to)
            events: Any = read_topic_events(operator_settings(settings), args.topic, report, within)
        else:
            events = None
    except (ValueError, IngestDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2, None
    partitions = args.partitions or settings.partitions
    try:
        out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    except OSError as exc:  # checked before (_checked_backtest): permissions, a dangling link
        print(f"error: --out {args.out}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return 2, None
    try:
        if events is not None:
            backtest(
                ruleset,
                events,
                out,
                report,
                time_from=args.time_from,
                time_to=args.time_to,
                partitions=partitions,
                tables=tables,
                max_skew_ms=settings.max_event_skew_ms,
            )
        else:
            backtest_file(
                ruleset,
                Path(args.input),
                out,
                report,
                time_from=args.time_from,
                time_to=args.time_to,
                source=args.source,
                partitions=partitions,
                tables=tables,
                max_skew_ms=settings.max_event_skew_ms,
            )
    except InputError as exc:
        report.print_summary()  # what was read before the damage
        print(f"error: {exc}", file=sys.stderr)
        return 2, None
    finally:
        if out is not sys.stdout:
            out.close()
    report.print_summary()
    return (0 if report.complete else 1), report


def _role(entry: RoleEntry) -> Command:
    def cmd(args: argparse.Namespace, settings: Settings) -> int:
        from app.runtime.role import run_role

        return run_role(entry.load(), settings, kafka=entry.kafka, **entry.options(settings))

    return cmd


def _cmd_topics(_args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from app.kafka.admin import ensure_topics

    if not settings.bootstrap_servers:
        print("error: KAFKA_BOOTSTRAP_SERVERS is not set", file=sys.stderr)
        return 2
    created = asyncio.run(ensure_topics(settings, settings.partitions, settings.replication_factor))
    print(f"created: {', '.join(created) or 'nothing (all topics exist)'}")
    return 0


def _cmd_acls(_args: argparse.Namespace, settings: Settings) -> int:
    """Write the per-role ACLs (app/kafka/acls.py) on KAFKA_BOOTSTRAP_SERVERS, as its administrator."""
    import asyncio

    from app.kafka.acls import ROLES, apply_acls, branch_grants, rule_branch_topics

    if not settings.bootstrap_servers:
        print("error: KAFKA_BOOTSTRAP_SERVERS is not set", file=sys.stderr)
        return 2
    # the engines may also create and write the branch topics of the rules in APP_RULES_DIR
    written = asyncio.run(apply_acls(settings, extra=branch_grants(rule_branch_topics(settings.rules_dir))))
    print(f"wrote {written} ACLs for the principals User:{', User:'.join(ROLES)}")
    return 0


def _cmd_broker(args: argparse.Namespace, settings: Settings) -> int:
    """Run the embedded broker until SIGINT or SIGTERM, then stop it (no orphan)."""
    import signal
    import threading

    from app.kafka.broker import KafkaBroker

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    home = args.home or settings.data_dir / "kafka"
    with KafkaBroker(home, port=args.port or None) as b:
        print(f"KAFKA_BOOTSTRAP_SERVERS={b.bootstrap}  (ready in {b.ready_s or 0:.1f} s, {home})", flush=True)
        stop.wait()
    return 0


def _cmd_native(args: argparse.Namespace, _settings: Settings) -> int:
    from app.runtime import native

    if args.action == "build":
        return native.build()
    print(native.status())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m app", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start the whole system on this machine")
    run.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop cleanly after this many seconds and print the counters",
    )
    run.add_argument("--no-dashboard", action="store_true", help="do not start Streamlit")
    run.add_argument("--quiet", action="store_true", help="send role output only to .data/logs/")
    run.add_argument(
        "--fresh",
        action="store_true",
        help="start from nothing: remove APP_DATA_DIR (broker log, alert store, dispatcher, progress) first",
    )
    run.add_argument(
        "--no-auth",
        action="store_true",
        help="run the embedded broker without SASL and ACLs (plaintext; for debugging only)",
    )
    run.set_defaults(func=_cmd_run)

    rules = sub.add_parser("rules", help="rule tooling")
    rsub = rules.add_subparsers(dest="rules_command", required=True)
    check = rsub.add_parser(
        "check", help="validate rule files; exit 1 on any problem, 2 when a directory holds none"
    )
    check.add_argument("paths", nargs="+", type=Path, help="rule files or directories")
    check.set_defaults(func=_cmd_rules_check)
    rtest = rsub.add_parser(
        "test", help="run rule unit tests (*.test.yaml); exit 1 on a failure, 2 on an invalid test file"
    )
    rtest.add_argument("paths", nargs="+", type=Path, help="test files or directories")
    rtest.set_defaults(func=_cmd_rules_test)

    bt = sub.add_parser("backtest", help="run rules over recorded events (JSON lines)")
    bt.add_argument("--rules", nargs="+", type=Path, required=True, help="rule files or directories")
    src = bt.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="JSON-lines events, e.g. from `python -m ingest convert`")
    src.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC",
        help="read a source topic from its earliest offset to its end (repeatable)",
    )
    src.add_argument("--archive", metavar="PATH", help="with --engine spark: the topics' Parquet archive")
    bt.add_argument(
        "--partitions",
        type=_partitions_arg,
        default=0,
        help="partitions to emulate (default APP_PARTITIONS, as the live worker sees them)",
    )
    bt.add_argument(
        "--table",
        action="append",
        metavar="NAME=FILE",
        help="registry rows (CSV or YAML) for enrichment, e.g. devices=devices.csv",
    )
    bt.add_argument(
        "--source",
        choices=["sensors", "logs", "finance"],
        help="source of every line (default: inferred from device_id, host or symbol)",
    )
    bt.add_argument("--from", dest="time_from", metavar="T", help="first event time (RFC 3339), inclusive")
    bt.add_argument("--to", dest="time_to", metavar="T", help="last event time (RFC 3339), exclusive")
    bt.add_argument("--out", help="write the transitions here instead of stdout")
    bt.add_argument(
        "--statuses",
        metavar="LIST",
        type=_statuses_arg,
        help="statuses to print: comma-separated (pending,firing,resolved,inactive,no_data) or 'all'; "
        "default firing,resolved",
    )
    bt.add_argument(
        "--watch",
        action="store_true",
        help="after the run, run again each time a rule file changes, printing each rule's change "
        "(Ctrl-C stops; with --engine spark the session stays up between runs)",
    )
    bt.set_defaults(func=_cmd_backtest)
    from jobs.cli import register as register_spark_commands  # argparse only; pyspark loads on use

    register_spark_commands(sub, bt)
    bt.set_defaults(func=_checked_backtest(bt.get_default("func")))  # both engines' backtests
    for entry in ROLES:
        sub.add_parser(entry.name, help=entry.help).set_defaults(func=_role(entry))
        for alias in entry.aliases:
            sub.add_parser(alias, help=f"alias of {entry.name}").set_defaults(func=_role(entry))
    from app.cli.alerts import register as register_alert_commands

    register_alert_commands(sub)
    from app.cli.console import register as register_user_commands

    register_user_commands(sub)
    sub.add_parser("topics", help="create the topics (idempotent)").set_defaults(func=_cmd_topics)
    sub.add_parser(
        "acls", help="write the per-role ACLs on the cluster (idempotent; run as its administrator)"
    ).set_defaults(func=_cmd_acls)

    nat = sub.add_parser("native", help="compile the evaluator's hot path with mypyc, or show what runs")
    nat.add_argument("action", choices=["build", "status"])
    nat.set_defaults(func=_cmd_native)

    br = sub.add_parser("broker", help="run the embedded Apache Kafka broker alone")
    br.add_argument(
        "--port", type=int, default=0, help="listener port (default: the last one, or a free one)"
    )
    br.add_argument("--home", type=Path, default=None, help="broker state dir (default APP_DATA_DIR/kafka)")
    br.set_defaults(func=_cmd_broker)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        setup_logging(settings.log_level)
        code: int = args.func(args, settings)
    except AppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `... | head`: the reader is done, so are we
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code
