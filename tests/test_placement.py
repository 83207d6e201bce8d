"""Partition placement (app/placement.py): Kafka's murmur2 is aiokafka's, and the cached
partitioner places every key where aiokafka's (and Java's) default would."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from app.kafka.clients import CachedPartitioner
from app.placement import KeyHashes, murmur2, partition_for

KEYS = [
    b"m1",
    b"",
    b"10.0.0.9",
    "caf\u00e9".encode(),
    bytes(range(256)),
    *(f"k{i}".encode() for i in range(500)),
]


def test_every_key_lands_where_the_default_partitioner_puts_it() -> None:
    hashes = KeyHashes(limit=7)  # starts over many times along the way
    cached, default = CachedPartitioner(hashes), DefaultPartitioner()
    for n in (1, 2, 3, 4, 12):
        parts = list(range(n))
        for key in KEYS * 2:  # the second pass reads remembered hashes
            want = default(key, parts, parts)
            assert cached(key, parts, parts) == want
            assert partition_for(key, n) == want
    assert 0 < len(hashes.known) <= 7


def test_a_key_less_record_goes_to_an_available_partition() -> None:
    assert CachedPartitioner()(None, [0, 1, 2], [2]) == 2


def test_murmur2_is_aiokafkas_on_random_byte_strings() -> None:
    """20,000 random byte strings, every length from 0 to 255 bytes (each tail of 0 to 3
    bytes after the 4-byte blocks) and every byte value; seeded, so a failure repeats."""
    rng = random.Random(20_241_126)  # noqa: S311 - reproducible test samples, not secrets
    for i in range(20_000):
        data = rng.randbytes(i % 256 if i < 2_560 else rng.randrange(0, 64))
        assert murmur2(data) == aiokafka_murmur2(data), data.hex()
        assert partition_for(data, 7) == (aiokafka_murmur2(data) & 0x7FFFFFFF) % 7, data.hex()
