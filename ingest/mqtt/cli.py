"""``python -m ingest mqtt --broker HOST:PORT --map PATTERN=FIELD``: see :mod:`ingest.mqtt.bridge`."""

from __future__ import annotations

import argparse
import logging
import socket
from pathlib import Path
from typing import Any

from ingest.cliargs import add_command, address, positive, read_secret
from ingest.model import IngestArgError
from ingest.mqtt.bridge import MqttOptions, bridge
from ingest.mqtt.mapping import MappingRule, load_mapping_file, parse_map_option
from ingest.runtime import run_adapter

logger = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    p = add_command(
        commands,
        "mqtt",
        summary="bridge MQTT sensor topics",
        run=run,
        description=(
            "Subscribe at QoS 1 with a persistent session and publish each message to events.sensors; "
            "the MQTT ack is sent only after Kafka acknowledged. Reconnects with backoff. "
            "SIGTERM/SIGINT stop it cleanly."
        ),
    )
    p.add_argument("--broker", type=address, default=("127.0.0.1", 1883), metavar="HOST:PORT")
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="PATTERN[=FIELD]",
        help="e.g. 'sensors/+device_id/temperature=temperature' (repeatable; first match wins)",
    )
    p.add_argument("--map-file", type=Path, help="YAML file: mappings: [{topic, device, field}, ...]")
    p.add_argument(
        "--client-id",
        default=f"ingest-mqtt-{socket.gethostname()}",
        help="MQTT client id; keep it stable so the broker keeps the session (ingest-mqtt-HOSTNAME)",
    )
    p.add_argument("--username", help="MQTT user name")
    p.add_argument("--password-file", type=Path, help="file holding the MQTT password")
    p.add_argument("--reconnect-max", type=positive(int), default=30, metavar="S", help="longest backoff")
    p.add_argument(
        "--ready-file",
        type=Path,
        metavar="FILE",
        help="create FILE once the MQTT broker acknowledged the subscriptions (publishers may start then)",
    )


def rules_from(args: argparse.Namespace) -> tuple[MappingRule, ...]:
    """The mapping rules of ``--map`` options, then of ``--map-file``."""
    rules = [parse_map_option(text) for text in args.map]
    if args.map_file is not None:
        rules += load_mapping_file(args.map_file)
    if not rules:
        msg = "give at least one --map PATTERN[=FIELD] or a --map-file"
        raise IngestArgError(msg)
    return tuple(rules)


def run(args: argparse.Namespace) -> int:
    password = read_secret(args.password_file, "--password-file")
    host, port = args.broker
    opts = MqttOptions(
        host,
        port,
        args.client_id,
        rules_from(args),
        username=args.username,
        password=password,
        reconnect_max_s=int(args.reconnect_max),
        ready_file=args.ready_file,
    )
    return run_adapter(lambda settings, stop: bridge(settings, opts, stop))
