"""Cassandra 5 column masks: read from the schema (DESCRIBE output, system_schema.column_masks) and applied to the
change events, so what Kafka consumers see of a masked column is what a user without UNMASK sees in cqlsh."""
from __future__ import annotations

import hashlib
import json
import re
import uuid

import pytest
from reference_model import json_table
from reference_model import visible_table as model_table
from servers import consume_topic
from test_schema_driver import ORDERS_ID, ROWS, FakeSession

from cdc_lib import pipeline as P
from cdc_lib.cql.masks import masked_json
from cdc_lib.cql.schema import REGULAR, ColumnMask, ColumnMetadata
from cdc_lib.cql.schema_from_cluster import load_from_cluster
from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.cql.types import parse_type
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, START_US, sample_schema, write_cluster_segments
from cdc_lib.errors import SchemaError
from cdc_lib.sinks.delta import read_state
from cdc_lib.sinks.kafka import table_topic
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import sha256_bytes

NOW = START_US // 1_000_000 + 30
EMAIL = "alice@example.com"


def masked(type_text: str, function: str, *args, value):
    col = ColumnMetadata("c", parse_type(type_text), REGULAR, mask=ColumnMask(function, tuple(args)))
    return masked_json(col, value)


@pytest.mark.parametrize("type_text, function, args, value, expected", [
    ("text", "mask_inner", (1, 3), EMAIL, "a*************com"),
    ("text", "mask_inner", (1, None, "#"), EMAIL, "a################"),
    ("text", "mask_inner", (2, 2), "abc", "abc"),                       # nothing between what is kept
    ("text", "mask_outer", (1, 3), EMAIL, "*lice@example.***"),
    ("ascii", "mask_outer", (2, 2), "abc", "***"),
    ("text", "mask_null", (), EMAIL, None),
    ("text", "mask_default", (), EMAIL, "****"),
    ("int", "mask_default", (), 42, 0),
    ("boolean", "mask_default", (), True, False),
    ("date", "mask_default", (), None, None),                            # null stays null
    ("timestamp", "mask_default", (), None, None),
    ("list<text>", "mask_default", (), ["a"], []),
    ("text", "mask_replace", ("redacted",), EMAIL, "redacted"),
    ("int", "mask_replace", (-1,), 42, -1),
    ("text", "mask_hash", (), EMAIL, "0x" + hashlib.sha256(EMAIL.encode()).hexdigest()),
    ("int", "mask_hash", ("SHA-512",), 1, "0x" + hashlib.sha512(b"\x00\x00\x00\x01").hexdigest()),
])
def test_mask_functions_give_what_cassandra_documents(type_text, function, args, value, expected):
    assert masked(type_text, function, *args, value=value) == expected


def test_describe_output_with_masks_is_read_and_bad_masks_are_errors():
    schema = load_cql_schema("""
        CREATE TABLE ks.people (id int PRIMARY KEY, email text MASKED WITH system.mask_inner(1, null, '#'),
                                age int MASKED WITH DEFAULT, nick text)
        WITH ID = 5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e09;""")
    cols = schema.by_name("ks", "people").columns
    assert cols["email"].mask == ColumnMask("mask_inner", (1, None, "#"))
    assert cols["age"].mask == ColumnMask("mask_default") and cols["nick"].mask is None
    for bad, message in [("x int MASKED WITH mask_inner(1, 2)", "mask_inner masks text columns, not int"),
                         ("x text MASKED WITH ks.my_mask()", "'my_mask' is not one of Cassandra's"),
                         ("x text MASKED WITH mask_null(1)", "mask_null() takes no argument")]:
        with pytest.raises(SchemaError, match=re.escape("<cql>:1: ks.t.x: ") + ".*" + re.escape(message)):
            load_cql_schema(f"CREATE TABLE ks.t (id int PRIMARY KEY, {bad}) WITH ID = "
                            "5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e0a;")


class MaskingCluster(FakeSession):
    """A 5.0 cluster: it also has system_schema.column_masks."""

    def execute(self, query, parameters=None):
        if "column_masks" not in query:
            return super().execute(query, parameters)
        self.queries.append((query, parameters))
        return [type("Row", (), {"_asdict": lambda self, r=r: r})() for r in self.masks]

    masks = [dict(keyspace_name="shop", table_name="orders", column_name="note", function_keyspace="system",
                  function_name="mask_inner", function_argument_types=["int", "int"],
                  function_argument_values=["1", "null"])]


def test_the_cluster_schema_carries_its_column_masks():
    orders = load_from_cluster(MaskingCluster(ROWS)).table(ORDERS_ID)
    assert orders.columns["note"].mask == ColumnMask("mask_inner", (1, None))
    assert orders.columns["total"].mask is None
    assert load_from_cluster(FakeSession()).table(ORDERS_ID).columns["note"].mask is None     # 4.x: no table


MASKED_CQL = (SAMPLE_SCHEMA_CQL
              .replace("    status text,\n", "    status text MASKED WITH mask_inner(1, 1),\n")
              .replace("    customer_name text static,\n", "    customer_name text static MASKED WITH DEFAULT,\n"))


def test_kafka_gets_masked_values_and_the_state_keeps_the_real_ones(tmp_path, kafka_broker, spark_session):
    assert MASKED_CQL.count("MASKED WITH") == 2
    schema = sample_schema()
    cw = write_cluster_segments(tmp_path / "gen", schema, 150, nodes=1, rf=1, seed=13)
    (tmp_path / "schema.cql").write_text(MASKED_CQL)
    (tmp_path / "store").mkdir()
    cfg = P.PipelineConfig(store_url=str(tmp_path / "store"), cluster="c1", schema_file=str(tmp_path / "schema.cql"),
                           now=NOW, kafka_bootstrap=kafka_broker, topic_prefix=f"mask{uuid.uuid4().hex[:6]}",
                           max_segments=100)
    store = P.open_store(cfg)
    for path in cw.segments["node1"]:
        data = open(path, "rb").read()
        store.put_bytes(Layout.incoming("c1", "n1", path.rsplit("/", 1)[1]), data, checksum=sha256_bytes(data))
    assert P.run_once(cfg, spark=spark_session).state == "archived"

    def inner_1_1(s):          # the test's own mask_inner(1, 1)
        return s if s is None or len(s) <= 2 else s[0] + "*" * (len(s) - 2) + s[-1]

    orders = schema.by_name("shop", "orders")
    model = json_table(orders, model_table(orders, cw.mutations, NOW))
    expected = {k: {**row, "status": inner_1_1(row["status"]),
                    "customer_name": None if row["customer_name"] is None else "****"} for k, row in model.items()}
    replayed: dict = {}
    for r in consume_topic(kafka_broker, table_topic(cfg.topic_prefix, "shop", "orders")):
        if r.value["after"] is None:
            replayed.pop(r.key, None)
        else:
            replayed[r.key] = r.value["after"]
    assert replayed == expected
    assert any(row["status"] and len(row["status"]) > 2 for row in model.values())   # something was masked
    # the Delta state is the pipeline's own copy of the table, needed to merge: real values (protect it as the
    # Cassandra data files are protected)
    state = read_state(str(tmp_path / "store"), "shop", "orders").to_pylist()
    live = sorted(r["status"] for r in state if r["_cdc_live"] and r["status"] is not None)
    assert live == sorted(row["status"] for row in model.values() if row["status"] is not None)
    assert json.dumps(expected)      # JSON-safe as sent
