"""Realistic generated workloads: what a 3-node, RF 3 cluster writes to its commit logs.

Used by the demo, the benchmarks and the tests. ``Workload`` produces logical writes as Cassandra's storage
layer sees them (``commitlog.model.Mutation``): inserts with row markers, partial updates, TTLs, collection element
adds/removes and overwrites (a complex deletion at ``ts - 1`` plus the new elements at ``ts``, as Cassandra writes
them), static columns, cell/row/range/partition deletions, counters, and batches of several statements on one
partition (one mutation), with client timestamps that do not follow arrival order. ``write_cluster_segments``
then gives every replica its copy, in a per-node arrival order, in real segment files written by
``commitlog.writer.SegmentWriter``.
"""
from __future__ import annotations

import datetime
import decimal
import ipaddress
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from functools import cmp_to_key

from cdc_lib.commitlog.model import (NO_TIMESTAMP, BoundKind, Cell, DeletionTime, LivenessInfo, Mutation,
                                     PartitionUpdate, RangeTombstoneMarker, Row, mutation_id)
from cdc_lib.commitlog.mutation import encode_mutation, finish_update
from cdc_lib.commitlog.writer import SegmentFull, SegmentWriter
from cdc_lib.cql import types as cqltypes

SAMPLE_SCHEMA_CQL = """
CREATE KEYSPACE shop WITH replication = {'class': 'NetworkTopologyStrategy', 'dc1': '3'};

CREATE TYPE shop.address (street text, city text, zip int);

CREATE TABLE shop.orders (
    customer_id uuid,
    order_day date,
    order_id timeuuid,
    customer_name text static,
    loyalty_points int static,
    status text,
    total decimal,
    items map<text, int>,
    tags set<text>,
    notes list<text>,
    shipping frozen<address>,
    PRIMARY KEY ((customer_id), order_day, order_id)
) WITH CLUSTERING ORDER BY (order_day DESC, order_id ASC)
    AND ID = 5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e01
    AND cdc = true;

CREATE TABLE shop.sessions (
    user_id bigint,
    device text,
    started timestamp,
    ip inet,
    pages list<text>,
    PRIMARY KEY ((user_id, device))
) WITH ID = 5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e02
    AND cdc = true;

CREATE TABLE shop.page_views (
    page text,
    day date,
    views counter,
    clicks counter,
    PRIMARY KEY ((page), day)
) WITH ID = 5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e03
    AND cdc = true;

CREATE TABLE shop.all_types (
    id int,
    ck_text text,
    ck_int int,
    a_ascii ascii,
    a_bigint bigint,
    a_blob blob,
    a_boolean boolean,
    a_date date,
    a_decimal decimal,
    a_double double,
    a_duration duration,
    a_float float,
    a_inet inet,
    a_int int,
    a_smallint smallint,
    a_text text,
    a_time time,
    a_timestamp timestamp,
    a_timeuuid timeuuid,
    a_tinyint tinyint,
    a_uuid uuid,
    a_varchar varchar,
    a_varint varint,
    a_frozen_list frozen<list<int>>,
    a_frozen_set frozen<set<text>>,
    a_frozen_map frozen<map<int, text>>,
    a_tuple tuple<int, text, boolean>,
    a_udt frozen<address>,
    a_nested frozen<map<text, frozen<list<frozen<tuple<int, text>>>>>>,
    a_map_uuid map<uuid, text>,
    a_set_int set<int>,
    a_udt_cells address,
    PRIMARY KEY ((id), ck_text, ck_int)
) WITH CLUSTERING ORDER BY (ck_text ASC, ck_int DESC)
    AND ID = 5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e04
    AND cdc = true;
"""

# When generated writes start (client timestamps in microseconds). Two datings:
# * START_US, a fixed instant (2025-11-13), the default: runs are reproducible, and whoever processes them gives
#   the pipeline a fixed processing time relative to it (``now = START_US // 1_000_000 + ...`` in the tests, the
#   workload's ``clock_us`` in the benchmarks). On the wall clock every TTL of such a workload has long expired.
# * ``clock_start_us()``, now: for a pipeline on the wall clock (scheduled DAG runs, the demo), where the 60 s
#   TTLs expire a minute after the writes and the 3600 s ones an hour after, as on a live cluster.
START_US = 1_763_000_000_000_000


def clock_start_us() -> int:
    """The wall clock in microseconds: ``Workload(start_us=clock_start_us())`` dates a workload now."""
    return time.time_ns() // 1000


def sample_schema():
    """The demo's schema (``SAMPLE_SCHEMA_CQL``) as a ``Schema``."""
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    return load_cql_schema(SAMPLE_SCHEMA_CQL)


# ------------------------------------------------------------------------------------------------------------
# Random values of every CQL type
# ------------------------------------------------------------------------------------------------------------

def random_value(t, rnd: random.Random, depth: int = 0):
    """A random Python value of CQL type ``t`` (as cqltypes decodes it)."""
    k = t.kind
    if k in ("text", "ascii"):
        words = ("alpha", "beta", "gamma", "delta", "kappa", "omega", "zeta", "sigma")
        s = " ".join(rnd.choice(words) for _ in range(rnd.randint(1, 4)))
        return s if k == "ascii" or rnd.random() < 0.8 else s + " \u00e9\u4e2d"
    if k == "blob":
        return rnd.randbytes(rnd.randint(0, 48))
    if k == "boolean":
        return rnd.random() < 0.5
    if k == "tinyint":
        return rnd.randint(-128, 127)
    if k == "smallint":
        return rnd.randint(-32768, 32767)
    if k == "int":
        return rnd.randint(-2**31, 2**31 - 1)
    if k in ("bigint",):
        return rnd.randint(-2**63, 2**63 - 1)
    if k == "varint":
        return rnd.randint(-10**40, 10**40)
    if k == "decimal":
        return decimal.Decimal(rnd.randint(-10**12, 10**12)).scaleb(-rnd.randint(0, 8))
    if k == "float":
        return cqltypes.FLOAT.decode(cqltypes.FLOAT.encode(rnd.uniform(-1e6, 1e6)))
    if k == "double":
        return rnd.uniform(-1e12, 1e12)
    if k == "uuid":
        return uuid.UUID(int=rnd.getrandbits(128), version=4)
    if k == "timeuuid":
        return _timeuuid(rnd, START_US + rnd.randint(0, 10**10))
    if k == "inet":
        if rnd.random() < 0.7:
            return ipaddress.IPv4Address(rnd.getrandbits(32))
        return ipaddress.IPv6Address(rnd.getrandbits(128))
    if k == "date":
        return datetime.date(2020, 1, 1) + datetime.timedelta(days=rnd.randint(0, 3000))
    if k == "time":
        return cqltypes.CqlTime(rnd.randint(0, 86400 * 10**9 - 1))
    if k == "timestamp":
        ms = rnd.randint(1_500_000_000_000, 1_800_000_000_000)
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).replace(
            microsecond=(ms % 1000) * 1000)
    if k == "duration":
        return cqltypes.Duration(rnd.randint(0, 24), rnd.randint(0, 60), rnd.randint(0, 86400 * 10**9))
    if k == "list":
        return [random_value(t.subtypes[0], rnd, depth + 1) for _ in range(rnd.randint(1, 3))]
    if k == "set":
        et = t.subtypes[0]
        encoded = {encode_value(et, random_value(et, rnd, depth + 1)) for _ in range(rnd.randint(1, 3))}
        return cqltypes.CqlSet(et.decode(v) for v in sorted(encoded, key=et.sort_key))
    if k == "map":
        kt, vt = t.subtypes
        d = {}
        for _ in range(rnd.randint(1, 3)):
            d[random_value(kt, rnd, depth + 1)] = random_value(vt, rnd, depth + 1)
        return d
    if k == "tuple":
        return tuple(random_value(s, rnd, depth + 1) for s in t.subtypes)
    if k == "udt":
        return cqltypes.UdtValue({n: random_value(s, rnd, depth + 1) for n, s in zip(t.field_names, t.subtypes)})
    if k == "vector":
        return [random_value(t.subtypes[0], rnd, depth + 1) for _ in range(t.dimension)]
    raise ValueError(f"no generator for {t.cql}")


def _timeuuid(rnd: random.Random, micros: int) -> uuid.UUID:
    ticks = micros * 10 + 0x01B21DD213814000
    time_low = ticks & 0xFFFFFFFF
    time_mid = (ticks >> 32) & 0xFFFF
    time_hi = ((ticks >> 48) & 0x0FFF) | 0x1000
    clock = rnd.getrandbits(14) | 0x8000
    node = rnd.getrandbits(48)
    return uuid.UUID(int=(time_low << 96) | (time_mid << 80) | (time_hi << 64) | (clock << 48) | node)


def encode_value(t, value) -> bytes:
    """Serialized bytes of a value; non-frozen types are encoded frozen (for keys and frozen fields)."""
    return (t.freeze() if t.multicell else t).encode(value)


def sorted_cells(t, pairs):
    """Complex-column cells in Cassandra's cell-path order."""
    pt = t.path_type
    return sorted(pairs, key=lambda pv: pt.sort_key(pv[0]))


# ------------------------------------------------------------------------------------------------------------
# Logical writes
# ------------------------------------------------------------------------------------------------------------

@dataclass
class _Known:
    """Rows the generator has written, so updates and deletes hit existing data."""
    partitions: dict = field(default_factory=dict)   # key bytes -> set of clustering tuples


class Workload:
    """Generates mutations over the tables of ``schema`` (counter tables get counter updates)."""

    def __init__(self, schema, seed: int = 0, start_us: int = START_US, tables=None, partitions: int = 200,
                 out_of_order_us: int = 2_000_000, ttl_fraction: float = 0.3):
        self.rnd = random.Random(seed)
        self.ttl_fraction = ttl_fraction      # of the writes that draw a TTL (60 s or 3600 s, or none)
        self.schema = schema
        self.tables = [t for t in schema.tables.values()
                       if not t.keyspace.startswith("system") and (tables is None or t.name in tables)]
        self.tables.sort(key=lambda t: t.name)
        self.clock_us = start_us
        self.partitions = partitions
        self.out_of_order_us = out_of_order_us
        self.known = {t.id: _Known() for t in self.tables}
        self.counter_ids = [uuid.UUID(int=self.rnd.getrandbits(128), version=4) for _ in range(3)]
        self.counter_state = {}   # (table, key, clustering, column, leader) -> (clock, total)

    # -- time ----------------------------------------------------------------------------------------------
    def _ts(self) -> int:
        """A client timestamp: time moves on, and some writes carry an older timestamp (late arrivals)."""
        self.clock_us += self.rnd.randint(50, 5000)
        if self.rnd.random() < 0.15:
            return self.clock_us - self.rnd.randint(1, self.out_of_order_us)
        return self.clock_us

    # -- keys -------------------------------------------------------------------------------------------------
    def _partition_key(self, table) -> bytes:
        known = self.known[table.id].partitions
        if known and (len(known) >= self.partitions or self.rnd.random() < 0.7):
            return self.rnd.choice(list(known))
        cols = table.partition_key
        values = [random_value(c.type, self.rnd) for c in cols]
        if len(cols) == 1:
            key = encode_value(cols[0].type, values[0])
        else:
            key = cqltypes.composite_encode([c.type for c in cols], values)
        known.setdefault(key, set())
        return key

    def _clustering(self, table, key: bytes) -> tuple:
        rows = self.known[table.id].partitions.setdefault(key, set())
        if rows and self.rnd.random() < 0.6:
            return self.rnd.choice(sorted(rows))
        ck = tuple(encode_value(c.type, random_value(c.type, self.rnd)) for c in table.clustering)
        rows.add(ck)
        return ck

    # -- cells ------------------------------------------------------------------------------------------------
    def _cells_for(self, col, ts: int, ttl: int, now_s: int):
        """Cells (and complex deletion) that ``SET col = <fresh random value>`` (or an INSERT) produces."""
        t = col.type
        ldt = now_s + ttl if ttl else None
        value = random_value(t, self.rnd)
        if not t.multicell:
            return [self._cell(col.name, encode_value(t, value), ts, ttl, ldt)], None
        pairs = t.encode_cells(value)
        cells = [self._cell(col.name, v, ts, ttl, ldt, path=p) for p, v in sorted_cells(t, pairs)]
        # INSERT or "SET c = ..." replaces the collection: Cassandra writes a complex deletion just below the
        # write (ts - 1) and the new elements at ts, in the same row of the same mutation.
        return cells, DeletionTime(ts - 1, now_s)

    @staticmethod
    def _cell(name, value, ts, ttl, ldt, path=None, tombstone=False):
        if tombstone:
            return Cell(name, b"", ts, 0, ldt, path, True)
        if ttl:
            return Cell(name, value, ts, ttl, ldt, path)
        return Cell(name, value, ts, path=path)

    # -- operations -----------------------------------------------------------------------------------------
    def next_mutation(self) -> Mutation:
        table = self.rnd.choice(self.tables)
        if table.is_counter:
            if self.rnd.random() < 0.1:
                return self._mutation(self._counter_batch(table))
            return self._mutation(self._counter_update(table, self._partition_key(table), self._ts()))
        if self.rnd.random() < 0.08:
            return self._mutation(self._batch(table))
        return self._mutation(self._statement(table, self._partition_key(table), self._ts()))

    def mutations(self, n: int):
        for _ in range(n):
            yield self.next_mutation()

    def _mutation(self, update: PartitionUpdate) -> Mutation:
        """The mutation of one partition update, with the id its serialized bytes give it (as read back from a
        segment written by ``write_cluster_segments``)."""
        m = Mutation([finish_update(update)])
        m.mutation_id = mutation_id(encode_mutation(m, self.schema))
        return m

    def _statement(self, table, key: bytes, ts: int, range_delete: bool = True) -> PartitionUpdate:
        """What one CQL statement on partition ``key`` writes, at timestamp ``ts``."""
        r = self.rnd.random()
        if r < 0.30:
            return self._write(table, key, ts, insert=True)
        if r < 0.62:
            return self._write(table, key, ts, insert=False)
        if r < 0.70 and any(c.type.multicell for c in table.regular_columns):
            return self._collection_edit(table, key, ts)
        if r < 0.76 and table.static_columns:
            return self._static_write(table, key, ts)
        if r < 0.84:
            return self._cell_delete(table, key, ts)
        if r < 0.91 or (r < 0.96 and table.clustering and not range_delete):
            return self._row_delete(table, key, ts)
        if r < 0.96 and table.clustering:
            return self._range_delete(table, key, ts)
        return self._partition_delete(table, key, ts)

    def _batch(self, table) -> PartitionUpdate:
        """A CQL batch (logged or unlogged: the commit log cannot tell them apart) of 2-4 statements on one
        partition, as one partition update (``merge_statements``). Either every statement carries the batch's
        timestamp, or each its own ``USING TIMESTAMP``. At most one range deletion: two would overlap into
        boundary markers, which ``merge_statements`` does not build."""
        key = self._partition_key(table)
        shared = self._ts() if self.rnd.random() < 0.5 else None
        parts = []
        for _ in range(self.rnd.randint(2, 4)):
            ranged = any(p.markers for p in parts)
            parts.append(self._statement(table, key, shared if shared is not None else self._ts(),
                                         range_delete=not ranged))
        return merge_statements(table, key, parts)

    def _write(self, table, key: bytes, ts: int, insert: bool) -> PartitionUpdate:
        ck = self._clustering(table, key)
        now_s = ts // 1_000_000
        ttl = self.rnd.choice((0, 0, 0, 0, 0, 60, 3600)) if self.rnd.random() < self.ttl_fraction else 0
        regular = table.regular_columns
        if insert:
            cols = regular
        else:
            cols = self.rnd.sample(regular, k=self.rnd.randint(1, max(1, min(3, len(regular))))) if regular else []
        cells, cdels = self._set_columns(cols, ts, ttl, now_s)
        liveness = LivenessInfo(ts, ttl, now_s + ttl) if ttl else LivenessInfo(ts)
        row = Row(ck, liveness if insert else None, cells=cells, complex_deletions=cdels)
        static_row = None
        if insert and table.static_columns and self.rnd.random() < 0.3:
            static_row = self._static_row(table, ts, now_s)
        return PartitionUpdate(table.id, key, table, unfiltereds=[row] if (cells or insert) else [],
                               static_row=static_row)

    def _set_columns(self, cols, ts: int, ttl: int, now_s: int):
        """(cells, complex deletions) of ``SET col = <fresh value>`` for each column (INSERT sets them too)."""
        cells, cdels = [], {}
        for col in sorted(cols, key=lambda c: (c.type.multicell, c.name.encode())):
            cs, cdel = self._cells_for(col, ts, ttl, now_s)
            cells += cs
            if cdel:
                cdels[col.name] = cdel
        return cells, cdels

    def _static_row(self, table, ts, now_s):
        cells, cdels = self._set_columns(table.static_columns, ts, 0, now_s)
        return Row((), cells=cells, complex_deletions=cdels, is_static=True)

    def _static_write(self, table, key: bytes, ts: int) -> PartitionUpdate:
        return PartitionUpdate(table.id, key, table, static_row=self._static_row(table, ts, ts // 1_000_000))

    def _collection_edit(self, table, key: bytes, ts: int) -> PartitionUpdate:
        ck = self._clustering(table, key)
        now_s = ts // 1_000_000
        col = self.rnd.choice([c for c in table.regular_columns if c.type.multicell])
        t = col.type
        pairs = t.encode_cells(random_value(t, self.rnd))
        if t.kind == "udt":
            # UDT field update: "SET addr.city = ?" writes one field cell
            pairs = pairs[:1]
        if self.rnd.random() < 0.35 and t.kind in ("set", "map"):
            cells = [self._cell(col.name, b"", ts, 0, now_s, path=p, tombstone=True) for p, _ in pairs[:1]]
        else:
            cells = [self._cell(col.name, v, ts, 0, None, path=p) for p, v in pairs]
        cells.sort(key=lambda c: t.path_type.sort_key(c.path))
        return PartitionUpdate(table.id, key, table, unfiltereds=[Row(ck, cells=cells)])

    def _cell_delete(self, table, key: bytes, ts: int) -> PartitionUpdate:
        ck = self._clustering(table, key)
        cols = table.regular_columns
        if not cols:
            return self._row_delete(table, key, ts)
        col = self.rnd.choice(cols)
        now_s = ts // 1_000_000
        if col.type.multicell:
            row = Row(ck, complex_deletions={col.name: DeletionTime(ts, now_s)})
        else:
            row = Row(ck, cells=[self._cell(col.name, b"", ts, 0, now_s, tombstone=True)])
        return PartitionUpdate(table.id, key, table, unfiltereds=[row])

    def _row_delete(self, table, key: bytes, ts: int) -> PartitionUpdate:
        ck = self._clustering(table, key)
        return PartitionUpdate(table.id, key, table, unfiltereds=[Row(ck, deletion=DeletionTime(ts, ts // 1_000_000))])

    def _range_delete(self, table, key: bytes, ts: int) -> PartitionUpdate:
        d = DeletionTime(ts, ts // 1_000_000)
        rows = sorted(self.known[table.id].partitions.get(key) or [])
        first = table.clustering[0]
        if rows and self.rnd.random() < 0.6:
            prefix = (self.rnd.choice(rows)[0],)
        else:
            prefix = (encode_value(first.type, random_value(first.type, self.rnd)),)
        if self.rnd.random() < 0.5 or len(rows) < 2:
            # DELETE ... WHERE pk = ? AND ck1 = ?: one prefix, inclusive on both sides
            markers = [RangeTombstoneMarker(BoundKind.INCL_START_BOUND, prefix, d),
                       RangeTombstoneMarker(BoundKind.INCL_END_BOUND, prefix, d)]
        else:
            # a slice ck1 > a AND ck1 <= b, laid out in clustering order (reversed for DESC)
            a, b = sorted((r[0] for r in self.rnd.sample(rows, 2)), key=first.type.sort_key)
            if a == b:
                markers = [RangeTombstoneMarker(BoundKind.INCL_START_BOUND, (a,), d),
                           RangeTombstoneMarker(BoundKind.INCL_END_BOUND, (a,), d)]
            elif not first.reversed:
                markers = [RangeTombstoneMarker(BoundKind.EXCL_START_BOUND, (a,), d),
                           RangeTombstoneMarker(BoundKind.INCL_END_BOUND, (b,), d)]
            else:
                markers = [RangeTombstoneMarker(BoundKind.INCL_START_BOUND, (b,), d),
                           RangeTombstoneMarker(BoundKind.EXCL_END_BOUND, (a,), d)]
        return PartitionUpdate(table.id, key, table, unfiltereds=markers)

    def _partition_delete(self, table, key: bytes, ts: int) -> PartitionUpdate:
        return PartitionUpdate(table.id, key, table, partition_deletion=DeletionTime(ts, ts // 1_000_000))

    def _counter_update(self, table, key: bytes, ts: int) -> PartitionUpdate:
        """A counter write as the leader replica logs it: one global shard holding the leader's running total."""
        ck = self._clustering(table, key)
        leader = self.rnd.randrange(len(self.counter_ids))
        cells = []
        for col in sorted(table.regular_columns, key=lambda c: c.name.encode()):
            if self.rnd.random() < 0.3 and cells:
                continue
            state_key = (table.id, key, ck, col.name, leader)
            clock, total = self.counter_state.get(state_key, (0, 0))
            clock += 1
            total += self.rnd.randint(-3, 10)
            self.counter_state[state_key] = (clock, total)
            ctx = cqltypes.encode_counter_context([(self.counter_ids[leader], clock, total, "global")])
            cells.append(Cell(col.name, ctx, ts))
        return PartitionUpdate(table.id, key, table, unfiltereds=[Row(ck, cells=cells)])

    def _counter_batch(self, table) -> PartitionUpdate:
        """``BEGIN COUNTER BATCH``: an increment and a DELETE (of a counter or a row) on one partition, one
        mutation, both at the batch's timestamp (counter statements cannot carry their own)."""
        key = self._partition_key(table)
        ts = self._ts()
        delete = self._cell_delete if self.rnd.random() < 0.5 else self._row_delete
        parts = [self._counter_update(table, key, ts), delete(table, key, ts)]
        self.rnd.shuffle(parts)
        return merge_statements(table, key, parts)


# ------------------------------------------------------------------------------------------------------------
# Several statements on one partition: one partition update
# ------------------------------------------------------------------------------------------------------------

def merge_statements(table, key: bytes, updates) -> PartitionUpdate:
    """The partition update a CQL batch writes for several statements on one partition.

    Cassandra's ``UpdatesCollector`` builds one partition update per table and partition key for the whole
    batch (logged or not), so the batch reaches the commit log as one mutation, applied atomically. Built here
    as Cassandra builds it: the newest partition deletion; rows of equal clustering merged as ``Rows.merge``
    merges them (the winning liveness, row deletion, complex deletions and cells; what the merged deletions
    cover dropped); rows and range tombstone markers in clustering order. (Cassandra also leaves out rows that
    the update's own partition or range deletion covers when it serializes; keeping them changes nothing a
    reader sees.) Range tombstones of different statements must not overlap.
    """
    deletion = None
    static = None
    rows: dict = {}
    markers = []
    for u in updates:
        d = u.partition_deletion
        if d is not None and (deletion is None or _deletion_key(d) > _deletion_key(deletion)):
            deletion = d
        if u.static_row is not None:
            static = u.static_row if static is None else _merge_rows(table, static, u.static_row)
        for x in u.unfiltereds:
            if isinstance(x, RangeTombstoneMarker):
                markers.append(x)
            else:
                cur = rows.get(x.clustering)
                rows[x.clustering] = x if cur is None else _merge_rows(table, cur, x)
    unfiltereds = sorted(list(rows.values()) + markers, key=cmp_to_key(lambda a, b: _compare_unfiltered(table, a, b)))
    return PartitionUpdate(table.id, key, table, partition_deletion=deletion, static_row=static,
                           unfiltereds=unfiltereds)


def _deletion_key(d: DeletionTime) -> tuple:
    return d.marked_for_delete_at, d.local_deletion_time


def _cell_key(c: Cell) -> tuple:
    """Which of two cells of one column (and path) Cassandra keeps: timestamp, then a tombstone, then the
    later local deletion time, then the greater value."""
    return c.timestamp, c.is_tombstone, c.local_deletion_time, c.value


def _merge_rows(table, a: Row, b: Row) -> Row:
    lv = a.liveness
    if b.liveness is not None and (lv is None or (b.liveness.timestamp, b.liveness.ttl != 0) >
                                   (lv.timestamp, lv.ttl != 0)):
        lv = b.liveness
    deletion = a.deletion
    if b.deletion is not None and (deletion is None or _deletion_key(b.deletion) > _deletion_key(deletion)):
        deletion = b.deletion
    shadow = deletion.marked_for_delete_at if deletion is not None else None
    if lv is not None and shadow is not None and lv.timestamp <= shadow:
        lv = None
    cdels = {}
    for col, d in list(a.complex_deletions.items()) + list(b.complex_deletions.items()):
        if (shadow is None or d.marked_for_delete_at > shadow) and (
                col not in cdels or _deletion_key(d) > _deletion_key(cdels[col])):
            cdels[col] = d
    cells: dict = {}
    for c in a.cells + b.cells:
        cur = cells.get((c.column, c.path))
        if cur is None or _cell_key(c) > _cell_key(cur):
            cells[(c.column, c.path)] = c
    kept = []
    for c in cells.values():
        floor = max(shadow if shadow is not None else NO_TIMESTAMP,
                    cdels[c.column].marked_for_delete_at if c.column in cdels else NO_TIMESTAMP)
        if c.timestamp > floor:
            kept.append(c)

    def cell_order(c):
        t = table.column_for_data(c.column).type
        return c.column, (t.path_type.sort_key(c.path) if c.path is not None else ())
    kept.sort(key=cell_order)
    return Row(a.clustering, lv, deletion, cells=kept, complex_deletions=cdels, is_static=a.is_static)


def _compare_unfiltered(table, a, b) -> int:
    """Clustering order of rows and range tombstone bounds (``ClusteringComparator.compare``): on an equal
    common prefix a start bound (inclusive) or end bound (exclusive) sorts before the rows it is a prefix of,
    the others after them."""
    pa_, ra = _prefix_and_rank(a)
    pb, rb = _prefix_and_rank(b)
    for col, x, y in zip(table.clustering, pa_, pb):
        kx, ky = col.type.sort_key(x), col.type.sort_key(y)
        if kx != ky:
            c = -1 if kx < ky else 1
            return -c if col.reversed else c
    if len(pa_) == len(pb):
        return (ra > rb) - (ra < rb)
    return ra if len(pa_) < len(pb) else -rb


def _prefix_and_rank(u) -> tuple:
    if not isinstance(u, RangeTombstoneMarker):
        return u.clustering, 0
    before = u.kind in (BoundKind.INCL_START_BOUND, BoundKind.EXCL_END_BOUND, BoundKind.EXCL_END_INCL_START_BOUNDARY)
    return u.clustering, -1 if before else 1


# ------------------------------------------------------------------------------------------------------------
# Replicas and segment files
# ------------------------------------------------------------------------------------------------------------

@dataclass
class ClusterWrite:
    """What ``write_cluster_segments`` produced."""
    segments: dict            # node name -> [segment paths] in segment-id order
    mutations: list           # the logical mutations, in generation order
    replica_copies: int


def write_cluster_segments(out_dir, schema, n_mutations: int, *, nodes: int = 3, rf: int = 3, seed: int = 0,
                           version: int = 7, compression: str | None = None, segment_size: int = 1 << 20,
                           sync_every: int = 50, workload: Workload | None = None, cdc_idx: bool = True,
                           segment_id_base: int = 1_763_000_000_000,
                           skip: dict[str, int] | None = None) -> ClusterWrite:
    """Write ``n_mutations`` generated writes as each replica's commit log: ``out_dir/<node>/CommitLog-*.log``.

    Every mutation goes to ``rf`` of the ``nodes`` (all of them with the defaults: RF 3 on 3 nodes), and each
    node receives its copies in its own order (a mutation can reach one replica later than another), so the
    pipeline sees replica copies and out-of-order arrivals exactly as it would from a real cluster. ``skip``
    (node name -> n): the node's first n copies are not written (they went to a segment of its commit log that
    closed before these), so that the nodes' segment boundaries fall at different writes, as in a cluster whose
    nodes did not start together.
    """
    rnd = random.Random(seed + 1)
    w = workload or Workload(schema, seed=seed)
    names = [f"node{i + 1}" for i in range(nodes)]
    per_node = {n: [] for n in names}
    muts = []
    for i in range(n_mutations):
        m = w.next_mutation()
        data = encode_mutation(m, schema)
        muts.append(m)
        for n in rnd.sample(names, rf):
            # arrival slot with jitter: some copies arrive a few mutations late
            per_node[n].append((i + rnd.random() * 8, data))
    out = {}
    for ni, n in enumerate(names):
        d = os.path.join(os.fspath(out_dir), n)
        os.makedirs(d, exist_ok=True)
        per_node[n].sort(key=lambda x: x[0])
        del per_node[n][:(skip or {}).get(n, 0)]
        paths = []
        seg_id = segment_id_base + ni * 1_000_000
        writer = None
        count = 0
        for _, data in per_node[n]:
            while True:
                if writer is None:
                    seg_id += 1
                    writer = SegmentWriter(d, seg_id, version=version, compression=compression,
                                           segment_size=segment_size)
                try:
                    writer.add(data)
                    break
                except SegmentFull:
                    _close(writer, cdc_idx)
                    paths.append(writer.path)
                    writer = None
            count += 1
            if count % sync_every == 0:
                writer.sync()
        if writer is not None:
            _close(writer, cdc_idx)
            paths.append(writer.path)
        out[n] = paths
    return ClusterWrite(out, muts, sum(len(v) for v in per_node.values()))


def _close(writer: SegmentWriter, cdc_idx: bool) -> None:
    writer.close()
    if cdc_idx and writer.version >= 7:
        writer.write_cdc_index(completed=True)
