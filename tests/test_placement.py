"""The cached partitioner places every key where aiokafka's (and Java's) default would."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from app.kafka.clients import CachedPartitioner
from app.placement import KeyHashes, partition_for

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
