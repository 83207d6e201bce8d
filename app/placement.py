"""Partition placement: which partition of a topic a record key goes to.

This is Kafka's default partitioner for keyed records, as the Java client and
aiokafka compute it: ``(murmur2(key) & 0x7FFFFFFF) % partitions``. It is pure
code, so the evaluator, the backtest and the Spark engine emulate the live
worker's partitions without a Kafka client; ``tests/test_placement.py`` checks
it against aiokafka's partitioner.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF

#: Most key hashes a :class:`KeyHashes` keeps before it starts over.
MAX_KEY_HASHES = 100_000


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data`` (``Utils.murmur2``), as an unsigned int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end = length - length % 4
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


class KeyHashes:
    """Kafka's positive key hash (``murmur2(key) & 0x7FFFFFFF``), remembered.

    Keys repeat (device ids, hosts, fingerprints), so each distinct key is hashed once;
    at ``limit`` distinct keys the memory starts over, bounding it.
    """

    def __init__(self, limit: int = MAX_KEY_HASHES) -> None:
        self.limit = limit
        self.known: dict[bytes, int] = {}

    def __call__(self, key: bytes) -> int:
        found = self.known.get(key)
        if found is None:
            if len(self.known) >= self.limit:
                self.known.clear()
            found = self.known[key] = murmur2(key) & 0x7FFFFFFF
        return found


_KEY_HASHES = KeyHashes()


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of ``partitions`` that Kafka's default partitioner gives ``key``."""
    return _KEY_HASHES(key) % partitions
