"""Exact row state under Cassandra's last-write-wins rules: a join-semilattice (CRDT) over cell-log records.

The state of one partition is a ``PartitionState``; merging cell-log records into it (``apply_record``,
``apply_records``) or merging two states (``merge_partitions``) is a commutative, associative and idempotent
join, so the order in which replicas' commit logs arrive, and how often the same record arrives, never matter.
The state does not depend on the clock: ``now`` (seconds since the epoch) is an explicit argument of the
functions that *read* it (``is_row_live``, ``visible_row``, ``visible_rows``); nothing here reads the clock.

Layout (plain tuples and dicts; every field is Arrow-friendly through ``partition_to_records``):

* a **cell** is a tuple ``(timestamp, ttl, local_deletion_time, is_tombstone, value)`` (index constants
  ``TS, TTL, LDT, TOMB, VALUE``). ``value`` is the serialized value (a counter's context for counters).
* a **deletion** is a tuple ``(marked_for_delete_at, local_deletion_time)``; a **liveness** is
  ``(timestamp, ttl, local_expiration_time)``.
* ``RowState``: ``liveness``, ``deletion`` (regular row tombstone), ``shadowable`` (materialized-view
  shadowable tombstone), ``cells`` {column: cell} for simple columns, ``complex`` {column: [deletion|None,
  {path: cell}]} for non-frozen collections and UDTs; a counter column keeps
  its shards there too ({counter id + 8-byte timestamp: (ts, 0, NO_DELETION_TIME, False, kind byte + clock +
  count)}, kind 2 global / 1 local / 0 remote; every shard no other of its id beats on both rank and timestamp,
  see ``_apply_counter``) and a counter tombstone in ``cells``.
* ``PartitionState``: ``deletion`` (partition tombstone), ``range_tombstones`` {(start, start_inclusive, end,
  end_inclusive): deletion} with bounds as ``celllog.encode_clustering`` bytes, ``static`` (a RowState),
  ``rows`` {clustering bytes: RowState}.

Reconciliation follows Cassandra 4.0/5.0 (``Cells.resolveRegular``, ``LivenessInfo.supersedes``,
``DeletionTime.supersedes``, ``CounterContext.merge``):

* cells: higher timestamp wins; on equal timestamps an expiring cell or tombstone beats a plain live cell
  (CASSANDRA-14592), a tombstone beats an expiring cell, then the higher local deletion time wins, then the
  greater value compared as *unsigned* bytes. To make the join commutative where Cassandra keeps "the left
  one" (two expiring cells differing only in TTL), the higher TTL wins last. Cassandra 3.x differs: it
  asked ``isLive(now)`` (so the winner depended on the clock), compared values with Java's *signed*
  ``ByteBuffer.compareTo`` before looking at expiry, and let a plain live cell beat an expiring one of the
  same value; we follow 4.x/5.0 for all data, whatever version wrote it.
* counter cells: a counter tombstone always wins (CASSANDRA-7346); live contexts merge shard by shard, per
  counter id the global shard beats a local one beats a remote one, then the higher clock, then the higher
  count; the timestamp becomes the maximum. Cassandra *sums* two legacy local shards with the same id
  (pre-2.1 data only); that is not idempotent (replaying a commit log twice would double the count), so
  here they merge like global shards. The row shows the context's total.
* row liveness: higher timestamp; then the MV "expired liveness" marker; then an expiring liveness beats
  a non-expiring one; then the later expiry; then the higher TTL.
* deletions: higher ``marked_for_delete_at``, then higher local deletion time. A deletion shadows data
  with a timestamp *at or below* it. Partition deletions shadow everything in the partition (static row
  included), range tombstones the clustering rows they cover, row deletions their row, complex deletions
  the elements of their column. A shadowable row deletion is void once the row's liveness timestamp is
  greater than it (``Row.Deletion.isShadowedBy``).
* expiring cells and liveness are live while ``now < local_deletion_time`` (``Cell.isLive``).
* a dropped column hides its cells written at or before the drop (``TableMetadata.dropped``).

Shadowed data is purged as soon as a *regular* tombstone covers it (Cassandra purges it on read): deletions
only ever grow, so a purged cell would stay shadowed in any later join and the join stays exact. Data under a
shadowable deletion is kept because newer liveness can lift that deletion. Tombstones themselves are kept here, so
that a late write older than a deletion stays shadowed, until ``state.purge`` drops them after the table's
``gc_grace_seconds``, as Cassandra's compaction does (and with Cassandra's consequence: a write older than a purged
tombstone that arrives later resurrects).

Visible rows follow CQL ``SELECT *``: a clustering row is visible iff it has live primary-key liveness or at
least one live cell, and its image carries the partition key, clustering, regular and static columns (static
values are part of every row's full image). A partition whose static row is live but that has no visible
clustering row shows one row keyed ``(partition key, clustering = None)`` with null clustering columns, as
CQL does; for a table without clustering columns the only row key is ``b""``.

Public API:

* joining: ``PartitionState``, ``RowState``, ``apply_record(table, part, rec)`` (returns what changed),
  ``apply_records(table, states, records)`` ({partition key: PartitionState}), ``merge_partitions``;
* reading at ``now``: ``visible_rows(table, pk, part, now)`` -> {row key: typed row},
  ``visible_row(table, pk, part, key, now)``, ``is_row_live``; row keys are clustering bytes
  (``celllog.encode_clustering``) or ``STATIC_KEY``; ``partition_images``/``row_image``/``typed_row`` are
  the byte-level images events compare and their typed form;
* storing: ``STATE_SCHEMA``, ``partition_to_records(pk, part)``, ``partition_from_records(records)``
  (lossless), ``partition_cell_records`` (the state as cell-log records);
* rules: ``reconcile_cells``, ``reconcile_counter_cells``, ``merge_counter_contexts``,
  ``counter_context_total``, ``compare_values(type, a, b)``, ``compare_clustering``,
  ``clustering_sort_key``, ``range_covers``, ``split_partition_key``.
"""
from __future__ import annotations

import struct
from decimal import Decimal
from functools import cmp_to_key, lru_cache
from typing import Iterable, Optional

import pyarrow as pa

from cdc_lib.celllog.schema import (KIND_CELL, KIND_CELL_TOMBSTONE, KIND_COMPLEX_DELETION, KIND_PARTITION_DELETION,
                                    KIND_RANGE_TOMBSTONE, KIND_ROW_DELETION, KIND_ROW_DELETION_SHADOWABLE,
                                    KIND_ROW_LIVENESS, decode_clustering)
from cdc_lib.commitlog.model import EXPIRED_LIVENESS_TTL, NO_DELETION_TIME, NO_TIMESTAMP
from cdc_lib.cql.types import read_length_prefixed
from cdc_lib.errors import CdcError

TS, TTL, LDT, TOMB, VALUE = range(5)
STATIC_KEY = None          # row key of the static-only CQL row (clustering columns null)


class StateError(CdcError):
    """A cell-log record or a stored state record that the state engine cannot apply."""


# ---------------------------------------------------------------------------------------------------------
# Reconciliation of single values

def reconcile_cells(a: tuple, b: tuple) -> tuple:
    """The winner of two regular cells for the same column and path (``Cells.resolveRegular``, 4.0+)."""
    if a[0] != b[0]:
        return a if a[0] > b[0] else b
    a_dead = a[3] or a[1] != 0          # tombstone or expiring: has a local deletion time
    b_dead = b[3] or b[1] != 0
    if a_dead or b_dead:
        if a_dead != b_dead:
            return a if a_dead else b
        if a[3] != b[3]:
            return a if a[3] else b
        if a[2] != b[2]:
            return a if a[2] > b[2] else b
    if a[4] != b[4]:
        return a if a[4] > b[4] else b   # bytes compare unsigned, shorter prefix first, as compareUnsigned
    return a if a[1] >= b[1] else b


def reconcile_counter_cells(a: tuple, b: tuple) -> tuple:
    """The merge of two counter cells (``Cells.resolveCounter``): a tombstone wins, else contexts merge."""
    if a[3] or b[3]:
        if a[3] and b[3]:
            return reconcile_cells(a, b)
        return a if a[3] else b
    if not a[4] or not b[4]:
        if bool(a[4]) != bool(b[4]):
            return a if not a[4] else b
        return reconcile_cells(a, b)
    merged = merge_counter_contexts(a[4], b[4])
    return (max(a[0], b[0]), 0, NO_DELETION_TIME, False, merged)


def _liveness_wins(a: tuple, b: tuple) -> bool:
    """True when liveness ``a`` supersedes ``b`` (``LivenessInfo.supersedes`` plus a TTL tie-break)."""
    if a[0] != b[0]:
        return a[0] > b[0]
    a_exp = a[1] == EXPIRED_LIVENESS_TTL
    b_exp = b[1] == EXPIRED_LIVENESS_TTL
    if a_exp != b_exp:
        return a_exp
    if bool(a[1]) != bool(b[1]):
        return bool(a[1])          # expiring beats non-expiring, as for cells (CASSANDRA-14592)
    if a[1] and a[2] != b[2]:
        return a[2] > b[2]
    return a[1] >= b[1]


def reconcile_liveness(a: Optional[tuple], b: Optional[tuple]) -> Optional[tuple]:
    if a is None:
        return b
    if b is None:
        return a
    return a if _liveness_wins(a, b) else b


def _max_deletion(a: Optional[tuple], b: Optional[tuple]) -> Optional[tuple]:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


# ---------------------------------------------------------------------------------------------------------
# Counter contexts

_SHARD = 32          # 16-byte counter id, 8-byte clock, 8-byte count
_GLOBAL, _LOCAL, _REMOTE = 2, 1, 0


def _parse_context(ctx: bytes) -> dict:
    """{counter id: (kind rank, clock, count)} of a counter context."""
    if len(ctx) < 2:
        raise StateError(f"counter context of {len(ctx)} bytes")
    n = abs(struct.unpack_from(">h", ctx, 0)[0])
    header = 2 + 2 * n
    if (len(ctx) - header) % _SHARD:
        raise StateError(f"counter context body of {len(ctx) - header} bytes is not a multiple of {_SHARD}")
    kinds = {}
    for i in range(n):
        e = struct.unpack_from(">h", ctx, 2 + 2 * i)[0]
        if e < 0:
            kinds[e + 32768] = _GLOBAL
        else:
            kinds[e] = _LOCAL
    out = {}
    for idx, off in enumerate(range(header, len(ctx), _SHARD)):
        cid = ctx[off:off + 16]
        clock, count = struct.unpack_from(">qq", ctx, off + 16)
        out[cid] = (kinds.get(idx, _REMOTE), clock, count)
    return out


def _encode_context(shards: dict) -> bytes:
    ids = sorted(shards)
    header = [(i - 32768) if shards[c][0] == _GLOBAL else i
              for i, c in enumerate(ids) if shards[c][0] != _REMOTE]
    out = bytearray(struct.pack(">h", len(header)))
    for h in header:
        out += struct.pack(">h", h)
    for c in ids:
        _, clock, count = shards[c]
        out += c + struct.pack(">qq", clock, count)
    return bytes(out)


def merge_counter_contexts(a: bytes, b: bytes) -> bytes:
    """Shard-by-shard merge of two counter contexts (``CounterContext.merge``); the result is canonical."""
    sa = _parse_context(a)
    sb = _parse_context(b)
    for cid, shard in sb.items():
        cur = sa.get(cid)
        if cur is None or shard > cur:        # (kind rank, clock, count) in that order
            sa[cid] = shard
    return _encode_context(sa)


def counter_context_total(ctx: bytes) -> int:
    """The counter value a context shows: the sum of its shards' counts."""
    if not ctx:
        return 0
    return sum(s[2] for s in _parse_context(ctx).values())


# ---------------------------------------------------------------------------------------------------------
# Value comparison (clustering order)

def _type_kind(t) -> str:
    k = getattr(t, "kind", None) or getattr(t, "name", None)
    return str(k).lower() if k is not None else ""


def _subtypes(t) -> list:
    for attr in ("subtypes", "params", "element_types", "types", "field_types"):
        v = getattr(t, attr, None)
        if v:
            return list(v)
    return []


def _cmp(a, b) -> int:
    return (a > b) - (a < b)


def _signed(b: bytes) -> int:
    return int.from_bytes(b, "big", signed=True)


def _unsigned(b: bytes) -> int:
    return int.from_bytes(b, "big", signed=False)


# The values of frozen collections, tuples and UDTs were validated when decoded (only comparisons read them
# here): bytes that still do not frame raise CqlValueError naming the type ``t``, never a value sliced short.
def _read_elements(t, data: bytes) -> list:
    """Elements of a frozen list or set: int32 count, then each element."""
    return read_length_prefixed(data, 4, struct.unpack_from(">i", data, 0)[0], "element", t)[0]


def _read_fields(t, data: bytes) -> list:
    """Components of a tuple or UDT value, up to the end."""
    return read_length_prefixed(data, 0, None, "field", t)[0]


def _timeuuid_key(b: bytes):
    msb = int.from_bytes(b[0:8], "big")
    ts = ((msb & 0x0FFF) << 48) | (((msb >> 16) & 0xFFFF) << 32) | (msb >> 32)
    return ts


def _cmp_signed_bytes(a: bytes, b: bytes) -> int:
    for x, y in zip(a, b):
        if x != y:
            x = x - 256 if x > 127 else x
            y = y - 256 if y > 127 else y
            return -1 if x < y else 1
    return _cmp(len(a), len(b))


def _float_key(v: float):
    # Java Float.compare/Double.compare: -0.0 < 0.0, NaN above +Infinity, all NaNs equal
    if v != v:
        return (2, 0.0)
    if v == 0.0:
        return (1, 0.0) if str(v)[0] != "-" else (0, 0.0)
    return (0, v) if v < 0 else (1, v)


def _decimal_value(b: bytes) -> Decimal:
    scale = struct.unpack_from(">i", b, 0)[0]
    unscaled = _signed(b[4:])
    return Decimal(unscaled).scaleb(-scale)


def compare_values(t, a: bytes, b: bytes) -> int:
    """Compare two serialized values of CQL type ``t`` as Cassandra's comparator does (-1, 0 or 1).

    Empty values sort first for every type. Reversal (DESC) is not applied here: see ``compare_clustering``.
    """
    if not a or not b:
        return _cmp(bool(a), bool(b))
    k = _type_kind(t)
    if k in ("int", "bigint", "smallint", "tinyint", "timestamp", "time", "counter", "long"):
        return _cmp(_signed(a), _signed(b))
    if k in ("text", "varchar", "ascii", "blob", "inet", "date", "duration", "empty"):
        # SimpleDateType stores days + 2^31 as an unsigned int: bytewise order is numeric order
        return _cmp(a, b)
    if k == "boolean":
        return _cmp(a[0] != 0, b[0] != 0)
    if k in ("float", "double"):
        fmt = ">f" if k == "float" else ">d"
        return _cmp(_float_key(struct.unpack(fmt, a)[0]), _float_key(struct.unpack(fmt, b)[0]))
    if k == "varint":
        return _cmp(_signed(a), _signed(b))
    if k == "decimal":
        return _cmp(_decimal_value(a), _decimal_value(b))
    if k == "timeuuid":
        c = _cmp(_timeuuid_key(a), _timeuuid_key(b))
        if c:
            return c
        return _cmp_signed_bytes(a[8:], b[8:])
    if k == "uuid":
        if len(a) < 16 or len(b) < 16:
            return _cmp(len(a) >= 16, len(b) >= 16)
        va, vb = a[6] >> 4, b[6] >> 4
        if va != vb:
            return _cmp(va, vb)
        if va == 1:
            c = _cmp(_timeuuid_key(a), _timeuuid_key(b))
            if c:
                return c
        return _cmp(a, b)
    subs = _subtypes(t)
    if k in ("list", "set"):
        ea, eb = _read_elements(t, a), _read_elements(t, b)
        et = subs[0] if subs else None
        for x, y in zip(ea, eb):
            c = _cmp_nullable(et, x, y)
            if c:
                return c
        return _cmp(len(ea), len(eb))
    if k == "map":
        ea, eb = _read_elements_map(t, a), _read_elements_map(t, b)
        kt = subs[0] if subs else None
        vt = subs[1] if len(subs) > 1 else None
        for (xk, xv), (yk, yv) in zip(ea, eb):
            c = _cmp_nullable(kt, xk, yk) or _cmp_nullable(vt, xv, yv)
            if c:
                return c
        return _cmp(len(ea), len(eb))
    if k in ("tuple", "udt", "user", "usertype"):
        fa, fb = _read_fields(t, a), _read_fields(t, b)
        for i in range(max(len(fa), len(fb))):
            x = fa[i] if i < len(fa) else None
            y = fb[i] if i < len(fb) else None
            c = _cmp_nullable(subs[i] if i < len(subs) else None, x, y)
            if c:
                return c
        return 0
    if k == "vector":
        et = subs[0] if subs else None
        size = getattr(et, "fixed_length", None)
        if size:
            for i in range(0, min(len(a), len(b)), size):
                c = compare_values(et, a[i:i + size], b[i:i + size])
                if c:
                    return c
        return _cmp(a, b)
    return _cmp(a, b)


def _cmp_nullable(t, x, y) -> int:
    if x is None or y is None:
        return _cmp(x is not None, y is not None)
    if t is None:
        return _cmp(x, y)
    return compare_values(t, x, y)


def _read_elements_map(t, data: bytes) -> list:
    """(key, value) pairs of a frozen map: int32 count, then key and value of each entry."""
    flat = read_length_prefixed(data, 4, 2 * struct.unpack_from(">i", data, 0)[0], "key/value", t)[0]
    return list(zip(flat[::2], flat[1::2]))


def compare_clustering(table, a: tuple, b: tuple) -> int:
    """Compare two clustering prefixes (tuples of serialized values) in the table's clustering order.

    Only the common prefix is compared; a DESC column (``ColumnMetadata.reversed``) reverses its component.
    """
    cols = table.clustering
    for i in range(min(len(a), len(b))):
        x, y = a[i], b[i]
        if x is None or y is None:
            c = _cmp(x is not None, y is not None)
        else:
            c = compare_values(cols[i].type, x, y)
        if c:
            return -c if cols[i].reversed else c
    return 0


def clustering_sort_key(table):
    """A ``sorted`` key for clustering bytes (``encode_clustering``) in the table's clustering order."""
    return cmp_to_key(lambda x, y: compare_clustering(table, decode_clustering(x), decode_clustering(y)))


@lru_cache(maxsize=65536)
def _bound(data: bytes) -> tuple:
    return decode_clustering(data) if data else ()


def range_covers(table, rt_key: tuple, clustering: tuple) -> bool:
    """True when the range tombstone bounds ``rt_key`` = (start, start_incl, end, end_incl) cover a row."""
    start, start_incl, end, end_incl = rt_key
    s = _bound(start)
    e = _bound(end)
    c = compare_clustering(table, clustering, s) if s else 0
    if c < 0 or (c == 0 and s and not start_incl):
        return False
    c = compare_clustering(table, clustering, e) if e else 0
    if c > 0 or (c == 0 and e and not end_incl):
        return False
    return True


# ---------------------------------------------------------------------------------------------------------
# State objects

class RowState:
    """Everything known about one clustering row (or the static row) of a partition."""
    __slots__ = ("liveness", "deletion", "shadowable", "cells", "complex")

    def __init__(self):
        self.liveness = None       # (ts, ttl, local_expiration_time)
        self.deletion = None       # (marked_for_delete_at, local_deletion_time)
        self.shadowable = None     # shadowable row deletion (materialized views)
        self.cells = {}            # column -> cell
        self.complex = {}          # column -> [complex deletion | None, {path: cell}]

    def is_empty(self) -> bool:
        return (self.liveness is None and self.deletion is None and self.shadowable is None
                and not self.cells and not self.complex)

    def copy(self) -> "RowState":
        r = RowState()
        r.liveness, r.deletion, r.shadowable = self.liveness, self.deletion, self.shadowable
        r.cells = dict(self.cells)
        r.complex = {k: [v[0], dict(v[1])] for k, v in self.complex.items()}
        return r

    def __eq__(self, other):
        return (isinstance(other, RowState) and self.liveness == other.liveness
                and self.deletion == other.deletion and self.shadowable == other.shadowable
                and self.cells == other.cells and self.complex == other.complex)

    def __repr__(self):
        return (f"RowState(liveness={self.liveness}, deletion={self.deletion}, shadowable={self.shadowable}, "
                f"cells={self.cells}, complex={self.complex})")


class PartitionState:
    """The state of one partition: its tombstones, static row and clustering rows."""
    __slots__ = ("deletion", "range_tombstones", "static", "rows")

    def __init__(self):
        self.deletion = None            # partition deletion (marked_for_delete_at, ldt)
        self.range_tombstones = {}      # (start, start_incl, end, end_incl) -> deletion
        self.static = RowState()
        self.rows = {}                  # clustering bytes -> RowState

    def is_empty(self) -> bool:
        return (self.deletion is None and not self.range_tombstones and self.static.is_empty()
                and not self.rows)

    def copy(self) -> "PartitionState":
        p = PartitionState()
        p.deletion = self.deletion
        p.range_tombstones = dict(self.range_tombstones)
        p.static = self.static.copy()
        p.rows = {k: v.copy() for k, v in self.rows.items()}
        return p

    def __eq__(self, other):
        return (isinstance(other, PartitionState) and self.deletion == other.deletion
                and self.range_tombstones == other.range_tombstones and self.static == other.static
                and self.rows == other.rows)

    def __repr__(self):
        return (f"PartitionState(deletion={self.deletion}, range_tombstones={self.range_tombstones}, "
                f"static={self.static}, rows={self.rows})")


# ---------------------------------------------------------------------------------------------------------
# Shadowing

def _row_shadow_ts(table, part: PartitionState, ck: bytes, row: Optional[RowState]) -> int:
    """The highest regular deletion timestamp that covers clustering row ``ck``."""
    ts = part.deletion[0] if part.deletion is not None else NO_TIMESTAMP
    if row is not None and row.deletion is not None and row.deletion[0] > ts:
        ts = row.deletion[0]
    if part.range_tombstones:
        clustering = None
        for rk, d in part.range_tombstones.items():
            if d[0] > ts:
                if clustering is None:
                    clustering = decode_clustering(ck)
                if range_covers(table, rk, clustering):
                    ts = d[0]
    return ts


def _purge_row(row: RowState, shadow: int) -> None:
    """Drop everything in ``row`` written at or before ``shadow`` (covered by a regular deletion)."""
    if shadow == NO_TIMESTAMP:
        return
    if row.liveness is not None and row.liveness[0] <= shadow:
        row.liveness = None
    if row.shadowable is not None and row.shadowable[0] <= shadow:
        row.shadowable = None
    if row.cells:
        dead = [c for c, cell in row.cells.items() if cell[0] <= shadow]
        for c in dead:
            del row.cells[c]
    if row.complex:
        for col in list(row.complex):
            entry = row.complex[col]
            if entry[0] is not None and entry[0][0] <= shadow:
                entry[0] = None
            cells = entry[1]
            dead = [p for p, cell in cells.items() if cell[0] <= shadow]
            for p in dead:
                del cells[p]
            if entry[0] is None and not cells:
                del row.complex[col]


def _purge_complex(entry: list) -> None:
    d = entry[0]
    if d is None:
        return
    cells = entry[1]
    dead = [p for p, cell in cells.items() if cell[0] <= d[0]]
    for p in dead:
        del cells[p]


def _normalize_row_deletion(row: RowState, part_shadow: int) -> None:
    """A row deletion at or below a covering partition/range deletion says nothing more: drop it."""
    if row.deletion is not None and row.deletion[0] <= part_shadow and part_shadow != NO_TIMESTAMP:
        row.deletion = None


def _purge_rows(part: PartitionState, keys: list, shadow: int) -> None:
    """Purge the rows ``keys`` of ``part`` under a partition or range deletion at ``shadow``; drop those left
    empty."""
    for ck in keys:
        row = part.rows[ck]
        _purge_row(row, shadow)
        _normalize_row_deletion(row, shadow)
        if row.is_empty():
            del part.rows[ck]


# ---------------------------------------------------------------------------------------------------------
# Applying cell-log records

ALL_ROWS = "*"        # apply_record's "every row of the partition may have changed"
STATIC_ROW = "static"  # apply_record's "the static row changed"


class _TableInfo:
    """Per-table facts the hot loops need, computed once per table object (recomputed when its column or
    dropped-column count changes; build a new TableMetadata rather than editing one in place)."""
    __slots__ = ("shape", "counter", "lists", "complex", "drop_time", "current", "typed_columns", "pk_cols",
                 "ck_cols", "pk_memo_ok", "pk_memo", "table_id", "change_plan", "key_names")

    def __init__(self, table, shape):
        self.shape = shape
        every = dict(table.dropped)
        every.update(table.columns)
        self.counter = frozenset(n for n, c in every.items() if _type_kind(c.type) == "counter")
        self.complex = frozenset(n for n, c in every.items() if c.type.multicell)
        self.lists = frozenset(n for n, c in table.columns.items() if _type_kind(c.type) == "list")
        self.current = frozenset(table.columns)
        self.drop_time = {n: d.dropped_time for n, d in table.dropped.items()}
        self.typed_columns = [(c.name, c.kind, c.type, _type_kind(c.type) == "counter", bool(c.type.multicell))
                              for c in table.columns.values() if c.kind not in ("partition_key", "clustering")]
        self.pk_cols = tuple((c.name, c.type) for c in table.partition_key)
        self.ck_cols = tuple((c.name, c.type) for c in table.clustering)
        # consecutive typed rows mostly share one partition key: remember its decoded values, but only when
        # they are immutable (a frozen collection decodes to a list/dict a caller could change)
        self.pk_memo_ok = all(_type_kind(t) in _IMMUTABLE_KINDS for _, t in self.pk_cols)
        self.pk_memo = None      # (partition key bytes, ((column, value), ...))
        self.table_id = str(table.id)
        # (name, 0 key / 1 static / 2 regular) in table.columns order: which image an event compares
        self.change_plan = [(c.name, 0 if c.kind in ("partition_key", "clustering") else
                             (1 if c.kind == "static" else 2)) for c in table.columns.values()]
        self.key_names = [c.name for c in table.partition_key] + [c.name for c in table.clustering]


_IMMUTABLE_KINDS = frozenset(("ascii", "text", "varchar", "blob", "boolean", "tinyint", "smallint", "int", "bigint",
                              "counter", "varint", "float", "double", "uuid", "timeuuid"))


_INFO: dict = {}


def _info(table) -> _TableInfo:
    hit = _INFO.get(id(table))
    if hit is not None and hit[0] is table:
        info = hit[1]
        shape = info.shape
        if shape[0] == len(table.columns) and shape[1] == len(table.dropped):
            return info
    shape = (len(table.columns), len(table.dropped))
    info = _TableInfo(table, shape)
    if len(_INFO) > 4096:
        _INFO.clear()
    _INFO[id(table)] = (table, info)
    return info


def _is_counter_column(table, column: str) -> bool:
    return column in _info(table).counter


def _is_list_column(table, column: str) -> bool:
    return column in _info(table).lists


def _is_complex_column(table, column: str, has_path: bool) -> bool:
    info = _info(table)
    if column in info.complex:
        return True
    return has_path and column not in info.current and column not in info.drop_time


def apply_record(table, part: PartitionState, rec) -> object:
    """Join one cell-log record (a dict with ``celllog.CELL_LOG_SCHEMA`` fields) into ``part``.

    Returns what may have changed: the clustering bytes of one row, ``STATIC_ROW`` or ``ALL_ROWS``; ``None``
    when the record changed nothing.
    """
    return _apply_record(_info(table), table, part, rec)


def _apply_record(info: _TableInfo, table, part: PartitionState, rec) -> object:
    """``apply_record`` with the table's facts already looked up (callers in loops look them up once)."""
    kind = rec["kind"]
    ts = rec["timestamp"]
    ldt = rec["local_deletion_time"]
    if kind == KIND_PARTITION_DELETION:
        d = (ts, ldt)
        if part.deletion is not None and part.deletion >= d:
            return None
        part.deletion = d
        for rk in [rk for rk, rd in part.range_tombstones.items() if rd[0] <= ts]:
            del part.range_tombstones[rk]
        _purge_row(part.static, ts)
        _purge_rows(part, list(part.rows), ts)
        return ALL_ROWS
    if part.deletion is not None and ts <= part.deletion[0]:
        return None       # shadowed by the partition deletion (or a tombstone subsumed by it)
    if kind == KIND_RANGE_TOMBSTONE:
        rk = (rec["clustering"] or b"", bool(rec["start_inclusive"]),
              rec["clustering_end"] or b"", bool(rec["end_inclusive"]))
        d = (ts, ldt)
        cur = part.range_tombstones.get(rk)
        if cur is not None and cur >= d:
            return None
        part.range_tombstones[rk] = d
        _purge_rows(part, [ck for ck in part.rows if range_covers(table, rk, decode_clustering(ck))], ts)
        return ALL_ROWS
    is_static = bool(rec["is_static"])
    if is_static:
        ck = STATIC_ROW
        row = part.static
    else:
        ck = rec["clustering"] or b""
        if part.range_tombstones and ts <= _row_shadow_ts(table, part, ck, None):
            return None   # covered by a range tombstone
        row = part.rows.get(ck)
        if row is None:
            row = part.rows[ck] = RowState()
    changed = _apply_to_row(info, row, rec, kind, ts, ldt)
    if not is_static and row.is_empty():
        del part.rows[ck]
    return ck if changed else None


def _apply_to_row(info: _TableInfo, row: RowState, rec, kind: str, ts: int, ldt: int) -> bool:
    if kind == KIND_ROW_DELETION:
        d = (ts, ldt)
        if row.deletion is not None and row.deletion >= d:
            return False
        row.deletion = d
        _purge_row(row, ts)
        return True
    if row.deletion is not None and ts <= row.deletion[0]:
        return False      # shadowed by the row deletion
    if kind == KIND_CELL or kind == KIND_CELL_TOMBSTONE:
        column = rec["column"]
        if column is None:
            raise StateError(f"{kind} record without a column")
        value = rec["value"]
        tomb = kind == KIND_CELL_TOMBSTONE
        cell = (ts, 0 if tomb else (rec["ttl"] or 0), ldt, tomb, b"" if value is None or tomb else bytes(value))
        path = rec["path"]
        if not tomb and column in info.counter:
            return _apply_counter(row, column, ts, cell[4])
        # _is_complex_column, inlined
        if column in info.complex or (path is not None and column not in info.current
                                      and column not in info.drop_time):
            if path is None:
                raise StateError(f"cell of complex column {column!r} without a cell path")
            entry = row.complex.get(column)
            if entry is None:
                entry = row.complex[column] = [None, {}]
            elif entry[0] is not None and ts <= entry[0][0]:
                return False
            path = bytes(path)
            cur = entry[1].get(path)
            new = cell if cur is None else reconcile_cells(cur, cell)
            if new == cur:
                return False
            entry[1][path] = new
            return True
        cur = row.cells.get(column)
        new = cell if cur is None else reconcile_cells(cur, cell)
        if new == cur:
            return False
        row.cells[column] = new
        return True
    if kind == KIND_ROW_LIVENESS:
        ttl = rec["ttl"] or 0
        new = reconcile_liveness(row.liveness, (ts, ttl, ldt))
        if new == row.liveness:
            return False
        row.liveness = new
        return True
    if kind == KIND_ROW_DELETION_SHADOWABLE:
        d = (ts, ldt)
        if row.shadowable is not None and row.shadowable >= d:
            return False
        row.shadowable = d
        return True
    if kind == KIND_COMPLEX_DELETION:
        column = rec["column"]
        if column is None:
            raise StateError("complex_deletion record without a column")
        entry = row.complex.get(column)
        d = (ts, ldt)
        if entry is None:
            row.complex[column] = [d, {}]
            return True
        if entry[0] is not None and entry[0] >= d:
            return False
        entry[0] = d
        _purge_complex(entry)
        return True
    raise StateError(f"unknown cell-log kind {kind!r}")


def _shard_rank(cell: tuple) -> tuple:
    """(kind rank, clock, count) of a stored shard: the order ``CounterContext.merge`` picks a shard by."""
    v = cell[4]
    return v[0], _signed(v[1:9]), _signed(v[9:17])


def _apply_counter(row: RowState, column: str, ts: int, context: bytes) -> bool:
    """Join a live counter cell: its shards become elements of ``row.complex[column]``.

    Each shard is kept with the timestamp of the cell that brought it, so that deletions shadow exactly the
    shards written at or before them whatever the arrival order (Cassandra merges a context's timestamp to
    the maximum, which makes "delete, then increment" depend on compaction timing). Per counter id that takes
    more than the winning shard: a shard with a lower clock but a later timestamp (a coordinator whose clock
    runs behind) wins once a deletion between the two timestamps shadows the other. So every shard no other
    shard of its id beats on both counts (rank and timestamp) is kept, keyed by counter id + timestamp; a
    reader takes, per id, the best rank among the shards no deletion covers.
    """
    if not context:
        return False
    entry = row.complex.get(column)
    if entry is None:
        entry = row.complex[column] = [None, {}]
    shards = entry[1]
    changed = False
    for cid, rank in _parse_context(context).items():
        same = [(p, _shard_rank(c), c[0]) for p, c in shards.items() if p[:16] == cid]
        if any(r >= rank and t >= ts for _, r, t in same):
            continue
        for p, r, t in same:
            if r <= rank and t <= ts:
                del shards[p]
        kind, clock, count = rank
        shards[cid + struct.pack(">q", ts)] = (ts, 0, NO_DELETION_TIME, False,
                                               bytes((kind,)) + struct.pack(">qq", clock, count))
        changed = True
    return changed


def _counter_shards_total(shards, floor: int) -> Optional[int]:
    """The total a counter shows from its shard elements written after ``floor``: per counter id the best
    shard, summed; None when no shard is left."""
    best: dict = {}
    for p, c in shards.items():
        if c[0] > floor:
            r = _shard_rank(c)
            cur = best.get(p[:16])
            if cur is None or r > cur:
                best[p[:16]] = r
    return sum(r[2] for r in best.values()) if best else None


def counter_shards_context(shards: dict) -> bytes:
    """The canonical counter context of a counter column's shard elements ({counter id: cell})."""
    return _encode_context({cid: (c[4][0], _signed(c[4][1:9]), _signed(c[4][9:17])) for cid, c in shards.items()})


def apply_records(table, states: dict, records: Iterable) -> set:
    """Join records of one table into ``states`` ({partition key bytes: PartitionState}); returns touched keys."""
    touched = set()
    info = _info(table)
    for rec in records:
        pk = rec["partition_key"]
        part = states.get(pk)
        if part is None:
            part = states[pk] = PartitionState()
        _apply_record(info, table, part, rec)
        touched.add(pk)
    return touched


def merge_partitions(table, a: PartitionState, b: PartitionState) -> PartitionState:
    """The join of two partition states (neither is modified)."""
    out = a.copy()
    for rec in partition_cell_records(b, table=table):
        apply_record(table, out, rec)
    return out


def partition_cell_records(part: PartitionState, partition_key: bytes = b"", table=None) -> list:
    """The state expressed as cell-log-shaped records (tombstones first); replaying them rebuilds it."""
    out = []

    def rec(kind, ts, ldt, clustering=b"", is_static=False, column=None, path=None, value=None, ttl=0,
            end=None, si=None, ei=None):
        out.append({"kind": kind, "timestamp": ts, "local_deletion_time": ldt, "clustering": clustering,
                    "clustering_end": end, "start_inclusive": si, "end_inclusive": ei, "is_static": is_static,
                    "column": column, "path": path, "value": value, "ttl": ttl,
                    "partition_key": partition_key})

    if part.deletion is not None:
        rec(KIND_PARTITION_DELETION, *part.deletion)
    for (s, si, e, ei), d in part.range_tombstones.items():
        rec(KIND_RANGE_TOMBSTONE, d[0], d[1], s, end=e, si=si, ei=ei)

    def row_records(ck, row, is_static):
        if row.deletion is not None:
            rec(KIND_ROW_DELETION, *row.deletion, clustering=ck, is_static=is_static)
        if row.shadowable is not None:
            rec(KIND_ROW_DELETION_SHADOWABLE, *row.shadowable, clustering=ck, is_static=is_static)
        if row.liveness is not None:
            rec(KIND_ROW_LIVENESS, row.liveness[0], row.liveness[2], clustering=ck, is_static=is_static,
                ttl=row.liveness[1])
        for col, (d, cells) in row.complex.items():
            if d is not None:
                rec(KIND_COMPLEX_DELETION, d[0], d[1], clustering=ck, is_static=is_static, column=col)
            if table is not None and _is_counter_column(table, col):
                for path, c in cells.items():
                    rec(KIND_CELL, c[0], c[2], clustering=ck, is_static=is_static, column=col,
                        value=counter_shards_context({path[:16]: c}))
                continue
            for path, c in cells.items():
                rec(KIND_CELL_TOMBSTONE if c[3] else KIND_CELL, c[0], c[2], clustering=ck, is_static=is_static,
                    column=col, path=path, value=c[4], ttl=c[1])
        for col, c in row.cells.items():
            rec(KIND_CELL_TOMBSTONE if c[3] else KIND_CELL, c[0], c[2], clustering=ck, is_static=is_static,
                column=col, value=c[4], ttl=c[1])

    row_records(b"", part.static, True)
    for ck, row in part.rows.items():
        row_records(ck, row, False)
    return out


# ---------------------------------------------------------------------------------------------------------
# Reading: liveness and visible rows at ``now``

def _cell_live(cell: tuple, now: int) -> bool:
    return not cell[3] and (cell[1] == 0 or now < cell[2])


def _liveness_live(lv: Optional[tuple], now: int) -> bool:
    if lv is None or lv[1] == EXPIRED_LIVENESS_TTL:
        return False
    return lv[1] == 0 or now < lv[2]


def _dropped_hides(table, column: str, ts: int) -> bool:
    info = _info(table)
    if column in info.current:
        d = info.drop_time.get(column)
        return d is not None and ts <= d
    return True     # cells of a column not in the table (dropped, not re-added) are never shown


def _effective_shadowable(row: RowState) -> int:
    s = row.shadowable
    if s is None:
        return NO_TIMESTAMP
    if row.liveness is not None and row.liveness[0] > s[0]:
        return NO_TIMESTAMP
    return s[0]


def row_image(table, row: Optional[RowState], now: int, extra_shadow: int = NO_TIMESTAMP) -> Optional[dict]:
    """The live content of a row at ``now`` in bytes: {column: bytes | int | tuple of (path, bytes)}.

    Simple columns map to their value bytes, counters to their total, complex columns to their live
    (path, value) pairs. Returns None when the row is not live (no live liveness and no live cell).
    ``extra_shadow`` is a deletion timestamp covering the row from outside (the engine purges regular
    deletions, so this is only needed for shadowable ones, which are applied here).
    """
    if row is None:
        return None
    return _row_image(_info(table), table, row, now, extra_shadow)


def _row_image(info: _TableInfo, table, row: RowState, now: int, extra_shadow: int = NO_TIMESTAMP) -> Optional[dict]:
    """``row_image`` of a row (not None) with the table's facts already looked up."""
    current, drop_time = info.current, info.drop_time
    lv = row.liveness
    s = row.shadowable
    # max(extra_shadow, _effective_shadowable(row)), inlined
    if s is None or (lv is not None and lv[0] > s[0]) or s[0] <= extra_shadow:
        shadow = extra_shadow
    else:
        shadow = s[0]
    live = lv is not None and lv[0] > shadow and _liveness_live(lv, now)
    image = {}
    for col, cell in row.cells.items():
        if cell[3] or cell[0] <= shadow or (cell[1] and now >= cell[2]) or col not in current:
            continue
        if drop_time and col in drop_time and cell[0] <= drop_time[col]:
            continue
        image[col] = cell[4]
    for col, (d, cells) in row.complex.items():
        if col not in current:
            continue
        floor = shadow
        if drop_time and col in drop_time:
            floor = max(floor, drop_time[col])
        if col in info.counter:
            tomb = row.cells.get(col)
            if tomb is not None and tomb[0] > shadow:
                continue      # a counter tombstone beats every counter cell (CASSANDRA-7346)
            total = _counter_shards_total(cells, floor)
            if total is not None:
                image[col] = total
            continue
        items = tuple(sorted((p, c[4]) for p, c in cells.items()
                             if c[0] > floor and not c[3] and (not c[1] or now < c[2])))
        if items:
            if col in info.lists:
                # a list shows its values in cell-path (timeuuid) order; the paths themselves are invisible
                pt = table.columns[col].type.path_type
                items = tuple((None, v) for _, v in sorted(items, key=lambda pv: pt.sort_key(pv[0])))
            image[col] = items
    if not live and not image:
        return None
    return image


def partition_images(table, part: PartitionState, now: int, only: Optional[Iterable] = None) -> dict:
    """{row key: (static image, row image)} for every visible CQL row of the partition at ``now``.

    The row key is the clustering bytes, or ``STATIC_KEY`` (None) for the static-only row. With ``only``
    (an iterable of clustering bytes) just those rows are examined, plus the static-only row.
    """
    info = _info(table)
    static = part.static
    static_img = _row_image(info, table, static, now) if not static.is_empty() else None
    static_vals = static_img if static_img is not None else {}
    out = {}
    rows = part.rows
    if only is None:
        for ck, row in rows.items():
            img = _row_image(info, table, row, now)
            if img is not None:
                out[ck] = (static_vals, img)
    else:
        for ck in only:
            row = rows.get(ck)
            if row is None:
                continue
            img = _row_image(info, table, row, now)
            if img is not None:
                out[ck] = (static_vals, img)
    if static_img is not None and _no_visible_row(info, table, part, now, out, only):
        out[STATIC_KEY] = (static_img, None)
    return out


def _no_visible_row(info, table, part, now, found, only) -> bool:
    if found:
        return False
    if only is None:
        return True
    for ck, row in part.rows.items():
        if _row_image(info, table, row, now) is not None:
            return False
    return True


def is_row_live(table, part: PartitionState, key, now: int) -> bool:
    """Whether the CQL row ``key`` (clustering bytes, or STATIC_KEY) of the partition is visible at ``now``."""
    if key is STATIC_KEY:
        return STATIC_KEY in partition_images(table, part, now, ())
    return row_image(table, part.rows.get(key), now) is not None


def _decode(col, data):
    return col.type.decode(data)


def typed_row(table, partition_key: bytes, key, images: Optional[tuple]) -> Optional[dict]:
    """Turn (static image, row image) into the typed CQL row {column: Python value or None}."""
    if images is None:
        return None
    return _typed_row(_info(table), table, partition_key, key, images)


def _key_values(info: _TableInfo, table, partition_key: bytes) -> dict:
    """{partition key column: decoded value} (a new dict each call)."""
    memo = info.pk_memo
    if memo is not None and memo[0] == partition_key:
        return dict(memo[1])
    pairs = tuple((name, t.decode(v)) for (name, t), v in zip(info.pk_cols, split_partition_key(table, partition_key)))
    if info.pk_memo_ok:
        info.pk_memo = (partition_key, pairs)
    return dict(pairs)


def _typed_row(info: _TableInfo, table, partition_key: bytes, key, images: tuple) -> dict:
    """``typed_row`` of images (not None) with the table's facts already looked up."""
    static_img, img = images
    row = _key_values(info, table, partition_key)
    ck_cols = info.ck_cols
    if ck_cols:
        ck_values = decode_clustering(key) if key else ()
        n = len(ck_values)
        for i, (name, t) in enumerate(ck_cols):
            v = ck_values[i] if i < n else None
            row[name] = None if v is None else t.decode(v)
    for name, kind, ctype, is_counter, is_complex in info.typed_columns:
        src = static_img if kind == "static" else img
        v = None if src is None else src.get(name)
        if v is None:
            row[name] = None
        elif is_counter:
            row[name] = v
        elif is_complex:
            row[name] = ctype.decode_cells(_in_path_order(ctype, v))
        else:
            row[name] = ctype.decode(v)
    return row


def _in_path_order(t, items) -> list:
    pt = t.path_type
    if pt is None or _type_kind(t) == "list":
        return list(items)     # list images are already in path order, without their paths
    return sorted(items, key=lambda pv: pt.sort_key(pv[0]))


def visible_row(table, partition_key: bytes, part: Optional[PartitionState], key, now: int) -> Optional[dict]:
    """The typed CQL row ``key`` (clustering bytes or STATIC_KEY) of a partition at ``now``, or None."""
    if part is None:
        return None
    if key is STATIC_KEY:
        images = partition_images(table, part, now, ()).get(STATIC_KEY)
    else:
        img = row_image(table, part.rows.get(key), now)
        if img is None:
            return None
        static_img = row_image(table, part.static, now) if not part.static.is_empty() else None
        images = (static_img or {}, img)
    return typed_row(table, partition_key, key, images)


def visible_rows(table, partition_key: bytes, part: Optional[PartitionState], now: int) -> dict:
    """{row key: typed row} of every visible CQL row of a partition at ``now``."""
    if part is None:
        return {}
    return {k: typed_row(table, partition_key, k, imgs)
            for k, imgs in partition_images(table, part, now).items()}


def split_partition_key(table, key: bytes) -> tuple:
    """The serialized components of a partition key (CompositeType for multi-column keys)."""
    if len(table.partition_key) <= 1:
        return (key,)
    out = []
    i = 0
    while i < len(key):
        ln = int.from_bytes(key[i:i + 2], "big")
        out.append(key[i + 2:i + 2 + ln])
        i += 3 + ln
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------
# Serialization (one plain record per row; the Delta layer stores these)

_CELL_STRUCT = pa.struct([
    pa.field("column", pa.string(), nullable=False),
    pa.field("path", pa.binary()),                       # complex columns' cell path, else null
    pa.field("value", pa.binary(), nullable=False),      # value bytes (counter context for counters)
    pa.field("ts", pa.int64(), nullable=False),          # write timestamp, micros
    pa.field("ttl", pa.int32(), nullable=False),
    pa.field("ldt", pa.int64(), nullable=False),         # expiry (expiring) / deletion time (tombstone), s
    pa.field("tombstone", pa.bool_(), nullable=False),
])
_DELETION_STRUCT = pa.struct([
    pa.field("column", pa.string(), nullable=False),
    pa.field("ts", pa.int64(), nullable=False),
    pa.field("ldt", pa.int64(), nullable=False),
])
_RT_STRUCT = pa.struct([
    pa.field("start", pa.binary(), nullable=False),
    pa.field("start_inclusive", pa.bool_(), nullable=False),
    pa.field("end", pa.binary(), nullable=False),
    pa.field("end_inclusive", pa.bool_(), nullable=False),
    pa.field("ts", pa.int64(), nullable=False),
    pa.field("ldt", pa.int64(), nullable=False),
])

ROW_KIND_PARTITION = "partition"   # the partition's own tombstones
ROW_KIND_STATIC = "static"
ROW_KIND_ROW = "row"

STATE_SCHEMA = pa.schema([
    pa.field("partition_key", pa.binary(), nullable=False),
    pa.field("row_kind", pa.string(), nullable=False),     # partition | static | row
    pa.field("clustering", pa.binary(), nullable=False),   # b"" for partition/static records
    pa.field("liveness_ts", pa.int64()),
    pa.field("liveness_ttl", pa.int32()),
    pa.field("liveness_ldt", pa.int64()),
    pa.field("deletion_ts", pa.int64()),                   # row deletion, or partition deletion
    pa.field("deletion_ldt", pa.int64()),
    pa.field("shadowable_ts", pa.int64()),
    pa.field("shadowable_ldt", pa.int64()),
    pa.field("cells", pa.list_(_CELL_STRUCT)),
    pa.field("complex_deletions", pa.list_(_DELETION_STRUCT)),
    pa.field("range_tombstones", pa.list_(_RT_STRUCT)),
])


def _row_record(pk: bytes, kind: str, ck: bytes, row: RowState) -> dict:
    lv, d, s = row.liveness, row.deletion, row.shadowable
    cells = [{"column": col, "path": None, "value": c[4], "ts": c[0], "ttl": c[1], "ldt": c[2], "tombstone": c[3]}
             for col, c in sorted(row.cells.items())]
    cdel = []
    for col, (cd, elems) in sorted(row.complex.items()):
        if cd is not None:
            cdel.append({"column": col, "ts": cd[0], "ldt": cd[1]})
        for p, c in sorted(elems.items()):
            cells.append({"column": col, "path": p, "value": c[4], "ts": c[0], "ttl": c[1], "ldt": c[2],
                          "tombstone": c[3]})
    return {"partition_key": pk, "row_kind": kind, "clustering": ck,
            "liveness_ts": None if lv is None else lv[0], "liveness_ttl": None if lv is None else lv[1],
            "liveness_ldt": None if lv is None else lv[2],
            "deletion_ts": None if d is None else d[0], "deletion_ldt": None if d is None else d[1],
            "shadowable_ts": None if s is None else s[0], "shadowable_ldt": None if s is None else s[1],
            "cells": cells, "complex_deletions": cdel, "range_tombstones": []}


def partition_to_records(partition_key: bytes, part: PartitionState) -> list:
    """One record per row (``STATE_SCHEMA``): a ``partition`` record when the partition has tombstones,
    a ``static`` record when the static row has content, and a ``row`` record per clustering row."""
    out = []
    if part.deletion is not None or part.range_tombstones:
        d = part.deletion
        rts = [{"start": s, "start_inclusive": si, "end": e, "end_inclusive": ei, "ts": rd[0], "ldt": rd[1]}
               for (s, si, e, ei), rd in sorted(part.range_tombstones.items())]
        out.append({"partition_key": partition_key, "row_kind": ROW_KIND_PARTITION, "clustering": b"",
                    "liveness_ts": None, "liveness_ttl": None, "liveness_ldt": None,
                    "deletion_ts": None if d is None else d[0], "deletion_ldt": None if d is None else d[1],
                    "shadowable_ts": None, "shadowable_ldt": None,
                    "cells": [], "complex_deletions": [], "range_tombstones": rts})
    if not part.static.is_empty():
        out.append(_row_record(partition_key, ROW_KIND_STATIC, b"", part.static))
    for ck in sorted(part.rows):
        out.append(_row_record(partition_key, ROW_KIND_ROW, ck, part.rows[ck]))
    return out


def _row_from_record(r: dict) -> RowState:
    row = RowState()
    if r.get("liveness_ts") is not None:
        row.liveness = (r["liveness_ts"], r["liveness_ttl"] or 0, r["liveness_ldt"])
    if r.get("deletion_ts") is not None:
        row.deletion = (r["deletion_ts"], r["deletion_ldt"])
    if r.get("shadowable_ts") is not None:
        row.shadowable = (r["shadowable_ts"], r["shadowable_ldt"])
    for cd in r.get("complex_deletions") or ():
        row.complex[cd["column"]] = [(cd["ts"], cd["ldt"]), {}]
    for c in r.get("cells") or ():
        cell = (c["ts"], c["ttl"], c["ldt"], bool(c["tombstone"]), bytes(c["value"]))
        if c["path"] is None:
            row.cells[c["column"]] = cell
        else:
            entry = row.complex.get(c["column"])
            if entry is None:
                entry = row.complex[c["column"]] = [None, {}]
            entry[1][bytes(c["path"])] = cell
    return row


def partition_from_records(records: Iterable[dict]) -> PartitionState:
    """Inverse of ``partition_to_records`` (records of one partition, any order)."""
    part = PartitionState()
    for r in records:
        kind = r["row_kind"]
        if kind == ROW_KIND_PARTITION:
            if r.get("deletion_ts") is not None:
                part.deletion = (r["deletion_ts"], r["deletion_ldt"])
            for rt in r.get("range_tombstones") or ():
                part.range_tombstones[(bytes(rt["start"]), bool(rt["start_inclusive"]), bytes(rt["end"]),
                                       bool(rt["end_inclusive"]))] = (rt["ts"], rt["ldt"])
        elif kind == ROW_KIND_STATIC:
            part.static = _row_from_record(r)
        elif kind == ROW_KIND_ROW:
            part.rows[bytes(r["clustering"])] = _row_from_record(r)
        else:
            raise StateError(f"unknown state row_kind {kind!r}")
    return part
