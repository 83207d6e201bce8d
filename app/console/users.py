"""The console's local users file: names with scrypt-hashed passwords.

Used when OIDC (Streamlit's ``st.login``) is not configured. The file is JSON,
mode 0600, at ``APP_USERS_FILE`` (default ``APP_DATA_DIR/console-users.json``)::

    {"users": {"ann": {"kdf": "scrypt", "n": 16384, "r": 8, "p": 1,
                       "salt": "<base64>", "hash": "<base64>", "created": "<RFC 3339>"}}}

Only the salted hash is stored; :func:`verify` recomputes it with the stored
parameters and compares in constant time. ``python -m app users add NAME`` adds
or replaces a user (password from the terminal, or ``--password-stdin``);
``make run`` creates a first user ``admin`` with a random password written next
to the file (``console-admin-password.txt``, 0600) when the file does not exist.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from app.errors import ConfigError

logger = logging.getLogger(__name__)

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
MIN_PASSWORD = 8
ADMIN_PASSWORD_FILE = "console-admin-password.txt"  # noqa: S105 - a file name


def users_path(env: Mapping[str, str] | None = None, data_dir: Path | None = None) -> Path:
    """``APP_USERS_FILE``, else ``console-users.json`` in ``data_dir`` (default ``APP_DATA_DIR``
    or ``.data``)."""
    env = os.environ if env is None else env
    if env.get("APP_USERS_FILE"):
        return Path(env["APP_USERS_FILE"])
    base = data_dir if data_dir is not None else Path(env.get("APP_DATA_DIR") or ".data")
    return base / "console-users.json"


@dataclass(frozen=True)
class UserRecord:
    name: str
    salt: bytes
    digest: bytes
    n: int = SCRYPT_N
    r: int = SCRYPT_R
    p: int = SCRYPT_P


def _kdf(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 * 1024 * 1024, dklen=32)


def hash_password(name: str, password: str) -> UserRecord:
    """A new record for ``name`` with a fresh 16-byte salt. ValueError for a bad name or a
    password shorter than :data:`MIN_PASSWORD`."""
    if not _NAME.match(name):
        msg = f"user name {name!r}: use 1-64 letters, digits, '.', '_', '@' or '-'"
        raise ValueError(msg)
    if len(password) < MIN_PASSWORD:
        msg = f"the password must have at least {MIN_PASSWORD} characters"
        raise ValueError(msg)
    salt = secrets.token_bytes(16)
    return UserRecord(name, salt, _kdf(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P))


def load_users(path: Path) -> dict[str, UserRecord]:
    """The users in ``path``; {} when it does not exist. ConfigError naming the file and the
    user for anything malformed."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        doc = orjson.loads(raw)
        entries: dict[str, Any] = doc["users"]
    except (ValueError, KeyError, TypeError):
        msg = f"{path}: not a users file (expected JSON with a 'users' object)"
        raise ConfigError(msg) from None
    out: dict[str, UserRecord] = {}
    for name, e in entries.items():
        try:
            if e["kdf"] != "scrypt":
                msg = f"{path}: user {name!r}: unknown kdf {e['kdf']!r}"
                raise ConfigError(msg)
            out[name] = UserRecord(
                name, base64.b64decode(e["salt"]), base64.b64decode(e["hash"]), int(e["n"]), int(e["r"]),
                int(e["p"]),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError):
            msg = f"{path}: user {name!r}: needs kdf, n, r, p, salt and hash"
            raise ConfigError(msg) from None
    return out


def save_user(path: Path, record: UserRecord) -> None:
    """Add or replace ``record`` in ``path`` (created 0600; written atomically)."""
    users = load_users(path)
    users[record.name] = record
    doc = {
        "users": {
            u.name: {"kdf": "scrypt", "n": u.n, "r": u.r, "p": u.p,
                     "salt": base64.b64encode(u.salt).decode(), "hash": base64.b64encode(u.digest).decode(),
                     "created": datetime.now(tz=UTC).isoformat(timespec="seconds")}
            for u in users.values()
        }
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    tmp.replace(path)


def verify(users: Mapping[str, UserRecord], name: str, password: str) -> bool:
    """True when ``name`` is a user and ``password`` is theirs (constant-time compare; an
    unknown name costs one KDF run too)."""
    rec = users.get(name)
    if rec is None:
        _kdf(password, b"0" * 16, SCRYPT_N, SCRYPT_R, SCRYPT_P)
        return False
    return hmac.compare_digest(_kdf(password, rec.salt, rec.n, rec.r, rec.p), rec.digest)


def admin_password_path(path: Path) -> Path:
    """Where :func:`ensure_first_user` writes admin's first password, beside the users file ``path``."""
    return path.with_name(ADMIN_PASSWORD_FILE)


def ensure_first_user(path: Path) -> Path | None:
    """When ``path`` does not exist: create it with the user ``admin`` and a random password,
    written to ``console-admin-password.txt`` next to it (0600); return that file's path.
    None when a users file is already there."""
    if path.exists():
        return None
    password = secrets.token_urlsafe(12)
    save_user(path, hash_password("admin", password))
    note = admin_password_path(path)
    fd = os.open(note, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"user: admin\npassword: {password}\n")
    logger.info("created the console user admin in %s (password in %s)", path, note)
    return note
