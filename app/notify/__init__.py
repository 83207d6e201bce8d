"""Alert notification: the signed webhook notifier, its retry policy and SSRF guard.

Import what you need from here; the sub-modules are the seams:
:mod:`~app.notify.payload` (body), :mod:`~app.notify.webhook` (one attempt),
:mod:`~app.notify.retry` (the policy), :mod:`~app.notify.ssrf` (where we may connect),
:mod:`~app.notify.receivers` (the transport of each receiver type, imported on its own
because it depends on the dispatcher's config models).
"""

from __future__ import annotations

import logging

from app.notify.payload import NOT_ENDED, build_payload, webhook_id
from app.notify.redact import redact_url
from app.notify.retry import RetryAbortedError, RetryPolicy, parse_retry_after
from app.notify.ssrf import AllowList, PinnedTarget, SSRFBlockedError, SSRFGuard
from app.notify.webhook import WebhookNotifier

logger = logging.getLogger(__name__)

__all__ = [
    "NOT_ENDED",
    "AllowList",
    "PinnedTarget",
    "RetryAbortedError",
    "RetryPolicy",
    "SSRFBlockedError",
    "SSRFGuard",
    "WebhookNotifier",
    "build_payload",
    "parse_retry_after",
    "redact_url",
    "webhook_id",
]
