"""SSTables straight to the Arrow cell log: the hot loop, and the streaming reader around it.

``decode_run`` is the SSTable counterpart of ``celllog.fast.decode_into``: one self-contained function over
plain ints and bytes that turns a piece of D (the uncompressed Data.db stream) into cell-log records, sharing
the row body decoder (``celllog.fast.decode_row_body``) with the commit-log loop. What it adds is what SSTables
add: the partition header, the static row, the row and marker sizes (checked), and range tombstone markers
paired as they come (a partition can be far larger than memory, so its ranges cannot wait for its end).

It runs until its bytes end. A structure cut by the end of the window, and anything it cannot decode, makes it
stop; ``read_sstable_cell_log`` then decodes that one structure with the reference decoder (``reader.SSTable``),
which grows the window as far as the structure needs and gives the typed error for damaged bytes. So, as for
commit logs, the reference is the one truth for the format and for errors; a compiled ``decode_run`` can
replace this one behind the same tests.

Records (``CELL_LOG_SCHEMA``) of SSTables carry: ``segment`` = the Data.db file name, ``segment_id`` = the
SSTable generation, ``position`` = the partition's offset in D, ``entry_index`` = the partition's number in the
file, ``seq`` = the record's number within the partition; the other columns mean what they mean for commit
logs. Range tombstone records come when the range closes, not after the partition's rows.
"""
from __future__ import annotations

import bisect
import gc
import logging
import struct

import pyarrow as pa
import pyarrow.compute as pc

from cdc_lib import wire
from cdc_lib.celllog.fast import NFIELDS, FastCellLog, decode_clustering_values, decode_deletion, decode_row_body
from cdc_lib.celllog.records import row_record_fields
from cdc_lib.celllog.schema import KIND_PARTITION_DELETION, KIND_RANGE_TOMBSTONE, encode_clustering
from cdc_lib.commitlog.model import NO_TIMESTAMP, RangeTombstoneMarker
from cdc_lib.commitlog.segment import Damage
from cdc_lib.cql.tokens import token as murmur3_token
from cdc_lib.errors import SSTableError

from .chunks import Window
from .descriptor import find_data_files
from .reader import Damaged, SSTable, damage_error, open_sstable

logger = logging.getLogger(__name__)

_read_uvint = wire.read_uvint
_NO_TS = NO_TIMESTAMP
_PDEL = KIND_PARTITION_DELETION
_RT = KIND_RANGE_TOMBSTONE
_I32_I64 = struct.Struct(">iq")
_U32 = struct.Struct(">I")
MIN_RUN = 1 << 16               # the window holds at least this much (unless D ends) before a run


class _Cut(Exception):
    """The structure being read continues past the bytes at hand."""


class ScanState:
    """Where the scan of one SSTable is, and what the hot loop needs of it, precomputed."""

    __slots__ = ("uidx", "partition_start", "prev", "open_rt", "entry", "failed_at", "segment", "segment_id",
                 "table_id", "keyspace", "table", "cfixed", "static_cols", "regular_cols", "ts0", "ldt0", "ttl0",
                 "unsigned_ldt", "uint_partition_deletion")

    def __init__(self, sst: SSTable):
        t = sst.table
        h = sst.header
        self.uidx = None                # index in FastCellLog.updates of the partition being read; None between
        self.partition_start = 0        # D offset of that partition
        self.prev = 0                   # D offset of its previous unfiltered (or of the partition)
        self.open_rt = None             # (start values, start inclusive, (ts, ldt)) of an open range tombstone
        self.entry = 0                  # partitions started so far (entry_index)
        self.failed_at = 0              # D offset of the structure decode_run stopped at
        self.segment = sst.name
        self.segment_id = sst.desc.generation_number
        self.table_id = str(t.id)
        self.keyspace = t.keyspace
        self.table = t.name
        self.cfixed = [c.type.fixed_length for c in t.clustering]
        self.static_cols = _layout(t, sst.static_columns)
        self.regular_cols = _layout(t, sst.regular_columns)
        self.ts0 = h.stats.min_timestamp
        self.ldt0 = h.stats.min_local_deletion_time
        self.ttl0 = h.stats.min_ttl
        self.unsigned_ldt = sst.messaging_version >= 13
        self.uint_partition_deletion = sst.version.uint_deletion_time

    def start_partition(self, log: FastCellLog, position: int, key: bytes) -> int:
        uidx = len(log.updates)
        # mutation_id None: an SSTable holds merged state, not the mutations that made it
        log.updates.append((self.segment, self.segment_id, position, self.entry, self.table_id, self.keyspace,
                            self.table, key, murmur3_token(key), None))
        self.entry += 1
        self.uidx = uidx
        self.partition_start = position
        self.prev = position
        self.open_rt = None
        return uidx


def _layout(table, names) -> tuple:
    """(name, is complex, fixed length) of each header column, typed as the reference decoder types it."""
    return tuple((n, table.column_for_data(n).type.multicell, table.column_for_data(n).type.fixed_length)
                 for n in names)


def pair_marker(st: ScanState, rows_append, uidx: int, kind_ord: int, values, d1: tuple, d2) -> None:
    """Fold one range tombstone marker into the open range; a closed range becomes a record (format reference
    CL §12.3: markers come as start bound, boundaries, end bound)."""
    open_ = st.open_rt
    if kind_ord == 1 or kind_ord == 7:                   # INCL_START / EXCL_START
        if open_ is not None:
            raise SSTableError("range tombstone opened twice without a close")
        st.open_rt = (values, kind_ord == 1, d1)
    elif kind_ord == 2 or kind_ord == 5:                 # boundaries: close with d1 (end), open with d2 (start)
        if open_ is None:
            raise SSTableError("range tombstone boundary without an open range")
        end_incl = kind_ord == 5
        rows_append((uidx, encode_clustering(open_[0]), encode_clustering(values), open_[1], end_incl, False, _RT,
                     None, None, None, d1[0], 0, d1[1]))
        st.open_rt = (values, not end_incl, d2)
    elif kind_ord == 0 or kind_ord == 6:                 # EXCL_END / INCL_END
        if open_ is None:
            raise SSTableError("range tombstone closed without an open range")
        rows_append((uidx, encode_clustering(open_[0]), encode_clustering(values), open_[1], kind_ord == 6, False,
                     _RT, None, None, None, open_[2][0], 0, open_[2][1]))
        st.open_rt = None
    else:
        raise SSTableError(f"bound kind {kind_ord} cannot appear in a range tombstone marker")


def decode_run(st: ScanState, log: FastCellLog, buf: bytes, p: int, base: int, full: int) -> int:
    """The hot loop: records of the partitions and unfiltereds in ``buf[p:]`` (``buf[0]`` is D offset
    ``base``). Returns the position where it stopped, at a structure boundary: the end of the bytes, or the
    first boundary after ``log.rows`` reached ``full`` values. On a structure it cannot finish (cut by the end
    of ``buf``, or undecodable) it raises, with ``st.failed_at`` at that structure's D offset and none of its
    records kept."""
    rows = log.rows
    rows_append = rows.extend
    n = len(buf)
    cfixed = st.cfixed
    ncl = len(cfixed)
    regular_cols = st.regular_cols
    ts0, ldt0, ttl0, unsigned_ldt = st.ts0, st.ldt0, st.ttl0, st.unsigned_ldt
    u = p
    mark = len(rows)
    try:
        while p < n:
            u = p
            mark = len(rows)
            if mark >= full:
                break
            uidx = st.uidx
            if uidx is None:
                p = _partition_head(st, log, buf, p, base)
                continue
            flags = buf[p]
            if flags & 0x01:                                     # end of partition
                if st.open_rt is not None:
                    raise SSTableError("range tombstone left open at the end of the partition")
                st.uidx = None
                p += 1
                continue
            if flags & 0x02:                                     # range tombstone marker
                kind_ord = buf[p + 1]
                size = (buf[p + 2] << 8) | buf[p + 3]
                if size > ncl:
                    raise SSTableError("marker bound longer than the clustering")
                values, q = decode_clustering_values(buf, p + 4, cfixed, size)
                msize, q = _read_uvint(buf, q)
                body_end = q + msize
                if body_end > n:
                    raise _Cut
                prev, q = _read_uvint(buf, q)
                if prev != base + u - st.prev:
                    raise SSTableError("previous unfiltered size mismatch")
                d1ts, d1ldt, q = decode_deletion(buf, q, ts0, ldt0, unsigned_ldt)
                d2 = None
                if kind_ord == 2 or kind_ord == 5:
                    d2ts, d2ldt, q = decode_deletion(buf, q, ts0, ldt0, unsigned_ldt)
                    d2 = (d2ts, d2ldt)
                if q != body_end:
                    raise SSTableError("marker size mismatch")
                pair_marker(st, rows_append, uidx, kind_ord, values, (d1ts, d1ldt), d2)
                st.prev = base + u
                p = q
                continue
            q = p + 1
            ext = 0
            if flags & 0x80:
                ext = buf[q]
                q += 1
                if ext & 0x01:
                    raise SSTableError("static row among clustering rows")
            values, q = decode_clustering_values(buf, q, cfixed, ncl)
            cl = encode_clustering(values) if ncl else b""
            b = buf[q]
            if b < 0x80:
                size = b
                q += 1
            else:
                size, q = _read_uvint(buf, q)
            body_end = q + size
            if body_end > n:
                raise _Cut
            b = buf[q]
            if b < 0x80:
                prev = b
                q += 1
            else:
                prev, q = _read_uvint(buf, q)
            if prev != base + u - st.prev:
                raise SSTableError("previous unfiltered size mismatch")
            q = decode_row_body(rows_append, buf, q, body_end, flags, ext, uidx, cl, False, regular_cols, ts0, ldt0,
                                ttl0, unsigned_ldt)
            if q != body_end:
                raise SSTableError("row size mismatch")
            st.prev = base + u
            p = q
    except Exception:
        del rows[mark:]
        st.failed_at = base + u
        raise
    return p


def _partition_head(st: ScanState, log: FastCellLog, buf: bytes, p: int, base: int) -> int:
    """Key, partition deletion and static row: records appended, the partition started; returns the position
    after the header."""
    n = len(buf)
    klen = (buf[p] << 8) | buf[p + 1]
    q = p + 2 + klen
    if q + 1 > n:
        raise _Cut
    key = buf[p + 2:q]
    if st.uint_partition_deletion:
        b0 = buf[q]
        if b0 & 0x80:
            if b0 != 0x80:
                raise SSTableError("bad partition deletion")
            mfda = _NO_TS
            q += 1
        else:
            if q + 12 > n:
                raise _Cut
            mfda = int.from_bytes(buf[q:q + 8], "big")
            ldt = _U32.unpack_from(buf, q + 8)[0]
            q += 12
    else:
        if q + 12 > n:
            raise _Cut
        ldt, mfda = _I32_I64.unpack_from(buf, q)
        q += 12
    uidx = len(log.updates)
    rows_append = log.rows.extend
    if mfda != _NO_TS:
        rows_append((uidx, b"", None, None, None, False, _PDEL, None, None, None, mfda, 0, ldt))
    if st.static_cols:
        flags = buf[q]
        if flags & 0x03 or not flags & 0x80 or not buf[q + 1] & 0x01:
            raise SSTableError("static row expected")
        size, r = _read_uvint(buf, q + 2)
        body_end = r + size
        if body_end > n:
            raise _Cut
        prev, r = _read_uvint(buf, r)
        if prev != 0:
            raise SSTableError("static row with a previous unfiltered size")
        r = decode_row_body(rows_append, buf, r, body_end, flags, buf[q + 1], uidx, b"", True, st.static_cols,
                            st.ts0, st.ldt0, st.ttl0, st.unsigned_ldt)
        if r != body_end:
            raise SSTableError("static row size mismatch")
        q = r
    st.start_partition(log, base + p, key)
    return q


class _CellLogScan:
    """``read_sstable_cell_log`` for one call: the shared record buffer and the per-SSTable loop."""

    def __init__(self, schema, batch_rows: int, on_damage, strict: bool, counters: dict):
        self.schema = schema
        self.batch_rows = batch_rows
        self.on_damage = on_damage
        self.strict = strict
        self.counters = counters
        self.log = FastCellLog()
        self.st = None
        self.first_seq_base = 0         # records the partition continued as update 0 had in earlier batches

    def damage(self, d: Damage) -> None:
        if self.strict:
            raise damage_error(d)
        self.counters["damaged"] += 1
        self.on_damage(d)

    def sstable(self, path):
        """Batches (when full) of one SSTable's records; damage goes to ``on_damage``."""
        sst = open_sstable(path, self.schema, strict=self.strict)
        if isinstance(sst, Damage):
            self.damage(sst)
            return
        self.counters["sstables"] += 1
        unchecked = sst.stream.unchecked()
        if unchecked is not None:
            self.damage(unchecked)
        st = self.st = ScanState(sst)
        log = self.log
        win = Window(sst.stream)
        pos = 0
        length = sst.length
        full = self.batch_rows * NFIELDS
        while pos is not None and pos < length:
            win.extend(pos, MIN_RUN)
            base = win.base
            stopped = False
            try:
                pos = base + decode_run(st, log, win.buf, pos - base, base, full)
            except Exception:  # noqa: BLE001 - the reference decoder below gives the typed answer
                stopped = True
            if not stopped and (pos < win.end or pos >= length or not (win.gap or win.at_end)):
                if len(log) >= self.batch_rows:
                    yield self.flush()
                continue
            at = st.failed_at if stopped else pos
            pos = self.reference(sst, win, at, win.end)
            if len(log) >= self.batch_rows:
                yield self.flush()
        if pos is not None and st.uidx is not None:
            self.damage(Damage(sst.name, st.partition_start, "undecodable",
                               f"Data.db ends inside the partition at {st.partition_start}"))
            st.uidx = None
        self.counters["partitions"] += st.entry

    def reference(self, sst: SSTable, win, at: int, window_end: int):
        """Decode the one structure at D offset ``at`` with the reference decoder; its records, or its Damage.
        Returns where to go on (None: the SSTable ends here)."""
        st, log = self.st, self.log
        rows_append = log.rows.extend
        try:
            if st.uidx is None:
                head, nxt = sst.decode(win, at, lambda r: sst.read_partition_head(r, at))
                uidx = len(log.updates)
                if head.deletion is not None:
                    d = head.deletion
                    rows_append((uidx, b"", None, None, None, False, _PDEL, None, None, None,
                                 d.marked_for_delete_at, 0, d.local_deletion_time))
                if head.static_row is not None:
                    _append_row(rows_append, uidx, b"", True, head.static_row)
                st.start_partition(log, at, head.key)
            else:
                prev = at - st.prev
                u, nxt = sst.decode(win, at, lambda r: sst.read_unfiltered(r, prev))
                try:
                    if u is None:
                        if st.open_rt is not None:
                            raise SSTableError("range tombstone left open at the end of the partition")
                        st.uidx = None
                    elif isinstance(u, RangeTombstoneMarker):
                        _append_marker(st, rows_append, u)
                    else:
                        _append_row(rows_append, st.uidx, encode_clustering(u.clustering), False, u)
                except SSTableError as e:
                    raise Damaged(Damage(sst.name, at, "undecodable", e.reason)) from None
                st.prev = at
            if nxt <= window_end:
                logger.warning("SSTable fast path and reference disagree on %s@%d; using the reference", sst.name, at)
            return nxt
        except Damaged as d:
            inside = st.partition_start if st.uidx is not None and d.damage.position > st.partition_start else None
            records, nxt = sst.after_damage(win, d.damage, inside)
            for rec in records:
                self.damage(rec)
            st.uidx = None
            st.open_rt = None
            if nxt is not None:
                win.restart(nxt)
            return nxt

    def flush(self):
        """The records so far as one batch. A partition that goes on in the next batch keeps its entry there
        and numbers its records on from where this batch stopped (``seq`` counts within the partition)."""
        log, st = self.log, self.st
        continuing = st is not None and st.uidx is not None
        uidx_col = log.rows[0::NFIELDS]
        base = self.first_seq_base
        first_count = bisect.bisect_right(uidx_col, 0) if base else 0     # records of the continued update 0
        if continuing:
            next_base = len(uidx_col) - bisect.bisect_left(uidx_col, st.uidx) + (base if st.uidx == 0 else 0)
            update = log.updates[st.uidx]
        batch = log.to_batch()
        if first_count:
            seq = batch.column("seq")
            shifted = pa.concat_arrays([pc.add(seq.slice(0, first_count), pa.scalar(base, pa.int32())),
                                        seq.slice(first_count)])
            batch = batch.set_column(batch.schema.get_field_index("seq"), "seq", shifted)
        if continuing:
            log.updates.append(update)
            st.uidx = 0
            self.first_seq_base = next_base
        else:
            self.first_seq_base = 0
        self.counters["records"] += batch.num_rows
        return batch


def _append_row(rows_append, uidx: int, cl: bytes, is_static: bool, row) -> None:
    for kind, column, path, value, ts, ttl, ldt in row_record_fields(row):
        rows_append((uidx, cl, None, None, None, is_static, kind, column, path, value, ts, ttl, ldt))


def _append_marker(st: ScanState, rows_append, m: RangeTombstoneMarker) -> None:
    if m.kind.is_boundary:
        d1 = (m.end_deletion.marked_for_delete_at, m.end_deletion.local_deletion_time)
        d2 = (m.start_deletion.marked_for_delete_at, m.start_deletion.local_deletion_time)
    else:
        d1, d2 = (m.deletion.marked_for_delete_at, m.deletion.local_deletion_time), None
    pair_marker(st, rows_append, st.uidx, int(m.kind), list(m.clustering), d1, d2)


def read_sstable_cell_log(paths, schema=None, *, on_damage=None, batch_rows: int = 65536, strict: bool = False,
                          stats: dict | None = None):
    """Arrow batches (``CELL_LOG_SCHEMA``) of every cell and tombstone of the SSTables in ``paths``
    (``*-Data.db`` files or table directories), in file order, streaming.

    ``schema`` (optional) names the table and its key columns (see ``sstable.table``). Damaged or undecodable
    bytes become ``Damage`` records for ``on_damage`` (required: the caller quarantines them); ``strict`` raises
    the first instead. ``stats`` (a dict) receives counters: sstables, partitions, records, damaged.
    """
    if on_damage is None and not strict:
        raise TypeError("read_sstable_cell_log needs on_damage: damaged bytes must go somewhere")
    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
        paths = [paths]
    counters = stats if stats is not None else {}
    for k in ("sstables", "partitions", "records", "damaged"):
        counters.setdefault(k, 0)
    scan = _CellLogScan(schema, batch_rows, on_damage, strict, counters)
    gc_was_enabled = gc.isenabled()
    gc.disable()          # as in celllog.read_cell_log: millions of acyclic tuples, nothing for the collector
    try:
        for path in paths:
            for data in find_data_files(path):
                for batch in scan.sstable(data):
                    if gc_was_enabled:
                        gc.enable()
                    yield batch
                    gc.disable()
        if len(scan.log):
            yield scan.flush()
    finally:
        if gc_was_enabled:
            gc.enable()
