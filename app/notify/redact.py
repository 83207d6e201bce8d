"""Redaction of URLs and secrets before they reach a log line or an error message.

A webhook URL may carry credentials (``https://user:token@host``) or a token in
its query string; a signing secret must never be printed. Everything the
notify package logs or raises goes through :func:`redact_url` or :func:`scrub`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

logger = logging.getLogger(__name__)

MASK = "***"


def redact_url(url: object) -> str:
    """``url`` with any user info and query replaced by ``***`` and the fragment dropped.

    Never raises: an unparseable value gives ``"<unparseable url>"``.
    """
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable url>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    if parts.username is not None or parts.password is not None:
        netloc = f"{MASK}@{netloc}"
    query = MASK if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every non-empty string of ``secrets`` replaced by ``***``."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def url_secrets(url: str) -> list[str]:
    """The parts of ``url`` that :func:`scrub` should hide: the URL itself,
    its user info and its query string."""
    try:
        parts = urlsplit(url)
        found = [url, parts.query, parts.password or "", parts.username or ""]
    except ValueError:
        found = [url]
    return [s for s in found if s]
