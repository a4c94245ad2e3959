"""One scenario, two truths: a write older than a tombstone arrives after the tombstone was purged.

Row ``k = 1`` is inserted (``USING TIMESTAMP 1000``) and deleted (``USING TIMESTAMP 2000``); the tombstone is purged
(Cassandra: flush and compaction; the pipeline: the maintenance step); then a write ``USING TIMESTAMP 1500`` arrives.
In a table with ``gc_grace_seconds = 0`` the tombstone is gone and the row comes back; in a table with the default
(ten days) it is still there and the late write stays shadowed. ``engine_rows`` runs it through the state engine
and its purge; ``tests/test_real_cluster.py`` runs the same statements on a real Cassandra 5.0 node and compares.

A second scenario checks when an expired TTL cell may go. Cassandra's ``AbstractCell.purge`` (4.0 to 5.0) drops an
expired cell when its expiry is before ``gc_before = now - gc_grace_seconds``, and otherwise turns it into a
tombstone dated expiry minus TTL (when it was written) and purges that if *it* is before ``gc_before``: the TTL
counts towards the grace period. A cell written at ``W`` with ``USING TTL 2 AND TIMESTAMP 2000`` is purged by a
compaction at ``now >= W + 2`` in a table with ``gc_grace_seconds = 1`` (``W + 1 < now``, while expiry plus grace,
``W + 3``, is not past yet before ``W + 4``) and kept in one with 60; a write ``USING TIMESTAMP 1500`` afterwards
shows in the first table only. ``ttl_engine_rows`` runs it through the engine.
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


TTL_S = 2
TTL_TABLES = {"ttl_grace1": 1, "ttl_grace60": 60}          # name: gc_grace_seconds
TTL_TABLE_IDS = {"ttl_grace1": "5b0e6a72-1c2d-11f0-9a1b-0242ac120002",
                 "ttl_grace60": "5b0e6a73-1c2d-11f0-9a1b-0242ac120002"}
TTL_CREATE = [f"CREATE TABLE purge.{name} (k int PRIMARY KEY, v text) WITH gc_grace_seconds = {grace}"
              for name, grace in TTL_TABLES.items()]
TTL_WRITE = f"UPDATE purge.{{table}} USING TTL {TTL_S} AND TIMESTAMP 2000 SET v = 'ttl' WHERE k = 1"
TTL_LATE = "UPDATE purge.{table} USING TIMESTAMP 1500 SET v = 'late' WHERE k = 1"


def _mutation(table, now: int, ts: int, value: bytes | None, *, marker: bool = True, ttl: int = 0) -> Mutation:
    """What the statement writes: the row with ``v = value`` at ``ts`` (with a row marker: INSERT; without: UPDATE;
    ``ttl``: written at ``now`` with that TTL), or (``value`` None) its deletion."""
    if value is None:
        row = Row((), deletion=DeletionTime(ts, now))
    else:
        cell = Cell("v", value, ts, ttl, now + ttl) if ttl else Cell("v", value, ts)
        row = Row((), liveness=LivenessInfo(ts) if marker else None, cells=[cell])
    return Mutation([PartitionUpdate(table.id, struct.pack(">i", 1), table=table, unfiltereds=[row])],
                    "CommitLog-7-1.log", 1, 64 + ts, mutation_id=ts.to_bytes(16, "big"))


def _schema(creates: list, ids: dict, options: str = ""):
    return load_cql_schema(";\n".join(CREATE[:1] + [f"{ddl} AND ID = {table_id}{options}"
                                                     for ddl, table_id in zip(creates, ids.values())]))


def _live_rows(root, table) -> list:
    state = read_state(str(root), "purge", table.name)
    return sorted((r["k"], r["v"]) for r in state.filter(state["_cdc_live"]).to_pylist())


def engine_rows(root, now: int) -> dict:
    """{table: (rows ``SELECT *`` shows at the end as (k, v), the ops the late write's batch published)} from the
    engine: the insert and the delete in one batch at ``now``, the maintenance step's purge one second later, the
    late write in the next batch."""
    schema = _schema(CREATE[1:], TABLE_IDS)
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
        out[t.name] = (_live_rows(root, t), [r["op"] for r in read_outbox(str(root), "b-2") if r["table"] == t.name])
    return out


def ttl_engine_rows(root, written_at: int, purged_at: int) -> dict:
    """{table: rows ``SELECT *`` shows at the end, as (k, v)} from the engine: the TTL write in a batch at
    ``written_at``; at ``purged_at`` a batch that sweeps its expiry (the engine purges an expired cell only once a
    batch has published its expiry) and the maintenance step's purge; the late write one second later."""
    schema = _schema(TTL_CREATE, TTL_TABLE_IDS, " AND cdc = true")     # a batch sweeps captured tables only
    tables = [schema.by_name("purge", name) for name in TTL_TABLES]
    store = DeltaRsStateStore(str(root))
    writes = [[_mutation(t, written_at, 2000, b"ttl", marker=False, ttl=TTL_S) for t in tables], [],
              [_mutation(t, purged_at + 1, 1500, b"late", marker=False) for t in tables]]
    nows = [written_at, purged_at, purged_at + 1]
    for seq, (mutations, now) in enumerate(zip(writes, nows), 1):
        if seq == 3:
            for t in tables:
                store.purge(t, purged_at)
        recs = [r for i, m in enumerate(mutations) for r in mutation_records(m, i)]
        run_store_batch(store, schema, [records_to_batch(recs)] if recs else [], batch_id=f"b-{seq}",
                        batch_seq=seq, now=now, prev_now=nows[seq - 2] if seq > 1 else None)
    return {t.name: _live_rows(root, t) for t in tables}
