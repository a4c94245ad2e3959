"""The pipeline captures only tables with ``cdc = true``.

A segment Cassandra keeps in ``cdc_raw`` holds the mutations of every table written while it was active, CDC or
not (it is kept because it holds some CDC data). Here one table of the sample schema loses its ``cdc = true``:
its entries are in the segments, ``inspect`` still shows them, but the pipeline makes no Delta table, no outbox
row and no event of it, and counts what it skipped. (Against a real cluster: ``tests/test_real_cluster.py``.)
"""
from __future__ import annotations

import json

import pytest

from cdc_lib.celllog.reader import read_cell_log
from cdc_lib.cli.main import main as cli_main
from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, START_US, sample_schema, write_cluster_segments
from cdc_lib.sinks.delta import read_outbox, read_state

NOW = START_US // 1_000_000 + 30
# shop.sessions without its cdc option: a table the pipeline must not capture
NOT_CDC_CQL = SAMPLE_SCHEMA_CQL.replace("ID = 5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e02\n    AND cdc = true;",
                                        "ID = 5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e02;")
assert NOT_CDC_CQL != SAMPLE_SCHEMA_CQL


@pytest.fixture(scope="module")
def segments(tmp_path_factory):
    d = tmp_path_factory.mktemp("cdcflag")
    cw = write_cluster_segments(d, sample_schema(), 200, nodes=1, rf=1, seed=3)
    return [str(p) for paths in cw.segments.values() for p in paths]


def test_schema_says_which_tables_are_captured():
    schema = load_cql_schema(NOT_CDC_CQL)
    assert not schema.by_name("shop", "sessions").cdc
    assert sorted(t.name for t in schema.captured_tables()) == ["all_types", "orders", "page_views"]


def test_reader_skips_tables_without_cdc_only_when_asked(segments):
    schema = load_cql_schema(NOT_CDC_CQL)
    sessions = schema.by_name("shop", "sessions")
    everything, captured = {}, {}
    rows_all = [r for b in read_cell_log(segments, schema, on_damage=pytest.fail, stats=everything)
                for r in b.to_pylist()]
    rows_cdc = [r for b in read_cell_log(segments, schema, on_damage=pytest.fail, stats=captured, cdc_only=True)
                for r in b.to_pylist()]
    session_entries = {(r["segment"], r["position"]) for r in rows_all if r["table"] == "sessions"}
    assert session_entries, "the workload must write shop.sessions"
    assert not any(r["table"] == "sessions" for r in rows_cdc)
    def without_index(rows):        # entry_index numbers the entries read, so it shifts past a skipped one
        return [{k: v for k, v in r.items() if k != "entry_index"} for r in rows]
    assert without_index(r for r in rows_all if r["table"] != "sessions") == without_index(rows_cdc)
    assert captured["not_captured_entries"] == len(session_entries) and everything["not_captured_entries"] == 0
    assert str(sessions.id) not in {r["table_id"] for r in rows_cdc}


def test_pipeline_makes_no_table_and_no_event_of_a_table_without_cdc(segments, tmp_path, spark_session):
    from cdc_lib.spark.merge_job import run_batch
    schema = load_cql_schema(NOT_CDC_CQL)
    root = tmp_path / "store"
    res = run_batch(spark_session, segments, root=str(root), schema=schema, batch_id="b0", batch_seq=1, now=NOW,
                    cluster="c1")
    assert res.events > 0 and not res.damaged
    tables = {row["table"] for row in read_outbox(str(root), "b0")}
    assert tables == {"orders", "page_views", "all_types"}
    assert not (root / "delta" / "state" / "shop.sessions").exists()
    assert read_state(str(root), "shop", "orders").num_rows > 0
    # a later batch that sweeps TTL expiries does not create it either
    run_batch(spark_session, [], root=str(root), schema=schema, batch_id="b1", batch_seq=2, now=NOW + 4000,
              prev_now=NOW, cluster="c1")
    assert not (root / "delta" / "state" / "shop.sessions").exists()


def test_inspect_still_shows_every_table(segments, tmp_path, capsys):
    """``inspect`` is a decoder: it prints what the segment holds, tables without cdc = true included."""
    schema_file = tmp_path / "schema.cql"
    schema_file.write_text(NOT_CDC_CQL)
    assert cli_main(["inspect", "--schema", str(schema_file), *segments]) == 0
    tables = {json.loads(line)["table"] for line in capsys.readouterr().out.splitlines()}
    assert "sessions" in tables
