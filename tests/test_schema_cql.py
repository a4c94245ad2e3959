"""load_cql_schema: DESCRIBE output -> Schema, including COMPACT STORAGE's internal layout."""
from __future__ import annotations

import logging
import re
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.errors import SchemaError

ID1 = uuid.UUID("5a1c395e-b41f-11e5-9f22-ba0be0483c18")
ID2 = uuid.UUID("6b2d4a6f-b41f-11e5-9f22-ba0be0483c18")
ID3 = uuid.UUID("7c3e5b70-b41f-11e5-9f22-ba0be0483c18")
ID4 = uuid.UUID("8d4f6c81-b41f-11e5-9f22-ba0be0483c18")

DESCRIBE = f"""
-- cqlsh DESCRIBE SCHEMA WITH INTERNALS, lightly edited
CREATE KEYSPACE IF NOT EXISTS "Shop" WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': '1'}}
    AND durable_writes = true;

/* types first: a UDT using another UDT */
CREATE TYPE "Shop".geo (lat double, lon double);
CREATE TYPE "Shop"."Address" (street text, "Zip" int, where frozen<geo>);

CREATE TABLE IF NOT EXISTS "Shop"."Orders" (
    customer text,
    region int,
    placed timestamp,
    line int,
    note text static,        // shared by the partition
    "Total" decimal,
    items map<text, int>,
    addr frozen<"Address">,
    gone text,
    PRIMARY KEY ((customer, region), placed, line)
) WITH ID = {ID1}
    AND CLUSTERING ORDER BY (placed DESC, line ASC)
    AND cdc = true
    AND compression = {{'chunk_length_in_kb': '16', 'class': 'org.apache.cassandra.io.compress.LZ4Compressor'}}
    AND comment = 'it''s; not a statement end'
    AND gc_grace_seconds = 3600
    AND speculative_retry = '99p';
ALTER TABLE "Shop"."Orders" DROP gone USING TIMESTAMP 1699000000123000;

USE "Shop";
CREATE TABLE plain (k uuid PRIMARY KEY, v blob) WITH ID = '{ID2}';
ALTER TABLE plain ADD (extra int, tags set<text>);
INSERT INTO plain (k, v) VALUES (uuid(), 0x01);
CREATE INDEX plain_v ON plain (v);
CREATE FUNCTION "Shop".f(a int) RETURNS NULL ON NULL INPUT RETURNS int LANGUAGE java AS $$ return a; $$;
BEGIN BATCH INSERT INTO plain (k) VALUES (uuid()); APPLY BATCH;

CREATE MATERIALIZED VIEW "Shop".by_v AS
    SELECT * FROM "Shop".plain WHERE v IS NOT NULL AND k IS NOT NULL
    PRIMARY KEY (v, k)
    WITH CLUSTERING ORDER BY (k ASC) AND ID = {ID3};
CREATE MATERIALIZED VIEW "Shop".no_id AS
    SELECT k FROM "Shop".plain WHERE v IS NOT NULL AND k IS NOT NULL PRIMARY KEY (v, k);
"""


def test_describe_output():
    s = load_cql_schema(DESCRIBE)
    assert set(s.tables) == {ID1, ID2, ID3}
    t = s.table(ID1)
    assert (t.keyspace, t.name, t.cdc, t.flags) == ("Shop", "Orders", True, {"compound"})
    assert [c.name for c in t.partition_key] == ["customer", "region"]
    assert [(c.name, c.reversed, c.position) for c in t.clustering] == [("placed", True, 0), ("line", False, 1)]
    assert t.columns["note"].is_static and not t.columns["Total"].is_static
    assert t.columns["items"].is_complex and t.columns["items"].type.cql == "map<text, int>"
    addr = t.columns["addr"].type
    assert not addr.multicell and addr.field_names == ("street", "Zip", "where")
    assert addr.subtypes[2].field_names == ("lat", "lon")
    assert "gone" not in t.columns
    d = t.column_for_data("gone")
    assert (d.dropped_time, d.type.cql, d.kind) == (1699000000123000, "text", "regular")
    assert set(s.types) == {("Shop", "geo"), ("Shop", "Address")}

    plain = s.table(ID2)
    assert plain.keyspace == "Shop" and not plain.cdc
    assert (t.gc_grace_seconds, plain.gc_grace_seconds) == (3600, 864000)      # the table option, else Cassandra's
    assert set(plain.columns) == {"k", "v", "extra", "tags"} and plain.columns["tags"].is_complex
    view = s.table(ID3)
    assert [c.name for c in view.partition_key] == ["v"] and [c.name for c in view.clustering] == ["k"]
    assert set(view.columns) == {"v", "k", "extra", "tags"}


def test_missing_id_is_an_error_naming_the_table(caplog):
    text = "CREATE TABLE ks.t1 (k int PRIMARY KEY, v int) WITH ID = %s;\nCREATE TABLE ks.t2 (k int PRIMARY KEY);" % ID1
    with pytest.raises(SchemaError, match=r"<cql>:2: table ks\.t2 has no ID"):
        load_cql_schema(text)
    with caplog.at_level(logging.WARNING, logger="cdc_lib.cql.schema_from_ddl"):
        a = load_cql_schema(text, allow_missing_ids=True)
    assert "ks.t2" in caplog.text
    b = load_cql_schema(text, allow_missing_ids=True)
    t2 = a.by_name("ks", "t2")
    assert t2.id == b.by_name("ks", "t2").id != ID1          # deterministic, and not another table's
    assert a.table(ID1).name == "t1"


def test_corpus_schema_file(corpus):
    path = corpus / "sstables" / "3.11-types" / "schema.cql"
    text = path.read_text()
    live = list(re.finditer(r"^CREATE TABLE IF NOT EXISTS testtypes1\.(\w+) "
                            r"\(id int PRIMARY KEY, (\w+) ([^)]+?)\) WITH", text, re.M))
    with pytest.raises(SchemaError, match="testtypes1.ascii"):
        load_cql_schema(path)
    s = load_cql_schema(path, allow_missing_ids=True)
    assert len(s.tables) == len(live) > 20                   # the commented-out counter table is skipped
    for m in live:
        t = s.by_name("testtypes1", m.group(1))
        col = t.columns[m.group(2)]
        assert col.kind == "regular" and t.partition_key[0].type.cql == "int"
        declared = m.group(3).replace(",", ", ").replace("varchar", "text")
        assert col.type.cql in (declared, f"frozen<{declared}>")
    assert s.by_name("testtypes1", "counter") is None
    assert s.by_name("testtypes1", "list").columns["listintval"].is_complex


def test_compact_storage_layouts():
    s = load_cql_schema(f"""
        CREATE TABLE k.dense1 (key ascii, col ascii, val blob, PRIMARY KEY (key, col))
            WITH COMPACT STORAGE AND ID = {ID1};
        CREATE TABLE k.dense2 (a int, b int, c int, PRIMARY KEY (a, b, c)) WITH ID = {ID2} AND COMPACT STORAGE;
        CREATE TABLE k.static (key text PRIMARY KEY, value int, column1 int, x text)
            WITH COMPACT STORAGE AND ID = {ID3};
        CREATE TABLE k.counts (key text PRIMARY KEY, hits counter) WITH COMPACT STORAGE AND ID = {ID4};
    """)
    d1 = s.table(ID1)
    assert d1.flags == {"dense"}
    assert [(c.name, c.kind, c.type.cql) for c in d1.columns.values()] == [
        ("key", "partition_key", "ascii"), ("col", "clustering", "ascii"), ("val", "regular", "blob")]
    d2 = s.table(ID2)
    assert d2.flags == {"dense", "compound"}
    assert [c.name for c in d2.clustering] == ["b", "c"]
    assert [(c.name, c.type.cql) for c in d2.regular_columns] == [("value", "empty")]
    st_ = s.table(ID3)
    assert st_.flags == frozenset()
    # user columns become static; the hidden clustering/value columns avoid the names already taken
    assert {c.name for c in st_.static_columns} == {"value", "column1", "x"}
    assert [(c.name, c.type.cql) for c in st_.clustering] == [("column2", "text")]
    assert [(c.name, c.type.cql) for c in st_.regular_columns] == [("value1", "blob")]
    counts = s.table(ID4)
    assert counts.flags == {"counter"} and counts.is_counter
    assert [(c.name, c.type.cql) for c in counts.regular_columns] == [("value", "counter")]
    assert [(c.name, c.type.cql) for c in counts.clustering] == [("column1", "text")]


def test_alter_type_and_column_type():
    s = load_cql_schema(f"""
        CREATE TYPE k.a (x int);
        ALTER TYPE k.a ADD y text;
        ALTER TYPE k.a RENAME x TO "X";
        CREATE TABLE k.t (k int PRIMARY KEY, v frozen<a>, w int) WITH ID = {ID1};
        ALTER TABLE k.t ALTER w TYPE varint;
    """)
    t = s.table(ID1)
    assert t.columns["v"].type.field_names == ("X", "y") and t.columns["w"].type.cql == "varint"


def test_counter_table_flags():
    s = load_cql_schema(f"CREATE TABLE k.c (k int, c int, n counter, PRIMARY KEY (k, c)) WITH ID = {ID1};")
    assert s.table(ID1).flags == {"compound", "counter"}


@pytest.mark.parametrize("text, message", [
    ("CREATE TABLE k.t (k int PRIMARY KEY, v 'broken) WITH ID = %s;" % ID1, r"<cql>:1: unterminated"),
    ("CREATE TABLE k.t (k int PRIMARY KEY,\n v nosuchtype) WITH ID = %s;" % ID1, r"<cql>:2: .*nosuchtype"),
    ("CREATE TABLE t (k int PRIMARY KEY) WITH ID = %s;" % ID1, r"not qualified by a keyspace"),
    ("CREATE TABLE k.t (k int, v int) WITH ID = %s;" % ID1, r"no PRIMARY KEY"),
    ("CREATE TABLE k.t (k int PRIMARY KEY) WITH ID = not-a-uuid;", r"ID"),
    ("CREATE TABLE k.a (k int PRIMARY KEY) WITH ID = %s; CREATE TABLE k.b (k int PRIMARY KEY) WITH ID = %s;"
     % (ID1, ID1), r"also the id of k\.a"),
    ("CREATE TABLE k.t (k int, c int, a int, b int, PRIMARY KEY (k, c)) WITH COMPACT STORAGE AND ID = %s;" % ID1,
     r"at most one other column"),
    ("ALTER TABLE k.nope ADD x int;", r"unknown table k\.nope"),
])
def test_errors_name_the_place(text, message):
    with pytest.raises(SchemaError, match=message):
        load_cql_schema(text)


def test_missing_file_is_a_schema_error(tmp_path):
    with pytest.raises(SchemaError, match="cannot read"):
        load_cql_schema(str(tmp_path / "nope.cql"))
    f = tmp_path / "s.cql"
    f.write_text(f"CREATE TABLE k.t (k int PRIMARY KEY) WITH ID = {ID1};")
    assert load_cql_schema(str(f)).table(ID1).name == "t"


# --- property: any table we can describe in CQL comes back as described -----------------------------------

_TYPES = ["int", "text", "bigint", "blob", "uuid", "timestamp", "frozen<list<int>>", "map<text, int>",
          "set<uuid>", "frozen<tuple<int, text>>", "decimal", "inet"]
_KEY_TYPES = [t for t in _TYPES if not (t.startswith("map") or t.startswith("set"))]
_name = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True) | st.from_regex(r"[A-Z][A-Za-z0-9 ]{0,8}",
                                                                               fullmatch=True)


def _q(name: str) -> str:
    return name if re.fullmatch(r"[a-z][a-z0-9_]*", name) else '"' + name.replace('"', '""') + '"'


@settings(max_examples=60, deadline=None)
@given(st.lists(_name, min_size=2, max_size=8, unique_by=str.lower), st.data())
def test_generated_tables_round_trip(names, data):
    n_pk = data.draw(st.integers(1, min(2, len(names) - 1)))
    n_ck = data.draw(st.integers(0, len(names) - n_pk - 1))
    pk, ck, rest = names[:n_pk], names[n_pk:n_pk + n_ck], names[n_pk + n_ck:]
    types = {n: data.draw(st.sampled_from(_KEY_TYPES if n in pk + ck else _TYPES)) for n in names}
    desc = {n for n in ck if data.draw(st.booleans())}
    static = {n for n in rest if ck and data.draw(st.booleans())}
    defs = ", ".join(f"{_q(n)} {types[n]}{' static' if n in static else ''}" for n in names)
    pk_text = _q(pk[0]) if len(pk) == 1 else "(" + ", ".join(map(_q, pk)) + ")"
    key = ", ".join([pk_text] + [_q(c) for c in ck])
    order = (" AND CLUSTERING ORDER BY (" + ", ".join(f"{_q(c)} {'DESC' if c in desc else 'ASC'}" for c in ck)
             + ")") if ck else ""
    s = load_cql_schema(f'CREATE TABLE "Ks".tbl ({defs}, PRIMARY KEY ({key})) WITH ID = {ID1}{order};')
    t = s.table(ID1)
    assert [c.name for c in t.partition_key] == pk and [c.name for c in t.clustering] == ck
    assert {c.name for c in t.clustering if c.reversed} == desc
    for n in names:
        col = t.columns[n]
        assert col.type.cql == types[n].replace("frozen<tuple", "frozen<tuple")
        expected_kind = ("partition_key" if n in pk else "clustering" if n in ck else
                         "static" if n in static else "regular")
        assert col.kind == expected_kind
