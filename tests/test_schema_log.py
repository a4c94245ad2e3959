"""SchemaTracker: the schema rebuilt from system_schema mutations, on real segments and hand-made mutations.

Hand-made schema mutations are shaped like Cassandra's (SchemaKeyspace: a keyspace row, the table row and
one row per column; row deletions for DROP; partition deletions for DROP KEYSPACE), encoded to bytes with
``commitlog.mutation.encode_mutation`` and decoded back through ``SchemaTracker.decode``, so the whole byte path runs.
"""
from __future__ import annotations

import random
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_lib.commitlog.model import (BoundKind, Cell, DeletionTime, LivenessInfo, Mutation, PartitionUpdate,
                                     RangeTombstoneMarker, Row)
from cdc_lib.commitlog.mutation import encode_mutation, finish_update
from cdc_lib.commitlog.schema_from_log import SchemaTracker
from cdc_lib.commitlog.segment import LogEntry, read_segment
from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.cql.system_schema import SCHEMA_KEYSPACE, SYSTEM_SCHEMA_DEFINITIONS, system_schema_tables, system_table_id
from cdc_lib.errors import UnknownTableError

SS = system_schema_tables()
LDT = 1_700_000_000


# ---------------------------------------------------------------------------------------------------------
# Building schema mutations
# ---------------------------------------------------------------------------------------------------------

def _enc(table: str, col: str, value) -> bytes:
    return SS[table].columns[col].type.encode(value)


def _clustering(table: str, values) -> tuple:
    return tuple(_enc(table, c.name, v) for c, v in zip(SS[table].clustering, values))


def srow(table: str, key, values: dict, ts: int) -> Row:
    """A live system_schema row written at ``ts`` (row marker + one cell per value)."""
    cells = [Cell(c, _enc(table, c, v), ts) for c, v in sorted(values.items())]
    return Row(_clustering(table, key), liveness=LivenessInfo(ts), cells=cells)


def sdelete(table: str, key, ts: int) -> Row:
    return Row(_clustering(table, key), deletion=DeletionTime(ts, LDT))


def supdate(table: str, keyspace: str, rows=(), partition_deletion=None, markers=()) -> PartitionUpdate:
    u = PartitionUpdate(system_table_id(SCHEMA_KEYSPACE, table), keyspace.encode(), SS[table],
                        partition_deletion=partition_deletion, unfiltereds=list(rows) + list(markers))
    return finish_update(u)


def column_rows(table: str, columns, ts: int) -> list:
    """columns: [(name, kind, position, type, clustering_order)]"""
    return [srow("columns", (table, n), {"kind": k, "position": p, "type": t, "clustering_order": o,
                                         "column_name_bytes": n.encode()}, ts)
            for n, k, p, t, o in columns]


def create_table(ks, name, tid, columns, ts, flags=("compound",), cdc=None, types=()) -> Mutation:
    trow = {"id": tid, "flags": set(flags)}
    if cdc is not None:
        trow["cdc"] = cdc
    updates = [supdate("keyspaces", ks, [srow("keyspaces", (), {"durable_writes": True,
                                                                 "replication": {"class": "SimpleStrategy"}}, ts)]),
               supdate("tables", ks, [srow("tables", (name,), trow, ts)]),
               supdate("columns", ks, column_rows(name, columns, ts))]
    if types:
        updates.append(supdate("types", ks, [srow("types", (n,), {"field_names": fn, "field_types": ft}, ts)
                                             for n, fn, ft in types]))
    return Mutation(updates)


def feed(tracker: SchemaTracker, mutation: Mutation):
    """Encode to bytes and decode with the tracker's schema in force, as a segment reader would."""
    data = encode_mutation(mutation, tracker.schema)
    m, changes = tracker.decode(data)
    return changes


KS = "shop"
TID = uuid.UUID("5a1c395e-b41f-11e5-9f22-ba0be0483c18")
ORDERS = [("customer", "partition_key", 0, "text", "none"),
          ("region", "partition_key", 1, "int", "none"),
          ("placed", "clustering", 0, "timestamp", "desc"),
          ("note", "static", -1, "text", "none"),
          ("total", "regular", -1, "decimal", "none"),
          ("items", "regular", -1, "map<text, int>", "none"),
          ("addr", "regular", -1, "frozen<address>", "none")]
ADDRESS = ("address", ("street", "zip"), ("text", "int"))


def test_system_schema_ids_are_javas_name_uuids():
    # Directory names of every Cassandra 3.0+ data dir: system_schema/tables-afddfb9dbc1e30688056eed6c302ba09 ...
    assert system_table_id("system_schema", "tables") == uuid.UUID("afddfb9d-bc1e-3068-8056-eed6c302ba09")
    assert system_table_id("system_schema", "columns") == uuid.UUID("24101c25-a2ae-3af7-87c1-b40ee1aca33f")
    assert system_table_id("system_schema", "keyspaces") == uuid.UUID("abac5682-dea6-31c5-b535-b3d6cffd0fb6")
    tracker = SchemaTracker()
    for name in SYSTEM_SCHEMA_DEFINITIONS:
        assert tracker.schema.table(system_table_id(SCHEMA_KEYSPACE, name)).name == name


def test_create_table_builds_full_metadata():
    tracker = SchemaTracker()
    changes = feed(tracker, create_table(KS, "orders", TID, ORDERS, 1000, cdc=True, types=[ADDRESS]))
    assert {(c.kind, c.name) for c in changes} == {("type_created", "address"), ("table_created", "orders")}
    t = tracker.schema.table(TID)
    assert t.qualified_name == "shop.orders" and t.cdc and t.flags == {"compound"}
    assert [c.name for c in t.partition_key] == ["customer", "region"]
    assert [(c.name, c.reversed, c.type.cql) for c in t.clustering] == [("placed", True, "timestamp")]
    assert t.columns["note"].is_static
    assert t.columns["items"].is_complex and not t.columns["addr"].is_complex
    assert t.columns["addr"].type.field_names == ("street", "zip")
    assert (KS, "address") in tracker.schema.types


def test_alter_add_then_drop_column_copy_on_write():
    tracker = SchemaTracker()
    feed(tracker, create_table(KS, "orders", TID, ORDERS, 1000, types=[ADDRESS]))
    before = tracker.schema
    # ALTER TABLE ADD: the table row is rewritten and only the new column's row is written
    changes = feed(tracker, Mutation([supdate("tables", KS, [srow("tables", ("orders",),
                                                                  {"id": TID, "flags": {"compound"}}, 2000)]),
                                      supdate("columns", KS, column_rows("orders", [
                                          ("coupon", "regular", -1, "text", "none")], 2000))]))
    assert [(c.kind, c.detail.split()[0]) for c in changes] == [("column_added", "coupon")]
    assert "coupon" in tracker.schema.table(TID).columns
    assert tracker.schema.table(TID).gc_grace_seconds == 864000
    assert "coupon" not in before.table(TID).columns        # the schema handed out earlier did not change
    assert len(tracker.schema.table(TID).columns) == len(ORDERS) + 1
    # ALTER TABLE ... WITH gc_grace_seconds = 60: the table row's cell, which the purge goes by
    changes = feed(tracker, Mutation([supdate("tables", KS, [srow("tables", ("orders",), {"gc_grace_seconds": 60},
                                                                  2500)])]))
    assert [c.kind for c in changes] == ["table_altered"] and tracker.schema.table(TID).gc_grace_seconds == 60
    # ALTER TABLE DROP total: column row deleted, dropped_columns row written (dropped_time in ms)
    changes = feed(tracker, Mutation([
        supdate("columns", KS, [sdelete("columns", ("orders", "total"), 3000)]),
        supdate("dropped_columns", KS, [srow("dropped_columns", ("orders", "total"),
                                             {"dropped_time": 1_699_000_000_123, "type": "decimal",
                                              "kind": "regular"}, 3000)])]))
    assert [c.kind for c in changes] == ["column_dropped"]
    t = tracker.schema.table(TID)
    assert "total" not in t.columns
    d = t.column_for_data("total")                          # old mutations still name it: it must be typed
    assert (d.type.cql, d.dropped_time, d.kind) == ("decimal", 1_699_000_000_123_000, "regular")


def test_drop_table_and_keyspace():
    tracker = SchemaTracker()
    feed(tracker, create_table(KS, "orders", TID, ORDERS, 1000, types=[ADDRESS]))
    other = uuid.uuid4()
    feed(tracker, create_table(KS, "plain", other, [("k", "partition_key", 0, "int", "none")], 1000))
    # DROP TABLE orders: row deletions of its table row and column rows
    changes = feed(tracker, Mutation([supdate("tables", KS, [sdelete("tables", ("orders",), 2000)]),
                                      supdate("columns", KS, [sdelete("columns", ("orders", c[0]), 2000)
                                                              for c in ORDERS])]))
    assert [(c.kind, c.name, c.table_id) for c in changes] == [("table_dropped", "orders", TID)]
    with pytest.raises(UnknownTableError):
        tracker.schema.table(TID)
    assert tracker.schema.table(other).name == "plain"
    # DROP KEYSPACE: a partition deletion in every schema table
    pd = DeletionTime(3000, LDT)
    changes = feed(tracker, Mutation([supdate(t, KS, partition_deletion=pd) for t in SYSTEM_SCHEMA_DEFINITIONS]))
    assert {(c.kind, c.name) for c in changes} == {("table_dropped", "plain"), ("type_dropped", "address")}
    assert tracker.schema.get(other) is None and (KS, "address") not in tracker.schema.types


def test_range_tombstone_then_recreate_with_new_id():
    tracker = SchemaTracker()
    feed(tracker, create_table(KS, "orders", TID, ORDERS, 1000, types=[ADDRESS]))
    new_id = uuid.uuid4()
    # "DELETE FROM system_schema.columns WHERE keyspace_name=? AND table_name='orders'" (a range tombstone)
    # then the table recreated with other columns, all at a later timestamp, in one mutation
    rt = [RangeTombstoneMarker(BoundKind.INCL_START_BOUND, _clustering("columns", ("orders",)),
                               DeletionTime(1500, LDT)),
          RangeTombstoneMarker(BoundKind.INCL_END_BOUND, _clustering("columns", ("orders",)),
                               DeletionTime(1500, LDT))]
    m = create_table(KS, "orders", new_id, [("id", "partition_key", 0, "uuid", "none"),
                                            ("v", "regular", -1, "blob", "none")], 2000)
    m.updates[2] = supdate("columns", KS, column_rows("orders", [("id", "partition_key", 0, "uuid", "none"),
                                                                 ("v", "regular", -1, "blob", "none")], 2000),
                           markers=rt)
    changes = feed(tracker, m)
    assert [(c.kind, c.table_id) for c in changes] == [("table_dropped", TID), ("table_created", new_id)]
    assert set(tracker.schema.table(new_id).columns) == {"id", "v"}


def test_last_write_wins_whatever_the_arrival_order():
    newer = create_table(KS, "t", TID, [("k", "partition_key", 0, "int", "none"),
                                        ("v", "regular", -1, "bigint", "none")], 2000)
    older = create_table(KS, "t", TID, [("k", "partition_key", 0, "int", "none"),
                                        ("v", "regular", -1, "int", "none")], 1000)
    for order in ([older, newer], [newer, older]):
        tracker = SchemaTracker()
        for m in order:
            feed(tracker, m)
        assert tracker.schema.table(TID).columns["v"].type.cql == "bigint"
    # same timestamp: the deletion wins over the write
    tracker = SchemaTracker()
    feed(tracker, newer)
    feed(tracker, Mutation([supdate("tables", KS, [sdelete("tables", ("t",), 2000)])]))
    assert tracker.schema.get(TID) is None


def test_alter_type_add_reaches_the_tables_that_use_the_type():
    # ALTER TYPE address ADD country text rewrites only the types row; the columns rows of orders still say
    # frozen<address>, so the table must be rebuilt with the type's new fields (P2, found on real 5.0 segments:
    # the values written after the ALTER were undecodable with --schema-from-log).
    tracker = SchemaTracker()
    columns = ORDERS + [("history", "regular", -1, "list<frozen<address>>", "none")]
    feed(tracker, create_table(KS, "orders", TID, columns, 1000, types=[ADDRESS]))
    old = tracker.schema.table(TID)
    changes = feed(tracker, Mutation([supdate("types", KS, [srow("types", ("address",), {
        "field_names": ("street", "zip", "country"), "field_types": ("text", "int", "text")}, 2000)])]))
    assert ("type_altered", "address") in {(c.kind, c.name) for c in changes}
    assert sorted(c.detail for c in changes if c.kind == "column_altered") == [
        "addr frozen<address>: a user type it uses changed",
        "history list<frozen<address>>: a user type it uses changed"]
    t = tracker.schema.table(TID)
    assert t.columns["addr"].type.field_names == ("street", "zip", "country")
    assert t.columns["history"].type.subtypes[0].field_names == ("street", "zip", "country")
    value = {"street": "Main", "zip": 1, "country": "NL"}
    assert t.columns["addr"].type.decode(t.columns["addr"].type.encode(value)) == value
    assert old.columns["addr"].type.field_names == ("street", "zip")      # the earlier schema is untouched


def test_alter_of_a_base_table_keeps_its_columns():
    base = load_cql_schema(f"""
        CREATE TYPE {KS}.geo (lat double, "Lon" double);
        CREATE TABLE {KS}.orders (customer text, placed timestamp, total decimal, gone int, loc frozen<geo>,
                                  PRIMARY KEY (customer, placed))
          WITH CLUSTERING ORDER BY (placed DESC) AND ID = {TID};
        ALTER TABLE {KS}.orders DROP gone USING TIMESTAMP 1500000;
        CREATE TABLE {KS}.untouched (k int PRIMARY KEY, z int, a int, m text) WITH ID = {uuid.UUID(int=7)};
    """)
    tracker = SchemaTracker(base)
    untouched = tracker.schema.table(uuid.UUID(int=7))
    assert tracker.schema.table(TID).dropped["gone"].dropped_time == 1500000
    changes = feed(tracker, Mutation([supdate("tables", KS, [srow("tables", ("orders",),
                                                                  {"id": TID, "flags": {"compound"}}, 2000)]),
                                      supdate("columns", KS, column_rows("orders", [
                                          ("coupon", "regular", -1, "text", "none")], 2000))]))
    assert [c.kind for c in changes] == ["column_added"]        # nothing said about the other table
    assert tracker.schema.table(uuid.UUID(int=7)) is untouched
    t = tracker.schema.table(TID)
    assert set(t.columns) == {"customer", "placed", "coupon", "total", "loc"}
    assert t.columns["loc"].type.field_names == ("lat", "Lon") and (KS, "geo") in tracker.schema.types
    assert t.clustering[0].reversed
    assert t.dropped["gone"].dropped_time == 1500000           # exact micros survive the row round trip
    assert base.table(TID).columns.keys() == {"customer", "placed", "total", "loc"}


def test_partial_definition_is_reported_not_invented():
    tracker = SchemaTracker()
    # an ALTER seen without the CREATE (the log began after it): the table row and one column only
    changes = feed(tracker, Mutation([supdate("tables", KS, [srow("tables", ("orders",),
                                                                  {"id": TID, "flags": {"compound"}}, 2000)]),
                                      supdate("columns", KS, column_rows("orders", [
                                          ("coupon", "regular", -1, "text", "none")], 2000))]))
    assert [(c.kind, c.name) for c in changes] == [("error", "orders")]
    assert "partition key" in changes[0].detail
    assert tracker.schema.get(TID) is None
    # said once: a later unrelated change in the keyspace does not repeat it
    changes = feed(tracker, create_table(KS, "other", uuid.UUID(int=9),
                                         [("k", "partition_key", 0, "int", "none")], 2500))
    assert [(c.kind, c.name) for c in changes] == [("table_created", "other")]


def test_a_damaged_collection_value_is_reported_and_the_log_goes_on(caplog):
    tracker = SchemaTracker()
    names = _enc("types", "field_names", ["street", "zip"])[:-1]          # the last name's bytes cut short
    row = Row(_clustering("types", ("address",)), liveness=LivenessInfo(3000),
              cells=[Cell("field_names", names, 3000),
                     Cell("field_types", _enc("types", "field_types", ["text", "int"]), 3000)])
    with caplog.at_level("WARNING", logger="cdc_lib.commitlog.schema_from_log"):
        tracker.observe(Mutation([supdate("types", KS, [row])]))
    assert "undecodable system_schema.types value for keyspace shop: @ 18: frozen<list<text>>: truncated element: " \
        "element 1 needs 3 bytes at byte 18" in caplog.text
    changes = feed(tracker, create_table(KS, "other", uuid.UUID(int=9),
                                         [("k", "partition_key", 0, "int", "none")], 2500))
    assert ("table_created", "other") in [(c.kind, c.name) for c in changes]


def test_data_decodes_only_once_its_schema_is_known():
    tracker = SchemaTracker()
    cols = [("k", "partition_key", 0, "int", "none"), ("c", "clustering", 0, "text", "none"),
            ("v", "regular", -1, "text", "none")]
    writer_schema = SchemaTracker()
    feed(writer_schema, create_table(KS, "t", TID, cols, 1000))
    t = writer_schema.schema.table(TID)
    data_update = finish_update(PartitionUpdate(TID, b"\x00\x00\x00\x07", t, unfiltereds=[
        Row((b"a",), LivenessInfo(5000), cells=[Cell("v", b"hello", 5000)])]))
    data = encode_mutation(Mutation([data_update]), writer_schema.schema)
    with pytest.raises(UnknownTableError):
        tracker.decode(data)
    feed(tracker, create_table(KS, "t", TID, cols, 1000))
    m, changes = tracker.decode(data)
    assert changes == [] and m.updates[0].rows[0].cells[0].value == b"hello"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["write", "delete"]), st.sampled_from(["a", "b", "c"]),
                          st.sampled_from(["int", "text", "blob"]), st.integers(1, 50)), min_size=1, max_size=12),
       st.randoms(use_true_random=False))
def test_rows_converge_in_any_order(ops, rnd: random.Random):
    """Writes and deletions of column rows give the same schema whatever order the log holds them in."""
    muts = [create_table(KS, "t", TID, [("k", "partition_key", 0, "int", "none")], 1)]
    for op, col, typ, ts in ops:
        if op == "write":
            rows = column_rows("t", [(col, "regular", -1, typ, "none")], ts * 10 + 1)
        else:
            rows = [sdelete("columns", ("t", col), ts * 10)]
        muts.append(Mutation([supdate("columns", KS, rows)]))
    results = []
    for _ in range(2):
        tracker = SchemaTracker()
        shuffled = muts[:]
        rnd.shuffle(shuffled)
        for m in shuffled:
            feed(tracker, m)
        t = tracker.schema.get(TID)
        results.append(None if t is None else {n: c.type.cql for n, c in t.columns.items()})
    assert results[0] == results[1]


# ---------------------------------------------------------------------------------------------------------
# Real segments: the schema of Keyspace1.Standard1 is created inside the log, before its data
# ---------------------------------------------------------------------------------------------------------

def _hash_txt(path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _java_int(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


@pytest.mark.parametrize("version", ["3.0.29", "4.0.11"])
def test_real_segment_schema_and_data(corpus, version):
    folder = corpus / "commitlog" / version
    truth = _hash_txt(folder / "hash.txt")
    cfid = uuid.UUID(truth["cfid"])
    tracker = SchemaTracker()
    cells = 0
    h = 0
    unknown = set()
    schema_changes = []
    for segment in sorted(folder.glob("CommitLog-*.log")):
        for rec in read_segment(segment):
            assert isinstance(rec, LogEntry), f"damage in a clean segment: {rec}"
            try:
                m, changes = tracker.decode(rec.data, rec.messaging_version, source=str(segment),
                                            position=rec.position)
            except UnknownTableError as e:
                # system.local, sstable_activity...: not schema we track. Never the data table itself.
                assert e.table_id != cfid, f"Standard1 data at {rec.position} before its schema"
                unknown.add(e.table_id)
                continue
            schema_changes += changes
            for u in m.updates:
                if u.table_id != cfid:
                    continue
                # each data mutation decoded with the schema in force at its position: same object as the tracker's
                assert u.table is tracker.schema.table(cfid)
                for r in u.rows:
                    if r.clustering and r.clustering[0].startswith(b"name"):
                        for c in r.cells:
                            cells += 1
                            shift = 0
                            for b in c.value:
                                h = _java_int(h + ((b & 0xFF) << shift))
                                shift = (shift + 8) & 31
    created = [c for c in schema_changes if c.kind == "table_created" and c.table_id == cfid]
    assert len(created) == 1
    assert (cells, h) == (int(truth["cells"]), int(truth["hash"]))
    t = tracker.schema.table(cfid)
    assert t.qualified_name == "Keyspace1.Standard1"
    assert [(c.name, c.type.cql) for c in t.partition_key] == [("key", "ascii")]
    assert len(t.clustering) == 1 and t.clustering[0].type.cql == "ascii" and not t.clustering[0].reversed
    assert t.columns["val"].kind == "regular" and not t.dropped
    if version == "4.0.11":
        assert t.clustering[0].name == "col"
        assert set(t.columns) == {"key", "col", "val"} and t.columns["val"].type.cql == "blob"
        assert t.flags == {"compound"}
    else:
        # The segment's own system_schema rows (not the corpus README, which says "col"/"val blob", COMPACT
        # STORAGE) define the 3.0 test table as SchemaLoader's standard table: non-compact, ascii values.
        assert t.clustering[0].name == "name"
        assert {n: c.type.cql for n, c in t.columns.items() if c.kind == "regular"} == {"val": "ascii",
                                                                                        "val0": "ascii"}
        assert t.flags == {"compound"} and "dense" not in t.flags
    assert cfid not in unknown
