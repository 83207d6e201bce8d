"""`python -m app users ...` (the console's local users file, :mod:`app.console.users`) and
`python -m app state RULE [KEY]` (the workers' live rule state, docs/interactive-queries.md)."""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from typing import Any

import orjson

from app.console.users import hash_password, load_users, save_user, users_path
from app.errors import ConfigError
from app.runtime.settings import Settings

logger = logging.getLogger(__name__)


def _cmd_add(args: argparse.Namespace, settings: Settings) -> int:
    path = users_path(data_dir=settings.data_dir)
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            print("error: the passwords differ", file=sys.stderr)
            return 2
    try:
        record = hash_password(args.name, password)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    save_user(path, record)
    print(f"user {args.name} saved in {path}")
    return 0


def _cmd_list(_args: argparse.Namespace, settings: Settings) -> int:
    path = users_path(data_dir=settings.data_dir)
    for name in sorted(load_users(path)):
        print(name)
    return 0


def _cmd_state(args: argparse.Namespace, _settings: Settings) -> int:
    from app.console.state_client import query_state

    answer = query_state(args.rule, args.key)
    if answer.error:
        print(f"error: {answer.error}", file=sys.stderr)
        return 1
    print(orjson.dumps(answer.body, option=orjson.OPT_INDENT_2).decode())
    return 0


def register(sub: Any) -> None:
    """Add ``users add|list`` and ``state`` to the top-level parser's subcommands."""
    state = sub.add_parser(
        "state",
        help="a rule's live state from the workers: its groups, or one group (KEY: values joined by |)",
    )
    state.add_argument("rule")
    state.add_argument("key", nargs="?", default=None)
    state.set_defaults(func=_cmd_state)
    users = sub.add_parser("users", help="the console's local users (hashed passwords)")
    usub = users.add_subparsers(dest="users_command", required=True)
    add = usub.add_parser("add", help="add a user or change a password (asks for it twice)")
    add.add_argument("name")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add.set_defaults(func=_cmd_add)
    usub.add_parser("list", help="list the user names").set_defaults(func=_cmd_list)
