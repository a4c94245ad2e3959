"""Backfill: a snapshot batch of ``op = 'r'`` events placed in the batch sequence, or a paged SELECT.

``request_snapshot`` makes the next claim a *snapshot batch* ``k`` without segments whose outbox is an ``r`` event
for every visible row of the state tables as batch ``k-1`` committed them. Batches are one serialized sequence
and each is published whole before the next is claimed, so in every topic the snapshot's events sit after every
event of batches ``< k`` and before every event of batches ``> k``: the low and the high watermark are the same
batch boundary (SeaTunnel's snapshot/incremental split). ``cluster_snapshot_events`` reads a live table with the
driver instead (paged SELECT) for a first load.
"""
from __future__ import annotations

import time
from typing import Optional

from cdc_lib.settings import PipelineConfig

from .batches import SNAPSHOT_REQUEST_KEY, Batch
from .resources import open_store


def snapshot_outbox(config: PipelineConfig, root: str, schema, batch: Batch, hook) -> int:
    """Outbox of a snapshot batch: an 'r' event for every visible row of every state table, in publish order.

    Reads each table's state as the previous batch committed it (batches are serialized, so nothing writes in
    between) and holds one table's state at a time in the driver's memory.
    """
    import pyarrow as pa

    from cdc_lib.cql.tokens import token
    from cdc_lib.sinks.delta import OUTBOX_SCHEMA, DeltaRsStateStore, outbox_row, read_state, states_from_rows
    from cdc_lib.state.batch import partition_order, table_order
    from cdc_lib.state.events import snapshot_events
    st = DeltaRsStateStore(root, config.delta_options(), app_id=config.app_id, fail_hook=hook)
    if st.outbox_committed(batch.batch_seq):
        return 0  # written by an earlier attempt (publish counts the events)
    rows: list = []
    for table in sorted(schema.captured_tables(), key=table_order):
        try:
            state = read_state(root, table.keyspace, table.name, config.delta_options() or None)
        except Exception:  # noqa: BLE001 - TableNotFoundError: the stream never wrote this table
            continue
        parts = states_from_rows(state)
        for pk in sorted(parts, key=lambda k: partition_order(token(k), k)):
            for e in snapshot_events(table, {pk: parts[pk]}, batch.now, cluster=config.cluster):
                rows.append(outbox_row(table, e, batch.batch_id, batch.batch_seq, len(rows)))
    st.write_outbox(batch.batch_seq, pa.Table.from_pylist(rows, schema=OUTBOX_SCHEMA), batch.batch_id)
    return len(rows)


def request_snapshot(config: PipelineConfig) -> dict:
    """Ask the next ``cassandra_cdc`` run for a backfill batch ('r' events of the current state; backfill DAG)."""
    store = open_store(config)
    store.put_json(SNAPSHOT_REQUEST_KEY, {"requested_at": int(time.time())})
    return {"snapshot_requested": 1}


def cluster_snapshot_events(session, table, *, cluster: str = "", fetch_size: int = 1000,
                            ts_ms: Optional[int] = None):
    """'r' events for every row of ``table`` read from a live cluster with the driver (paged SELECT).

    ``session`` is a cassandra-driver Session (anything whose ``execute(statement)`` returns an iterable of
    rows with ``_asdict()``; the driver pages through ``fetch_size`` rows at a time). Values are the driver's
    Python types. For a cluster that has no Delta state yet (first start), see the merge rule in the report /
    ``cdc_lib.pipeline`` docstring: start the stream first, then snapshot.
    """
    import hashlib
    statement = f'SELECT * FROM "{table.keyspace}"."{table.name}"'
    try:
        from cassandra.query import SimpleStatement
        statement = SimpleStatement(statement, fetch_size=fetch_size)
    except ImportError:  # pragma: no cover - the driver is an optional dependency
        pass
    key_cols = [c.name for c in table.partition_key + table.clustering]
    now_ms = int(time.time() * 1000) if ts_ms is None else ts_ms
    for row in session.execute(statement):
        values = row._asdict() if hasattr(row, "_asdict") else dict(row)
        key = {c: values.get(c) for c in key_cols}
        ident = hashlib.sha256(repr((table.keyspace, table.name, sorted(key.items(), key=lambda kv: kv[0]),
                                     "r", now_ms)).encode()).hexdigest()[:32]
        yield {"id": ident, "op": "r", "key": key, "before": None, "after": values, "changed": [],
               "source": {"connector": "cassandra-cdc", "cluster": cluster, "node": "", "keyspace": table.keyspace,
                          "table": table.name, "segment": None, "position": None, "ts_us": now_ms * 1000,
                          "expired": False, "snapshot": True},
               "ts_ms": now_ms}
