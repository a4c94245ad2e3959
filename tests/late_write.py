"""One scenario, two truths: a write older than a tombstone arrives after the tombstone was purged.

Row ``k = 1`` is inserted (``USING TIMESTAMP 1000``) and deleted (``USING TIMESTAMP 2000``); the tombstone is purged
(Cassandra: flush and compaction; the pipeline: the maintenance step); then a write ``USING TIMESTAMP 1500`` arrives.
In a table with ``gc_grace_seconds = 0`` the tombstone is gone and the row comes back; in a table with the default
(ten days) it is still there and the late write stays shadowed. ``engine_rows`` runs it through the state engine
and its purge; ``tests/test_real_cluster.py`` runs the same statements on a real Cassandra 5.0 node and compares.
"""
from __future__ import annotations

import struct

from cdc_lib.celllog.records import mutation_records, records_to_batch
from cdc_lib.commitlog.model import Cell, DeletionTime, LivenessInfo, Mutation, PartitionUpdate, Row
from cdc_lib.cql.schema_from_ddl import load_cql_schema
from cdc_lib.sinks.delta import DeltaRsStateStore, read_outbox, read_state, run_store_batch

TABLES = {"gc0": "WITH gc_grace_seconds = 0", "keep": "WITH comment = 'default gc_grace_seconds'"}
TABLE_IDS = {"gc0": "5b0e6a70-1c2d-11f0-9a1b-0242ac120002", "keep": "5b0e6a71-1c2d-11f0-9a1b-0242ac120002"}
CREATE = ["CREATE KEYSPACE purge WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}"] + [
    f"CREATE TABLE purge.{name} (k int PRIMARY KEY, v text) {options}" for name, options in TABLES.items()]
BEFORE_PURGE = ["INSERT INTO purge.{table} (k, v) VALUES (1, 'first') USING TIMESTAMP 1000",
                "DELETE FROM purge.{table} USING TIMESTAMP 2000 WHERE k = 1"]
AFTER_PURGE = ["INSERT INTO purge.{table} (k, v) VALUES (1, 'late') USING TIMESTAMP 1500"]


def _mutation(table, now: int, ts: int, value: bytes | None) -> Mutation:
    """What the statement writes: the row with ``v = value`` at ``ts``, or (``value`` None) its deletion."""
    row = (Row((), liveness=LivenessInfo(ts), cells=[Cell("v", value, ts)]) if value is not None
           else Row((), deletion=DeletionTime(ts, now)))
    return Mutation([PartitionUpdate(table.id, struct.pack(">i", 1), table=table, unfiltereds=[row])],
                    "CommitLog-7-1.log", 1, 64 + ts, mutation_id=ts.to_bytes(16, "big"))


def engine_rows(root, now: int) -> dict:
    """{table: (rows ``SELECT *`` shows at the end as (k, v), the ops the late write's batch published)} from the
    engine: the insert and the delete in one batch at ``now``, the maintenance step's purge one second later, the
    late write in the next batch."""
    schema = load_cql_schema(";\n".join(CREATE[:1] + [f"{ddl} AND ID = {TABLE_IDS[name]}"
                                                       for name, ddl in zip(TABLES, CREATE[1:])]))
    tables = [schema.by_name("purge", name) for name in TABLES]
    store = DeltaRsStateStore(str(root))

    def batch(seq: int, at: int, writes: list) -> None:
        recs = []
        for i, (table, ts, value) in enumerate(writes):
            recs += mutation_records(_mutation(table, at, ts, value), i)
        run_store_batch(store, schema, [records_to_batch(recs)], batch_id=f"b-{seq}", batch_seq=seq, now=at,
                        prev_now=None if seq == 1 else now)

    batch(1, now, [(t, ts, v) for t in tables for ts, v in ((1000, b"first"), (2000, None))])
    for t in tables:
        store.purge(t, now + 1)
    batch(2, now + 2, [(t, 1500, b"late") for t in tables])
    out = {}
    for t in tables:
        state = read_state(str(root), "purge", t.name)
        rows = sorted((r["k"], r["v"]) for r in state.filter(state["_cdc_live"]).to_pylist())
        out[t.name] = (rows, [r["op"] for r in read_outbox(str(root), "b-2") if r["table"] == t.name])
    return out
