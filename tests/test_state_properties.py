"""Property tests: the state engine and its events against the naive reference model.

Random small schemas (single and composite partition keys; frozen collections, frozen and non-frozen user
types among the columns) and random mutation streams of every kind (collection and user-type overwrites as
Cassandra writes them, INSERTs over existing rows, static overwrites, range deletions and the boundary markers of
adjacent ones, batches of several statements on one partition with one timestamp or several) are written to three replicas, shuffled, split into batches at arbitrary points and fed
batch by batch (with the expiry sweep between batches, and ``now`` moving forward) through
``state.events.process``. After every batch the engine's visible table must equal the model's; the events must
replay to it, and show exactly the model's history, mutation after mutation (``event_invariant.check_events``).
"""
from __future__ import annotations

import functools
import random
import uuid

from event_invariant import check_events, engine_events
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_model import published_states, visible_table

from cdc_lib.celllog.records import mutation_records
from cdc_lib.celllog.schema import decode_clustering
from cdc_lib.commitlog.model import (NO_DELETION_TIME, BoundKind, Cell, DeletionTime, LivenessInfo, Mutation,
                                     PartitionUpdate, RangeTombstoneMarker, Row, mutation_id)
from cdc_lib.commitlog.mutation import encode_mutation, finish_update
from cdc_lib.cql import types as cqltypes
from cdc_lib.cql.schema import CLUSTERING, PARTITION_KEY, REGULAR, STATIC, ColumnMetadata, TableMetadata
from cdc_lib.demo.workload import merge_statements
from cdc_lib.state.events import expiry_sweep, process
from cdc_lib.state.reconcile import (PartitionState, apply_records, merge_partitions, partition_from_records,
                                     partition_to_records, visible_rows)

T = cqltypes.parse_type
CLUSTERING_TYPES = ["int", "text", "bigint", "blob", "boolean", "timeuuid", "uuid", "varint", "date",
                    "frozen<list<int>>", "frozen<tuple<int, text>>", "smallint", "inet", "decimal", "timestamp"]
TIMEUUIDS = [uuid.UUID(int=(((t & 0xFFFFFFFF) << 96) | (((t >> 32) & 0xFFFF) << 80) | (0x1 << 76)
                            | (((t >> 48) & 0x0FFF) << 64) | (0x8 << 60) | n))
             for t, n in ((5, 3), (1, 9), (1 << 33, 1), (7, 0), (1 << 49, 5), (5, 2))]


def _sample_value(rng: random.Random, t) -> bytes:
    k = t.kind
    if k == "int":
        return t.encode(rng.choice([-2, -1, 0, 1, 2, 300]))
    if k in ("bigint", "counter"):
        return t.encode(rng.choice([-(1 << 40), -1, 0, 1, 7]))
    if k == "smallint":
        return t.encode(rng.choice([-3, 0, 3]))
    if k == "varint":
        return t.encode(rng.choice([-(1 << 70), -1, 0, 1, 255, 1 << 70]))
    if k == "text":
        return t.encode(rng.choice(["", "a", "b", "ab", "é"]))
    if k == "blob":
        return rng.choice([b"", b"\x00", b"\x7f", b"\x80", b"\xff\x01"])
    if k == "boolean":
        return t.encode(rng.choice([True, False]))
    if k == "timeuuid":
        return rng.choice(TIMEUUIDS).bytes
    if k == "uuid":
        return rng.choice(TIMEUUIDS[:2] + [uuid.UUID(int=5), uuid.UUID("6ba7b810-9dad-41d1-80b4-00c04fd430c8")]).bytes
    if k == "date":
        return rng.choice([b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00", b"\x80\x00\x00\x05"])
    if k == "timestamp":
        return t.encode(cqltypes.CqlTimestamp(rng.choice([-1000, 0, 1000])))
    if k == "inet":
        return rng.choice([b"\x7f\x00\x00\x01", b"\x0a\x00\x00\x01", b"\x00" * 15 + b"\x01"])
    if k == "decimal":
        return rng.choice([b"\x00\x00\x00\x01\x0f", b"\x00\x00\x00\x00\xff", b"\x00\x00\x00\x02\x01\x00"])
    if k == "list":
        return t.encode([rng.choice([-1, 0, 1]) for _ in range(rng.randint(0, 2))])
    if k == "tuple":
        return t.encode((rng.choice([None, 0, 1]), rng.choice(["a", "b"])))
    if k == "set":
        return t.encode(rng.sample([-1, 0, 1, 2], rng.randint(0, 2)))
    if k == "map":
        return t.encode({key: rng.choice([0, 1]) for key in rng.sample(["a", "b", "c"], rng.randint(0, 2))})
    if k == "udt":
        return t.encode({"f0": rng.choice([None, 0, 1]), "f1": rng.choice([None, "a", "b"])})
    raise AssertionError(k)


# A user type (Cassandra: CREATE TYPE ks.pair (f0 int, f1 text)), as a non-frozen column (one cell per field,
# path = the field's index) and a frozen one
PAIR = cqltypes.udt_type("ks", "pair", ["f0", "f1"], [T("int"), T("text")])
REGULAR_COLUMNS = (("v", T("int")), ("t", T("text")), ("s", T("set<int>")), ("m", T("map<text, int>")),
                   ("l", T("list<int>")), ("fs", T("frozen<set<int>>")), ("fm", T("frozen<map<text, int>>")),
                   ("u", PAIR), ("fu", PAIR.freeze()))


def make_table(rng: random.Random, counter: bool = False) -> TableMetadata:
    cols = {}
    if rng.random() < 0.3:       # a composite partition key: (pk, pk2)
        pks = [ColumnMetadata("pk", T("int"), PARTITION_KEY, 0), ColumnMetadata("pk2", T("text"), PARTITION_KEY, 1)]
    else:
        pks = [ColumnMetadata("pk", T("int"), PARTITION_KEY, 0)]
    cols.update((c.name, c) for c in pks)
    clustering = []
    for i in range(rng.randint(0, 2)):
        c = ColumnMetadata(f"c{i}", T(rng.choice(CLUSTERING_TYPES)), CLUSTERING, i, rng.random() < 0.5)
        clustering.append(c)
        cols[c.name] = c
    if counter:
        for n in ("n1", "n2"):
            cols[n] = ColumnMetadata(n, T("counter"), REGULAR)
        flags = frozenset({"compound", "counter"})
    else:
        for n, ty in rng.sample(REGULAR_COLUMNS, rng.randint(4, len(REGULAR_COLUMNS))):
            cols[n] = ColumnMetadata(n, ty, REGULAR)
        if clustering:
            cols["st"] = ColumnMetadata("st", T("int"), STATIC)
            cols["ss"] = ColumnMetadata("ss", T("set<int>"), STATIC)
        flags = frozenset({"compound"})
    return TableMetadata("ks", "t", uuid.UUID(int=rng.getrandbits(128)), pks, clustering, cols, flags=flags)


class Gen:
    """Random CQL writes on one table, as the mutations Cassandra logs for them."""

    def __init__(self, rng: random.Random, table: TableMetadata, shadowable: bool = False):
        self.rng = rng
        self.table = table
        self.shadowable = shadowable     # materialized-view tombstones: outside the reference model

    def ts(self) -> int:
        return self.rng.randint(1, 12)

    def ldt(self) -> int:
        return self.rng.randint(100, 130)

    def ttl_ldt(self):
        if self.rng.random() < 0.3:
            return self.rng.choice([5, 10]), self.ldt()
        return 0, NO_DELETION_TIME

    def ck(self) -> tuple:
        return tuple(_sample_value(self.rng, c.type) for c in self.table.clustering)

    def mutation(self) -> Mutation:
        """One statement, or (one time in five) a batch of 2-4 statements on one partition, which Cassandra
        logs as one mutation whether the batch is logged or not: every statement at the batch's timestamp, or
        each with its own USING TIMESTAMP (counter batches cannot). The id is that of its serialized bytes."""
        rng = self.rng
        t = self.table
        pk = self.partition_key()
        if rng.random() < 0.2:
            shared = self.ts() if t.is_counter or rng.random() < 0.5 else None
            parts = []
            for _ in range(rng.randint(2, 4)):
                ranged = any(p.markers for p in parts)
                parts.append(self.statement(pk, shared if shared is not None else self.ts(), ranges=not ranged))
            update = merge_statements(t, pk, parts)
        else:
            update = self.statement(pk, self.ts())
        m = Mutation([finish_update(update)])
        m.mutation_id = mutation_id(encode_mutation(m, None))
        return m

    def partition_key(self) -> bytes:
        """One of two partitions; a composite key serialized as Cassandra's CompositeType."""
        n = self.rng.choice([1, 2])
        pks = self.table.partition_key
        if len(pks) == 1:
            return pks[0].type.encode(n)
        return cqltypes.composite_encode([c.type for c in pks], [n, "x" if n == 1 else ""])

    def statement(self, pk: bytes, ts: int, ranges: bool = True) -> PartitionUpdate:
        rng = self.rng
        t = self.table
        u = PartitionUpdate(t.id, pk, t)
        choice = rng.random()
        has_ck = bool(t.clustering)
        if choice < 0.08:
            u.partition_deletion = DeletionTime(ts, self.ldt())
        elif choice < 0.18 and has_ck and ranges:
            u.unfiltereds = self.range_markers(ts)
        elif choice < 0.27:
            u.unfiltereds = [Row(self.ck(), deletion=DeletionTime(ts, self.ldt()),
                                 shadowable=self.shadowable and rng.random() < 0.5)]
        elif choice < 0.37 and "st" in t.columns:
            cells, cdel = self.cells(ts, True, False)
            lv = LivenessInfo(ts, *self.ttl_ldt()) if rng.random() < 0.3 else None
            u.static_row = Row((), liveness=lv, cells=cells, complex_deletions=cdel, is_static=True)
        else:
            insert = rng.random() < 0.5 and not t.is_counter
            cells, cdel = self.cells(ts, False, insert)
            lv = LivenessInfo(ts, *self.ttl_ldt()) if insert else None
            if lv is None and not cells and not cdel:
                lv = LivenessInfo(ts)
            u.unfiltereds = [Row(self.ck(), liveness=lv, cells=cells, complex_deletions=cdel)]
        return u

    def cells(self, ts: int, static: bool, insert: bool) -> tuple:
        """(cells, complex deletions) of an INSERT or UPDATE of some columns of a row (or the static row)."""
        rng = self.rng
        cells, cdel = [], {}
        cols = [c for c in self.table.columns.values() if c.kind == (STATIC if static else REGULAR)]
        for col in cols:
            if rng.random() < 0.4:
                continue
            ttl, ldt = self.ttl_ldt()
            k = col.type.kind
            if k == "counter":
                if rng.random() < 0.1:
                    cells.append(Cell(col.name, b"", ts, 0, self.ldt(), None, True))
                    continue
                # Cassandra 2.1+ writes global shards; remote and local ones come with older data (here: the
                # writes before ts 4 and 7), and the merge (kind, then clock, then count) must hold for them
                # too. A node's clock for its counter id only grows (clock = ts), and a later write never
                # brings an older kind of shard: with deletions in between, which shard a delete shadows
                # would otherwise depend on when Cassandra compacts.
                kind = "remote" if ts < 4 else "local" if ts < 7 else "global"
                shards = []
                for cid in sorted(rng.sample([uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3)],
                                             rng.randint(1, 2)), key=lambda u: u.bytes):
                    shards.append((cid, ts, rng.randint(-5, 9), kind))
                cells.append(Cell(col.name, cqltypes.encode_counter_context(shards), ts))
            elif col.type.multicell:
                # INSERT and SET c = {...}: the old collection deleted at ts - 1, the new elements at ts;
                # SET c = c + {...}: elements only; SET c = c - {...} / DELETE c[k]: element tombstones;
                # DELETE c: a collection deletion at ts
                action = "overwrite" if insert else rng.choice(["overwrite", "overwrite", "add", "remove", "delete"])
                if action == "overwrite":
                    cdel[col.name] = DeletionTime(ts - 1, self.ldt())
                elif action == "delete":
                    cdel[col.name] = DeletionTime(ts, self.ldt())
                    continue
                et = col.type.subtypes[0]
                for _ in range(rng.randint(0 if action == "overwrite" else 1, 2)):
                    if k == "udt":         # SET u.f = x; a removal is SET u.f = null (a tombstone at the path)
                        i = rng.randrange(len(col.type.subtypes))
                        path, value = cqltypes.SMALLINT.encode(i), _sample_value(rng, col.type.subtypes[i])
                    elif k == "list":
                        path = rng.choice(TIMEUUIDS).bytes
                        value = _sample_value(rng, et)
                    elif k == "set":
                        path, value = _sample_value(rng, et), b""
                    else:
                        path, value = _sample_value(rng, et), _sample_value(rng, col.type.subtypes[1])
                    if action == "remove":
                        cells.append(Cell(col.name, b"", ts, 0, self.ldt(), path, True))
                    else:
                        cells.append(Cell(col.name, value, ts, ttl, ldt, path))
                cells.sort(key=lambda c: (c.column, col.type.path_type.sort_key(c.path) if c.path else ()))
            else:
                if rng.random() < 0.15:
                    cells.append(Cell(col.name, b"", ts, 0, self.ldt(), None, True))
                else:
                    cells.append(Cell(col.name, _sample_value(rng, col.type), ts, ttl, ldt))
        return _one_cell_per_path(cells), cdel

    def range_markers(self, ts: int) -> list:
        rng = self.rng
        t = self.table
        d = DeletionTime(ts, self.ldt())
        n = rng.randint(0, len(t.clustering))
        a = self.ck()[:n]
        b = self.ck()[:n]
        if n and _cmp_prefix(t, a, b) > 0:
            a, b = b, a
        si, ei = rng.random() < 0.7, rng.random() < 0.7
        if not n or _cmp_prefix(t, a, b) == 0:
            si = ei = True          # an empty bound is the partition's start or end: always inclusive
        if rng.random() < 0.2:
            a = ()
            si = True
        if rng.random() < 0.2:
            b = ()
            ei = True
        start = RangeTombstoneMarker(BoundKind.INCL_START_BOUND if si else BoundKind.EXCL_START_BOUND, a, d)
        end = RangeTombstoneMarker(BoundKind.INCL_END_BOUND if ei else BoundKind.EXCL_END_BOUND, b, d)
        if n and rng.random() < 0.4:
            # Two adjacent ranges with different deletion times in one mutation (a batch of two range deletes
            # USING TIMESTAMP): Cassandra writes a start, a boundary marker that closes the first range and
            # opens the second, an end
            points = sorted({self.ck()[:n] for _ in range(3)}, key=functools.cmp_to_key(lambda x, y: _cmp_prefix(t, x, y)))
            d2 = DeletionTime(self.ts(), self.ldt())
            if len(points) == 3 and d2.marked_for_delete_at != ts:
                a, middle, b = points
                kind = rng.choice([BoundKind.EXCL_END_INCL_START_BOUNDARY, BoundKind.INCL_END_EXCL_START_BOUNDARY])
                return [RangeTombstoneMarker(start.kind, a, d), RangeTombstoneMarker(kind, middle, None, d, d2),
                        RangeTombstoneMarker(end.kind, b, d2)]
        return [start, end]


def _one_cell_per_path(cells: list) -> list:
    """A row holds one cell per column and path: a statement naming an element twice writes it once."""
    return list({(c.column, c.path): c for c in cells}.values())


def _cmp_prefix(t, a, b) -> int:
    for col, x, y in zip(t.clustering, a, b):
        kx, ky = col.type.sort_key(x), col.type.sort_key(y)
        if kx != ky:
            c = -1 if kx < ky else 1
            return -c if col.reversed else c
    return 0


def engine_table(table, states, now) -> dict:
    out = {}
    for pk, part in states.items():
        for key, row in visible_rows(table, pk, part, now).items():
            out[(pk, None if key is None else decode_clustering(key))] = row
    return out


def _key_of(table, row) -> tuple:
    return tuple(repr(row[c.name]) for c in table.partition_key + table.clustering)


def run_scenario(seed: int, counter: bool, n_mutations: int | None = None):
    rng = random.Random(seed)
    n_mutations = n_mutations or rng.randint(5, 40)
    table = make_table(rng, counter)
    gen = Gen(rng, table)
    mutations = [gen.mutation() for _ in range(n_mutations)]
    # three replicas: each writes every mutation to its own commit log
    copies = []
    for replica in range(3):
        for i, m in enumerate(mutations):
            copies.append((m, Mutation(m.updates, f"CommitLog-7-{replica}.log", replica, 100 + i,
                                       mutation_id=m.mutation_id)))
    rng.shuffle(copies)
    cuts = sorted(rng.sample(range(1, len(copies)), rng.randint(1, 6)))
    batches = [copies[a:b] for a, b in zip([0] + cuts, cuts + [len(copies)])]
    states: dict = {}
    seen = []
    events = []
    nows = []
    now, prev = 100, None
    for batch in batches:
        records = []
        for i, (orig, copy) in enumerate(batch):
            records += mutation_records(copy, i)
            seen.append(orig)
        evs = process(table, states, records, now, prev)
        events += evs
        nows.append(now)
        expected = visible_table(table, seen, now)
        got = engine_table(table, states, now)
        assert got == expected, f"seed {seed}: state differs after a batch at now={now}"
        prev, now = now, now + rng.randint(0, 12)
    # drain expiries, then check the event history against the final table
    events += expiry_sweep(table, states, prev, 200)
    final = engine_table(table, states, 200)
    assert final == visible_table(table, seen, 200)
    last = {}
    for e in events:
        assert e["before"] != e["after"], "no-op event"
        k = tuple(repr(v) for v in e["key"].values())
        assert e["before"] == last.get(k), "before must be the previous after"
        last[k] = e["after"]
        assert e["op"] == ("c" if e["before"] is None else "d" if e["after"] is None else "u")
    replayed = {k: v for k, v in last.items() if v is not None}
    assert replayed == {_key_of(table, row): row for row in final.values()}
    # every image is a state the table had, mutation after mutation, and no state is skipped
    history = published_states(table, [[orig for orig, _ in b] for b in batches], nows, end=200)
    check_events(engine_events(table, events), history, complete=True)
    return table, states, events


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2 ** 32))
def test_engine_matches_model_regular(seed):
    run_scenario(seed, counter=False)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 32))
def test_engine_matches_model_counters(seed):
    run_scenario(seed, counter=True)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 32))
def test_join_is_order_free_and_idempotent(seed):
    """Any order, any split, any repetition: the same state (exactly, not just the same visible rows)."""
    rng = random.Random(seed)
    table = make_table(rng, rng.random() < 0.3)
    gen = Gen(rng, table, shadowable=True)
    records = []
    for i in range(20):
        m = gen.mutation()
        m.segment, m.segment_id, m.position = "s", 1, i
        records += mutation_records(m, i)
    a: dict = {}
    apply_records(table, a, records)
    shuffled = records * 2
    rng.shuffle(shuffled)
    b: dict = {}
    apply_records(table, b, shuffled)
    assert a.keys() == b.keys()
    for pk in a:
        assert a[pk] == b[pk]
    # merging two halves' states gives the same state as applying everything
    half = len(records) // 2
    x: dict = {}
    y: dict = {}
    apply_records(table, x, records[:half])
    apply_records(table, y, records[half:])
    for pk in a:
        merged = merge_partitions(table, x.get(pk, PartitionState()), y.get(pk, PartitionState()))
        assert merged == a[pk]
        # serialisation is lossless
        assert partition_from_records(partition_to_records(pk, a[pk])) == a[pk]
