"""Mutation decoding and encoding (messaging versions 10 to 13), the reference implementation.

``decode_mutation`` turns the bytes of one commit-log entry into a ``commitlog.model.Mutation``; ``encode_mutation`` is
its exact inverse (the segment writer uses it, and the round trip is how the decoder is tested). The layout is
Cassandra's ``Mutation`` / ``PartitionUpdate`` / ``UnfilteredSerializer`` messaging form (format reference
§9-§17). Versions 10-12 are byte-identical; 13 (Cassandra 5.0 with storage_compatibility_mode NONE/UPGRADING)
only reads local deletion times as unsigned 32-bit values.

This module is the single source of truth for the layout. The cell-log fast path (``celllog_decoder``) must
agree with it; the tests run both over the same bytes.
"""
from __future__ import annotations

import struct
import uuid

from cdc_lib import wire
from cdc_lib.errors import CdcError, FormatError, MutationError, SchemaError, TruncatedError

from .model import (NO_DELETION_TIME, NO_DELETION_TIME_UINT, NO_TIMESTAMP, NO_TTL, BoundKind, Cell, DeletionTime,
                    EncodingStats, LivenessInfo, Mutation, PartitionUpdate, RangeTombstoneMarker, Row)

MASK32 = wire.MASK32
MASK64 = wire.MASK64

# Partition-level flags (UnfilteredRowIteratorSerializer)
P_IS_EMPTY = 0x01
P_IS_REVERSED = 0x02
P_HAS_PARTITION_DELETION = 0x04
P_HAS_STATIC_ROW = 0x08
P_HAS_ROW_ESTIMATE = 0x10

# Row flags (UnfilteredSerializer)
R_END_OF_PARTITION = 0x01
R_IS_MARKER = 0x02
R_HAS_TIMESTAMP = 0x04
R_HAS_TTL = 0x08
R_HAS_DELETION = 0x10
R_HAS_ALL_COLUMNS = 0x20
R_HAS_COMPLEX_DELETION = 0x40
R_EXTENSION_FLAG = 0x80
RX_IS_STATIC = 0x01
RX_HAS_SHADOWABLE_DELETION = 0x02

# Cell flags (Cell.Serializer)
C_IS_DELETED = 0x01
C_IS_EXPIRING = 0x02
C_HAS_EMPTY_VALUE = 0x04
C_USE_ROW_TIMESTAMP = 0x08
C_USE_ROW_TTL = 0x10

TIMESTAMP_EPOCH = 1442880000000000
DELETION_TIME_EPOCH = 1442880000

MESSAGING_VERSIONS = (10, 11, 12, 13)
MAX_CLUSTERING_VALUE = 0xFFFF    # bytes (FBUtilities.MAX_UNSIGNED_SHORT: writes of longer values are refused)
DESCRIPTOR_MESSAGING_VERSION = {6: 11, 7: 12, 8: 13}


def no_deletion_time(messaging_version: int) -> int:
    """Cassandra's "no local deletion time" sentinel as it reads back under ``messaging_version``."""
    return NO_DELETION_TIME_UINT if messaging_version >= 13 else NO_DELETION_TIME


class Reader:
    """A cursor over serialized bytes (a mutation, or a window of an SSTable's Data.db). Raises TruncatedError
    instead of IndexError/struct.error."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes, pos: int = 0):
        self.buf = buf
        self.pos = pos
        self.end = len(buf)

    def u8(self) -> int:
        p = self.pos
        if p >= self.end:
            raise TruncatedError("unexpected end of the data", position=p)
        self.pos = p + 1
        return self.buf[p]

    def u16(self) -> int:
        p = self.pos
        if p + 2 > self.end:
            raise TruncatedError("unexpected end of the data", position=p)
        self.pos = p + 2
        return (self.buf[p] << 8) | self.buf[p + 1]

    def take(self, n: int) -> bytes:
        p = self.pos
        if n < 0 or p + n > self.end:
            raise TruncatedError(f"value of {n} bytes runs past the end of the data", position=p)
        self.pos = p + n
        return self.buf[p:p + n]

    def uvint(self) -> int:
        p = self.pos
        if p < self.end:
            b = self.buf[p]
            if b < 0x80:
                self.pos = p + 1
                return b
        v, self.pos = wire.read_uvint(self.buf, p)
        return v

    def uvint32(self) -> int:
        """A Java int written through the unsigned-vint writer (sign-extended): keep its low 32 bits, signed."""
        v = self.uvint()
        if v < 0x80000000:
            return v
        return wire.s32(v)

    def vbytes(self) -> bytes:
        return self.take(self.uvint32())


class Times:
    """Delta decoding of timestamps, TTLs and local deletion times against one update's encoding stats."""

    __slots__ = ("ts0", "ldt0", "ttl0", "unsigned_ldt")

    def __init__(self, stats: EncodingStats, messaging_version: int):
        self.ts0 = stats.min_timestamp
        self.ldt0 = stats.min_local_deletion_time
        self.ttl0 = stats.min_ttl
        self.unsigned_ldt = messaging_version >= 13

    def ts(self, r: Reader) -> int:
        return wire.s64(r.uvint() + self.ts0)

    def ldt(self, r: Reader) -> int:
        v = r.uvint32() + self.ldt0
        return v & MASK32 if self.unsigned_ldt else wire.s32(v)

    def ttl(self, r: Reader) -> int:
        return wire.s32(r.uvint32() + self.ttl0)

    def deletion(self, r: Reader) -> DeletionTime:
        ts = self.ts(r)
        return DeletionTime(ts, self.ldt(r))


def read_encoding_stats(r: Reader) -> EncodingStats:
    """The EncodingStats of a mutation's partition update or of an SSTable's serialization header."""
    ts = wire.s64(r.uvint() + TIMESTAMP_EPOCH)
    ldt = wire.s32(r.uvint32() + DELETION_TIME_EPOCH)
    ttl = r.uvint32()
    return EncodingStats(ts, ldt, ttl)


def _read_columns(r: Reader, table, static: bool) -> tuple:
    n = r.uvint32()
    if n < 0 or n > r.end:
        raise MutationError(f"implausible column count {n}", position=r.pos)
    names = []
    for _ in range(n):
        raw = r.vbytes()
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MutationError(f"column name is not UTF-8: {raw!r}", position=r.pos) from None
        table.column_for_data(name)  # fails early, with the name, if the schema cannot type it
        names.append(name)
    return tuple(names)


def read_clustering(r: Reader, types: list, size: int) -> tuple:
    values = []
    header = 0
    for i in range(size):
        if i % 32 == 0:
            header = r.uvint()
        j = (i % 32) * 2
        if header & (2 << j):          # null
            values.append(None)
        elif header & (1 << j):        # empty
            values.append(b"")
        else:
            fixed = types[i].fixed_length if i < len(types) else None
            v = r.take(fixed) if fixed is not None else r.vbytes()
            if len(v) > MAX_CLUSTERING_VALUE:
                raise MutationError(f"clustering value of {len(v)} bytes is over Cassandra's limit of "
                                    f"{MAX_CLUSTERING_VALUE}", position=r.pos)
            values.append(v)
    return tuple(values)


def _read_subset(r: Reader, superset: tuple) -> tuple:
    v = r.uvint()
    n = len(superset)
    if v == 0:
        return superset
    if n < 64:
        if v >> n:
            raise MutationError(f"column subset bitmap {v:#x} names columns beyond the {n} in the header",
                                position=r.pos)
        return tuple(c for i, c in enumerate(superset) if not (v >> i) & 1)
    # Large subsets (Columns.Serializer.deserializeLargeSubset): the number of missing columns, then the
    # indexes of the present columns when they are fewer than half, else those of the missing ones. The writer
    # lists them in ascending order; Cassandra's reader relies on that for the missing ones (it skips the
    # column at its cursor whatever index is read), so any other order, a repeat or an index past the header
    # is damage in either list.
    missing = v
    count = n - missing
    if count < 0:
        raise MutationError(f"column subset misses {missing} of {n} columns", position=r.pos)
    listed = [r.uvint() for _ in range(count if count < n // 2 else missing)]
    for a, b in zip(listed, listed[1:] + [n]):
        if a >= b:
            raise MutationError(f"column subset indexes {listed} are not ascending indexes of the {n} columns",
                                position=r.pos)
    if count < n // 2:
        present = set(listed)
        return tuple(c for i, c in enumerate(superset) if i in present)
    absent = set(listed)
    return tuple(c for i, c in enumerate(superset) if i not in absent)


def _read_cell(r: Reader, t: Times, column: str, complex_: bool, fixed, liveness: LivenessInfo | None,
               no_ldt: int) -> Cell:
    flags = r.u8()
    if flags & C_USE_ROW_TIMESTAMP:
        if liveness is None:
            raise MutationError("cell uses the row timestamp but the row has none", position=r.pos)
        ts = liveness.timestamp
    else:
        ts = t.ts(r)
    deleted = bool(flags & C_IS_DELETED)
    expiring = bool(flags & C_IS_EXPIRING)
    ttl = NO_TTL
    ldt = no_ldt
    if flags & C_USE_ROW_TTL:
        if liveness is None:
            raise MutationError("cell uses the row TTL but the row has none", position=r.pos)
        ttl = liveness.ttl
        ldt = liveness.local_expiration_time
    elif deleted or expiring:
        ldt = t.ldt(r)
        if expiring:
            ttl = t.ttl(r)
    path = r.vbytes() if complex_ else None
    if flags & C_HAS_EMPTY_VALUE:
        value = b""
    elif fixed is not None and not complex_:
        value = r.take(fixed)
    else:
        value = r.vbytes()
    return Cell(column, value, ts, ttl, ldt, path, deleted)


def _read_row(r: Reader, flags: int, table, header_columns: tuple, clustering_types: list, t: Times,
              mv: int) -> Row:
    ext = r.u8() if flags & R_EXTENSION_FLAG else 0
    clustering = () if ext & RX_IS_STATIC else read_clustering(r, clustering_types, len(clustering_types))
    return read_row_body(r, flags, ext, clustering, table, header_columns, t, mv)


def read_row_body(r: Reader, flags: int, ext: int, clustering: tuple, table, header_columns: tuple, t: Times,
                  mv: int) -> Row:
    """A row from its liveness on (after flags, extended flags, clustering and, in SSTables, the two sizes):
    liveness, deletion, column subset, cells. The layout is the same in mutations and SSTables."""
    no_ldt = no_deletion_time(mv)
    liveness = None
    if flags & R_HAS_TIMESTAMP:
        ts = t.ts(r)
        if flags & R_HAS_TTL:
            ttl = t.ttl(r)
            ldt = t.ldt(r)
            liveness = LivenessInfo(ts, ttl, ldt)
        else:
            liveness = LivenessInfo(ts, NO_TTL, no_ldt)
    deletion = t.deletion(r) if flags & R_HAS_DELETION else None
    columns = header_columns if flags & R_HAS_ALL_COLUMNS else _read_subset(r, header_columns)
    has_complex_deletion = flags & R_HAS_COMPLEX_DELETION
    cells = []
    complex_deletions = {}
    for name in columns:
        col = table.column_for_data(name)
        ctype = col.type
        if ctype.multicell:
            if has_complex_deletion:
                d = t.deletion(r)
                if d.marked_for_delete_at != NO_TIMESTAMP:
                    complex_deletions[name] = d
            n = r.uvint32()
            if n < 0 or n > r.end - r.pos:
                raise MutationError(f"implausible cell count {n} for {name}", position=r.pos)
            for _ in range(n):
                cells.append(_read_cell(r, t, name, True, None, liveness, no_ldt))
        else:
            cells.append(_read_cell(r, t, name, False, ctype.fixed_length, liveness, no_ldt))
    return Row(clustering, liveness, deletion, bool(ext & RX_HAS_SHADOWABLE_DELETION), cells,
               complex_deletions, bool(ext & RX_IS_STATIC), columns)


def read_bound(r: Reader, clustering_types: list) -> tuple:
    """A range tombstone marker's bound, after its flags byte: (BoundKind, clustering prefix values)."""
    kind_ord = r.u8()
    try:
        kind = BoundKind(kind_ord)
    except ValueError:
        raise MutationError(f"unknown range tombstone bound kind {kind_ord}", position=r.pos) from None
    if kind in (BoundKind.STATIC_CLUSTERING, BoundKind.CLUSTERING):
        raise MutationError(f"bound kind {kind.name} cannot appear in a range tombstone marker", position=r.pos)
    size = r.u16()
    if size > len(clustering_types):
        raise MutationError(f"range tombstone bound has {size} values, the table has "
                            f"{len(clustering_types)} clustering columns", position=r.pos)
    return kind, read_clustering(r, clustering_types, size)


def read_marker_body(r: Reader, kind: BoundKind, values: tuple, t: Times) -> RangeTombstoneMarker:
    """A marker's deletion time(s), after its bound (and, in SSTables, its two sizes)."""
    if kind.is_boundary:
        end = t.deletion(r)
        start = t.deletion(r)
        return RangeTombstoneMarker(kind, values, None, end, start)
    return RangeTombstoneMarker(kind, values, t.deletion(r))


def _check_marker(m: RangeTombstoneMarker, open_range, position: int):
    """The deletion of the range open after marker ``m`` (None when none is), given the one open before it.

    A partition update's markers open and close ranges in turn, a boundary closing one and opening the next;
    a close carries the deletion of the range it closes (``MutableDeletionInfo.Builder.add`` fails otherwise).
    Cassandra's writer never breaks these rules, so a marker that does is damage.
    """
    k = m.kind
    if k.is_start:
        if open_range is not None:
            raise MutationError("range tombstone opened twice without a close", position=position)
        return m.deletion
    closes = m.end_deletion if k.is_boundary else m.deletion
    if open_range is None:
        raise MutationError("range tombstone closed without an open range", position=position)
    if closes != open_range:
        raise MutationError(f"range tombstone closed with deletion {closes}, opened with {open_range}",
                            position=position)
    return m.start_deletion if k.is_boundary else None


def _read_marker(r: Reader, clustering_types: list, t: Times) -> RangeTombstoneMarker:
    kind, values = read_bound(r, clustering_types)
    return read_marker_body(r, kind, values, t)


def decode_partition_update(r: Reader, schema, messaging_version: int) -> PartitionUpdate:
    tid_bytes = r.take(16)
    table_id = uuid.UUID(bytes=tid_bytes)
    table = schema.table(table_id)
    key = r.vbytes()
    flags = r.u8()
    if flags & P_IS_EMPTY:
        return PartitionUpdate(table_id, key, table, is_empty=True)
    if flags & P_IS_REVERSED:
        raise MutationError("reversed partition update in a mutation", position=r.pos)
    stats = read_encoding_stats(r)
    t = Times(stats, messaging_version)
    static_cols = _read_columns(r, table, True) if flags & P_HAS_STATIC_ROW else ()
    regular_cols = _read_columns(r, table, False)
    pdel = t.deletion(r) if flags & P_HAS_PARTITION_DELETION else None
    clustering_types = [c.type for c in table.clustering]
    static_row = None
    if flags & P_HAS_STATIC_ROW:
        f = r.u8()
        if f & R_END_OF_PARTITION or f & R_IS_MARKER:
            raise MutationError("static row expected", position=r.pos)
        static_row = _read_row(r, f, table, static_cols, clustering_types, t, messaging_version)
        if not static_row.is_static:
            raise MutationError("static row lacks its IS_STATIC flag", position=r.pos)
    estimate = r.uvint32() if flags & P_HAS_ROW_ESTIMATE else None
    unfiltereds = []
    open_range = None          # the deletion of the range tombstone open at this point
    while True:
        f = r.u8()
        if f & R_END_OF_PARTITION:
            break
        if f & R_IS_MARKER:
            marker = _read_marker(r, clustering_types, t)
            open_range = _check_marker(marker, open_range, r.pos)
            unfiltereds.append(marker)
        else:
            row = _read_row(r, f, table, regular_cols, clustering_types, t, messaging_version)
            if row.is_static:
                raise MutationError("static row among clustering rows", position=r.pos)
            unfiltereds.append(row)
    if open_range is not None:
        raise MutationError("range tombstone left open at the end of the partition", position=r.pos)
    return PartitionUpdate(table_id, key, table, pdel, static_row, unfiltereds, static_cols, regular_cols,
                           stats, estimate)


def decode_mutation(data: bytes, schema, messaging_version: int = 12, *, source: str | None = None,
                    base_position: int = 0) -> Mutation:
    """Decode one mutation. Errors are typed (``MutationError``, ``UnknownTableError``...) and carry
    ``source`` and the absolute position (``base_position`` + offset in ``data``)."""
    r = Reader(data)
    try:
        n = r.uvint32()
        if n <= 0 or n > len(data):
            raise MutationError(f"implausible partition update count {n}", position=0)
        updates = [decode_partition_update(r, schema, messaging_version) for _ in range(n)]
        if r.pos != r.end:
            raise MutationError(f"{r.end - r.pos} trailing bytes after the mutation", position=r.pos)
    except FormatError as e:
        raise e.located(source, base_position) from None
    except SchemaError as e:
        raise MutationError(str(e), source, base_position + r.pos) from e
    except CdcError:
        raise
    except (ValueError, struct.error, IndexError, UnicodeDecodeError) as e:  # defensive: never a bare crash
        raise MutationError(f"undecodable mutation: {e}", source, base_position + r.pos) from e
    return Mutation(updates, messaging_version=messaging_version)


# --------------------------------------------------------------------------------------------------------
# Encoding: the exact inverse, following the writer's rules for flags (format reference §12, §15).
# --------------------------------------------------------------------------------------------------------

class _Writer:
    __slots__ = ("out", "ts0", "ldt0", "ttl0")

    def __init__(self, stats: EncodingStats | None = None):
        self.out = bytearray()
        if stats is not None:
            self.ts0 = stats.min_timestamp
            self.ldt0 = stats.min_local_deletion_time
            self.ttl0 = stats.min_ttl

    def uvint(self, v: int) -> None:
        self.out += wire.encode_uvint(v)

    def vbytes(self, b: bytes) -> None:
        self.out += wire.encode_uvint(len(b))
        self.out += b

    def ts(self, v: int) -> None:
        self.out += wire.encode_uvint((v - self.ts0) & MASK64)

    def ldt(self, v: int) -> None:
        self.out += wire.encode_uvint(wire.s32(v - self.ldt0))

    def ttl(self, v: int) -> None:
        self.out += wire.encode_uvint(wire.s32(v - self.ttl0))

    def deletion(self, d: DeletionTime) -> None:
        self.ts(d.marked_for_delete_at)
        self.ldt(d.local_deletion_time)


def compute_stats(update: PartitionUpdate) -> EncodingStats:
    """The encoding stats Cassandra's writer would compute for ``update`` (minimum timestamp, LDT, TTL).

    Mirrors ``EncodingStats.Collector``: the partition deletion, every row's liveness/deletion, complex
    deletions, cells and range tombstone deletions are collected; absent values leave the epoch.
    """
    ts = []
    ldt = []
    ttl = []

    def deletion(d):
        if d is not None and d.marked_for_delete_at != NO_TIMESTAMP:
            ts.append(d.marked_for_delete_at)
            ldt.append(d.local_deletion_time)

    deletion(update.partition_deletion)
    rows = ([update.static_row] if update.static_row is not None else []) + list(update.unfiltereds)
    for u in rows:
        if isinstance(u, RangeTombstoneMarker):
            for d in (u.deletion, u.end_deletion, u.start_deletion):
                deletion(d)
            continue
        if u.liveness is not None and u.liveness.timestamp != NO_TIMESTAMP:
            ts.append(u.liveness.timestamp)
            if u.liveness.ttl != NO_TTL:
                ttl.append(u.liveness.ttl)
                ldt.append(u.liveness.local_expiration_time)
        deletion(u.deletion)
        for d in u.complex_deletions.values():
            deletion(d)
        for c in u.cells:
            ts.append(c.timestamp)
            if c.ttl != NO_TTL:
                ttl.append(c.ttl)
            if c.is_tombstone or c.ttl != NO_TTL:
                ldt.append(c.local_deletion_time)
    return EncodingStats(min(ts) if ts else TIMESTAMP_EPOCH, min(ldt) if ldt else DELETION_TIME_EPOCH,
                         min(ttl) if ttl else 0)


def _encode_clustering_values(w: _Writer, types: list, values: tuple) -> None:
    for g in range(0, len(values), 32):
        group = values[g:g + 32]
        header = 0
        for j, v in enumerate(group):
            if v is None:
                header |= 2 << (j * 2)
            elif len(v) == 0:
                header |= 1 << (j * 2)
        w.uvint(header)
        for i, v in enumerate(group, start=g):
            if v is None or len(v) == 0:
                continue
            fixed = types[i].fixed_length
            if fixed is not None:
                if len(v) != fixed:
                    raise MutationError(f"clustering value of {len(v)} bytes for a {fixed}-byte type")
                w.out += v
            else:
                w.vbytes(v)


def _encode_subset(w: _Writer, columns: tuple, superset: tuple) -> None:
    n = len(superset)
    present = set(columns)
    if n < 64:
        bits = 0
        for i, c in enumerate(superset):
            if c not in present:
                bits |= 1 << i
        w.uvint(bits)
        return
    count = len(columns)
    w.uvint(n - count)
    if count < n // 2:
        for i, c in enumerate(superset):
            if c in present:
                w.uvint(i)
    else:
        for i, c in enumerate(superset):
            if c not in present:
                w.uvint(i)


def _encode_cell(w: _Writer, c: Cell, complex_: bool, fixed, liveness: LivenessInfo | None) -> None:
    flags = 0
    expiring = c.ttl != NO_TTL and not c.is_tombstone
    if c.is_tombstone:
        flags |= C_IS_DELETED
    if expiring:
        flags |= C_IS_EXPIRING
    if len(c.value) == 0:
        flags |= C_HAS_EMPTY_VALUE
    use_row_ts = liveness is not None and liveness.timestamp != NO_TIMESTAMP and c.timestamp == liveness.timestamp
    use_row_ttl = (expiring and liveness is not None and liveness.ttl != NO_TTL and c.ttl == liveness.ttl
                   and c.local_deletion_time == liveness.local_expiration_time)
    if use_row_ts:
        flags |= C_USE_ROW_TIMESTAMP
    if use_row_ttl:
        flags |= C_USE_ROW_TTL
    w.out.append(flags)
    if not use_row_ts:
        w.ts(c.timestamp)
    if (c.is_tombstone or expiring) and not use_row_ttl:
        w.ldt(c.local_deletion_time)
        if expiring:
            w.ttl(c.ttl)
    if complex_:
        if c.path is None:
            raise MutationError(f"cell of complex column {c.column} has no path")
        w.vbytes(c.path)
    if len(c.value):
        if fixed is not None and not complex_:
            if len(c.value) != fixed:
                raise MutationError(f"value of {len(c.value)} bytes for {c.column}, whose type takes {fixed}")
            w.out += c.value
        else:
            w.vbytes(c.value)


def _row_columns(row: Row, header: tuple) -> tuple:
    if row.columns is not None:
        return row.columns
    present = {c.column for c in row.cells} | set(row.complex_deletions)
    return tuple(c for c in header if c in present)


def _encode_row(w: _Writer, row: Row, table, header: tuple, clustering_types: list, mv: int) -> None:
    flags, columns, liveness = _encode_row_head(w, row, header, clustering_types)
    _encode_row_body(w, row, flags, table, header, columns, liveness, mv)


def _encode_row_head(w: _Writer, row: Row, header: tuple, clustering_types: list) -> tuple:
    """Flags, extended flags and clustering; returns what the body needs: (flags, columns, liveness)."""
    flags = 0
    ext = 0
    if row.is_static:
        ext |= RX_IS_STATIC
    if row.deletion is not None and row.shadowable:
        ext |= RX_HAS_SHADOWABLE_DELETION
    liveness = row.liveness if row.liveness is not None and row.liveness.timestamp != NO_TIMESTAMP else None
    if liveness is not None:
        flags |= R_HAS_TIMESTAMP
        if liveness.ttl != NO_TTL:
            flags |= R_HAS_TTL
    if row.deletion is not None and row.deletion.marked_for_delete_at != NO_TIMESTAMP:
        flags |= R_HAS_DELETION
    columns = _row_columns(row, header)
    if len(columns) == len(header):
        flags |= R_HAS_ALL_COLUMNS
    if row.complex_deletions:
        flags |= R_HAS_COMPLEX_DELETION
    if ext:
        flags |= R_EXTENSION_FLAG
    w.out.append(flags)
    if ext:
        w.out.append(ext)
    if not row.is_static:
        if len(row.clustering) != len(clustering_types):
            raise MutationError(f"row clustering has {len(row.clustering)} values, the table "
                                f"{len(clustering_types)} clustering columns")
        _encode_clustering_values(w, clustering_types, row.clustering)
    return flags, columns, liveness


def _encode_row_body(w: _Writer, row: Row, flags: int, table, header: tuple, columns: tuple, liveness,
                     mv: int) -> None:
    """Liveness, deletion, column subset and cells (``read_row_body``'s inverse)."""
    if liveness is not None:
        w.ts(liveness.timestamp)
        if liveness.ttl != NO_TTL:
            w.ttl(liveness.ttl)
            w.ldt(liveness.local_expiration_time)
    if flags & R_HAS_DELETION:
        w.deletion(row.deletion)
    if not flags & R_HAS_ALL_COLUMNS:
        _encode_subset(w, columns, header)
    by_column: dict = {}
    for c in row.cells:
        by_column.setdefault(c.column, []).append(c)
    live_ldt = no_deletion_time(mv)
    for name in columns:
        col = table.column_for_data(name)
        cells = by_column.get(name, ())
        if col.type.multicell:
            if flags & R_HAS_COMPLEX_DELETION:
                w.deletion(row.complex_deletions.get(name, DeletionTime(NO_TIMESTAMP, live_ldt)))
            w.uvint(len(cells))
            for c in cells:
                _encode_cell(w, c, True, None, liveness)
        else:
            if len(cells) != 1:
                raise MutationError(f"simple column {name} needs exactly one cell, got {len(cells)}")
            _encode_cell(w, cells[0], False, col.type.fixed_length, liveness)


def encode_unfiltered(u, table, header: tuple, clustering_types: list, stats: EncodingStats, mv: int) -> tuple:
    """(head, body) of a row or range tombstone marker, delta-encoded against ``stats``: the head is the flags,
    extended flags and clustering (or bound), the body the rest. A mutation writes them back to back; an
    SSTable writes the unfiltered's size and the previous unfiltered's size between them (format reference
    SSTable §6.4-§6.5)."""
    head, body = _Writer(stats), _Writer(stats)
    if isinstance(u, RangeTombstoneMarker):
        _encode_marker_head(head, u, clustering_types)
        _encode_marker_body(body, u)
    else:
        flags, columns, liveness = _encode_row_head(head, u, header, clustering_types)
        _encode_row_body(body, u, flags, table, header, columns, liveness, mv)
    return bytes(head.out), bytes(body.out)


def _encode_marker(w: _Writer, m: RangeTombstoneMarker, clustering_types: list) -> None:
    _encode_marker_head(w, m, clustering_types)
    _encode_marker_body(w, m)


def _encode_marker_head(w: _Writer, m: RangeTombstoneMarker, clustering_types: list) -> None:
    w.out.append(R_IS_MARKER)
    w.out.append(int(m.kind))
    w.out += len(m.clustering).to_bytes(2, "big")
    _encode_clustering_values(w, clustering_types, m.clustering)


def _encode_marker_body(w: _Writer, m: RangeTombstoneMarker) -> None:
    if m.kind.is_boundary:
        w.deletion(m.end_deletion)
        w.deletion(m.start_deletion)
    else:
        w.deletion(m.deletion)


def encode_partition_update(update: PartitionUpdate, schema, messaging_version: int = 12) -> bytes:
    table = update.table if update.table is not None else schema.table(update.table_id)
    w = _Writer()
    w.out += update.table_id.bytes
    w.vbytes(update.partition_key)
    if update.is_empty:
        w.out.append(P_IS_EMPTY)
        return bytes(w.out)
    stats = update.stats if update.stats is not None else compute_stats(update)
    w.ts0, w.ldt0, w.ttl0 = stats.min_timestamp, stats.min_local_deletion_time, stats.min_ttl
    flags = P_HAS_ROW_ESTIMATE if update.row_estimate is not None else 0
    if update.partition_deletion is not None and not update.partition_deletion.is_live:
        flags |= P_HAS_PARTITION_DELETION
    if update.static_row is not None:
        flags |= P_HAS_STATIC_ROW
    w.out.append(flags)
    w.uvint((stats.min_timestamp - TIMESTAMP_EPOCH) & MASK64)
    w.uvint(wire.s32(stats.min_local_deletion_time - DELETION_TIME_EPOCH))
    w.uvint(wire.s32(stats.min_ttl))
    static_header = tuple(update.static_columns)
    regular_header = tuple(update.regular_columns)
    if update.static_row is not None:
        w.uvint(len(static_header))
        for name in static_header:
            w.vbytes(name.encode("utf-8"))
    w.uvint(len(regular_header))
    for name in regular_header:
        w.vbytes(name.encode("utf-8"))
    if flags & P_HAS_PARTITION_DELETION:
        w.deletion(update.partition_deletion)
    clustering_types = [c.type for c in table.clustering]
    if update.static_row is not None:
        _encode_row(w, update.static_row, table, static_header, clustering_types, messaging_version)
    if update.row_estimate is not None:
        w.uvint(update.row_estimate)
    for u in update.unfiltereds:
        if isinstance(u, RangeTombstoneMarker):
            _encode_marker(w, u, clustering_types)
        else:
            _encode_row(w, u, table, regular_header, clustering_types, messaging_version)
    w.out.append(R_END_OF_PARTITION)
    return bytes(w.out)


def encode_mutation(mutation: Mutation, schema, messaging_version: int | None = None) -> bytes:
    """Serialize ``mutation`` exactly as Cassandra would (the inverse of ``decode_mutation``)."""
    mv = messaging_version if messaging_version is not None else mutation.messaging_version
    parts = [wire.encode_uvint(len(mutation.updates))]
    parts += [encode_partition_update(u, schema, mv) for u in mutation.updates]
    return b"".join(parts)


def finish_update(update: PartitionUpdate, schema=None) -> PartitionUpdate:
    """Fill the header column lists, encoding stats and row estimate of a hand-built update the way
    Cassandra's writer does, so it can be encoded. Used by generators and tests."""
    table = update.table if update.table is not None else schema.table(update.table_id)
    update.table = table
    order = _column_order(table)
    if update.static_row is not None and not update.static_columns:
        present = {c.column for c in update.static_row.cells} | set(update.static_row.complex_deletions)
        update.static_columns = tuple(sorted(present, key=order))
    if not update.regular_columns:
        present = set()
        for u in update.unfiltereds:
            if isinstance(u, Row):
                present |= {c.column for c in u.cells} | set(u.complex_deletions)
        update.regular_columns = tuple(sorted(present, key=order))
    update.stats = compute_stats(update)
    if update.row_estimate is None:
        update.row_estimate = len(update.rows)
    return update


def _column_order(table):
    """Cassandra's internal column order: simple columns before complex ones, then by name bytes."""
    def key(name):
        col = table.column_for_data(name)
        return (1 if col.type.multicell else 0, name.encode("utf-8"))
    return key
