"""Who may do what on the cluster: one Kafka principal per role, and the ACLs that bind it.

The table (:data:`ROLE_ACLS`) is the whole policy, read as "principal may OPERATION on
RESOURCE". Kafka's StandardAuthorizer denies everything else:
- Only the engines (``worker``, ``spark``) may write ``alerts``.
- Only the operator console and CLI (``console``) may write ``commands``.
- Ingest writes the event, dead-letter and registry topics and reads nothing.
- The dispatcher and the alert store read what they apply and write only their own
  outputs.
- A client without credentials cannot even connect to a SASL listener.
- The topics rules copy events to (``branch:`` arms, named freely by rule authors) are
  granted to the engines one by one (:func:`branch_grants`), for the rules present when the
  ACLs are written; a rule that later names a new one needs them written again (a worker
  that may not create it keeps its last good rules and says so).

:func:`apply_acls` writes the table with Kafka's CreateAcls. The call is idempotent, since
Kafka keeps one copy of an identical binding. ``make run`` calls it on its embedded broker;
on a cluster, run ``python -m app acls`` once as an administrator.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from aiokafka import AIOKafkaClient
from aiokafka.protocol.admin import CreateAclsRequest
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactBytes,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

from app.errors import BrokerError
from app.kafka.clients import Target, bootstrap_of, connection
from app.topics import ALERTS, COMMANDS, DLQ, NOTIFICATIONS, SYSTEM_TOPIC_PREFIXES, SYSTEM_TOPICS

logger = logging.getLogger(__name__)

# Kafka's wire codes (org.apache.kafka.common.resource / acl)
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = 2, 3, 4, 5
LITERAL, PREFIXED = 3, 4
READ, WRITE, CREATE, DESCRIBE, DESCRIBE_CONFIGS, IDEMPOTENT_WRITE, ALL = 3, 4, 5, 8, 10, 12, 2
ALLOW = 3

#: The principals of the roles, as ``make run`` names them (``User:<name>``).
ROLES = ("worker", "spark", "ingest", "dispatch", "store", "console")


@dataclass(frozen=True)
class Grant:
    """``operations`` on one resource (``name`` literal, or a prefix when ``prefixed``)."""

    resource: int
    name: str
    operations: tuple[int, ...]
    prefixed: bool = False


_CLUSTER = Grant(CLUSTER, "kafka-cluster", (IDEMPOTENT_WRITE, DESCRIBE))
_EVENTS_READ = Grant(TOPIC, "events.", (READ, DESCRIBE, DESCRIBE_CONFIGS), prefixed=True)

ROLE_ACLS: dict[str, tuple[Grant, ...]] = {
    "worker": (
        _CLUSTER,
        Grant(TOPIC, "events.", (READ, WRITE, CREATE, DESCRIBE, DESCRIBE_CONFIGS), prefixed=True),
        Grant(TOPIC, "tables.", (READ, DESCRIBE), prefixed=True),
        Grant(TOPIC, ALERTS, (WRITE, DESCRIBE)),
        Grant(TOPIC, DLQ, (WRITE, DESCRIBE)),
        Grant(TOPIC, "streamalert-rules", (ALL,), prefixed=True),  # Faust's changelogs and its leader topic
        Grant(GROUP, "streamalert-rules", (ALL,), prefixed=True),
        Grant(TRANSACTIONAL_ID, "streamalert-rules", (ALL,), prefixed=True),
    ),
    "spark": (
        _CLUSTER,
        _EVENTS_READ,
        Grant(TOPIC, "tables.", (READ, DESCRIBE), prefixed=True),
        Grant(TOPIC, ALERTS, (WRITE, DESCRIBE)),
        Grant(TOPIC, DLQ, (WRITE, DESCRIBE)),
        Grant(GROUP, "spark-kafka-", (READ, DESCRIBE), prefixed=True),
    ),
    "ingest": (
        _CLUSTER,
        Grant(TOPIC, "events.", (WRITE, DESCRIBE), prefixed=True),
        Grant(TOPIC, DLQ, (WRITE, DESCRIBE)),
        Grant(TOPIC, "tables.", (READ, WRITE, DESCRIBE), prefixed=True),
    ),
    "dispatch": (
        _CLUSTER,
        Grant(TOPIC, ALERTS, (READ, DESCRIBE)),  # exactly "alerts": its outputs alerts.<receiver> below
        Grant(TOPIC, COMMANDS, (READ, DESCRIBE)),
        # its notification log: written per delivery, read back at start (_rebuild_log)
        Grant(TOPIC, NOTIFICATIONS, (READ, WRITE, DESCRIBE)),
        Grant(TOPIC, f"{ALERTS}.", (WRITE, CREATE, DESCRIBE), prefixed=True),
        Grant(GROUP, "dispatcher", (READ, DESCRIBE)),
    ),
    "store": (
        Grant(TOPIC, ALERTS, (READ, DESCRIBE)),
        Grant(TOPIC, COMMANDS, (READ, DESCRIBE)),
        Grant(TOPIC, NOTIFICATIONS, (READ, DESCRIBE)),
        Grant(GROUP, "alert-store", (READ, DESCRIBE)),
    ),
    "console": (
        _CLUSTER,
        Grant(TOPIC, COMMANDS, (WRITE, DESCRIBE)),
        Grant(TOPIC, ALERTS, (READ, DESCRIBE)),
        Grant(TOPIC, "tables.", (READ, DESCRIBE), prefixed=True),
        _EVENTS_READ,  # `backtest --topic` and the input chart (no group: it assigns partitions)
        # the Overview's pipeline health: the DLQ's end offsets, the consumer groups' lag
        Grant(TOPIC, DLQ, (DESCRIBE,)),
        *(Grant(GROUP, g, (DESCRIBE,)) for g in ("streamalert-rules", "dispatcher", "alert-store")),
    ),
}


#: The engines, which copy events to the topics their rules' ``branch:`` arms name.
ENGINES = ("worker", "spark")


def branch_grants(topics: Iterable[str]) -> dict[str, tuple[Grant, ...]]:
    """What the engines need to create and write the branch topics ``topics`` (which rule
    authors name freely, e.g. ``finance.high_amount``): literal grants to each engine. A system
    topic is left out (and logged): a rule may not make an engine write commands or
    notifications."""
    wanted: list[Grant] = []
    for topic in sorted(set(topics)):
        if topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIXES):  # the loader refuses them too
            logger.warning("no ACL for branch topic %r: it is one of the system's own topics", topic)
            continue
        if not topic.startswith("events."):  # events.* is granted already
            wanted.append(Grant(TOPIC, topic, (CREATE, WRITE, DESCRIBE)))
    return dict.fromkeys(ENGINES, tuple(wanted))


def rule_branch_topics(rules_dir: Path) -> list[str]:
    """The branch topics the rule files under ``rules_dir`` name (none when they do not load:
    the worker reports why)."""
    from app.errors import RuleConfigError
    from app.rules.loader import load_rules

    try:
        ruleset = load_rules([rules_dir])
    except (RuleConfigError, OSError) as exc:
        logger.warning(
            "no branch-topic ACLs: the rules in %s do not load (%s)", rules_dir, type(exc).__name__
        )
        return []
    return [arm.topic for r in ruleset.rules for arm in (r.rule.branch or ())]


#: ``(resource type, name, pattern type, principal, operation)``
Binding = tuple[int, str, int, str, int]


def bindings(role: str, extra: Mapping[str, tuple[Grant, ...]] | None = None) -> list[Binding]:
    """``(resource type, name, pattern type, principal, operation)`` of every ACL of ``role``
    (its :data:`ROLE_ACLS` and its ``extra`` grants, e.g. :func:`branch_grants`)."""
    principal = f"User:{role}"
    return [
        (g.resource, g.name, PREFIXED if g.prefixed else LITERAL, principal, op)
        for g in (*ROLE_ACLS[role], *(extra or {}).get(role, ()))
        for op in g.operations
    ]


async def apply_acls(
    target: Target,
    roles: tuple[str, ...] = ROLES,
    timeout_s: float = 30.0,
    extra: Mapping[str, tuple[Grant, ...]] | None = None,
) -> int:
    """Create every ACL of ``roles`` (as an administrator); return how many were written.
    The requests are in flight together (one round trip each took ~3.5 s for the 70 of
    :data:`ROLES` on a loaded host). A :class:`BrokerError` names a binding the cluster refused."""
    client = AIOKafkaClient(**connection(target), request_timeout_ms=int(timeout_s * 1000))
    wanted = [b for role in roles for b in bindings(role, extra)]

    async def create(node: int, binding: Binding) -> None:
        resource, name, pattern, principal, op = binding
        request = CreateAclsRequest(resource, name, pattern, principal, "*", op, ALLOW)
        response = await client.send(node, request)
        for code, message in (tuple(r)[:2] for r in response.creation_responses):
            if code:
                msg = f"the cluster refused the ACL {principal} op {op} on {name}: {code} {message}"
                raise BrokerError(msg)

    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        node = client.get_random_node()
        await asyncio.wait_for(asyncio.gather(*(create(node, b) for b in wanted)), timeout_s)
        written = len(wanted)
    except (TimeoutError, OSError) as exc:
        msg = f"cannot write ACLs on {bootstrap_of(target)}: {exc!r}"
        raise BrokerError(msg) from exc
    finally:
        await client.close()
    logger.info("wrote %d ACLs for %s", written, ", ".join(roles))
    return written


# --- SCRAM credentials (Kafka's AlterUserScramCredentials, API 51, KIP-554) ---------------

#: SCRAM mechanisms by Kafka's wire code, with their hash
SCRAM_MECHANISMS: dict[str, tuple[int, str]] = {
    "SCRAM-SHA-256": (1, "sha256"),
    "SCRAM-SHA-512": (2, "sha512"),
}
#: PBKDF2 iterations of a stored credential: Kafka's minimum (and its tools' default)
SCRAM_ITERATIONS = 4096


class _AlterScramResponse(Response):
    API_KEY = 51
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("results", CompactArray(("user_name", CompactString("utf-8")), ("error_code", Int16),
                                 ("error_message", CompactString("utf-8")), ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )  # fmt: skip


class _AlterScramStruct(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 51
    API_VERSION = 0
    RESPONSE_TYPE = _AlterScramResponse
    SCHEMA = Schema(
        ("deletions", CompactArray(("name", CompactString("utf-8")), ("mechanism", Int8),
                                   ("tags", TaggedFields))),
        ("upsertions", CompactArray(("name", CompactString("utf-8")), ("mechanism", Int8),
                                    ("iterations", Int32), ("salt", CompactBytes),
                                    ("salted_password", CompactBytes), ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )  # fmt: skip


#: (user, mechanism code, iterations, salt, salted password, tagged fields)
_Upsertion = tuple[str, int, int, bytes, bytes, dict[int, bytes]]


class _AlterScramRequest(Request[_AlterScramStruct]):
    API_KEY: ClassVar[int] = 51

    def __init__(self, upsertions: list[_Upsertion]) -> None:
        self._upsertions = upsertions

    def build(self, request_struct_class: type[_AlterScramStruct]) -> _AlterScramStruct:
        return request_struct_class([], self._upsertions, {})


def scram_upsertion(user: str, password: str, mechanism: str) -> _Upsertion:
    """One stored SCRAM credential (RFC 5802's SaltedPassword = Hi(password, salt, i), PBKDF2
    with the mechanism's HMAC): what ``kafka-storage format --add-scram`` and
    ``kafka-configs --alter --add-config SCRAM-...`` store. The password itself never travels."""
    code, digest = SCRAM_MECHANISMS[mechanism]
    salt = secrets.token_bytes(32)
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, SCRAM_ITERATIONS)
    return (user, code, SCRAM_ITERATIONS, salt, salted, {})


async def upsert_scram_users(target: Target, users: Mapping[str, str], timeout_s: float = 30.0) -> None:
    """Create or replace the SCRAM-SHA-256 and SCRAM-SHA-512 credentials of ``users`` (user ->
    password), as an administrator: a log dir formatted before these users existed (or with
    other passwords) then takes them. A :class:`BrokerError` names a user the cluster refused."""
    client = AIOKafkaClient(**connection(target), request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        for mechanism in SCRAM_MECHANISMS:  # a request may alter each user once
            upserts = [scram_upsertion(u, p, mechanism) for u, p in users.items()]
            request = _AlterScramRequest(upserts)
            response = await asyncio.wait_for(client.send(client.get_random_node(), request), timeout_s)
            for user, code, message, _tags in response.results:
                if code:
                    msg = f"the cluster refused the {mechanism} credentials of {user!r}: {code} {message}"
                    raise BrokerError(msg)
    except (TimeoutError, OSError) as exc:
        msg = f"cannot write SCRAM credentials on {bootstrap_of(target)}: {exc!r}"
        raise BrokerError(msg) from exc
    finally:
        await client.close()
    logger.info("wrote the SCRAM credentials of %s", ", ".join(users))
