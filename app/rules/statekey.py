"""The keys of rule state: one format, built and parsed here only.

A rule's state for one group lives under ``rule_id US value US value ...`` (US:
:data:`SEPARATOR`, the ASCII unit separator, which no rule id contains); a rule
without ``group_by`` has the key ``rule_id``. A group value is its field's text
(NULL and the empty string share a group). The same text joins the group values
of an event's partition key on a regrouped stream (:func:`group_text`).

Beside the rule states, a store holds records of other kinds under keys that
start with NUL, so they never parse as a rule's: a stream partition's event-time
clock (:func:`clock_key`, see :mod:`app.rules.timebound`), on the rule worker a
regrouped stream partition's last forwarded offset of each source partition
(:func:`forwarded_key`), and, on the Spark engine, a stream partition's evaluator
(``jobs.streams``).

The hot paths build a key as ``rule_id + suffix`` (:meth:`StateKey.suffix`), with
the suffix computed once per event and shared by every rule of one grouping;
:meth:`StateKey.encode` gives the same string.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

logger = logging.getLogger(__name__)

#: between a key's rule id and each group value
SEPARATOR: Final = "\x1f"
#: the head of a stream partition's clock record's key (no rule id starts with NUL)
CLOCK_PREFIX: Final = "\x00clock" + SEPARATOR
#: the head of the key of a regrouped stream partition's last forwarded source offset
#: (:func:`forwarded_key`)
FORWARDED_PREFIX: Final = "\x00fwd" + SEPARATOR


@dataclass(frozen=True)
class StateKey:
    """The key of one rule's state for one group (``group``: the group values as text)."""

    rule_id: str
    group: tuple[str, ...] = ()

    def encode(self) -> str:
        """The key as the stores hold it: ``rule_id + suffix(group)``."""
        return self.rule_id + self.suffix(self.group)

    @staticmethod
    def suffix(group: tuple[str, ...]) -> str:
        """What follows the rule id in the key of ``group`` ('' without group values)."""
        return SEPARATOR + SEPARATOR.join(group) if group else ""

    @staticmethod
    def parse(key: str) -> StateKey:
        """The rule id and group values of an encoded key. The inverse of :meth:`encode`,
        except that a rule grouped by one field whose value is '' and a rule without
        ``group_by`` cannot be told apart from the text alone: both parse as one group
        value (``('',)``) after a separator, and ``()`` without one."""
        rule_id, sep, rest = key.partition(SEPARATOR)
        return StateKey(rule_id, tuple(rest.split(SEPARATOR)) if sep else ())

    @staticmethod
    def rule_of(key: str) -> str:
        """The rule id at the head of an encoded key, without building a :class:`StateKey`."""
        return key.split(SEPARATOR, 1)[0]


def group_text(values: tuple[str, ...] | list[str]) -> str:
    """Group values joined as keys join them: the partition key of a regrouped event."""
    return SEPARATOR.join(values)


def clock_key(stream: str, partition: int) -> str:
    """The key of a stream partition's clock record."""
    return CLOCK_PREFIX + stream + SEPARATOR + str(partition)


def is_clock_key(key: str) -> bool:
    return key.startswith(CLOCK_PREFIX)


def forwarded_key(stream: str, partition: int, source_partition: int) -> str:
    """The key of the record of the last source offset of ``source_partition`` that
    ``partition`` of regrouped ``stream`` evaluated (the rule worker's, ``agents.wiring``: a
    replayed source batch forwards its events again, and they are dropped there)."""
    return FORWARDED_PREFIX + stream + SEPARATOR + str(partition) + SEPARATOR + str(source_partition)
