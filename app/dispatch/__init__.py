"""Alert dispatch: routing, grouping, dedup, silences, inhibition, acks, escalation, flapping, storms.

A pure core (no Kafka, no HTTP): :class:`~app.dispatch.dispatcher.Dispatcher`
turns alert transitions and operator commands into outbox messages, driven
by an injected clock. The seams:

- :mod:`~app.dispatch.config`: the routes file (typed, validated with file:line errors);
- :mod:`~app.dispatch.routes`: the routing tree; :mod:`~app.dispatch.matchers`: label matchers;
- :mod:`~app.dispatch.grouping`, :mod:`~app.dispatch.nflog`: aggregation groups and the dedup log;
- :mod:`~app.dispatch.silences`, :mod:`~app.dispatch.inhibit`, :mod:`~app.dispatch.acks`,
  :mod:`~app.dispatch.flapping`: the Muters (and escalation);
- :mod:`~app.dispatch.storm`: storm control; :mod:`~app.dispatch.pipeline`: the stages;
- :mod:`~app.storage.dispatch_db`: the SQLite state file with the outbox.

The Kafka role that drives it is :mod:`app.roles.dispatch`.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
