"""A real Apache Cassandra 5.0 node is the source of truth.

One scenario (the module fixture) runs once on the session's 1-node cluster (``real_cassandra``), and each test
checks one thing about its outcome:

1. the workload of ``real_workload`` through cassandra-driver, each statement followed by ``SELECT *`` at CL ALL
   of the tables it touched;
2. phase one, then a forced segment switch (the DROP of a scratch table); the agent ships the real ``cdc_raw``
   (completed segments and the synced prefix of the live one); pipeline batch 1 (schema from the driver);
3. phase two (``ALTER TYPE``/``ALTER TABLE ... DROP`` between writes, late ``USING TIMESTAMP`` writes), a switch,
   ship, batch 2;
4. phase three, the final states, ``WRITETIME``/``TTL`` and ``DESCRIBE``, ``nodetool drain``, ship, batch 3
   (schema from the ``DESCRIBE`` output).

Every batch's ``now`` is the moment its states were read, so Delta's ``_cdc_live`` and CQL speak of the same
instant. One node, RF 1: replica copies, a stopped node and its hints have a 3-node test of their own
(``test_three_nodes_replica_copies_and_a_hinted_late_arrival``).
"""
from __future__ import annotations

import contextlib
import json
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import late_write
import pytest
from cassandra import ConsistencyLevel
from event_invariant import check_events
from real_workload import (CDC_TABLES, KS, NOT_CDC_TABLE, Recorder, create_schema, phase_one, phase_three, phase_two,
                           short_ttls, switch_segments, wait_for)
from servers import consume_topic, get_local_spark_session
from sstable_check import differences, select_cell_times, state_cell_times

from cdc_lib import pipeline as P
from cdc_lib.agent.cdc_raw import IDX_SUFFIXES, holds_data, read_idx
from cdc_lib.agent.shipper import Agent
from cdc_lib.commitlog.reader import LogSchema, decode_entry
from cdc_lib.commitlog.model import Mutation
from cdc_lib.commitlog.segment import Damage, SegmentReader
from cdc_lib.cql.schema_from_cluster import load_from_cluster
from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.demo.cassandra import LocalCassandra, describe
from cdc_lib.demo.compare import (Comparison, compare_native, compare_table, delta_live_rows, select_native,
                                  select_rows)
from cdc_lib.settings import AgentConfig
from cdc_lib.sinks.delta import read_outbox, read_state, states_from_rows
from cdc_lib.sinks.kafka import table_topic
from cdc_lib.storage.layout import Layout, parse_segment_name

CLUSTER = "real"
SHORT_TTL = 12


@dataclass
class Scenario:
    cluster: LocalCassandra
    store: Path
    config: P.PipelineConfig
    rec: Recorder
    final_now: int
    final_rows: dict                     # table -> SELECT * rows (typed) at final_now, CL ALL
    final_times: dict                    # table -> {key JSON: {column: [WRITETIME, TTL]}}
    final_native: dict                   # table -> SELECT * scalar columns as the driver's own values
    describe_cql: str
    driver_schema: object
    agents: dict
    batches: list
    expired_by: float
    left_after_drain: dict               # node -> [(name, links, holds an entry)] in cdc_raw after the drain
    timings: dict = field(default_factory=dict)

    def archived(self, node: int) -> list:
        d = self.store / "archived" / CLUSTER / f"node{node}"
        return sorted(d.glob("CommitLog-*.log"), key=lambda p: parse_segment_name(p.name)[1])


def _cdc_raw_files(cluster: LocalCassandra) -> dict:
    """{node: [(file name, link count, holds an entry)]} of every file in the nodes' cdc_raw."""
    return {n.index: [(p.name, p.stat().st_nlink, holds_data(p) if p.suffix == ".log" else None)
                      for p in sorted(n.cdc_raw.iterdir())] for n in cluster.nodes}


def ship(agents: dict) -> int:
    return sum(a.run_once() for a in agents.values())


def wait_for_a_synced_live_segment(cluster: LocalCassandra, timeout_s: float = 30.0) -> None:
    """Wait until some node's live segment has a ``_cdc.idx`` past its start. Cassandra writes it at each
    commit-log sync (every 10 s here): shipping the live prefixes before the first one would find nothing to
    ship, which a busy machine makes likelier."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node in cluster.nodes:
            for idx in node.cdc_raw.glob(f"*{IDX_SUFFIXES[0]}"):
                state = read_idx(idx)
                if state is not None and not state.completed and state.offset > 0:
                    return
        time.sleep(0.2)
    raise AssertionError(f"no live segment's _cdc.idx moved past its start within {timeout_s} s")


def run_pipeline(cfg: P.PipelineConfig, spark) -> list:
    batches = P.run_until_idle(cfg, spark=spark)
    assert batches, "the pipeline found nothing to do"
    return batches


def run_scenario(cluster: LocalCassandra, base: Path, kafka_broker: str, spark) -> Scenario:
    t = {"cluster_start_s": round(cluster.started_in, 1)}
    t0 = time.monotonic()
    nodes = tuple(n.index for n in cluster.nodes)
    session = cluster.session()
    create_schema(session, rf=len(nodes))
    rec = Recorder(session)
    store = base / "store"
    store.mkdir()
    agents = {n.index: Agent(AgentConfig(cdc_raw=n.cdc_raw, store_url=str(store), cluster=CLUSTER,
                                         node=f"node{n.index}", state_dir=base / "agent" / f"node{n.index}",
                                         ship_live_prefix=True, orphan_grace_s=1.0))
              for n in cluster.nodes}
    prefix = f"real{uuid.uuid4().hex[:6]}"
    cfg = dict(store_url=str(store), cluster=CLUSTER, kafka_bootstrap=kafka_broker, topic_prefix=prefix,
               schema_source="driver", cassandra_hosts=cluster.contact_points,
               cassandra_port=cluster.native_port, max_segments=64)
    batches = []

    t1 = time.monotonic()
    phase_one(rec)
    wait_for_a_synced_live_segment(cluster)
    ship(agents)                                     # live prefixes (the idx of the live segments)
    expired_by = short_ttls(rec, SHORT_TTL)
    rec.capture()
    now1 = int(time.time())
    switch_segments(rec.session, cluster, nodes)
    ship(agents)
    t["phase_one_s"] = round(time.monotonic() - t1, 1)
    t1 = time.monotonic()
    batches += run_pipeline(P.PipelineConfig(now=now1, **cfg), spark)
    t["batch_one_s"] = round(time.monotonic() - t1, 1)

    t1 = time.monotonic()
    phase_two(rec)
    rec.capture()
    now2 = int(time.time())
    switch_segments(rec.session, cluster, nodes)
    ship(agents)
    t["phase_two_s"] = round(time.monotonic() - t1, 1)
    t1 = time.monotonic()
    batches += run_pipeline(P.PipelineConfig(now=now2, **cfg), spark)
    t["batch_two_s"] = round(time.monotonic() - t1, 1)

    phase_three(rec)
    time.sleep(max(0.0, expired_by + 1 - time.time()))
    rec.capture()
    final_now = int(time.time())
    final_rows = {n: select_rows(session, rec.tables[n]) for n in CDC_TABLES}
    final_times = {n: select_cell_times(session, rec.tables[n], "ALL") for n in CDC_TABLES}
    final_native = {n: select_native(session, rec.tables[n]) for n in CDC_TABLES}
    describe_cql = describe(session, KS)
    driver_schema = load_from_cluster(session, [KS])
    t1 = time.monotonic()
    cluster.nodetool_all("drain")
    t["drain_s"] = round(time.monotonic() - t1, 1)
    ship(agents)
    time.sleep(1.0)                                  # the agents' orphan grace
    ship(agents)
    left_after_drain = _cdc_raw_files(cluster)
    schema_file = base / "schema.cql"
    schema_file.write_text(describe_cql)
    t1 = time.monotonic()
    batches += run_pipeline(P.PipelineConfig(now=final_now, **{**cfg, "schema_source": "cql",
                                                               "schema_file": str(schema_file)}), spark)
    t["batch_three_s"] = round(time.monotonic() - t1, 1)
    t["statements"] = rec.statements
    t["scenario_s"] = round(time.monotonic() - t0, 1)
    (base / "timings.json").write_text(json.dumps(t, indent=1))
    return Scenario(cluster, store, P.PipelineConfig(now=final_now, **cfg), rec, final_now, final_rows,
                    final_times, final_native, describe_cql, driver_schema, agents, batches, expired_by, left_after_drain, t)


@pytest.fixture(scope="module")
def scenario(real_cassandra, tmp_path_factory, kafka_broker, _spark_workdir):
    base = tmp_path_factory.mktemp("real")
    return run_scenario(real_cassandra, base, kafka_broker, get_local_spark_session(_spark_workdir))


# ------------------------------------------------------------------------------------------------ helpers

def _fill(t, v):
    """A JSON value with the UDT fields of type ``t`` that it lacks (added by ALTER TYPE later) as null, and an
    empty value (``{"$empty": true}``) as null."""
    if v is None or v == {"$empty": True}:
        # the driver returns None for an empty value (blobAsInt(0x)): SELECT * cannot tell it from null
        return None
    if t.kind == "udt":
        return {n: _fill(s, v.get(n)) for n, s in zip(t.field_names, t.subtypes)}
    if t.kind in ("list", "set", "vector"):
        return [_fill(t.subtypes[0], x) for x in v]
    if t.kind == "map" and isinstance(v, dict):          # text keys: a JSON object
        return {k: _fill(t.subtypes[1], x) for k, x in v.items()}
    if t.kind == "map":                                    # other keys: a list of [key, value] pairs
        return [[_fill(t.subtypes[0], k), _fill(t.subtypes[1], x)] for k, x in v]
    if t.kind == "tuple":
        return [_fill(s, x) for s, x in zip(t.subtypes, v)]
    return v


def normalized(table, row):
    """A JSON row in the shape of ``table`` as it is now: its current columns (absent ones null: added later, by
    ALTER TABLE ADD), UDT values with their current fields. Rows read before a schema change and after it can
    then be compared; the workload never changes only a column it drops later."""
    if row is None:
        return None
    if isinstance(row, str):
        row = json.loads(row)
    return {c.name: _fill(c.type, row.get(c.name)) for c in table.columns.values()}


def kafka_events(sc: Scenario, name: str) -> list:
    table = sc.rec.tables[name]
    return consume_topic(sc.config.kafka_bootstrap, table_topic(sc.config.topic_prefix, KS, table.name))


# ------------------------------------------------------------------------------------------------ the checks

def test_another_cassandra_on_the_port_is_not_taken_for_the_node(real_cassandra, tmp_path):
    """A node whose CQL port another Cassandra answers on (here the session's node) is not ready: the start
    fails naming both commit logs, instead of the tests talking to someone else's cluster. (Before the scenario
    tests: their scenario drains the session's node.)"""
    from cdc_lib.demo.cassandra import CassandraStartError
    other = LocalCassandra(tmp_path / "other", 1)
    other.native_port = real_cassandra.native_port             # as if it had lost the race for the port
    with pytest.raises(CassandraStartError, match="another Cassandra answers"):
        other._answers_as(other.node(1))


def test_a_write_older_than_a_purged_tombstone_comes_back_as_in_the_engine(real_cassandra, tmp_path):
    """The consequence of the tombstone purge (README, "Maintenance"), on the real node and in the engine: once
    compaction purged a tombstone (``gc_grace_seconds = 0``), a write older than it brings the row back; within
    ``gc_grace_seconds`` the write stays shadowed. The engine with the maintenance step's purge shows the same rows.
    (Before the scenario tests: their scenario drains the node. The tables have no cdc: the scenario's pipeline
    skips their mutations in the segments it ships.)"""
    session = real_cassandra.session()
    for statement in late_write.CREATE:
        session.execute(statement)
    for table in late_write.TABLES:
        for statement in late_write.BEFORE_PURGE:
            session.execute(statement.format(table=table))
    deleted_at = time.time()
    real_cassandra.nodetool(1, "flush", "purge")
    time.sleep(max(0.0, int(deleted_at) + 1.05 - time.time()))   # purgeable once its local deletion time is past
    real_cassandra.nodetool(1, "compact", "purge")
    for table in late_write.TABLES:
        for statement in late_write.AFTER_PURGE:
            session.execute(statement.format(table=table))
    cassandra = {table: sorted((r.k, r.v) for r in session.execute(f"SELECT k, v FROM purge.{table}"))
                 for table in late_write.TABLES}
    assert cassandra == {"gc0": [(1, "late")], "keep": []}
    engine = late_write.engine_rows(tmp_path, int(deleted_at))
    assert {table: rows for table, (rows, _) in engine.items()} == cassandra
    assert engine["gc0"][1] == ["c"] and engine["keep"][1] == []      # the row came back: an insert event


def test_an_expired_cell_is_purged_when_its_write_time_is_past_the_grace_period_as_in_the_engine(real_cassandra,
                                                                                                  tmp_path):
    """The grace period of an expired TTL cell counts from its write, not its expiry (``late_write``): a compaction
    two seconds after a ``TTL 2`` write purges it under ``gc_grace_seconds = 1`` (expiry plus grace is still a
    second ahead) and keeps it under 60; the engine's purge at the same moment decides the same, so a late write
    older than the cell comes back in the first table only. (Before the scenario tests, which drain the node.)"""
    session = real_cassandra.session()
    session.execute(late_write.CREATE[0].replace("CREATE KEYSPACE", "CREATE KEYSPACE IF NOT EXISTS"))
    for statement in late_write.TTL_CREATE:
        session.execute(statement)
    # one batch: both cells get the same local time (a batch reads the clock once), which must be known to the
    # second; a batch that straddles a second boundary is written again (same timestamp: the later expiry wins)
    batch = "BEGIN UNLOGGED BATCH " + "; ".join(late_write.TTL_WRITE.format(table=t) for t in late_write.TTL_TABLES) \
        + "; APPLY BATCH"
    for _ in range(5):
        time.sleep(0 if time.time() % 1 < 0.5 else 1.02 - time.time() % 1)
        before = time.time()
        session.execute(batch)
        if int(time.time()) == int(before):
            break
    else:
        pytest.fail("five TTL batches in a row took the best part of a second")
    written_at = int(before)
    real_cassandra.nodetool(1, "flush", "purge")
    # expired from written_at + TTL on; the rule under test purges it from then on (grace 1 s counted from the
    # write), expiry plus grace only from written_at + 4: the compaction's clock is read after it starts
    time.sleep(max(0.0, written_at + late_write.TTL_S + 0.02 - time.time()))
    compact_started = int(time.time())
    real_cassandra.nodetool(1, "compact", "purge")
    for table in late_write.TTL_TABLES:
        session.execute(late_write.TTL_LATE.format(table=table))
    cassandra = {table: sorted((r.k, r.v) for r in session.execute(f"SELECT k, v FROM purge.{table}"))
                 for table in late_write.TTL_TABLES}
    assert cassandra == {"ttl_grace1": [(1, "late")], "ttl_grace60": []}
    # the purge at the moment the compaction started: its clock was read at that moment or a little later, and
    # both tables' fates are the same at every such moment under Cassandra's rule
    assert late_write.ttl_engine_rows(tmp_path, written_at, compact_started) == cassandra


def test_delta_state_equals_select_star(scenario):
    """For every CDC table, the Delta state WHERE _cdc_live equals SELECT * at CL ALL, value for value."""
    out = Comparison()
    for name in CDC_TABLES:
        table = scenario.rec.tables[name]
        delta_rows = delta_live_rows(str(scenario.store), table)
        compare_table(table, scenario.final_rows[name], delta_rows, out)
        compare_native(table, scenario.final_native[name], delta_rows, out)
    figures = {"tables": out.tables, "rows": out.rows, "cells": out.cells, "native_cells": out.native_cells}
    scenario.timings["equality"] = figures
    (scenario.store.parent / "equality.json").write_text(json.dumps({**figures, "by_table": out.rows_by_table},
                                                                    indent=1))
    print("\n" + out.summary())
    assert out.equal, out.summary()
    assert out.tables == len(CDC_TABLES) and out.rows >= 140 and out.native_cells > 500


def test_write_times_and_ttls_equal_writetime_and_ttl(scenario):
    """Every regular (and static) simple cell: WRITETIME() exact, TTL() within 2 s (it counts down)."""
    compared = 0
    for name in CDC_TABLES:
        table = scenario.rec.tables[name]
        parts = states_from_rows(read_state(str(scenario.store), KS, table.name))
        ours = {}
        for pk, state in parts.items():
            ours.update(state_cell_times(table, pk, state, scenario.final_now))
        visible = _visible_keys(scenario, name)
        ours = {k: v for k, v in ours.items() if k in visible and v}
        diff = differences(scenario.final_times[name], ours, what="times", ttl_slack=2)
        assert not diff, f"{name}:\n" + "\n".join(diff[:20])
        compared += sum(len(v) for v in scenario.final_times[name].values())
    assert compared > 300
    assert any(v[1] for times in scenario.final_times["types"].values() for v in times.values()), "no TTL seen"


def _visible_keys(sc: Scenario, name: str) -> set:
    from cdc_lib.demo.compare import key_json
    table = sc.rec.tables[name]
    keys = table.partition_key + table.clustering
    return {key_json(table, {c.name: r[c.name] for c in keys}) for r in sc.final_rows[name]}


def test_replaying_the_kafka_events_gives_select_star(scenario):
    for name in CDC_TABLES:
        table = scenario.rec.tables[name]
        records = kafka_events(scenario, name)
        assert records, f"no event for {name}"
        ids = [r.event_id for r in records]
        assert len(ids) == len(set(ids)), f"{name}: an event is in Kafka twice"
        replayed = {}
        for r in records:
            if r.value["after"] is None:
                replayed.pop(r.key, None)
            else:
                replayed[r.key] = normalized(table, r.value["after"])
        expected = {k: normalized(table, v) for k, v in scenario.rec.states[name][-1].items()}
        assert replayed == expected, name


def test_every_change_cql_showed_is_exactly_one_event(scenario):
    """The events follow the states SELECT * showed after every statement (tests/event_invariant.py, complete):
    each state a write produced is one event, no event shows a row that never existed."""
    for name in CDC_TABLES:
        table = scenario.rec.tables[name]
        events = [(r.key, {**r.value, "before": normalized(table, r.value["before"]),
                           "after": normalized(table, r.value["after"])}) for r in kafka_events(scenario, name)]
        states = [{k: normalized(table, v) for k, v in s.items()} for s in scenario.rec.states[name]]
        check_events(events, states, complete=True)


def test_a_table_without_cdc_produces_nothing(scenario):
    from confluent_kafka.admin import AdminClient
    store = scenario.store
    assert not (store / "delta" / "state" / f"{KS}.{NOT_CDC_TABLE}").exists()
    topics = AdminClient({"bootstrap.servers": scenario.config.kafka_bootstrap}).list_topics(timeout=10).topics
    assert table_topic(scenario.config.topic_prefix, KS, NOT_CDC_TABLE) not in topics
    assert table_topic(scenario.config.topic_prefix, KS, "types") in topics
    for b in scenario.batches:
        assert all(r["table"] != NOT_CDC_TABLE for r in read_outbox(str(store), b.batch_id))
    # ... although its mutations were in the very segments the pipeline read
    plain = scenario.rec.tables[NOT_CDC_TABLE]
    found = sum(1 for m in _mutations(scenario, 1) for u in m.updates if u.table_id == plain.id)
    assert found >= 5


def _mutations(sc: Scenario, node: int, schema=None):
    schema = schema or load_cql_schema(sc.describe_cql)
    for path in sc.archived(node):
        for rec in SegmentReader(path):
            assert not isinstance(rec, Damage), rec
            m = decode_entry(rec, schema)
            if isinstance(m, Mutation):
                yield m


def _describe_tables(schema, keyspace: str) -> dict:
    out = {}
    for t in schema.tables.values():
        if t.keyspace != keyspace:
            continue
        out[t.name] = {
            "id": str(t.id), "cdc": t.cdc, "flags": sorted(t.flags),
            "columns": sorted((c.name, c.type.cql, repr(getattr(c.type, "field_names", None)), c.kind, c.position,
                               c.reversed) for c in t.columns.values()),
            "dropped": sorted((d.name, d.type.cql, d.dropped_time) for d in t.dropped.values())}
    out["types"] = sorted((n, list(u.field_names), [s.cql for s in u.subtypes])
                          for (ks, n), u in schema.types.items() if ks == keyspace)
    return out


def test_schema_sources_agree_with_describe(scenario):
    """The CQL file (DESCRIBE output), the driver source and --schema-from-log give the same tables: ids,
    columns, clustering order, cdc flag, dropped columns and UDTs."""
    expected = _describe_tables(load_cql_schema(scenario.describe_cql), KS)
    assert expected["evolve"]["dropped"] and expected["types"][0][1] == ["street", "city", "zip", "country"]
    assert _describe_tables(scenario.driver_schema, KS) == expected
    log = LogSchema()
    for path in scenario.archived(1):
        for rec in SegmentReader(path):
            m = decode_entry(rec, log.current())
            if isinstance(m, Mutation):
                log.observe(m)
    from_log = _describe_tables(log.current(), KS)
    assert from_log == expected


def test_the_agents_shipped_every_entry_and_left_only_cassandras_empty_segment(scenario):
    """After the drain, cdc_raw holds one file: the pre-allocated segment, header only, no idx, still in
    commitlog/ (2 links: a drained node keeps it, also after SIGTERM). Everything with entries was shipped."""
    for n in scenario.cluster.nodes:
        left = scenario.left_after_drain[n.index]
        assert [(links, data) for _, links, data in left] == [(2, False)], left
        m = scenario.agents[n.index].metrics()
        assert m["segments_lost"] == 0 and m["upload_failures"] == 0
        assert len(scenario.archived(n.index)) >= 3                 # two forced switches, drain, full segments
    assert not list((scenario.store / "incoming").rglob("CommitLog-*"))
    assert not (scenario.store / "quarantined").exists() or not list((scenario.store / "quarantined").rglob("*"))


def test_live_prefix_chunks_are_the_segments_first_bytes(scenario):
    """What the agents shipped from live segments (up to their _cdc.idx) is exactly the start of the segment
    Cassandra completed later."""
    chunks = 0
    for node in (n.index for n in scenario.cluster.nodes):
        archived = {p.name: p for p in scenario.archived(node)}
        live = scenario.store / "incoming-live" / CLUSTER / f"node{node}"
        for seg_dir in sorted(live.iterdir()) if live.exists() else []:
            data = archived[seg_dir.name].read_bytes()
            end = 0
            for chunk in sorted(p for p in seg_dir.iterdir() if not p.name.endswith(".sha256")):
                start, stop = Layout.parse_live_chunk(f"x/{chunk.name}")
                assert start == end
                assert chunk.read_bytes() == data[start:stop], f"{seg_dir.name} [{start}, {stop})"
                end = stop
                chunks += 1
    assert chunks >= 1


def test_batch_timings_are_reported(scenario):
    """Not a check of speed: the figures go to the README (and the module's tmp dir, timings.json)."""
    t = scenario.timings
    assert t["cluster_start_s"] > 0 and len(scenario.batches) >= 3
    print("\nreal cluster scenario:", json.dumps(t))


def test_the_comparison_reports_what_differs():
    """The comparison itself (no cluster): a changed value, a missing row and an extra row are each reported,
    by the typed and by the driver-value comparison alike."""
    import datetime

    from cassandra.util import Date
    table = load_cql_schema("CREATE TABLE k.t (id int PRIMARY KEY, v text, d date) WITH cdc = true "
                             "AND ID = 5a1c395e-b41f-11e5-9f22-ba0be0483c18;").by_name("k", "t")
    far = Date(-(1 << 31) + 5)                               # outside Python's date range
    delta = [{"id": 1, "v": "a", "d": -(1 << 31) + 5}, {"id": 3, "v": "c", "d": 0}]
    typed = select_rows_like(table, [(1, "a", far), (2, "b", Date(datetime.date(1970, 1, 1)))])
    out = Comparison()
    compare_table(table, typed, delta, out)
    assert out.rows == 2 and out.cells == 3 and len(out.differences) == 2, out.differences
    same = Comparison()
    compare_table(table, typed[:1], delta[:1], same)
    assert same.equal and same.cells == 3
    changed = Comparison()
    compare_native(table, [{"id": 1, "v": "A", "d": far.days_from_epoch}], delta[:1], changed)
    assert [d.split(" ", 2)[2] for d in changed.differences] == ["v: driver 'A', Delta 'a'"]


def select_rows_like(table, rows) -> list:
    """Rows as ``select_rows`` makes them: driver values through the driver's serializer and our codec."""
    from cassandra.cqltypes import Int32Type, SimpleDateType, UTF8Type

    from cdc_lib.demo.compare import typed_from_driver
    drivers = (Int32Type, UTF8Type, SimpleDateType)
    cols = [table.columns[n] for n in ("id", "v", "d")]
    return [{c.name: typed_from_driver(c.type, t, v) for c, t, v in zip(cols, drivers, row)} for row in rows]


def test_missing_jars_fail_with_how_to_get_them(tmp_path, monkeypatch):
    """No jars is a failure that says what to run, never a skip."""
    from cdc_lib.demo import jvm
    monkeypatch.setattr(jvm, "JVM_LIB", tmp_path / "lib")
    with pytest.raises(jvm.JvmPartMissing, match="bash scripts/setup.sh"):
        LocalCassandra(tmp_path / "c", 1)


def test_a_node_that_cannot_start_shows_its_log(tmp_path):
    """A start that fails raises at once with the end of the node's log (here: a yaml value Cassandra rejects),
    and leaves no process behind."""
    from cdc_lib.demo.cassandra import CassandraStartError
    cluster = LocalCassandra(tmp_path / "bad", 1, yaml={"commitlog_segment_size": "3 parsecs"})
    with pytest.raises(CassandraStartError) as err:
        cluster.start(timeout=120)
    message = str(err.value)
    assert f"==> {cluster.node(1).log_dir}" in message, message[-2000:]          # which log, and its end
    assert "commitlog_segment_size" in message, message[-2000:]
    assert not cluster.node(1).running()


def _hints_pending(cluster: LocalCassandra, i: int) -> bool:
    """Whether node ``i`` still holds hints on disk, for any node (``nodetool listpendinghints``)."""
    return "does not have any pending hints" not in cluster.nodetool(i, "listpendinghints")


def _segment_mutations(reader: SegmentReader, schema, table_id, *, live: bool = False):
    """(position, mutation) of ``table_id``'s mutations in one segment, in log order. ``live``: a segment being
    written, whose end holds bytes not synced yet (read until there); otherwise any damage fails the test."""
    for rec in reader:
        if isinstance(rec, Damage):
            assert live, rec
            break
        m = decode_entry(rec, schema)
        if isinstance(m, Mutation) and any(u.table_id == table_id for u in m.updates):
            yield rec.position, m


def _logged_since(cluster: LocalCassandra, node: int, schema, table_id, since_ms: int) -> int:
    """How many mutations of ``table_id`` node ``node`` has logged so far in commit-log segments it created after
    ``since_ms`` (its live commit log)."""
    return sum(1 for path in cluster.node(node).commitlog.glob("CommitLog-*.log")
               if parse_segment_name(path.name)[1] > since_ms
               for _ in _segment_mutations(SegmentReader(path), schema, table_id, live=True))


def _replica_differences(per_node: dict) -> str:
    """Which node lacks which mutation, by partition key: what a failing id comparison needs to be understood."""
    ids = {i: {m.mutation_id: m for _, _, m in rows} for i, rows in per_node.items()}
    lines = []
    for i, mine in ids.items():
        for j, theirs in ids.items():
            for mid in sorted(set(theirs) - set(mine)):
                u = theirs[mid].updates[0]
                lines.append(f"node {i} lacks node {j}'s mutation {mid.hex()[:12]} (key {u.partition_key.hex()})")
    return "\n".join(lines)


def _table_mutations(cluster: LocalCassandra, node: int, schema, table_id) -> list:
    """(segment id, position, mutation) of ``table_id``'s mutations in node ``node``'s cdc_raw, in log order;
    and every segment's compressor."""
    out, compressors = [], set()
    for segment_id, path in sorted((parse_segment_name(p.name)[1], p)
                                   for p in cluster.node(node).cdc_raw.glob("CommitLog-*.log")):
        reader = SegmentReader(path)
        out += [(segment_id, position, m) for position, m in _segment_mutations(reader, schema, table_id)]
        compressors.add((reader.header.compression_class or "").rsplit(".", 1)[-1] or None)
    return out, compressors


def test_three_nodes_replica_copies_and_a_hinted_late_arrival(tmp_path, kafka_broker):
    """Three nodes, RF 3, LZ4-compressed commit logs.

    1. Writes at CL ALL: every replica logs every mutation, and the copies have the same mutation id (a hash of
       the entry bytes) in all three commit logs: the pipeline's dedupe relies on it. Counters are left out: the
       leader turns a counter update into a different mutation (its own shard).
    2. Node 3 stopped, writes at CL ONE: nodes 1 and 2 keep hints; node 3 restarts and gets them through hint
       replay, later than its peers, in a segment written after its restart: a real late arrival.
    3. The three nodes' agents ship everything, the pipeline runs (in process: a small batch), and the Delta
       state equals ``SELECT *`` at CL ALL; each hinted write is one event in Kafka, not one per replica."""
    from cassandra.query import SimpleStatement

    from cdc_lib.demo.cassandra import start_cluster
    # Hints reach the disk (where ``listpendinghints`` sees them) within hints_flush_period: 1 s instead of 10 s.
    yaml = {"commitlog_compression": [{"class_name": "LZ4Compressor"}], "hints_flush_period": "1000ms"}
    with start_cluster(3, tmp_path / "c3", cluster_name="replicas", yaml=yaml) as cluster:
        session = cluster.session()
        session.execute("CREATE KEYSPACE IF NOT EXISTS r WITH replication = {'class': 'NetworkTopologyStrategy', "
                        "'datacenter1': 3}")
        session.execute("CREATE TABLE IF NOT EXISTS r.t (k int, c int, v text, m map<text, int>, s text static, "
                        "PRIMARY KEY (k, c)) WITH cdc = true AND read_repair = 'NONE'")
        statements = []
        for k in range(8):
            statements += [f"INSERT INTO r.t (k, c, v, m) VALUES ({k}, 1, 'v{k}', {{'a': {k}}})",
                           f"UPDATE r.t USING TTL 3600 SET v = 'ttl', m['b'] = 2 WHERE k = {k} AND c = 2",
                           f"UPDATE r.t SET s = 'static {k}' WHERE k = {k}",
                           f"DELETE m['a'] FROM r.t WHERE k = {k} AND c = 1",
                           f"DELETE FROM r.t WHERE k = {k} AND c > 5",
                           f"BEGIN BATCH INSERT INTO r.t (k, c, v) VALUES ({k}, 3, 'b'); "
                           f"DELETE FROM r.t WHERE k = {k} AND c = 2; APPLY BATCH"]
        for cql in statements:
            session.execute(SimpleStatement(cql, consistency_level=ConsistencyLevel.ALL))

        t0 = time.monotonic()
        cluster.stop_node(3)
        hinted = [f"INSERT INTO r.t (k, c, v) VALUES ({100 + k}, 1, 'while node 3 was down')" for k in range(4)]
        hinted += ["UPDATE r.t SET v = 'late on node 3' WHERE k = 0 AND c = 1", "DELETE FROM r.t WHERE k = 1 AND c = 3"]
        for cql in hinted:
            session.execute(SimpleStatement(cql, consistency_level=ConsistencyLevel.ONE))
        ddl = describe(session, "r")
        schema = load_cql_schema(ddl)
        table = schema.by_name("r", "t")
        restarted_at_ms = int(time.time() * 1000)
        cluster.start_node(3)
        # Delivered means logged by node 3: "no pending hints" is no proof, as `listpendinghints` lists only hint
        # files already closed, and a coordinator's open one is closed only when its dispatch begins (seen in CI:
        # node 3 drained without the hints, none ever listed). Then every node's hints must be gone: on a loaded
        # machine a coordinator may also have judged node 1 or 2 down for a moment and kept hints for it (seen in
        # CI). The table has read_repair NONE: a read before delivery would otherwise repair a replica with
        # mutations of other bytes, and a replica still lacking a write fails the id comparison below instead of
        # being patched silently.
        wait_for("node 3 logging the hinted writes",
                 lambda: _logged_since(cluster, 3, schema, table.id, restarted_at_ms) >= len(hinted), timeout=300,
                 every=2.0)
        wait_for("hint replay on every node", lambda: not any(_hints_pending(cluster, i) for i in (1, 2, 3)),
                 timeout=300, every=2.0)
        hints_s = time.monotonic() - t0
        expected, native = select_rows(session, table), select_native(session, table)
        now = int(time.time())
        cluster.nodetool_all("drain")

    per_node, compressors = {}, set()
    for n in cluster.nodes:
        per_node[n.index], found = _table_mutations(cluster, n.index, schema, table.id)
        compressors |= found
    assert compressors == {"LZ4Compressor"}, compressors
    all_ids = {i: [m.mutation_id for _, _, m in per_node[i]] for i in per_node}
    assert len(all_ids[1]) == len(statements) + len(hinted), {i: len(v) for i, v in all_ids.items()}
    assert len(set(all_ids[1])) == len(all_ids[1])
    assert sorted(all_ids[1]) == sorted(all_ids[2]) == sorted(all_ids[3]), _replica_differences(per_node)
    # node 3 logged the hinted writes after its restart, behind everything else it had: late arrivals
    late = per_node[3][-len(hinted):]
    assert {m.mutation_id for _, _, m in late} == {m.mutation_id for _, _, m in per_node[1][len(statements):]}
    assert all(segment_id > restarted_at_ms for segment_id, _, _ in late), (late, restarted_at_ms)

    store = tmp_path / "store"
    store.mkdir()
    for n in cluster.nodes:
        Agent(AgentConfig(cdc_raw=n.cdc_raw, store_url=str(store), cluster=CLUSTER, node=f"node{n.index}",
                          state_dir=tmp_path / "agent" / f"node{n.index}")).run_once()
    schema_file = tmp_path / "schema.cql"
    schema_file.write_text(ddl)
    prefix = f"hints{uuid.uuid4().hex[:6]}"
    cfg = P.PipelineConfig(store_url=str(store), cluster=CLUSTER, kafka_bootstrap=kafka_broker, topic_prefix=prefix,
                           schema_file=str(schema_file), now=now, max_segments=64)
    batches = run_pipeline(cfg, None)
    assert all(b.steps["transform"].get("mode") == "driver" for b in batches)
    out = Comparison()
    delta_rows = delta_live_rows(str(store), table)
    compare_table(table, expected, delta_rows, out)
    compare_native(table, native, delta_rows, out)
    assert out.equal, out.summary()
    records = consume_topic(kafka_broker, table_topic(prefix, "r", "t"))
    for k in range(4):
        key = [r for r in records if json.loads(r.key) == {"k": 100 + k, "c": 1}]
        assert [r.value["op"] for r in key] == ["c"], key
    late_update = [r for r in records if json.loads(r.key) == {"k": 0, "c": 1} and r.value["after"]
                   and r.value["after"]["v"] == "late on node 3"]
    assert len(late_update) == 1, late_update
    print(f"\n3 nodes started in {cluster.started_in:.1f} s; {len(statements)} mutations at CL ALL, one id each on "
          f"3 replicas; node 3 stopped, {len(hinted)} writes at CL ONE reached it by hints "
          f"{hints_s:.0f} s after its stop; {out.summary()}")


def _zstd_descriptor_8(tmp_path) -> tuple:
    return {"storage_compatibility_mode": "NONE", "commitlog_compression": [{"class_name": "ZstdCompressor"}]}, None, {}


def _tde(tmp_path) -> tuple:
    from cdc_lib.commitlog.encryption import EncryptionKeys
    from cdc_lib.demo.cassandra import make_tde_keystore, tde_options
    keystore = make_tde_keystore(tmp_path / "tde.jceks")            # the JDK's keytool
    password_file = tmp_path / "keystore-password"
    password_file.write_text("cassandra\n")
    password_file.chmod(0o600)
    return (tde_options(keystore), EncryptionKeys.from_keystore(str(keystore), "cassandra", "cassandra"),
            {"keystore": str(keystore), "keystore_password_file": str(password_file)})


SEGMENT_VARIANTS = {"zstd, descriptor 8": (_zstd_descriptor_8, 8, "ZstdCompressor", False),
                    "encrypted (TDE, JCEKS)": (_tde, 7, None, True)}


@pytest.mark.parametrize("variant", sorted(SEGMENT_VARIANTS))
def test_compressed_encrypted_and_descriptor_8_segments_give_select_star(variant, tmp_path, kafka_broker):
    """Real segments of the kinds the corpus lacks: Zstd with ``storage_compatibility_mode: NONE`` (descriptor
    8, messaging 13), and TDE (Cassandra 5.0.9 needs a compressor beside it: CASSANDRA-21540). Every cdc_raw
    segment decodes without damage, the independent reference model's merge of its mutations equals ``SELECT *``,
    and so does the Delta state after the agent shipped them and the pipeline ran (the keystore and its password
    file as settings, for TDE).

    Each node also loses a port to another process between the choice of its ports and its start (a socket bound
    there, as another job's server would): the Zstd node its JMX port, the TDE node its storage port (Cassandra 5.0
    says "is in use by another process"). The start begins again on other ports, once."""
    from cassandra.query import SimpleStatement
    from reference_model import json_table, visible_table

    from cdc_lib.demo.compare import select_json
    make, descriptor, compressor, encrypted = SEGMENT_VARIANTS[variant]
    yaml, keys, key_settings = make(tmp_path)
    cluster = LocalCassandra(tmp_path / "c", 1, yaml=yaml, cluster_name="variant")

    def port():
        return cluster.storage_port if encrypted else cluster.node(1).jmx_port
    lost_port = port()
    with contextlib.ExitStack() as stack:
        thief = stack.enter_context(socket.socket())
        thief.bind(("127.0.0.1", lost_port))          # bound, not listening: only the node's own bind fails
        cluster.start()
        stack.callback(cluster.stop)
        assert cluster.port_retries == 1 and port() != lost_port
        session = cluster.session()
        session.execute("CREATE KEYSPACE IF NOT EXISTS v WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("CREATE TABLE IF NOT EXISTS v.t (k int, c text, v text, n bigint, d decimal, m map<text, int>, "
                        "l list<double>, s text static, PRIMARY KEY (k, c)) WITH cdc = true")
        for k in range(30):
            for cql in (f"INSERT INTO v.t (k, c, v, n, d, m, l) VALUES ({k}, 'a', 'v{k}', {k << 40}, {k}.5, "
                        f"{{'x': {k}}}, [{k}.25, -1.0])",
                        f"UPDATE v.t USING TTL 3600 SET v = 'ttl', m['y'] = 2, l = l + [9.0] WHERE k = {k} AND c = 'b'",
                        f"UPDATE v.t SET s = 'static {k}' WHERE k = {k}",
                        f"DELETE m['x'] FROM v.t WHERE k = {k} AND c = 'a'",
                        f"DELETE FROM v.t WHERE k = {k} AND c > 'a' AND c < 'b'"):
                session.execute(SimpleStatement(cql))
            if k % 7 == 0:
                session.execute(f"DELETE FROM v.t WHERE k = {k}")
        ddl = describe(session, "v")
        schema = load_cql_schema(ddl)
        expected = select_json(session, schema.by_name("v", "t"))
        rows, native = select_rows(session, schema.by_name("v", "t")), select_native(session, schema.by_name("v", "t"))
        now = int(time.time())
        cluster.nodetool(1, "drain")
    table = schema.by_name("v", "t")
    mutations, headers = [], set()
    for path in sorted(cluster.node(1).cdc_raw.glob("CommitLog-*.log")):
        reader = SegmentReader(path, keys=keys)
        for rec in reader:
            assert not isinstance(rec, Damage), rec
            m = decode_entry(rec, schema)
            if isinstance(m, Mutation) and any(u.table_id == table.id for u in m.updates):
                mutations.append(m)
        headers.add((reader.header.version, reader.header.encrypted,
                     (reader.header.compression_class or "").rsplit(".", 1)[-1] or None))
    assert headers == {(descriptor, encrypted, compressor)}, headers
    assert json_table(table, visible_table(table, mutations, now)) == expected
    assert len(expected) > 40

    store = tmp_path / "store"
    store.mkdir()
    Agent(AgentConfig(cdc_raw=cluster.node(1).cdc_raw, store_url=str(store), cluster=CLUSTER, node="node1",
                      state_dir=tmp_path / "agent")).run_once()
    (tmp_path / "schema.cql").write_text(ddl)
    prefix = f"variant{uuid.uuid4().hex[:6]}"
    batches = run_pipeline(P.PipelineConfig(store_url=str(store), cluster=CLUSTER, kafka_bootstrap=kafka_broker,
                                            topic_prefix=prefix, schema_file=str(tmp_path / "schema.cql"), now=now,
                                            **key_settings), None)
    assert all(b.steps["transform"]["damaged"] == 0 == b.steps["transform"]["quarantined_entries"] for b in batches)
    out = Comparison()
    delta_rows = delta_live_rows(str(store), table)
    compare_table(table, rows, delta_rows, out)
    compare_native(table, native, delta_rows, out)
    assert out.equal, out.summary()

