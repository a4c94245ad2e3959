"""The decoded shape of a commit-log mutation: partition updates, rows, cells, tombstones.

These are plain data. Values stay as their serialized bytes here (clustering values, cell values, cell
paths): the CQL type registry (``cdc_lib.cql.types``) turns them into Python values when a consumer asks, so the
decoder's hot loop never pays for value conversion and the bytes can be re-encoded exactly.

Times follow Cassandra's conventions: timestamps are microseconds since the epoch (Java long), local
deletion times and TTLs are seconds. ``NO_TIMESTAMP`` and ``NO_DELETION_TIME`` are Cassandra's sentinels.
"""
from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Optional, Union

NO_TIMESTAMP = -(1 << 63)            # LivenessInfo.NO_TIMESTAMP / DeletionTime.LIVE.markedForDeleteAt
NO_DELETION_TIME = (1 << 31) - 1     # Cell.NO_DELETION_TIME for messaging <= 12 (Integer.MAX_VALUE)
NO_DELETION_TIME_UINT = (1 << 32) - 1  # the same sentinel under messaging 13 (5.0 unsigned LDT)
NO_TTL = 0
EXPIRED_LIVENESS_TTL = (1 << 31) - 1  # materialized-view "expired liveness" marker

# Encoding-stats epochs (SerializationHeader): deltas are taken from these when the stats are empty.
TIMESTAMP_EPOCH = 1442880000000000
DELETION_TIME_EPOCH = 1442880000
TTL_EPOCH = 0


@dataclass(slots=True, frozen=True)
class DeletionTime:
    """A tombstone: data with timestamp <= ``marked_for_delete_at`` is deleted; written at ``local_deletion_time``."""
    marked_for_delete_at: int
    local_deletion_time: int

    @property
    def is_live(self) -> bool:
        return self.marked_for_delete_at == NO_TIMESTAMP


LIVE = DeletionTime(NO_TIMESTAMP, NO_DELETION_TIME)


@dataclass(slots=True, frozen=True)
class LivenessInfo:
    """A row's primary-key liveness (the CQL row marker written by INSERT)."""
    timestamp: int
    ttl: int = NO_TTL
    local_expiration_time: int = NO_DELETION_TIME

    @property
    def is_expiring(self) -> bool:
        return self.ttl != NO_TTL


@dataclass(slots=True)
class Cell:
    """One cell: a simple column's value, or one element of a complex (non-frozen) column.

    ``value`` is the serialized value (``b""`` for an empty value, a set element or a tombstone),
    ``path`` the cell path of a complex column's element (None for simple columns).
    ``local_deletion_time`` is the deletion time of a tombstone or the expiry time of an expiring cell,
    and ``NO_DELETION_TIME`` for a live, non-expiring cell.
    """
    column: str
    value: bytes
    timestamp: int
    ttl: int = NO_TTL
    local_deletion_time: int = NO_DELETION_TIME
    path: Optional[bytes] = None
    is_tombstone: bool = False

    @property
    def is_expiring(self) -> bool:
        return self.ttl != NO_TTL and not self.is_tombstone


@dataclass(slots=True)
class Row:
    """A clustering row or the static row of one partition update.

    ``clustering`` holds the serialized clustering values in clustering-column order (empty for the static
    row and for tables without clustering columns); an element is ``b""`` for an empty value.
    ``cells`` are in the order they were serialized: header column order, then cell-path order.
    ``complex_deletions`` maps a complex column to its collection tombstone (``SET c = ...`` writes one).
    ``columns`` lists the columns the row carries, in header order (a complex column may be present with
    only a complex deletion, and no cells).
    """
    clustering: tuple
    liveness: Optional[LivenessInfo] = None
    deletion: Optional[DeletionTime] = None
    shadowable: bool = False
    cells: list = field(default_factory=list)
    complex_deletions: dict = field(default_factory=dict)
    is_static: bool = False
    columns: Optional[tuple] = None


class BoundKind(IntEnum):
    """``ClusteringPrefix.Kind`` ordinals as serialized in range tombstone markers."""
    EXCL_END_BOUND = 0
    INCL_START_BOUND = 1
    EXCL_END_INCL_START_BOUNDARY = 2
    STATIC_CLUSTERING = 3
    CLUSTERING = 4
    INCL_END_EXCL_START_BOUNDARY = 5
    INCL_END_BOUND = 6
    EXCL_START_BOUND = 7

    @property
    def is_boundary(self) -> bool:
        return self in (BoundKind.EXCL_END_INCL_START_BOUNDARY, BoundKind.INCL_END_EXCL_START_BOUNDARY)

    @property
    def is_start(self) -> bool:
        return self in (BoundKind.INCL_START_BOUND, BoundKind.EXCL_START_BOUND)

    @property
    def is_end(self) -> bool:
        return self in (BoundKind.INCL_END_BOUND, BoundKind.EXCL_END_BOUND)


@dataclass(slots=True)
class RangeTombstoneMarker:
    """One bound (or boundary) of a range tombstone over clustering prefixes.

    A bound carries ``deletion``; a boundary closes the previous range with ``end_deletion`` and opens the
    next with ``start_deletion``. ``clustering`` holds the bound's prefix values (may be shorter than the
    clustering, or empty for "from the start"/"to the end").
    """
    kind: BoundKind
    clustering: tuple
    deletion: Optional[DeletionTime] = None
    end_deletion: Optional[DeletionTime] = None
    start_deletion: Optional[DeletionTime] = None


Unfiltered = Union[Row, RangeTombstoneMarker]


@dataclass(slots=True)
class EncodingStats:
    """The minima that every delta-encoded time of a partition update is relative to."""
    min_timestamp: int = TIMESTAMP_EPOCH
    min_local_deletion_time: int = DELETION_TIME_EPOCH
    min_ttl: int = TTL_EPOCH


@dataclass(slots=True)
class PartitionUpdate:
    """Everything one mutation writes to one partition of one table.

    ``table`` is the ``schema.TableMetadata`` it was decoded with (None only before decoding).
    ``static_columns``/``regular_columns`` are the serialization header's column lists, kept so that the
    writer reproduces the bytes exactly; ``row_estimate`` likewise.
    """
    table_id: uuid.UUID
    partition_key: bytes
    table: object = None
    partition_deletion: Optional[DeletionTime] = None
    static_row: Optional[Row] = None
    unfiltereds: list = field(default_factory=list)
    static_columns: tuple = ()
    regular_columns: tuple = ()
    stats: EncodingStats = field(default_factory=EncodingStats)
    row_estimate: Optional[int] = None
    is_empty: bool = False

    @property
    def rows(self) -> list:
        return [u for u in self.unfiltereds if isinstance(u, Row)]

    @property
    def markers(self) -> list:
        return [u for u in self.unfiltereds if isinstance(u, RangeTombstoneMarker)]


MUTATION_ID_BYTES = 16


def mutation_id(entry_bytes: bytes) -> bytes:
    """What identifies one mutation wherever it was logged: the first 16 bytes of the SHA-256 of its serialized
    bytes.

    ``entry_bytes`` are the bytes a commit-log entry's mutation CRC covers (``LogEntry.data``). Every replica
    serializes the same mutation to the same bytes (the coordinator fixes its timestamps, local deletion
    times, column headers and encoding stats, and replicas re-serialize what they received), so replica
    copies, hints and batchlog replays of one mutation share the id, while two different writes never do.
    Replicas on different messaging versions (a rolling upgrade) serialize it differently: their copies are then
    two mutations with the same content and write time, and applying the second changes nothing.

    A cryptographic hash, so that no one who can write to the cluster can make a write collide with another and
    have it dropped as its copy. SHA-256 because processors hash it in hardware (x86 SHA extensions, Armv8's
    SHA-2 instructions; OpenSSL here, ``native/src/sha256.rs`` in the compiled decoder): on the development machine
    it hashed inputs sized as commit-log entries 2.8 times as fast as BLAKE2b (1,730 against 624 MB/s), which the
    compiled decoder spent a third of its time on. Without those instructions (Intel before Ice Lake) SHA-256 in
    software is slower than BLAKE2b (362 MB/s); the id must be the same wherever a batch is decoded, so it is one
    hash for all. The id lives within a batch only (replica copies are dropped before the state merge; nothing
    stores it), so the digest is not a stored format.
    """
    return hashlib.sha256(entry_bytes).digest()[:MUTATION_ID_BYTES]


@dataclass(slots=True)
class Mutation:
    """One commit-log entry's mutation: updates to one partition key in one keyspace, possibly several tables.

    ``segment``/``position`` locate the entry: ``position`` is the logical offset just after the entry, the
    same value Cassandra uses for ``CommitLogPosition`` and writes into ``_cdc.idx``. ``mutation_id`` is
    ``mutation_id(entry bytes)`` for a mutation read from a log (None for one built in memory and not
    serialized yet).
    """
    updates: list
    segment: Optional[str] = None
    segment_id: Optional[int] = None
    position: Optional[int] = None
    messaging_version: int = 12
    mutation_id: Optional[bytes] = None
