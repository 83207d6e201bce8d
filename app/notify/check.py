"""What makes a configured receiver unusable, found before any delivery: one function that
``routes check`` reports and the dispatcher obeys (it disables such a receiver alone).

:func:`receiver_problems` returns ``(field, message)`` pairs for one receiver: a URL that
is not ``http(s)://`` with a host, a literal address the SSRF guard would refuse, a
signing secret that is not base64, a header that cannot be sent, a timeout that is not
positive, an ``APP_WEBHOOK_ALLOW_PRIVATE`` entry that does not parse. A blank URL is not
a problem here: the receiver's delivery waits until one is configured (see
:class:`app.roles.delivery.OutboxSender`). Host names are not resolved: what they resolve to is
checked at each delivery.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import httpx

from app.notify.config import AlertmanagerReceiverConfig, KafkaReceiverConfig, WebhookReceiverConfig
from app.notify.redact import redact_url
from app.notify.ssrf import AllowList, is_forbidden, literal_ip
from app.notify.webhook import secret_problem, url_problem

logger = logging.getLogger(__name__)

Receiver = WebhookReceiverConfig | AlertmanagerReceiverConfig | KafkaReceiverConfig
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
_PORTS = {"http": 80, "https": 443}


def receiver_problems(cfg: Receiver, allow_private: Iterable[str] = ()) -> list[tuple[str, str]]:
    """Every reason ``cfg`` cannot deliver, as ``(field, message)``; empty when it can."""
    if isinstance(cfg, KafkaReceiverConfig):
        return []  # its fields are checked by the model (topic name pattern)
    out: list[tuple[str, str]] = []
    try:
        allow = AllowList.parse(allow_private)
    except ValueError as exc:
        out.append(("url", f"APP_WEBHOOK_ALLOW_PRIVATE: {exc}"))
        allow = AllowList()
    url = cfg.url.strip()
    if url:
        problem = url_problem(url)
        if problem is not None:
            out.append(("url", problem))
        else:
            parsed = httpx.URL(url)
            ip = literal_ip(parsed.host)
            port = parsed.port or _PORTS[parsed.scheme]
            if ip is not None and is_forbidden(ip) and not allow.allows(parsed.host, ip, port):
                entry = f"[{parsed.host}]:{port}" if ":" in parsed.host else f"{parsed.host}:{port}"
                out.append(("url", f"{redact_url(url)} is a non-public address; the SSRF guard refuses it "
                                   f"unless APP_WEBHOOK_ALLOW_PRIVATE has {entry}"))  # fmt: skip
    if isinstance(cfg, WebhookReceiverConfig):
        problem = secret_problem(cfg.secret.get_secret_value())
        if problem is not None:
            out.append(("secret", problem))
    if cfg.timeout <= 0:
        out.append(("timeout", f"must be longer than 0s, got {cfg.timeout:g}s"))
    for name, value in cfg.headers.items():
        if not _TOKEN.match(name):
            out.append(("headers", f"{name!r} is not an HTTP header name"))
        elif any(c in value for c in "\r\n\x00"):
            out.append(("headers", f"the value of {name!r} holds a line break or NUL"))
    return out
