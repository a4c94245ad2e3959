"""load_from_cluster: system_schema rows read through cassandra-driver -> Schema.

No Cassandra server can run in this test environment, so the session is a fake: its ``execute`` answers the
``SELECT * FROM system_schema.<table> [WHERE keyspace_name = %s]`` queries with rows made by the driver's
own ``named_tuple_factory`` and holding the Python types the driver returns (uuid.UUID, SortedSet for
``flags``, lists for UDT fields; ``dropped_time`` is read as milliseconds, see ``_selection``). Only the
connection-failure test talks to the real driver, against a closed local port; ``tests/test_real_cluster.py``
reads a real Cassandra 5.0.
"""
from __future__ import annotations

import datetime
import re
import socket
import uuid

import pytest
from cassandra.query import named_tuple_factory
from cassandra.util import SortedSet

from cdc_lib.cql.schema_from_cluster import load_from_cluster
from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.cql.system_schema import SCHEMA_KEYSPACE, system_table_id
from cdc_lib.errors import SchemaError

ORDERS_ID = uuid.UUID("5a1c395e-b41f-11e5-9f22-ba0be0483c18")
DENSE_ID = uuid.UUID("6b2d4a6f-b41f-11e5-9f22-ba0be0483c18")
VIEW_ID = uuid.UUID("7c3e5b70-b41f-11e5-9f22-ba0be0483c18")
OTHER_ID = uuid.UUID("8d4f6c81-b41f-11e5-9f22-ba0be0483c18")


def _col(ks, table, name, kind, position, type_, order="none"):
    return dict(keyspace_name=ks, table_name=table, column_name=name, clustering_order=order,
                column_name_bytes=name.encode(), kind=kind, position=position, type=type_)


ROWS = {
    "keyspaces": [dict(keyspace_name="shop", durable_writes=True, replication={"class": "SimpleStrategy"}),
                  dict(keyspace_name="other", durable_writes=True, replication={"class": "SimpleStrategy"})],
    "tables": [
        dict(keyspace_name="shop", table_name="orders", id=ORDERS_ID, flags=SortedSet(["compound"]), cdc=True,
             comment=""),
        dict(keyspace_name="shop", table_name="legacy", id=DENSE_ID, flags=SortedSet(["dense"]), cdc=None,
             comment=""),
        dict(keyspace_name="other", table_name="t", id=OTHER_ID, flags=SortedSet(["compound"]), cdc=False,
             comment=""),
    ],
    "views": [dict(keyspace_name="shop", view_name="by_total", base_table_id=ORDERS_ID, base_table_name="orders",
                   id=VIEW_ID, include_all_columns=False, where_clause="total IS NOT NULL")],
    "columns": [
        _col("shop", "orders", "customer", "partition_key", 0, "text"),
        _col("shop", "orders", "region", "partition_key", 1, "int"),
        _col("shop", "orders", "placed", "clustering", 0, "timestamp", "desc"),
        _col("shop", "orders", "note", "static", -1, "text"),
        _col("shop", "orders", "total", "regular", -1, "decimal"),
        _col("shop", "orders", "addr", "regular", -1, "frozen<address>"),
        _col("shop", "orders", "tags", "regular", -1, "set<text>"),
        _col("shop", "legacy", "key", "partition_key", 0, "ascii"),
        _col("shop", "legacy", "col", "clustering", 0, "ascii", "asc"),
        _col("shop", "legacy", "val", "regular", -1, "blob"),
        _col("shop", "by_total", "total", "partition_key", 0, "decimal"),
        _col("shop", "by_total", "customer", "clustering", 0, "text", "asc"),
        _col("shop", "by_total", "region", "clustering", 1, "int", "asc"),
        _col("shop", "by_total", "placed", "clustering", 2, "timestamp", "desc"),
        _col("other", "t", "k", "partition_key", 0, "int"),
    ],
    "dropped_columns": [dict(keyspace_name="shop", table_name="orders", column_name="coupon",
                             dropped_time=datetime.datetime(2023, 11, 6, 14, 9, 49, 123000), kind="regular",
                             type="frozen<tuple<text, int>>")],
    "types": [dict(keyspace_name="shop", type_name="address", field_names=["street", "geo"],
                   field_types=["text", "frozen<point>"]),
              dict(keyspace_name="shop", type_name="point", field_names=["x", "y"], field_types=["double", "double"])],
}

_QUERY = re.compile(r"SELECT (\*|keyspace_name|[\w(), ]+ AS dropped_time[\w, ]*) FROM system_schema\.(\w+)"
                    r"( WHERE keyspace_name = %s)?\Z")
_COLUMNS_OF = "SELECT column_name FROM system_schema.columns WHERE keyspace_name = %s AND table_name = %s"


class FakeSession:
    """Answers system_schema queries like a driver Session with the default named-tuple row factory."""

    def __init__(self, rows=ROWS):
        self.rows = rows
        self.queries = []

    def execute(self, query, parameters=None):
        self.queries.append((query, parameters))
        if query == _COLUMNS_OF:           # the columns of system_schema.dropped_columns
            assert parameters == (SCHEMA_KEYSPACE, "dropped_columns")
            names = list(self.rows["dropped_columns"][0]) if self.rows.get("dropped_columns") else \
                ["keyspace_name", "table_name", "column_name", "dropped_time", "kind", "type"]
            return named_tuple_factory(["column_name"], [(n,) for n in names])
        m = _QUERY.match(query)
        assert m, f"unexpected query {query!r}"
        table = m.group(2)
        if table not in ("keyspaces", "tables", "views", "columns", "dropped_columns", "types"):
            raise RuntimeError(f"unconfigured table {table}")   # what InvalidRequest would say
        rows = self.rows.get(table, [])
        if m.group(3):
            rows = [r for r in rows if r["keyspace_name"] == parameters[0]]
        if not rows:
            return []
        if m.group(1) == "keyspace_name":
            names = ["keyspace_name"]
        elif m.group(1) == "*":
            names = list(rows[0])
        else:                              # dropped_columns, dropped_time as blobAsBigint(timestampAsBlob(...))
            names = [n.split(" AS ")[-1].strip() for n in m.group(1).split(", ")]
            epoch = datetime.datetime(1970, 1, 1)
            rows = [{**r, "dropped_time": (r["dropped_time"] - epoch) // datetime.timedelta(milliseconds=1)}
                    for r in rows]
        return named_tuple_factory(names, [tuple(r.get(n) for n in names) for r in rows])


def test_rows_become_metadata():
    s = load_from_cluster(FakeSession())
    t = s.table(ORDERS_ID)
    assert t.qualified_name == "shop.orders" and t.cdc and t.flags == {"compound"}
    assert [c.name for c in t.partition_key] == ["customer", "region"]
    assert [(c.name, c.reversed) for c in t.clustering] == [("placed", True)]
    assert t.columns["note"].is_static and t.columns["tags"].is_complex
    assert t.columns["addr"].type.subtypes[1].field_names == ("x", "y")     # UDT using a UDT defined after it
    d = t.column_for_data("coupon")
    assert d.dropped_time == 1699279789123000 and d.type.cql == "frozen<tuple<text, int>>"
    legacy = s.table(DENSE_ID)
    assert legacy.flags == {"dense"} and not legacy.cdc
    view = s.table(VIEW_ID)
    assert view.name == "by_total" and view.flags == {"compound"}
    assert [c.name for c in view.clustering] == ["customer", "region", "placed"] and view.clustering[2].reversed
    assert s.table(OTHER_ID).keyspace == "other"
    assert set(s.types) == {("shop", "address"), ("shop", "point")}
    # system_schema's own tables are always known, so the log's schema mutations can be decoded
    assert s.table(system_table_id(SCHEMA_KEYSPACE, "dropped_columns")).name == "dropped_columns"


def test_same_metadata_as_the_cql_source():
    cql = load_cql_schema(f"""
        CREATE TYPE shop.point (x double, y double);
        CREATE TYPE shop.address (street text, geo frozen<point>);
        CREATE TABLE shop.orders (customer text, region int, placed timestamp, note text static, total decimal,
            addr frozen<address>, tags set<text>, coupon frozen<tuple<text, int>>,
            PRIMARY KEY ((customer, region), placed))
            WITH CLUSTERING ORDER BY (placed DESC) AND ID = {ORDERS_ID} AND cdc = true;
        ALTER TABLE shop.orders DROP coupon USING TIMESTAMP 1699279789123000;
        CREATE TABLE shop.legacy (key ascii, col ascii, val blob, PRIMARY KEY (key, col))
            WITH COMPACT STORAGE AND ID = {DENSE_ID};
    """)
    driver = load_from_cluster(FakeSession())
    for tid in (ORDERS_ID, DENSE_ID):
        a, b = cql.table(tid), driver.table(tid)
        assert (a.qualified_name, a.flags, a.cdc) == (b.qualified_name, b.flags, b.cdc)
        assert a.columns == b.columns
        assert a.partition_key == b.partition_key and a.clustering == b.clustering
        assert a.dropped == b.dropped


def test_keyspace_filter_reads_only_those_partitions():
    session = FakeSession()
    s = load_from_cluster(session, keyspaces=["other"])
    assert s.get(OTHER_ID) is not None and s.get(ORDERS_ID) is None
    assert all(params == ("other",) for q, params in session.queries if q != _COLUMNS_OF)
    with pytest.raises(SchemaError, match="'nope' does not exist"):
        load_from_cluster(FakeSession(), keyspaces=["nope"])


def test_unbuildable_table_is_left_out_or_fatal():
    rows = dict(ROWS, columns=[c for c in ROWS["columns"] if c["table_name"] != "legacy"])
    s = load_from_cluster(FakeSession(rows))
    assert s.get(DENSE_ID) is None and s.get(ORDERS_ID) is not None
    with pytest.raises(SchemaError, match="shop.legacy: no partition key"):
        load_from_cluster(FakeSession(rows), strict=True)


def test_driver_errors_become_schema_errors():
    class Broken(FakeSession):
        def execute(self, query, parameters=None):
            raise TimeoutError("read timed out")
    with pytest.raises(SchemaError, match="read timed out"):
        load_from_cluster(Broken())


def test_unreachable_cluster():
    with socket.socket() as sock:            # a local port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SchemaError, match="cannot connect"):
        load_from_cluster("127.0.0.1", port=port, connect_timeout=2)
