"""Who each role of ``make run`` is on its embedded broker, and how an operator's command
line reaches that broker.

``make run`` (:mod:`app.runtime.system`) runs its embedded Apache Kafka with SASL/SCRAM and ACLs
unless ``APP_EMBEDDED_AUTH=off`` or ``python -m app run --no-auth``:

- :func:`embedded_users` keeps one generated password per principal in
  ``APP_DATA_DIR/kafka/users.json`` (mode 0600): the broker's own ``admin`` (its super user)
  and each principal of :data:`app.kafka.acls.ROLES`. The second run on the data dir reuses them,
  so its roles and the SCRAM credentials stored in the broker's log dir still agree (the
  broker writes them again on a log dir formatted earlier: :class:`app.kafka.broker.KafkaBroker`).
- :data:`ROLE_PRINCIPALS` names the principal of each role; :func:`role_kafka_env` is the
  ``KAFKA_*`` part of its environment. Credentials travel in the environment only: never on
  a command line, never in a log line.
- :func:`write_client_env` writes ``APP_DATA_DIR/client.env`` (mode 0600) while ``make run``
  is up: the broker's address, the console principal and the data dir's command secret, as
  ``KEY=value`` lines a shell can source. :func:`operator_settings` reads it, so
  ``python -m app alerts ack ...`` and a dashboard started by hand reach the running
  ``make run`` with no variable set (as the ``console`` principal, the only one that may
  write ``commands``). ``make run`` removes it when it stops.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
from collections.abc import Mapping
from pathlib import Path

import orjson
from pydantic import SecretStr

from app.errors import ConfigError
from app.kafka.acls import ROLES
from app.kafka.auth import AUTH_ENV_DOCS, KafkaAuth
from app.runtime.settings import Settings

logger = logging.getLogger(__name__)

#: The embedded broker's own identity: its inter-broker and controller user, and its super user.
ADMIN = "admin"
#: The SASL mechanism every role of ``make run`` uses (the broker also offers SCRAM-SHA-256 and PLAIN).
ROLE_MECHANISM = "SCRAM-SHA-512"
#: The principal of the operator's command line and of the dashboard.
CONSOLE = "console"

#: The principal each role of ``make run`` connects as (None: the role does not use Kafka).
ROLE_PRINCIPALS: dict[str, str | None] = {
    "replay-sensors": "ingest",
    "replay-cpu": "ingest",
    "replay-latency": "ingest",
    "replay-logs": "ingest",
    "sim-fleet": "ingest",
    "mqtt-bridge": "ingest",
    "registry": "ingest",
    "sim-ticks": "ingest",
    "worker": "worker",
    "spark": "spark",
    "archive": "spark",  # reads what the Spark engine reads
    "dispatch": "dispatch",
    "store-sync": "store",
    "dashboard": CONSOLE,
    "receiver": None,
    "mosquitto": None,
}


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only (0600), atomically: a reader sees
    the old file or the new one, and the bytes are never in a file others may read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode passes the umask; an older tmp kept its own
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def users_path(data_dir: Path) -> Path:
    return data_dir / "kafka" / "users.json"


def embedded_users(data_dir: Path) -> dict[str, str]:
    """User -> password for the embedded broker of ``data_dir``: ``admin`` first (the broker's
    own identity), then each role principal. Made on first use, kept in :func:`users_path`
    (0600) and reused; a principal added since is given a password and the file rewritten."""
    path = users_path(data_dir)
    try:
        kept = orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        kept = {}
    if not isinstance(kept, dict) or not all(isinstance(v, str) and v for v in kept.values()):
        kept = {}
    users = {u: kept.get(u) or secrets.token_urlsafe(24) for u in (ADMIN, *ROLES)}
    if users != kept:
        write_private(path, orjson.dumps(users))
        logger.info("made Kafka passwords for %s in %s", ", ".join(u for u in users if u not in kept), path)
    return users


def role_auth(users: Mapping[str, str], principal: str) -> KafkaAuth:
    """How ``principal`` connects to the embedded broker."""
    return KafkaAuth(
        protocol="SASL_PLAINTEXT", mechanism=ROLE_MECHANISM, username=principal, password=users[principal]
    )


def auth_env(auth: KafkaAuth) -> dict[str, str]:
    """The ``KAFKA_*`` security variables that make :meth:`KafkaAuth.from_env` give ``auth``
    (TLS files blank: the embedded broker's listener is loopback plaintext)."""
    env = {name: "" for name in AUTH_ENV_DOCS}
    env["KAFKA_SECURITY_PROTOCOL"] = auth.protocol
    env["KAFKA_SSL_CHECK_HOSTNAME"] = "true"
    if auth.uses_sasl:
        env.update(
            KAFKA_SASL_MECHANISM=auth.mechanism,
            KAFKA_SASL_USERNAME=auth.username,
            KAFKA_SASL_PASSWORD=auth.password,
        )
    else:
        env["KAFKA_SASL_MECHANISM"] = "PLAIN"
    return env


def role_kafka_env(role: str, users: Mapping[str, str] | None) -> dict[str, str]:
    """The Kafka security environment of ``make run``'s role ``role`` on its embedded broker:
    its principal's SCRAM credentials (``users`` from :func:`embedded_users`), or plaintext
    when authentication is off (``users`` None). Nothing for a role that does not use Kafka.
    A :class:`ConfigError` for a role :data:`ROLE_PRINCIPALS` does not know."""
    if role not in ROLE_PRINCIPALS:
        msg = f"make run's role {role!r} has no Kafka principal in app.runtime.credentials.ROLE_PRINCIPALS"
        raise ConfigError(msg)
    principal = ROLE_PRINCIPALS[role]
    if principal is None:
        return {}
    return auth_env(KafkaAuth() if users is None else role_auth(users, principal))


def client_env_path(data_dir: Path) -> Path:
    return data_dir / "client.env"


def write_client_env(data_dir: Path, bootstrap: str, auth: KafkaAuth, command_secret: str) -> Path:
    """Write :func:`client_env_path` (0600): what an operator's command line needs to act on the
    ``make run`` of ``data_dir``; ``auth`` is the console principal's (or plaintext)."""
    env = {
        "APP_DATA_DIR": str(data_dir),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        **{k: v for k, v in auth_env(auth).items() if v},
        "APP_COMMAND_SECRET": command_secret,
    }
    head = (
        "# The operator's client settings for the `make run` of this data dir (it removes this\n"
        "# file when it stops). `python -m app alerts ...` reads it by itself; other tools:\n"
        "# (set -a; . ./client.env; set +a; exec <command>)\n"
    )
    path = client_env_path(data_dir)
    write_private(path, (head + "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items())).encode())
    return path


def read_client_env(data_dir: Path) -> dict[str, str] | None:
    """The variables of :func:`client_env_path`, or None when no ``make run`` wrote one."""
    try:
        text = client_env_path(data_dir).read_text(encoding="utf-8")
    except OSError:
        return None
    env: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        words = shlex.split(value) if sep else []
        if not key.isidentifier() or len(words) > 1:
            msg = f"{client_env_path(data_dir)}: cannot read the line {key!r}=..."
            raise ConfigError(msg)
        env[key] = words[0] if words else ""
    return env


def operator_settings(settings: Settings, env: Mapping[str, str] | None = None) -> Settings:
    """``settings`` for an operator's command against Kafka: unchanged when
    ``KAFKA_BOOTSTRAP_SERVERS`` is set; otherwise the address, principal and command secret of
    the ``make run`` of the same data dir (:func:`read_client_env`; an ``APP_COMMAND_SECRET``
    the environment sets still wins, as it does for ``make run``'s roles). A
    :class:`ConfigError` says what to do when neither exists."""
    if settings.bootstrap_servers:
        return settings
    found = read_client_env(settings.data_dir)
    if found is None:
        msg = (
            f"KAFKA_BOOTSTRAP_SERVERS is not set and no `make run` is up on APP_DATA_DIR={settings.data_dir} "
            f"(it writes {client_env_path(settings.data_dir)}): start it, or set KAFKA_BOOTSTRAP_SERVERS"
        )
        raise ConfigError(msg)
    env = os.environ if env is None else env
    secret = env.get("APP_COMMAND_SECRET") or found.get("APP_COMMAND_SECRET")
    return settings.model_copy(
        update={
            "bootstrap_servers": found.get("KAFKA_BOOTSTRAP_SERVERS", ""),
            "kafka_auth": KafkaAuth.from_env(found),
            "command_secret": SecretStr(secret) if secret else settings.command_secret,
        }
    )
