"""The cell log: one Arrow row per cell or tombstone, the hand-off from the decoder to the state merge.

Spark jobs consume it with ``mapInArrow``; the state engine (``cdc_lib.state``) reconciles it. Values stay in their
serialized form (``value``, ``path``, ``partition_key``, ``clustering``) so that reconciliation compares value
bytes exactly as Cassandra does and nothing is lost in conversion.

``clustering`` (and ``clustering_end``) is the clustering prefix encoded as Cassandra encodes a composite:
for each component a big-endian u16 length, the bytes, then an end-of-component byte 0x00 (see
``encode_clustering``). An empty prefix is ``b""``.

Kinds (``kind`` column):

============================  ===================================================================
``cell``                      a live cell (``ttl`` > 0 for an expiring cell; ``local_deletion_time``
                              is then its expiry time in seconds)
``cell_tombstone``            a deleted cell (``local_deletion_time`` = when it was deleted)
``row_liveness``              the row's primary-key liveness (INSERT's row marker); ttl/ldt as cells
``row_deletion``              a row tombstone (``timestamp`` = markedForDeleteAt)
``row_deletion_shadowable``   a shadowable row tombstone (materialized views)
``complex_deletion``          a collection/UDT tombstone on ``column`` (``SET c = ...`` writes one)
``partition_deletion``        a partition tombstone (clustering empty)
``range_tombstone``           rows with ``clustering`` .. ``clustering_end`` (inclusive per the flags)
                              deleted at ``timestamp``
============================  ===================================================================

``is_static`` marks cells of the static row. ``entry_index`` numbers the partition updates inside a segment
in file order so that (segment, position, entry_index, seq) orders the log exactly as it was written.

``mutation_id`` (16 bytes) says which mutation a record belongs to: ``hashlib.sha256(data).digest()[:16]`` of
the commit-log entry's serialized mutation (``data``: the entry's bytes between its size CRC and its mutation
CRC, exactly what that CRC covers; ``commitlog.model.mutation_id``). Every record of one entry carries the same
id, and so does every replica's copy of the entry, since replicas serialize a mutation to identical bytes. The
state engine publishes one change per mutation (``state.events``). Records that come from no commit-log entry
(SSTable or CQL backfill, the expiry sweep's marker rows) have it null.
"""
from __future__ import annotations

import pyarrow as pa

KIND_CELL = "cell"
KIND_CELL_TOMBSTONE = "cell_tombstone"
KIND_ROW_LIVENESS = "row_liveness"
KIND_ROW_DELETION = "row_deletion"
KIND_ROW_DELETION_SHADOWABLE = "row_deletion_shadowable"
KIND_COMPLEX_DELETION = "complex_deletion"
KIND_PARTITION_DELETION = "partition_deletion"
KIND_RANGE_TOMBSTONE = "range_tombstone"

KINDS = (KIND_CELL, KIND_CELL_TOMBSTONE, KIND_ROW_LIVENESS, KIND_ROW_DELETION, KIND_ROW_DELETION_SHADOWABLE,
         KIND_COMPLEX_DELETION, KIND_PARTITION_DELETION, KIND_RANGE_TOMBSTONE)

CELL_LOG_SCHEMA = pa.schema([
    pa.field("segment", pa.string(), nullable=False),        # segment file name
    pa.field("segment_id", pa.int64(), nullable=False),
    pa.field("position", pa.int64(), nullable=False),         # logical offset just after the entry
    pa.field("entry_index", pa.int32(), nullable=False),      # partition update number within the segment
    pa.field("seq", pa.int32(), nullable=False),              # record number within the partition update
    pa.field("table_id", pa.string(), nullable=False),        # canonical UUID string
    pa.field("keyspace", pa.string(), nullable=False),
    pa.field("table", pa.string(), nullable=False),
    pa.field("partition_key", pa.binary(), nullable=False),   # serialized key bytes (composite for multi-column keys)
    pa.field("token", pa.int64(), nullable=False),            # Murmur3 token of the key
    pa.field("clustering", pa.binary(), nullable=False),
    pa.field("clustering_end", pa.binary(), nullable=True),   # range tombstones only
    pa.field("start_inclusive", pa.bool_(), nullable=True),   # range tombstones only
    pa.field("end_inclusive", pa.bool_(), nullable=True),     # range tombstones only
    pa.field("is_static", pa.bool_(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("column", pa.string(), nullable=True),
    pa.field("path", pa.binary(), nullable=True),             # cell path of a complex column's element
    pa.field("value", pa.binary(), nullable=True),            # serialized value; b"" for empty values
    pa.field("timestamp", pa.int64(), nullable=False),        # write time (micros) or markedForDeleteAt
    pa.field("ttl", pa.int32(), nullable=False),
    pa.field("local_deletion_time", pa.int64(), nullable=False),
    pa.field("mutation_id", pa.binary(), nullable=True),     # SHA-256 of the entry's mutation bytes, 16 bytes
])


def encode_clustering(values) -> bytes:
    """Encode a clustering prefix (a sequence of serialized values) as composite bytes.

    ``None`` components (null in a bound) are encoded with length 0xFFFF so they stay distinct from empty values.
    """
    out = bytearray()
    for v in values:
        if v is None:
            out += b"\xff\xff\x00"
        else:
            out += len(v).to_bytes(2, "big")
            out += v
            out += b"\x00"
    return bytes(out)


def decode_clustering(data: bytes) -> tuple:
    """Inverse of ``encode_clustering``."""
    out = []
    i = 0
    n = len(data)
    while i < n:
        ln = int.from_bytes(data[i:i + 2], "big")
        i += 2
        if ln == 0xFFFF:
            out.append(None)
        else:
            out.append(bytes(data[i:i + ln]))
            i += ln
        i += 1  # end-of-component byte
    return tuple(out)


def binary_array(values) -> pa.Array:
    """An Arrow binary array from a sequence of bytes/None, built from one joined buffer.

    ``pa.array`` converts Python bytes one object at a time; joining them and computing offsets with numpy
    (every pass below iterates in C: ``map`` over C functions, ``filter(None, ...)``) is ~20x faster, and the
    cell log is mostly binary columns.
    """
    import operator
    from itertools import repeat

    import numpy as np
    n = len(values)
    nulls = values.count(None) if hasattr(values, "count") else sum(v is None for v in values)
    lens = np.fromiter(map(operator.length_hint, values), dtype=np.int64, count=n)   # None -> 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise OverflowError("cell-log batch holds 2 GiB of binary data; use smaller batches")
    validity = None
    if nulls:
        is_null = np.fromiter(map(operator.is_, values, repeat(None)), dtype=bool, count=n)
        validity = pa.py_buffer(np.packbits(~is_null, bitorder="little"))
    data = b"".join(filter(None, values))           # drops None and b"" (which add nothing anyway)
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(data)], null_count=nulls)
