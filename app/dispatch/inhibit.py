"""Inhibition rules: a firing source alert mutes target alerts that share its ``equal`` labels.

As in Alertmanager: an alert matching a rule's ``target_matchers`` is muted
while some *other* firing alert matches the rule's ``source_matchers`` and has
the same value (absent counts as empty) for every label in ``equal``. An
alert that matches both sides cannot be inhibited by a source that also
matches both sides, so a rule never lets an alert group silence itself.
Sources are the firing alerts of the :class:`AlertRegistry`; the per-rule
source lists are rebuilt only when the registry changed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from app.alerts import Alert
from app.dispatch.config import InhibitRuleConfig
from app.dispatch.matchers import matches_all
from app.dispatch.registry import AlertRegistry
from app.notify.payload import alert_labels

logger = logging.getLogger(__name__)


class Inhibitor:
    """A Muter over ``rules`` and the registry's firing alerts."""

    def __init__(self, rules: Sequence[InhibitRuleConfig], registry: AlertRegistry) -> None:
        self.rules = tuple(rules)
        self.registry = registry
        self._version = -1
        self._sources: list[list[tuple[str, dict[str, str]]]] = []

    def set_rules(self, rules: Sequence[InhibitRuleConfig]) -> None:
        """Replace the rules (routes file reload); the source cache is rebuilt on next use."""
        self.rules = tuple(rules)
        self._version = -1

    def _refresh(self) -> None:
        if self._version == self.registry.version:
            return
        firing = [(a.fingerprint, alert_labels(a)) for a in self.registry.firing()]
        self._sources = [
            [(fp, lb) for fp, lb in firing if matches_all(r.source_matchers, lb)] for r in self.rules
        ]
        self._version = self.registry.version

    def mutes(self, alert: Alert, now: float) -> bool:
        return self.inhibited_by(alert) is not None

    def inhibited_by(self, alert: Alert) -> str | None:
        """The fingerprint of a firing alert that inhibits ``alert``, or None."""
        if not self.rules:
            return None
        self._refresh()
        labels = alert_labels(alert)
        for rule, sources in zip(self.rules, self._sources, strict=True):
            if not matches_all(rule.target_matchers, labels):
                continue
            two_sided = matches_all(rule.source_matchers, labels)
            for fp, src in sources:
                if fp == alert.fingerprint:
                    continue
                if two_sided and matches_all(rule.target_matchers, src):
                    continue
                if all(src.get(k, "") == labels.get(k, "") for k in rule.equal):
                    return fp
        return None
