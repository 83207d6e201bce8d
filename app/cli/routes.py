"""`python -m app routes ...`: test, show and check the routes file.

``routes test k=v ...`` prints the receivers an alert with those labels
would reach, like ``amtool config routes test`` (exit 1 when none);
``routes show`` prints the resolved tree; ``routes check`` validates the file
and prints every problem as ``file:line:col: message`` (exit 1 if any).
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial
from pathlib import Path
from typing import Any

from app.dispatch.config import RoutesConfigError, load_routes
from app.dispatch.routes import Route, build_tree
from app.notify.check import receiver_problems
from app.runtime.settings import Settings

logger = logging.getLogger(__name__)


def _routes(args: argparse.Namespace, settings: Settings) -> Route:
    return build_tree(load_routes(args.config or settings.routes_file))


def cmd_routes_test(args: argparse.Namespace, settings: Settings) -> int:
    labels: dict[str, str] = {}
    for item in [*args.labels, *(args.label_opt or [])]:
        name, sep, value = item.partition("=")
        if not sep or not name:
            print(f"error: expected label=value, got {item!r}", file=sys.stderr)
            return 2
        labels[name] = value
    hits = _routes(args, settings).match(labels)
    print(",".join(r.receiver for r in hits))
    if args.verbose:
        for r in hits:
            print(f"  {r.receiver}: route {r.name} group {r.group_key(labels)}", file=sys.stderr)
    return 0 if hits else 1


def cmd_routes_show(args: argparse.Namespace, settings: Settings) -> int:
    def walk(route: Route, depth: int) -> None:
        matchers = ",".join(str(m) for m in route.matchers) or "(all)"
        cont = " continue" if route.continue_ else ""
        timers = (
            f"wait={route.group_wait:g}s interval={route.group_interval:g}s repeat={route.repeat_interval:g}s"
        )
        print(
            f"{'  ' * depth}{route.name}: {matchers} -> {route.receiver}{cont}",
            f"group_by={list(route.group_by)}",
            timers,
        )
        for child in route.children:
            walk(child, depth + 1)

    walk(_routes(args, settings), 0)
    return 0


def cmd_routes_check(args: argparse.Namespace, settings: Settings) -> int:
    """Exit 1 with every problem, including what the dispatcher would refuse of a receiver
    (the same :func:`app.notify.check.receiver_problems`, with ``APP_WEBHOOK_ALLOW_PRIVATE``)."""
    path = args.config or settings.routes_file
    try:
        cfg = load_routes(
            path, receivers=partial(receiver_problems, allow_private=settings.webhook_allow_private)
        )
    except RoutesConfigError as exc:
        for problem in exc.problems:
            print(problem)
        print(f"{len(exc.problems)} problem(s) found", file=sys.stderr)
        return 1
    print(f"{path}: ok ({len(cfg.receivers)} receiver(s), {len(build_tree(cfg).walk())} route(s))")
    return 0


def register(sub: Any) -> None:
    """Add the ``routes`` command to the top-level subparsers ``sub``."""
    routes = sub.add_parser("routes", help="routes file tooling (test, show, check)")
    rsub = routes.add_subparsers(dest="routes_command", required=True)
    p = rsub.add_parser("test", help="which receivers an alert with these labels reaches")
    p.add_argument("labels", nargs="*", help="label=value ...")
    p.add_argument("--labels", dest="label_opt", nargs="+", metavar="K=V", help="label=value ... (same)")
    p.add_argument("--config", type=Path, help="routes file (default APP_ROUTES_FILE)")
    p.add_argument("-v", "--verbose", action="store_true", help="also print the route and group per receiver")
    p.set_defaults(func=cmd_routes_test)
    for name, fn, text in (("show", cmd_routes_show, "print the routing tree"),
                           ("check", cmd_routes_check, "validate the routes file")):  # fmt: skip
        p = rsub.add_parser(name, help=text)
        p.add_argument("config", nargs="?", type=Path, help="routes file (default APP_ROUTES_FILE)")
        p.set_defaults(func=fn)
