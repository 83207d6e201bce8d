"""Where a stream partition's state group runs: spreading the stream path over the cores.

Spark places a ``groupBy(...).applyInPandasWithState`` group on shuffle
partition ``pmod(hash(group key), spark.sql.shuffle.partitions)`` (Murmur3,
seed 42: the ``hash()`` SQL function). With a handful of stream partitions
that is a coin toss: on ``local[2]`` both partitions of ``sensors`` hashed to
the same shuffle partition, so the whole stream path ran on one core.

:func:`placed` appends a *salt* to a stream key so that its hash is congruent
to a chosen target modulo :data:`SPREAD` (840 = lcm(1..8)). Then for every
shuffle partition count ``n`` dividing 840 (1 to 8, 10, 12, 14, 15, 20, 24,
28, 30, 35, 40, 42, 56, 60, ...) the key lands on ``target mod n``. The
target is the stream's own offset (CRC-32 of its name) plus the partition
number, so the partitions of one stream go to consecutive shuffle partitions
whatever ``n`` is, and the salted key depends on the key alone: neither on
the configuration nor on the other rules, so a restart finds its state under
the same group key.

:func:`spark_hash` is Spark's ``Murmur3_x86_32.hashUnsafeBytes`` for a UTF-8
string (tail bytes mixed one by one, signed), checked against Spark's
``hash()`` in ``tests/spark/test_placement.py``.
"""

from __future__ import annotations

import logging
import zlib

logger = logging.getLogger(__name__)

SPREAD = 840  # lcm(1, ..., 8)
SEED = 42  # Spark's Murmur3Hash seed
_MASK = 0xFFFFFFFF
_SALT_SEP = "\x1e"


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix(h1: int, k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & _MASK
    k1 = (_rotl(k1, 15) * 0x1B873593) & _MASK
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK


def spark_hash(text: str, seed: int = SEED) -> int:
    """Spark's ``hash(text)`` (a signed 32-bit int) for one string column."""
    data = text.encode()
    aligned = len(data) - len(data) % 4
    h1 = seed & _MASK
    for i in range(0, aligned, 4):
        h1 = _mix(h1, int.from_bytes(data[i : i + 4], "little"))
    for b in data[aligned:]:
        h1 = _mix(h1, (b - 256 if b > 127 else b) & _MASK)
    h1 ^= len(data)
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def shuffle_partition(key: str, partitions: int) -> int:
    """The shuffle partition of group ``key`` among ``partitions`` (Spark's ``pmod``)."""
    return spark_hash(key) % partitions


def placed(key: str, name: str, partition: int) -> str:
    """``key`` + a salt so that it lands on shuffle partition ``(crc32(name) + partition)
    mod n`` for every ``n`` dividing :data:`SPREAD`. About 840 hashes: its caller,
    :func:`jobs.streams.stream_key`, makes each key once."""
    target = (zlib.crc32(name.encode()) + partition) % SPREAD
    salt = 0
    while spark_hash(f"{key}{_SALT_SEP}{salt}") % SPREAD != target:
        salt += 1
    return f"{key}{_SALT_SEP}{salt}"


def unplaced(key: str) -> str:
    """The key without the salt :func:`placed` added."""
    return key.rpartition(_SALT_SEP)[0] or key
