"""Typed mutations to cell-log records: the reference conversion (the fast path in ``fast`` must agree with it)."""
from __future__ import annotations

import pyarrow as pa

from .schema import (CELL_LOG_SCHEMA, KIND_CELL, KIND_CELL_TOMBSTONE, KIND_COMPLEX_DELETION, KIND_PARTITION_DELETION,
                     KIND_RANGE_TOMBSTONE, KIND_ROW_DELETION, KIND_ROW_DELETION_SHADOWABLE, KIND_ROW_LIVENESS,
                     encode_clustering)


def range_tombstones(markers) -> list:
    """Pair a partition update's markers into ranges: (start_values, start_incl, end_values, end_incl, deletion).

    Markers arrive in clustering order as start bound, boundaries, end bound (format reference §12.3).
    """
    from cdc_lib.commitlog.model import BoundKind
    from cdc_lib.errors import MutationError
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


def row_record_fields(row) -> list:
    """(kind, column, path, value, timestamp, ttl, local_deletion_time) of each record of one row, in order:
    liveness, deletion, complex deletions, cells."""
    from cdc_lib.commitlog.model import NO_DELETION_TIME, NO_TIMESTAMP
    out = []
    lv = row.liveness
    if lv is not None and lv.timestamp != NO_TIMESTAMP:
        out.append((KIND_ROW_LIVENESS, None, None, None, lv.timestamp, lv.ttl,
                    lv.local_expiration_time if lv.ttl else NO_DELETION_TIME))
    if row.deletion is not None and not row.deletion.is_live:
        out.append((KIND_ROW_DELETION_SHADOWABLE if row.shadowable else KIND_ROW_DELETION, None, None, None,
                    row.deletion.marked_for_delete_at, 0, row.deletion.local_deletion_time))
    for col, d in row.complex_deletions.items():
        out.append((KIND_COMPLEX_DELETION, col, None, None, d.marked_for_delete_at, 0, d.local_deletion_time))
    for c in row.cells:
        if c.is_tombstone:
            out.append((KIND_CELL_TOMBSTONE, c.column, c.path, c.value, c.timestamp, 0, c.local_deletion_time))
        else:
            out.append((KIND_CELL, c.column, c.path, c.value, c.timestamp, c.ttl,
                        c.local_deletion_time if c.ttl else NO_DELETION_TIME))
    return out


def update_records(update, segment: str, segment_id: int, position: int, entry_index: int,
                   mutation_id: bytes | None = None) -> list:
    """The cell-log records (dicts keyed like CELL_LOG_SCHEMA) of one partition update, in written order;
    ``mutation_id`` is that of the mutation the update belongs to."""
    from cdc_lib.commitlog.model import NO_DELETION_TIME, NO_TIMESTAMP, RangeTombstoneMarker
    from cdc_lib.cql.tokens import token as murmur3_token
    table = update.table
    base = {
        "segment": segment, "segment_id": segment_id, "position": position, "entry_index": entry_index,
        "table_id": str(update.table_id), "keyspace": table.keyspace, "table": table.name,
        "partition_key": update.partition_key, "token": murmur3_token(update.partition_key),
        "mutation_id": mutation_id,
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
        for kind, column, path, value, ts, ttl, ldt in row_record_fields(row):
            add(kind, clustering, is_static, column, path, value, ts, ttl, ldt)

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
                              entry_index + i, mutation.mutation_id)
    return out


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
