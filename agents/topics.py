"""The worker's own topics (one regroup topic per source, the late topic, branch targets) and
the check that the source and regroup topics have ``APP_PARTITIONS`` partitions."""

from __future__ import annotations

import logging

from app.errors import ConfigError
from app.kafka.clients import partition_counts
from app.rules.evaluator import LATE_TOPIC
from app.rules.loader import RuleSet
from app.runtime.settings import Settings
from app.topics import SOURCE_TOPICS, TopicSpec

logger = logging.getLogger(__name__)


def regroup_topic(source: str) -> str:
    return f"streamalert-rules-{source}-regroup"


async def check_partitions(settings: Settings) -> None:
    """Refuse to start when a source or regroup topic's partition count is not ``APP_PARTITIONS``.

    The worker places regrouped events and registry absences (``expect_from``) by
    ``APP_PARTITIONS``, as the backtest does; with another count on the topics, some
    registry devices would be expected by no worker and never reported silent.
    """
    topics = [*SOURCE_TOPICS.values(), *(regroup_topic(s) for s in SOURCE_TOPICS)]
    counts = await partition_counts(settings, topics)
    wrong = {t: n for t, n in counts.items() if n != settings.partitions}
    if wrong:
        listed = ", ".join(f"{t} has {n}" for t, n in sorted(wrong.items()))
        msg = (
            f"APP_PARTITIONS={settings.partitions} but {listed} partitions: the rule worker places "
            "regrouped events and registry absences by APP_PARTITIONS, so they must agree. Set "
            "APP_PARTITIONS to the topics' count (or recreate the topics)."
        )
        raise ConfigError(msg)


def extra_topics(ruleset: RuleSet, settings: Settings) -> tuple[TopicSpec, ...]:
    names = {regroup_topic(s) for s in SOURCE_TOPICS} | {LATE_TOPIC}
    names |= {topic for r in ruleset.rules for topic in (a.topic for a in r.rule.branch)}
    return tuple(TopicSpec(n, key="", partitions=settings.partitions) for n in sorted(names))
