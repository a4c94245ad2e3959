"""Include/exclude lists of keyspaces, tables and columns: what an operator leaves out never reaches Delta or Kafka,
and a typo in a list is an error, not a leak."""
from __future__ import annotations

import uuid

import pytest
from reference_model import json_table
from reference_model import visible_table as model_table
from servers import consume_topic

from cdc_lib import pipeline as P
from cdc_lib.cql.capture import CaptureRules
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, START_US, sample_schema, write_cluster_segments
from cdc_lib.errors import ConfigError
from cdc_lib.settings import PipelineConfig, load
from cdc_lib.sinks.delta import read_state
from cdc_lib.sinks.kafka import table_topic
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import sha256_bytes

NOW = START_US // 1_000_000 + 30


def test_rules_leave_tables_out_and_hide_columns_without_touching_the_schema_given():
    schema = sample_schema()
    rules = CaptureRules(include_tables=("shop.orders", "shop.sessions", "shop.all_types"),
                         exclude_tables=("shop.sessions",), exclude_columns=("shop.orders.total",))
    view = rules.apply(schema)
    assert sorted(t.name for t in view.captured_tables()) == ["all_types", "orders"]
    orders = view.by_name("shop", "orders")
    assert "total" not in orders.columns and "total" in orders.dropped
    assert orders.column_for_data("total").type == schema.by_name("shop", "orders").columns["total"].type
    assert "total" in schema.by_name("shop", "orders").columns             # the schema given is unchanged
    assert len(schema.captured_tables()) == 4
    assert CaptureRules().apply(schema) is schema
    assert [t.name for t in CaptureRules(exclude_keyspaces=("shop",)).apply(schema).captured_tables()] == []
    assert len(CaptureRules(include_keyspaces=("shop",)).apply(schema).captured_tables()) == 4


def test_a_key_column_cannot_be_left_out():
    with pytest.raises(ConfigError, match="shop.orders.order_id: a clustering column cannot be left out"):
        CaptureRules(exclude_columns=("shop.orders.order_id",)).apply(sample_schema())


def test_names_the_schema_does_not_have_are_errors_all_at_once():
    rules = CaptureRules(exclude_keyspaces=("shpo",), exclude_tables=("shop.order",),
                         exclude_columns=("shop.orders.totl", "shop.orders"))
    with pytest.raises(ConfigError) as e:
        rules.apply(sample_schema())
    text = str(e.value)
    for expected in ("exclude_keyspaces: no keyspace 'shpo'", "exclude_tables: no table 'shop.order'",
                     "table shop.orders has no column 'totl'", "'shop.orders' is not keyspace.table.column"):
        assert expected in text


def test_settings_take_lists_from_the_environment_and_refuse_unknown_keys(tmp_path):
    cfg = load(PipelineConfig, env={"CASSANDRA_CDC_EXCLUDE_TABLES": "shop.sessions, shop.page_views",
                                    "CASSANDRA_CDC_EXCLUDE_COLUMNS": "shop.orders.total"})
    assert cfg.exclude_tables == ["shop.sessions", "shop.page_views"] and cfg.exclude_columns == ["shop.orders.total"]
    with pytest.raises(ConfigError, match="CASSANDRA_CDC_EXCLUDE_TABLE"):
        load(PipelineConfig, env={"CASSANDRA_CDC_EXCLUDE_TABLE": "shop.sessions"})
    with pytest.raises(ConfigError, match="exclude_column"):
        PipelineConfig.from_mapping({"exclude_column": ["shop.orders.total"]})


def test_pipeline_ships_neither_left_out_tables_nor_left_out_columns(tmp_path, kafka_broker, spark_session):
    schema = sample_schema()
    cw = write_cluster_segments(tmp_path / "gen", schema, 200, nodes=1, rf=1, seed=11)
    (tmp_path / "schema.cql").write_text(SAMPLE_SCHEMA_CQL)
    (tmp_path / "store").mkdir()
    cfg = P.PipelineConfig(store_url=str(tmp_path / "store"), cluster="c1", schema_file=str(tmp_path / "schema.cql"),
                           now=NOW, kafka_bootstrap=kafka_broker, topic_prefix=f"cap{uuid.uuid4().hex[:6]}",
                           max_segments=100, exclude_tables=["shop.sessions", "shop.page_views"],
                           exclude_columns=["shop.orders.total"])
    store = P.open_store(cfg)
    for path in cw.segments["node1"]:
        data = open(path, "rb").read()
        store.put_bytes(Layout.incoming("c1", "n1", path.rsplit("/", 1)[1]), data, checksum=sha256_bytes(data))
    b = P.run_once(cfg, spark=spark_session)
    assert b.state == "archived" and b.steps["transform"]["quarantined_entries"] == 0   # skipped, not damaged

    from confluent_kafka.admin import AdminClient
    topics = AdminClient({"bootstrap.servers": kafka_broker}).list_topics(timeout=10).topics
    assert table_topic(cfg.topic_prefix, "shop", "orders") in topics
    for name in ("sessions", "page_views"):
        topic = table_topic(cfg.topic_prefix, "shop", name)
        assert topic not in topics or consume_topic(kafka_broker, topic) == [], name
        assert not (tmp_path / "store" / "delta" / "state" / f"shop.{name}").exists(), name

    orders = schema.by_name("shop", "orders")
    records = consume_topic(kafka_broker, table_topic(cfg.topic_prefix, "shop", "orders"))
    assert records
    replayed: dict = {}
    for r in records:
        for image in (r.value["before"], r.value["after"]):
            assert image is None or "total" not in image, "an excluded column reached Kafka"
        if r.value["after"] is None:
            replayed.pop(r.key, None)
        else:
            replayed[r.key] = r.value["after"]
    # The reference model knows nothing of the rules: every visible row minus the column. A row whose only cells
    # were in the left-out column is invisible without it, as in Cassandra after dropping that column.
    model = {k: {c: v for c, v in row.items() if c != "total"}
             for k, row in json_table(orders, model_table(orders, cw.mutations, NOW)).items()}
    assert set(replayed) <= set(model)
    assert all(replayed[k] == model[k] for k in replayed)
    assert len(replayed) >= 0.9 * len(model)
    assert "total" not in read_state(str(tmp_path / "store"), "shop", "orders").schema.names
