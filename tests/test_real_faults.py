"""Faults on a real Cassandra 5.0 node: a crash mid-write, and a full ``cdc_total_space``.

1. **SIGKILL while writing.** The live segment is torn (its ``_cdc.idx`` lags the bytes by up to the 10 s fsync
   period). On restart Cassandra replays those entries into memtables without logging them again and rewrites
   the idx to ``<file length>\\nCOMPLETED``: the torn segment is the only record of the writes it acknowledged
   after the last idx update. The agent ships what the idx covered before the crash (the live prefix) and the
   whole segment once it is COMPLETED; every acknowledged write reaches the Delta state and the events.
2. **``cdc_total_space`` full** (agent stopped). Cassandra rejects CDC writes (``WriteFailure``); once the agent
   runs again it ships and deletes the completed segments and writes resume. How long that takes is printed.

Each test starts its own node (``start_cluster``) and stops it by PID.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

from cassandra import WriteFailure
from servers import consume_topic, get_local_spark_session

from cdc_lib import pipeline as P
from cdc_lib.agent.shipper import Agent
from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.demo.cassandra import describe, start_cluster
from cdc_lib.settings import AgentConfig
from cdc_lib.sinks.delta import read_state
from cdc_lib.sinks.kafka import table_topic

KS = "faults"
CLUSTER = "faults"


def _schema(session) -> None:
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {KS} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    session.execute(f"CREATE TABLE IF NOT EXISTS {KS}.t (k int PRIMARY KEY, v text, n bigint) WITH cdc = true")


def _agent(node, base) -> Agent:
    return Agent(AgentConfig(cdc_raw=node.cdc_raw, store_url=str(base / "store"), cluster=CLUSTER, node="node1",
                             state_dir=base / "agent", ship_live_prefix=True, orphan_grace_s=1.0))


def _run_pipeline(base, schema_cql: str, kafka_broker, spark) -> P.PipelineConfig:
    schema_file = base / "schema.cql"
    schema_file.write_text(schema_cql)
    cfg = P.PipelineConfig(store_url=str(base / "store"), cluster=CLUSTER, schema_file=str(schema_file),
                           kafka_bootstrap=kafka_broker, topic_prefix=f"f{uuid.uuid4().hex[:6]}",
                           now=int(time.time()), max_segments=64)
    assert P.run_until_idle(cfg, spark=spark)
    return cfg


def _idx(segment):
    return segment.with_name(segment.name.replace(".log", "_cdc.idx"))


def _torn_segments(node) -> dict:
    """{segment: the offset its idx covered} of the cdc_raw segments left live (idx missing or not COMPLETED)
    that hold data."""
    from cdc_lib.agent.cdc_raw import holds_data
    out = {}
    for segment in node.cdc_raw.glob("CommitLog-*.log"):
        idx = _idx(segment)
        text = idx.read_bytes() if idx.exists() else b"0"
        if b"COMPLETED" not in text and holds_data(segment):
            out[segment] = int(text.split(b"\n")[0] or 0)
    return out


def _keys_past(node, live: dict, schema) -> set:
    """Keys of table t written by entries of the torn segments that lie past the offset their idx said before
    the crash (the single int partition key, as its 4 bytes)."""
    from cdc_lib.commitlog.model import Mutation
    from cdc_lib.commitlog.reader import decode_entry
    from cdc_lib.commitlog.segment import LogEntry, SegmentReader
    table_id = schema.by_name(KS, "t").id
    keys = set()
    for segment, offset in live.items():
        for rec in SegmentReader(segment):
            if not isinstance(rec, LogEntry) or rec.position <= offset:
                continue
            m = decode_entry(rec, schema)
            if isinstance(m, Mutation):
                keys |= {int.from_bytes(u.partition_key, "big", signed=True) for u in m.updates
                         if u.table_id == table_id}
    return keys


def _freeze_with_writes_past_idx(node, schema, acked: dict, timeout: float = 60.0) -> tuple:
    """SIGSTOP the node at a moment its live segment holds writes past its idx, and return ({segment: idx
    offset}, their keys). Frozen, the node cannot run a periodic sync between this check and the SIGKILL that
    follows (a sync in that gap would cover every entry and leave nothing torn). Fails, naming what it saw,
    when no such moment comes within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        os.kill(node.pid, signal.SIGSTOP)
        try:
            live = _torn_segments(node)
            past = _keys_past(node, live, schema)
        except BaseException:
            os.kill(node.pid, signal.SIGCONT)   # a frozen node would ignore the SIGTERM of the cluster's stop
            raise
        if past:
            return live, past
        os.kill(node.pid, signal.SIGCONT)
        if time.monotonic() > deadline:
            raise AssertionError(f"no write lay past the live segment's idx within {timeout:.0f} s "
                                 f"({len(acked)} writes acknowledged; live segments and idx offsets: {live})")
        time.sleep(0.2)


def _live_keys(cfg: P.PipelineConfig) -> dict:
    state = read_state(P.delta_root(cfg, P.open_store(cfg)), KS, "t").to_pylist()
    return {r["k"]: r["v"] for r in state if r["_cdc_live"]}


def test_a_node_killed_mid_write_loses_no_write_cassandra_logged(tmp_path, kafka_broker, _spark_workdir):
    (tmp_path / "store").mkdir()
    with start_cluster(1, tmp_path / "c", cluster_name="crash") as cluster:
        node = cluster.node(1)
        session = cluster.session()
        _schema(session)
        schema = load_cql_schema(describe(session, KS))
        agent = _agent(node, tmp_path)
        acked: dict = {}
        stop = threading.Event()

        def write():
            i = 0
            while not stop.is_set():
                try:
                    session.execute(f"INSERT INTO {KS}.t (k, v, n) VALUES ({i}, 'v{i}', {i << 20})")
                except Exception:  # noqa: BLE001 - not acknowledged: the node died under this write, or it timed out
                    continue        # (a loaded machine): writing on until the kill keeps the live segment growing
                acked[i] = f"v{i}"
                i += 1

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        time.sleep(12.0)                        # past one 10 s periodic sync: the live segment has an idx
        agent.run_once()                        # the live prefix, as a running agent would have shipped it
        time.sleep(3.0)
        live, past_idx = _freeze_with_writes_past_idx(node, schema, acked)
        cluster.kill_node(1)                    # SIGKILL (to the frozen node): no shutdown hook, no sync of the idx
        stop.set()
        writer.join(30)
        cluster.close_driver()
        assert _torn_segments(node) == live     # the kill changed no idx: what was past it before still is
        agent.run_once()                        # before the restart: nothing past the idx is shipped
        cluster.start_node(1)                   # replay; the idx becomes <file length>\nCOMPLETED
        assert all(b"COMPLETED" in _idx(p).read_bytes() for p in live)   # rewritten by the replay
        agent.run_once()
        session = cluster.session()
        selected = {r.k: r.v for r in session.execute(f"SELECT k, v FROM {KS}.t")}
        cfg = _run_pipeline(tmp_path, describe(session, KS), kafka_broker, get_local_spark_session(_spark_workdir))
    assert len(acked) > 100
    # Periodic commit-log sync (10 s, the default) acknowledges a write before its bytes are durable: what
    # Cassandra replayed after the kill is what survives, and that is what the pipeline must hold.
    lost_by_cassandra = sorted(set(acked) - set(selected))
    state = _live_keys(cfg)
    assert state == selected                    # every write Cassandra logged and replayed is in the state
    assert past_idx and past_idx <= set(state)  # including those only the torn part of the segment holds
    events = consume_topic(kafka_broker, table_topic(cfg.topic_prefix, KS, "t"))
    assert {json.loads(r.key)["k"] for r in events} == set(selected)
    print(f"\n{len(acked)} writes acknowledged before the SIGKILL; {len(selected)} replayed by Cassandra "
          f"({len(lost_by_cassandra)} lost in its periodic-sync window); {len(past_idx)} of them only in the torn "
          f"part of the live segment (past its idx): all in Delta and Kafka")


def test_a_full_cdc_space_blocks_writes_until_the_agent_drains_it(tmp_path, kafka_broker, _spark_workdir):
    (tmp_path / "store").mkdir()
    yaml = {"cdc_total_space": "4MiB", "cdc_block_writes": True, "cdc_free_space_check_interval": "250ms"}
    with start_cluster(1, tmp_path / "c", yaml=yaml, cluster_name="cdcfull") as cluster:
        node = cluster.node(1)
        session = cluster.session()
        _schema(session)
        big = "x" * 20_000
        acked = []
        rejected_at = None
        for i in range(2000):                   # the agent is not running: cdc_raw fills up
            try:
                session.execute(f"INSERT INTO {KS}.t (k, v, n) VALUES ({i}, '{big}', {i})")
                acked.append(i)
            except WriteFailure:
                rejected_at = i
                break
        assert rejected_at is not None, "cdc_total_space never filled"
        agent = _agent(node, tmp_path)
        t0 = time.monotonic()
        resumed_after = None
        j = rejected_at
        while time.monotonic() - t0 < 120:
            agent.run_once()                    # ships the completed segments and deletes them from cdc_raw
            try:
                session.execute(f"INSERT INTO {KS}.t (k, v, n) VALUES ({j}, 'after', {j})")
                acked.append(j)
                resumed_after = time.monotonic() - t0
                break
            except WriteFailure:
                time.sleep(0.25)
        assert resumed_after is not None, "writes did not resume within 120 s of the agent's restart"
        selected = {r.k: r.v for r in session.execute(f"SELECT k, v FROM {KS}.t")}
        schema_cql = describe(session, KS)
        cluster.nodetool(1, "drain")            # closes the live segment (and CQL)
        agent.run_once()
        time.sleep(1.0)
        agent.run_once()
        cfg = _run_pipeline(tmp_path, schema_cql, kafka_broker, get_local_spark_session(_spark_workdir))
    assert sorted(selected) == sorted(acked)
    assert _live_keys(cfg) == selected
    print(f"\ncdc_total_space 4 MiB full after {rejected_at} writes of 20 KB; writes resumed "
          f"{resumed_after:.1f} s after the agent started")
