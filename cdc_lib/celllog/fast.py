"""The decoder's hot loop: mutation bytes straight to cell-log columns, without building model objects.

This is the fast path behind ``celllog.read_cell_log``; ``commitlog.mutation.decode_mutation`` + ``celllog.update_records``
is the reference it must agree with (the tests decode the same bytes both ways and compare every record).
It is deliberately one self-contained function over plain ints, bytes and lists (no dataclasses, no
attribute lookups in the inner loop) so that a compiled version (Cython/Rust) can replace ``decode_into``
later behind the same API, as fastavro does.

On any problem it raises; the caller discards what this entry appended (``FastCellLog.add_entry`` does) and
re-decodes the entry with the reference decoder, which produces the typed error. There is one truth for the
format and one for the errors: the reference.
"""
from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa

from cdc_lib import wire
from cdc_lib.commitlog.model import mutation_id
from cdc_lib.cql.tokens import token as murmur3_token
from cdc_lib.gcpause import gc_paused

from .schema import CELL_LOG_SCHEMA, binary_array, encode_clustering

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
_B63 = 1 << 63
_B31 = 1 << 31
_TS_EPOCH = 1442880000000000
_LDT_EPOCH = 1442880000
_NO_TS = -(1 << 63)
_NO_LDT = (1 << 31) - 1
_read_uvint = wire.read_uvint

# kinds (same strings as celllog.KIND_*)
_CELL, _TOMB, _LIVE, _RDEL, _RDELS, _CDEL, _PDEL, _RT = (
    "cell", "cell_tombstone", "row_liveness", "row_deletion", "row_deletion_shadowable", "complex_deletion",
    "partition_deletion", "range_tombstone")


NFIELDS = 13   # values per record in FastCellLog.rows


class _TableLayout:
    """What the hot loop needs of a table, precomputed once per TableMetadata."""

    __slots__ = ("table", "id_str", "keyspace", "name", "clustering_fixed", "columns", "last_static",
                 "last_regular")

    def __init__(self, table):
        self.table = table
        self.id_str = str(table.id)
        self.keyspace = table.keyspace
        self.name = table.name
        self.clustering_fixed = [c.type.fixed_length for c in table.clustering]
        self.columns = {}   # name bytes -> (name str, is_complex, fixed_length)
        self.last_static = None    # (raw header bytes, parsed columns) of the last static column header
        self.last_regular = None

    def column(self, raw: bytes):
        c = self.columns.get(raw)
        if c is None:
            name = raw.decode("utf-8")
            col = self.table.column_for_data(name)
            c = (name, col.type.multicell, col.type.fixed_length)
            self.columns[raw] = c
        return c


class FastCellLog:
    """Accumulates cell-log records of many entries; ``to_batch()`` returns them as an Arrow batch."""

    def __init__(self):
        self.updates = []      # per partition update: (segment, segment_id, position, entry_index, table_id,
                               #                        keyspace, table, partition_key, token, mutation_id)
        self.rows = []         # flat: NFIELDS values per record: (update_index, clustering, clustering_end, start_incl,
                               #              end_incl, is_static, kind, column, path, value, ts, ttl, ldt)
        self._layouts = {}     # (id(schema), table id bytes) -> _TableLayout
        self._schema_ref = None

    def __len__(self):
        return len(self.rows) // NFIELDS

    def _layout(self, schema, tid: bytes):
        if self._schema_ref is not schema:           # a new schema version: drop layouts of the old one
            self._layouts = {}
            self._schema_ref = schema
        lay = self._layouts.get(tid)
        if lay is None:
            lay = _TableLayout(schema.table(uuid.UUID(bytes=tid)))
            self._layouts[tid] = lay
        return lay

    def add_entry(self, data: bytes, schema, messaging_version: int, segment: str, segment_id: int,
                  position: int, entry_index: int) -> int:
        """Append the records of one mutation; returns its number of partition updates. On error nothing of
        this entry is kept and the exception propagates (decode with the reference for the typed error)."""
        nu, nr = len(self.updates), len(self.rows)
        with gc_paused():
            try:
                return decode_into(self, data, schema, messaging_version, segment, segment_id, position,
                                   entry_index)
            except BaseException:
                del self.updates[nu:]
                del self.rows[nr:]
                raise

    def add_records(self, records: list) -> None:
        """Append reference records (dicts, as ``celllog.update_records`` makes them)."""
        index = {}
        for r in records:
            key = (r["segment"], r["position"], r["entry_index"])
            if key not in index:
                index[key] = len(self.updates)
                self.updates.append((r["segment"], r["segment_id"], r["position"], r["entry_index"],
                                     r["table_id"], r["keyspace"], r["table"], r["partition_key"], r["token"],
                                     r["mutation_id"]))
            self.rows.extend((index[key], r["clustering"], r["clustering_end"], r["start_inclusive"],
                              r["end_inclusive"], r["is_static"], r["kind"], r["column"], r["path"], r["value"],
                              r["timestamp"], r["ttl"], r["local_deletion_time"]))

    def to_batch(self) -> pa.RecordBatch:
        with gc_paused():
            return self._to_batch()

    def _to_batch(self) -> pa.RecordBatch:
        ups = self.updates
        rows = self.rows
        # the flat list is transposed by strided slices (C speed)
        (uidx, clustering, clustering_end, start_incl, end_incl, is_static, kind, column, path, value,
         ts, ttl, ldt) = (rows[i::NFIELDS] for i in range(NFIELDS))
        idx_np = np.asarray(uidx, dtype=np.int32)
        idx = pa.array(idx_np)
        # records of one update are contiguous: seq = index - index of the update's first record
        seq = np.arange(len(idx_np), dtype=np.int32) - np.searchsorted(idx_np, idx_np).astype(np.int32)
        names = ("segment", "segment_id", "position", "entry_index", "table_id", "keyspace", "table",
                 "partition_key", "token", "mutation_id")
        upd_cols = list(zip(*ups)) if ups else [()] * len(names)
        arrays = {}
        for name, values in zip(names, upd_cols):
            typ = CELL_LOG_SCHEMA.field(name).type
            arr = binary_array(values) if typ == pa.binary() else pa.array(values, typ)
            arrays[name] = arr.take(idx)
        own = {"seq": seq, "clustering": clustering, "clustering_end": clustering_end,
               "start_inclusive": start_incl, "end_inclusive": end_incl, "is_static": is_static, "kind": kind,
               "column": column, "path": path, "value": value, "timestamp": ts, "ttl": ttl,
               "local_deletion_time": ldt}
        for name, values in own.items():
            typ = CELL_LOG_SCHEMA.field(name).type
            arrays[name] = binary_array(values) if typ == pa.binary() else pa.array(values, typ)
        batch = pa.RecordBatch.from_arrays([arrays[f.name] for f in CELL_LOG_SCHEMA], schema=CELL_LOG_SCHEMA)
        self.updates = []
        self.rows = []
        return batch


def decode_into(log: FastCellLog, buf: bytes, schema, mv: int, segment: str, segment_id: int, position: int,
                entry_index: int) -> int:
    """The hot loop. Layout as in ``commitlog.mutation.py`` (format reference §9-§17)."""
    rows_append = log.rows.extend      # flat list: NFIELDS values per record
    mid = mutation_id(buf)             # every record of the entry belongs to this mutation
    unsigned_ldt = mv >= 13
    end = len(buf)
    p = 0

    # ---- number of partition updates
    b = buf[p]
    if b < 0x80:
        n_updates = b
        p += 1
    else:
        n_updates, p = _read_uvint(buf, p)
    if n_updates <= 0 or n_updates > end:
        raise ValueError("implausible update count")

    for u_i in range(n_updates):
        tid = buf[p:p + 16]
        p += 16
        lay = log._layout(schema, tid)
        b = buf[p]
        if b < 0x80:
            klen = b
            p += 1
        else:
            klen, p = _read_uvint(buf, p)
        key = buf[p:p + klen]
        if len(key) != klen:
            raise ValueError("truncated key")
        p += klen
        uidx = len(log.updates)
        log.updates.append((segment, segment_id, position, entry_index + u_i, lay.id_str, lay.keyspace,
                            lay.name, key, murmur3_token(key), mid))
        flags = buf[p]
        p += 1
        if flags & 0x01:
            continue
        if flags & 0x02:
            raise ValueError("reversed partition update")
        # encoding stats
        u, p = _read_uvint(buf, p)
        ts0 = ((u + _TS_EPOCH + _B63) & _M64) - _B63
        u, p = _read_uvint(buf, p)
        ldt0 = ((u + _LDT_EPOCH + _B31) & _M32) - _B31
        u, p = _read_uvint(buf, p)
        ttl0 = ((u + _B31) & _M32) - _B31
        static_cols = ()
        if flags & 0x08:
            static_cols, p = _header(buf, p, lay, True)
        regular_cols, p = _header(buf, p, lay, False)
        if flags & 0x04:
            dts, dldt, p = decode_deletion(buf, p, ts0, ldt0, unsigned_ldt)
            if dts != _NO_TS:                       # a deletion at Long.MIN_VALUE deletes nothing: LIVE
                rows_append((uidx, b"", None, None, None, False, _PDEL, None, None, None, dts, 0, dldt))
        cfixed = lay.clustering_fixed
        ncl = len(cfixed)
        markers = []
        static_next = bool(flags & 0x08)
        if flags & 0x10 and not static_next:
            u, p = _read_uvint(buf, p)               # row estimate (after the static row when there is one)
        while True:
            flags_r = buf[p]
            p += 1
            if static_next:
                is_static = True
                static_next = False
                if flags_r & 0x03:
                    raise ValueError("static row expected")
            else:
                is_static = False
                if flags_r & 0x01:
                    break
            if flags_r & 0x02:                   # range tombstone marker
                kind_ord = buf[p]
                size = (buf[p + 1] << 8) | buf[p + 2]
                p += 3
                if size > ncl:
                    raise ValueError("bound longer than the clustering")
                values, p = decode_clustering_values(buf, p, cfixed, size)
                d1ts, d1ldt, p = decode_deletion(buf, p, ts0, ldt0, unsigned_ldt)
                if kind_ord == 2 or kind_ord == 5:
                    d2ts, d2ldt, p = decode_deletion(buf, p, ts0, ldt0, unsigned_ldt)
                    markers.append((kind_ord, values, (d1ts, d1ldt), (d2ts, d2ldt)))
                elif kind_ord in (0, 1, 6, 7):
                    markers.append((kind_ord, values, (d1ts, d1ldt), None))
                else:
                    raise ValueError("bad bound kind")
                continue
            ext = 0
            if flags_r & 0x80:
                ext = buf[p]
                p += 1
            if is_static:
                if not ext & 0x01:
                    raise ValueError("static row expected")
                cl = b""
                header_cols = static_cols
            else:
                if ext & 0x01:
                    raise ValueError("static row among rows")
                values, p = decode_clustering_values(buf, p, cfixed, ncl)
                cl = encode_clustering(values) if ncl else b""
                header_cols = regular_cols
            p = decode_row_body(rows_append, buf, p, end, flags_r, ext, uidx, cl, is_static, header_cols, ts0,
                                ldt0, ttl0, unsigned_ldt)
            if is_static and flags & 0x10:
                u, p = _read_uvint(buf, p)                      # row estimate follows the static row
        # range tombstones after the rows, paired as the reference pairs them
        if markers:
            open_ = None
            for kind_ord, values, d1, d2 in markers:
                if kind_ord == 1 or kind_ord == 7:
                    if open_ is not None:
                        raise ValueError("range opened twice")
                    open_ = (values, kind_ord == 1, d1)
                elif kind_ord == 2 or kind_ord == 5:
                    if open_ is None or open_[2] != d1:
                        raise ValueError("boundary without open range")
                    end_incl = kind_ord == 5
                    rows_append((uidx, encode_clustering(open_[0]), encode_clustering(values), open_[1],
                                 end_incl, False, _RT, None, None, None, d1[0], 0, d1[1]))
                    open_ = (values, not end_incl, d2)
                else:
                    if open_ is None or open_[2] != d1:
                        raise ValueError("close without open range")
                    rows_append((uidx, encode_clustering(open_[0]), encode_clustering(values), open_[1],
                                 kind_ord == 6, False, _RT, None, None, None, open_[2][0], 0, open_[2][1]))
                    open_ = None
            if open_ is not None:
                raise ValueError("range left open")
    if p != end:
        raise ValueError("trailing bytes")
    return n_updates


def decode_row_body(rows_append, buf, p: int, end: int, flags_r: int, ext: int, uidx: int, cl: bytes,
                    is_static: bool, header_cols, ts0: int, ldt0: int, ttl0: int, unsigned_ldt: bool) -> int:
    """A row's records from its liveness on (after flags, extended flags, clustering and, in SSTables, the row
    sizes): liveness, deletion, column subset, cells. Shared by the commit-log loop (``decode_into``) and the
    SSTable loop (``cdc_lib.sstable.fast``), as the byte layout is the same; ``header_cols`` holds
    (name, is_complex, fixed_length) per header column. Returns the position after the row."""
    no_ldt_read = _M32 if unsigned_ldt else _NO_LDT
    has_lv = flags_r & 0x04                  # the row's liveness, which cells may take their timestamp/TTL from
    lts = _NO_TS
    lttl = 0
    lldt = no_ldt_read
    if has_lv:
        u, p = _read_uvint(buf, p)
        lts = ((u + ts0 + _B63) & _M64) - _B63
        if flags_r & 0x08:
            u, p = _read_uvint(buf, p)
            lttl = ((((u if u < 0x80000000 else (u & _M32) - ((u & _B31) << 1)) + ttl0) + _B31) & _M32) - _B31
            u, p = _read_uvint(buf, p)
            x = (u if u < 0x80000000 else (u & _M32) - ((u & _B31) << 1)) + ldt0
            lldt = (x & _M32) if unsigned_ldt else ((x + _B31) & _M32) - _B31
        if lts != _NO_TS:                    # a liveness without a timestamp is no row marker
            rows_append((uidx, cl, None, None, None, is_static, _LIVE, None, None, None, lts, lttl,
                         lldt if lttl else _NO_LDT))
    if flags_r & 0x10:
        rts, rldt, p = decode_deletion(buf, p, ts0, ldt0, unsigned_ldt)
        if rts != _NO_TS:                    # a deletion at Long.MIN_VALUE deletes nothing: LIVE
            rows_append((uidx, cl, None, None, None, is_static, _RDELS if ext & 0x02 else _RDEL, None,
                         None, None, rts, 0, rldt))
    if flags_r & 0x20:
        row_cols = header_cols
    else:
        u, p = _read_uvint(buf, p)
        nh = len(header_cols)
        if u == 0:
            row_cols = header_cols
        elif nh < 64:
            if u >> nh:
                raise ValueError("bad subset")
            row_cols = [c for i, c in enumerate(header_cols) if not (u >> i) & 1]
        else:                                # large subset: ascending indexes of the present or absent columns
            count = nh - u
            if count < 0:
                raise ValueError("bad subset")
            listed_present = count < nh // 2
            listed = []
            last = -1
            for _ in range(count if listed_present else u):
                v, p = _read_uvint(buf, p)
                if v <= last or v >= nh:
                    raise ValueError("bad subset")
                listed.append(v)
                last = v
            if listed_present:
                row_cols = [header_cols[i] for i in listed]
            else:
                absent = set(listed)
                row_cols = [c for i, c in enumerate(header_cols) if i not in absent]
    has_cdel = flags_r & 0x40
    if has_cdel:                             # complex deletions are recorded before the row's cells
        pending_cdel = []
        cell_buf = []
        cell_append = cell_buf.extend
    else:
        cell_append = rows_append
    for name, is_complex, fixed in row_cols:
        if is_complex:
            if has_cdel:
                cts, cldt, p = decode_deletion(buf, p, ts0, ldt0, unsigned_ldt)
                if cts != _NO_TS:
                    pending_cdel.extend((uidx, cl, None, None, None, is_static, _CDEL, name, None,
                                         None, cts, 0, cldt))
            b = buf[p]
            if b < 0x80:
                ncells = b
                p += 1
            else:
                ncells, p = _read_uvint(buf, p)
        else:
            ncells = 1
        for _ in range(ncells):
            cf = buf[p]
            p += 1
            if cf & 0x08:
                if not has_lv:
                    raise ValueError("cell uses missing row timestamp")
                cts = lts
            else:
                b = buf[p]
                if b < 0x80:
                    u = b
                    p += 1
                else:
                    u, p = _read_uvint(buf, p)
                cts = ((u + ts0 + _B63) & _M64) - _B63
            cttl = 0
            cldt = _NO_LDT
            if cf & 0x10:
                if not has_lv:
                    raise ValueError("cell uses missing row ttl")
                cttl = lttl
                cldt = lldt
            elif cf & 0x03:
                u, p = _read_uvint(buf, p)
                x = (u if u < 0x80000000 else (u & _M32) - ((u & _B31) << 1)) + ldt0
                cldt = (x & _M32) if unsigned_ldt else ((x + _B31) & _M32) - _B31
                if cf & 0x02:
                    u, p = _read_uvint(buf, p)
                    cttl = ((((u if u < 0x80000000 else (u & _M32) - ((u & _B31) << 1)) + ttl0) + _B31) & _M32) - _B31
            if is_complex:
                b = buf[p]
                if b < 0x80:
                    ln = b
                    p += 1
                else:
                    ln, p = _read_uvint(buf, p)
                path = buf[p:p + ln]
                p += ln
            else:
                path = None
            if cf & 0x04:
                value = b""
            elif fixed is not None and not is_complex:
                value = buf[p:p + fixed]
                p += fixed
            else:
                b = buf[p]
                if b < 0x80:
                    ln = b
                    p += 1
                else:
                    ln, p = _read_uvint(buf, p)
                    if ln >= 0x80000000:
                        raise ValueError("negative length")
                value = buf[p:p + ln]
                p += ln
            if cf & 0x01:
                cell_append((uidx, cl, None, None, None, is_static, _TOMB, name, path, value, cts, 0,
                             cldt))
            else:
                cell_append((uidx, cl, None, None, None, is_static, _CELL, name, path, value, cts,
                             cttl, cldt if cttl else _NO_LDT))
    if p > end:
        raise ValueError("truncated")
    if has_cdel:
        rows_append(pending_cdel)
        rows_append(cell_buf)
    return p


def decode_deletion(buf, p, ts0, ldt0, unsigned_ldt):
    """A delta-encoded DeletionTime: (marked_for_delete_at, local_deletion_time, next position)."""
    u, p = _read_uvint(buf, p)
    ts = ((u + ts0 + _B63) & _M64) - _B63
    u, p = _read_uvint(buf, p)
    x = (u if u < 0x80000000 else (u & _M32) - ((u & _B31) << 1)) + ldt0
    return ts, ((x & _M32) if unsigned_ldt else ((x + _B31) & _M32) - _B31), p


def _header(buf, p, lay, static: bool):
    """A column header; headers repeat from one mutation to the next, so the last parse is reused when the
    bytes match (one C-level ``startswith`` instead of parsing every name)."""
    last = lay.last_static if static else lay.last_regular
    if last is not None and buf.startswith(last[0], p):
        return last[1], p + len(last[0])
    cols, q = _columns(buf, p, lay.column)
    if static:
        lay.last_static = (buf[p:q], cols)
    else:
        lay.last_regular = (buf[p:q], cols)
    return cols, q


def _columns(buf, p, column_of):
    n, p = _read_uvint(buf, p)
    if n > len(buf) - p:
        raise ValueError("implausible column count")
    cols = []
    for _ in range(n):
        ln, p = _read_uvint(buf, p)
        raw = buf[p:p + ln]
        if len(raw) != ln:
            raise ValueError("truncated column name")
        cols.append(column_of(raw))
        p += ln
    return tuple(cols), p


def decode_clustering_values(buf, p, fixed_lengths, size):
    """The first ``size`` values of a clustering prefix (``None`` null, ``b""`` empty) and the next position."""
    values = []
    header = 0
    for i in range(size):
        if i % 32 == 0:
            b = buf[p]
            if b < 0x80:
                header = b
                p += 1
            else:
                header, p = _read_uvint(buf, p)
        j = (i % 32) * 2
        if header & (2 << j):
            values.append(None)
        elif header & (1 << j):
            values.append(b"")
        else:
            f = fixed_lengths[i]
            if f is None:
                b = buf[p]
                if b < 0x80:
                    ln = b
                    p += 1
                else:
                    ln, p = _read_uvint(buf, p)
                f = ln
            v = buf[p:p + f]
            if len(v) != f:
                raise ValueError("truncated clustering value")
            values.append(v)
            p += f
    return values, p
