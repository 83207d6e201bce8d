"""Who may do what on the cluster: one Kafka principal per role, and the ACLs that bind it.

The table (:data:`ROLE_ACLS`) is the whole policy, read as "principal may OPERATION on
RESOURCE". Kafka's StandardAuthorizer denies everything else:
- Only the engines (``worker``, ``spark``) may write ``alerts``.
- Only the operator console and CLI (``console``) may write ``commands``.
- Ingest writes the event, dead-letter and registry topics and reads nothing.
- The dispatcher and the alert store read what they apply and write only their own
  outputs.
- A client without credentials cannot even connect to a SASL listener.

:func:`apply_acls` writes the table with Kafka's CreateAcls. The call is idempotent, since
Kafka keeps one copy of an identical binding. ``make run`` calls it on its embedded broker;
on a cluster, run ``python -m app acls`` once as an administrator.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiokafka import AIOKafkaClient
from aiokafka.protocol.admin import CreateAclsRequest

from app.errors import BrokerError
from app.kafka.clients import Target, bootstrap_of, connection
from app.topics import ALERTS, COMMANDS, DLQ, NOTIFICATIONS

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
        Grant(TOPIC, NOTIFICATIONS, (WRITE, DESCRIBE)),
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
    ),
}


def bindings(role: str) -> list[tuple[int, str, int, str, int]]:
    """``(resource type, name, pattern type, principal, operation)`` of every ACL of ``role``."""
    principal = f"User:{role}"
    return [
        (g.resource, g.name, PREFIXED if g.prefixed else LITERAL, principal, op)
        for g in ROLE_ACLS[role]
        for op in g.operations
    ]


async def apply_acls(target: Target, roles: tuple[str, ...] = ROLES, timeout_s: float = 30.0) -> int:
    """Create every ACL of ``roles`` (as an administrator); return how many were written.
    A :class:`BrokerError` names the first binding the cluster refused."""
    client = AIOKafkaClient(**connection(target), request_timeout_ms=int(timeout_s * 1000))
    written = 0
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        node = client.get_random_node()
        for role in roles:
            for resource, name, pattern, principal, op in bindings(role):
                request = CreateAclsRequest(resource, name, pattern, principal, "*", op, ALLOW)
                response = await asyncio.wait_for(client.send(node, request), timeout_s)
                for code, message in (tuple(r)[:2] for r in response.creation_responses):
                    if code:
                        msg = f"the cluster refused the ACL {principal} op {op} on {name}: {code} {message}"
                        raise BrokerError(msg)
                written += 1
    except (TimeoutError, OSError) as exc:
        msg = f"cannot write ACLs on {bootstrap_of(target)}: {exc!r}"
        raise BrokerError(msg) from exc
    finally:
        await client.close()
    logger.info("wrote %d ACLs for %s", written, ", ".join(roles))
    return written
