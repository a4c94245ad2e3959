"""The cell log: one Arrow row per cell or tombstone, the hand-off from the decoder to the state merge.

Spark jobs consume it with ``mapInArrow``; the state engine (``state``) reconciles it. Values stay in their
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
"""
from __future__ import annotations

import gc
import uuid

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


# --------------------------------------------------------------------------------------------------------
# Mutations -> cell-log records (the reference path; the fast path in ``celllog_fast`` must agree with it)
# --------------------------------------------------------------------------------------------------------

def range_tombstones(markers) -> list:
    """Pair a partition update's markers into ranges: (start_values, start_incl, end_values, end_incl, deletion).

    Markers arrive in clustering order as start bound, boundaries, end bound (format reference §12.3).
    """
    from .errors import MutationError
    from .model import BoundKind
    out = []
    open_ = None  # (values, inclusive, deletion)
    for m in markers:
        k = m.kind
        if k.is_start:
            if open_ is not None:
                raise MutationError("range tombstone opened twice without a close")
            open_ = (m.clustering, k == BoundKind.INCL_START_BOUND, m.deletion)
        elif k.is_boundary:
            if open_ is None:
                raise MutationError("range tombstone boundary without an open range")
            end_incl = k == BoundKind.INCL_END_EXCL_START_BOUNDARY
            out.append((open_[0], open_[1], m.clustering, end_incl, m.end_deletion))
            open_ = (m.clustering, not end_incl, m.start_deletion)
        elif k.is_end:
            if open_ is None:
                raise MutationError("range tombstone closed without an open range")
            out.append((open_[0], open_[1], m.clustering, k == BoundKind.INCL_END_BOUND, open_[2]))
            open_ = None
    if open_ is not None:
        raise MutationError("range tombstone left open at the end of the partition")
    return out


def update_records(update, segment: str, segment_id: int, position: int, entry_index: int) -> list:
    """The cell-log records (dicts keyed like CELL_LOG_SCHEMA) of one partition update, in written order."""
    from .model import NO_DELETION_TIME, NO_TIMESTAMP, RangeTombstoneMarker
    from .murmur3 import token as murmur3_token
    table = update.table
    base = {
        "segment": segment, "segment_id": segment_id, "position": position, "entry_index": entry_index,
        "table_id": str(update.table_id), "keyspace": table.keyspace, "table": table.name,
        "partition_key": update.partition_key, "token": murmur3_token(update.partition_key),
    }
    out = []

    def add(kind, clustering=b"", is_static=False, column=None, path=None, value=None, timestamp=NO_TIMESTAMP,
            ttl=0, ldt=NO_DELETION_TIME, clustering_end=None, start_inclusive=None, end_inclusive=None):
        rec = dict(base)
        rec.update(seq=len(out), clustering=clustering, clustering_end=clustering_end,
                   start_inclusive=start_inclusive, end_inclusive=end_inclusive, is_static=is_static, kind=kind,
                   column=column, path=path, value=value, timestamp=timestamp, ttl=ttl, local_deletion_time=ldt)
        out.append(rec)

    if update.is_empty:
        return out
    if update.partition_deletion is not None and not update.partition_deletion.is_live:
        d = update.partition_deletion
        add(KIND_PARTITION_DELETION, timestamp=d.marked_for_delete_at, ldt=d.local_deletion_time)

    def row_records(row, clustering, is_static):
        lv = row.liveness
        if lv is not None and lv.timestamp != NO_TIMESTAMP:
            add(KIND_ROW_LIVENESS, clustering, is_static, timestamp=lv.timestamp, ttl=lv.ttl,
                ldt=lv.local_expiration_time if lv.ttl else NO_DELETION_TIME)
        if row.deletion is not None and not row.deletion.is_live:
            add(KIND_ROW_DELETION_SHADOWABLE if row.shadowable else KIND_ROW_DELETION, clustering, is_static,
                timestamp=row.deletion.marked_for_delete_at, ldt=row.deletion.local_deletion_time)
        for col, d in row.complex_deletions.items():
            add(KIND_COMPLEX_DELETION, clustering, is_static, column=col, timestamp=d.marked_for_delete_at,
                ldt=d.local_deletion_time)
        for c in row.cells:
            if c.is_tombstone:
                add(KIND_CELL_TOMBSTONE, clustering, is_static, c.column, c.path, c.value, c.timestamp, 0,
                    c.local_deletion_time)
            else:
                add(KIND_CELL, clustering, is_static, c.column, c.path, c.value, c.timestamp, c.ttl,
                    c.local_deletion_time if c.ttl else NO_DELETION_TIME)

    if update.static_row is not None:
        row_records(update.static_row, b"", True)
    markers = []
    for u in update.unfiltereds:
        if isinstance(u, RangeTombstoneMarker):
            markers.append(u)
        else:
            row_records(u, encode_clustering(u.clustering), False)
    for start, start_incl, end, end_incl, d in range_tombstones(markers):
        add(KIND_RANGE_TOMBSTONE, encode_clustering(start), timestamp=d.marked_for_delete_at,
            ldt=d.local_deletion_time, clustering_end=encode_clustering(end), start_inclusive=start_incl,
            end_inclusive=end_incl)
    return out


def mutation_records(mutation, entry_index: int = 0) -> list:
    """Records of every partition update of ``mutation``; updates are numbered from ``entry_index``."""
    out = []
    for i, u in enumerate(mutation.updates):
        out += update_records(u, mutation.segment or "", mutation.segment_id or 0, mutation.position or 0,
                              entry_index + i)
    return out


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


def records_to_batch(records: list) -> pa.RecordBatch:
    """Build an Arrow record batch with CELL_LOG_SCHEMA from record dicts."""
    cols = {f.name: [r[f.name] for r in records] for f in CELL_LOG_SCHEMA}
    return pa.RecordBatch.from_pydict(cols, schema=CELL_LOG_SCHEMA)


class CellLogBuilder:
    """Accumulates records and hands out Arrow batches of about ``batch_rows`` rows."""

    def __init__(self, batch_rows: int = 65536):
        self.batch_rows = batch_rows
        self._records: list = []
        self._entry_index = 0

    def add_mutation(self, mutation) -> None:
        self._records += mutation_records(mutation, self._entry_index)
        self._entry_index += len(mutation.updates)

    def full(self) -> bool:
        return len(self._records) >= self.batch_rows

    def take(self) -> pa.RecordBatch:
        batch = records_to_batch(self._records)
        self._records = []
        return batch

    def __len__(self):
        return len(self._records)


SYSTEM_KEYSPACES = frozenset({"system", "system_schema", "system_auth", "system_distributed", "system_traces",
                              "system_views", "system_virtual_schema", "system_cluster_metadata"})


def read_cell_log(paths, schema=None, *, schema_from_log: bool = False, keys=None, batch_rows: int = 65536,
                  on_damage=None, start=None, stop=None, strict: bool = False, stats: dict | None = None):
    """Arrow batches (CELL_LOG_SCHEMA) of the user-table cells of ``paths``, in file order.

    Entries are decoded by the fast path (``celllog_fast``). An entry it cannot decode is decoded again by the
    reference decoder (``mutation``): the typed error it raises becomes a ``Damage`` record. Mutations of system
    keyspaces are not user data and are skipped (``system_schema`` ones update the schema when
    ``schema_from_log``); an unknown table id is Damage (``unknown_table``). Each Damage goes to ``on_damage``
    (required: the caller quarantines it; nothing is dropped here). ``stats`` (a dict) receives counters.
    ``entry_index`` counts partition updates per segment.
    """
    from .celllog_fast import FastCellLog
    from .commitlog import schema_source
    if on_damage is None:
        raise TypeError("read_cell_log needs on_damage: damaged or undecodable entries must go somewhere")
    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
        paths = [paths]
    counters = stats if stats is not None else {}
    for k in ("entries", "system_entries", "damaged", "records"):
        counters.setdefault(k, 0)
    src = schema_source(schema, schema_from_log)
    fast = FastCellLog()
    # Decoding allocates millions of acyclic tuples; the cyclic collector would rescan the growing record buffer
    # again and again (measured: 2.5x slower batches). It is paused while a batch is built.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield from _read_cell_log(paths, src, fast, keys, start, stop, strict, on_damage, counters, batch_rows,
                                  schema_from_log, gc_was_enabled)
    finally:
        if gc_was_enabled:
            gc.enable()


def _read_cell_log(paths, src, fast, keys, start, stop, strict, on_damage, counters, batch_rows, schema_from_log,
                   gc_was_enabled):
    import logging
    from .commitlog import decode_entry
    from .model import Mutation
    from .segment import Damage, SegmentReader
    from .wire import EXTRA_BYTES
    tables_by_raw_id: dict = {}     # 16 raw id bytes -> TableMetadata | None, for the schema in `cached_for`
    cached_for = None
    for path in paths:
        entry_index = 0
        for rec in SegmentReader(path, keys=keys, start=start, stop=stop, strict=strict):
            if isinstance(rec, Damage):
                counters["damaged"] += 1
                on_damage(rec)
                continue
            counters["entries"] += 1
            current = src.current()
            if current is not cached_for:
                tables_by_raw_id = {}
                cached_for = current
            data = rec.data
            p = 1 if data[0] < 0x80 else 1 + EXTRA_BYTES[data[0]]
            raw_id = data[p:p + 16]
            try:
                table = tables_by_raw_id[raw_id]
            except KeyError:
                tid = uuid.UUID(bytes=bytes(raw_id)) if len(raw_id) == 16 else None
                table = tables_by_raw_id[raw_id] = current.get(tid) if tid is not None else None
            if table is not None and table.keyspace in SYSTEM_KEYSPACES:
                counters["system_entries"] += 1
                if schema_from_log and table.keyspace == "system_schema":
                    out = decode_entry(rec, current)
                    if isinstance(out, Mutation):
                        src.observe(out)
                    else:
                        counters["damaged"] += 1
                        on_damage(out)
                continue
            n = None
            if table is not None and rec.messaging_version is not None:
                try:
                    n = fast.add_entry(rec.data, current, rec.messaging_version, rec.segment, rec.segment_id,
                                       rec.position, entry_index)
                except Exception:  # noqa: BLE001 - the reference decoder below gives the typed answer
                    n = None
            if n is None:
                out = decode_entry(rec, current)
                if isinstance(out, Damage):
                    if strict:
                        raise out.error()
                    counters["damaged"] += 1
                    on_damage(out)
                    continue
                logging.getLogger(__name__).warning(
                    "fast path and reference disagree on %s@%d; using the reference", rec.segment, rec.position)
                recs = mutation_records(out, entry_index)
                fast.add_records(recs)
                n = len(out.updates)
            entry_index += n
            if len(fast) >= batch_rows:
                counters["records"] += len(fast)
                batch = fast.to_batch()
                if gc_was_enabled:
                    gc.enable()          # the caller's code runs with the collector as it had it
                yield batch
                gc.disable()
    if len(fast):
        counters["records"] += len(fast)
        yield fast.to_batch()
