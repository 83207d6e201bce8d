"""`python -m app alerts ...`: the operator's alert commands (``routes ...`` is in :mod:`app.cli.routes`).

Reads (``list``, ``show``, ``silences``, ``dead-letters``) open the alert
store read-only; writes (``ack``, ``silence``, ``unsilence``, ``resolve``)
produce one command to the ``commands`` topic (of KAFKA_BOOTSTRAP_SERVERS, or
else of the ``make run`` up on the same APP_DATA_DIR, as its console principal),
which the dispatcher applies and store-sync records, and print it.
An alert is named by a prefix of its fingerprint or of one of its alert ids.
Exit codes: 0 done, 2 usage or configuration error (nothing matches, no store,
no broker).
"""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from typing import Any

import orjson

from app.cli.operator import (
    ack_command,
    now_iso,
    publish_commands,
    resolve_command,
    silence_command,
    unsilence_command,
)
from app.console.queries import retired as is_retired
from app.dispatch.base import iso
from app.dispatch.commands import Command
from app.dispatch.matchers import matches_all, parse_matchers
from app.errors import ConfigError, RuleConfigError
from app.rules.loader import running_versions
from app.runtime.settings import Settings
from app.storage.alert_store import AlertStore, CurrentAlert

logger = logging.getLogger(__name__)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


def _store(settings: Settings) -> AlertStore:
    try:
        return AlertStore(settings.store_path, readonly=True)
    except FileNotFoundError:
        msg = f"no alert store at {settings.store_path} yet (is store-sync running?)"
        raise ConfigError(msg) from None


def _one(store: AlertStore, ident: str) -> CurrentAlert:
    found = store.find(ident)
    if len(found) != 1:
        what = "no alert" if not found else f"{len(found)} alerts"
        msg = f"{what} match {ident!r}; give more of the fingerprint or alert id"
        raise ConfigError(msg)
    return found[0]


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity"))


def _send(settings: Settings, *cmds: Command) -> int:
    try:
        publish_commands(settings, cmds)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for cmd in cmds:
        print(cmd.model_dump_json())
    return 0


def _retired(settings: Settings, rows: list[CurrentAlert]) -> set[str] | None:
    """The fingerprints of ``rows`` whose episode is open under a rule that no longer runs in
    that version: the rule files (``APP_RULES_DIR``, as the engines load them) have no rule of
    its id, or another version of it. No engine resolves such an episode (docs/rules.md, hot
    reload). None when the files do not load: the engines then keep their last good rules,
    which this cannot know."""
    try:
        running = running_versions([settings.rules_dir])
    except RuleConfigError as exc:
        print(f"note: the rule files do not load, so retired alerts are not told ({exc.problems[0]})",
              file=sys.stderr)  # fmt: skip
        return None
    return {a.fingerprint for a in rows if is_retired(a, running)}


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    with _store(settings) as store:
        acked = {(a["fingerprint"], a["starts_at"]) for a in store.acks()}
        silences = [(s["id"], parse_matchers(s["matchers"])) for s in store.silences(active_at=now_iso())]
        rows = store.current(None if args.status == "all" else args.status, limit=args.limit)
    retired = _retired(settings, rows) or set()
    for a in rows:
        state = a.status
        if (a.fingerprint, a.starts_at) in acked or (a.fingerprint, "") in acked:
            state += "+acked"
        labels = {**a.labels, "alertname": a.labels.get("alertname", a.rule_id), "severity": a.severity}
        if any(matches_all(m, labels) for _, m in silences):
            state += "+silenced"
        if a.fingerprint in retired:
            state += "+retired"
        cols = (a.fingerprint, f"{state:<24}", f"{a.severity:<8}", f"{a.rule_id:<24}", f"{a.starts_at:<24}")
        print("  ".join(cols), _labels(a.labels))
    print(f"{len(rows)} alert(s)", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    with _store(settings) as store:
        cur = _one(store, args.id)
        history = store.transitions_of(cur.rule_id, cur.fingerprint)
        info: dict[str, Any] = {
            "current": cur.__dict__,
            "transitions": [h.to_dict() for h in history],
            "acks": [a for a in store.acks() if a["fingerprint"] == cur.fingerprint],
            "notifications": [
                _times_as_iso(n) for h in history for n in store.notifications(alert_id=h.alert_id)
            ],
        }
    print(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode())
    return 0


def _times_as_iso(notification: dict[str, Any]) -> dict[str, Any]:
    """A notification with its times as RFC 3339 UTC, like every other time ``show`` prints
    (the store keeps them as Unix seconds)."""
    return {k: iso(v) if k in ("queued_at", "updated_at") and v is not None else v
            for k, v in notification.items()}  # fmt: skip


def cmd_ack(args: argparse.Namespace, settings: Settings) -> int:
    with _store(settings) as store:
        cur = _one(store, args.id)
    cmd = ack_command(cur, by=args.by, comment=args.comment, all_episodes=args.all_episodes)
    return _send(settings, cmd)


def cmd_resolve(args: argparse.Namespace, settings: Settings) -> int:
    if (args.id is None) == (not args.retired):
        print("error: name an alert, or give --retired (not both)", file=sys.stderr)
        return 2
    if args.id is not None:
        with _store(settings) as store:
            cur = _one(store, args.id)
        return _send(settings, resolve_command(cur, by=args.by, comment=args.comment))
    with _store(settings) as store:
        rows = store.current("firing", limit=-1)  # SQLite: no limit
    retired = _retired(settings, rows)
    if retired is None:
        return 2
    comment = args.comment or "its rule was removed or edited"
    chosen = [a for a in rows if a.fingerprint in retired]
    if not args.yes:  # a rules dir other than the engines' would name live alerts: look first
        for a in chosen:
            print(f"{a.fingerprint}  {a.rule_id}@{a.rule_version}  {a.starts_at}  {_labels(a.labels)}")
        print(f"{len(chosen)} retired alert(s) would be resolved (rules from {settings.rules_dir}); "
              "run again with --yes to resolve them", file=sys.stderr)  # fmt: skip
        return 0
    print(f"{len(chosen)} retired alert(s) to resolve", file=sys.stderr)
    return (
        _send(settings, *(resolve_command(a, by=args.by, comment=comment) for a in chosen)) if chosen else 0
    )


def cmd_silence(args: argparse.Namespace, settings: Settings) -> int:
    try:
        cmd = silence_command(
            list(args.matchers),
            by=args.by,
            comment=args.comment,
            duration=args.duration,
            start=args.start,
            end=args.end,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _send(settings, cmd)


def cmd_unsilence(args: argparse.Namespace, settings: Settings) -> int:
    return _send(settings, unsilence_command(args.silence_id, by=args.by))


def cmd_silences(args: argparse.Namespace, settings: Settings) -> int:
    with _store(settings) as store:
        rows = store.silences(active_at=None if args.all else now_iso())
    for s in rows:
        print(f"{s['id']}  {s['starts_at']} .. {s['ends_at']}  {s['created_by']}  {' '.join(s['matchers'])}  "
              f"# {s['comment']}")  # fmt: skip
    print(f"{len(rows)} silence(s)", file=sys.stderr)
    return 0


def cmd_dead_letters(args: argparse.Namespace, settings: Settings) -> int:
    with _store(settings) as store:
        rows = store.notifications(status="dead", limit=args.limit)
    for n in rows:  # when it was given up on, in UTC, first
        print(f"{iso(n['updated_at'])}  {n['msg_id']}  {n['receiver']}  "
              f"attempts={n['attempts']}  alerts={','.join(n['alert_ids'])}  {n['reason']}")  # fmt: skip
    print(f"{len(rows)} dead letter(s)", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add the ``alerts`` and ``routes`` commands to the top-level subparsers ``sub``."""
    from app.cli.routes import register as register_routes

    register_routes(sub)
    user = _user()
    alerts = sub.add_parser("alerts", help="list, show, ack, silence, unsilence or resolve alerts")
    asub = alerts.add_subparsers(dest="alerts_command", required=True)
    p = asub.add_parser("list", help="current alerts from the store")
    p.add_argument(
        "--status", default="firing", choices=["firing", "pending", "no_data", "resolved", "inactive", "all"]
    )
    p.add_argument("--limit", type=int, default=200)
    p.set_defaults(func=cmd_list)
    p = asub.add_parser("show", help="one alert: state, transitions, acks, notifications (JSON)")
    p.add_argument("id", help="a prefix of the fingerprint or of an alert id")
    p.set_defaults(func=cmd_show)
    for name, fn, text in (
        ("ack", cmd_ack, "acknowledge an alert"),
        ("resolve", cmd_resolve, "resolve by hand"),
    ):
        p = asub.add_parser(name, help=text)
        p.add_argument("id", nargs="?" if name == "resolve" else None,
                       help="a prefix of the fingerprint or of an alert id")  # fmt: skip
        p.add_argument("--by", default=user)
        p.add_argument("--comment", default="")
        if name == "ack":
            p.add_argument("--all-episodes", action="store_true", help="also later episodes of this alert")
        else:
            retired = "every firing alert whose rule was removed or edited since it fired (APP_RULES_DIR)"
            p.add_argument("--retired", action="store_true", help=retired)
            p.add_argument("--yes", action="store_true", help="with --retired: resolve them (else list them)")
        p.set_defaults(func=fn)
    p = asub.add_parser("silence", help="silence alerts matching every matcher")
    p.add_argument("matchers", nargs="+", help='e.g. severity=critical device_id=~"pump-.*"')
    p.add_argument("--duration", default="1h", help="how long (default 1h); or use --end")
    p.add_argument("--start", help="RFC 3339 start (default now)")
    p.add_argument("--end", help="RFC 3339 end")
    p.add_argument("--by", default=user)
    p.add_argument("--comment", default="")
    p.set_defaults(func=cmd_silence)
    p = asub.add_parser("unsilence", help="end a silence now")
    p.add_argument("silence_id")
    p.add_argument("--by", default=user)
    p.set_defaults(func=cmd_unsilence)
    p = asub.add_parser("silences", help="active silences (--all: every one)")
    p.add_argument("--all", action="store_true")
    p.set_defaults(func=cmd_silences)
    p = asub.add_parser("dead-letters", help="notifications that could not be delivered")
    p.add_argument("--limit", type=int, default=100)
    p.set_defaults(func=cmd_dead_letters)
