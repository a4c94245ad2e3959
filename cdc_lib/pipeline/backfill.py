"""Backfill: what the manual DAG ``cassandra_cdc_backfill`` asks for, by its ``mode`` param.

* ``snapshot`` (the default): a snapshot batch of ``op = 'r'`` events placed in the batch sequence (below);
* ``cql``: load what live tables hold (rows written before CDC was enabled) through a parallel CQL scan, as
  ``r`` events and state (``bootstrap``; params ``tables``, ``consistency``, ``splits``, ``page_size``,
  ``splits_per_batch``, ``parallelism``);
* ``sstables``: the same from the SSTable snapshot the nodes' agents shipped (``agent snapshot``; params ``tag``,
  ``tables``, ``nodes``, ``sstables_per_batch``);
* ``replay``: archived batches again, to rebuild state or re-emit events (``replay``; params ``purpose``,
  ``batches_from``, ``batches_to``, ``since``, ``until``, ``nodes``, ``tables``).

``request_snapshot`` makes the next claim a *snapshot batch* ``k`` without segments whose outbox is an ``r`` event
for every visible row of the state tables as batch ``k-1`` committed them. Batches are one serialized sequence
and each is published whole before the next is claimed, so in every topic the snapshot's events sit after every
event of batches ``< k`` and before every event of batches ``> k``: the low and the high watermark are the same
batch boundary (SeaTunnel's snapshot/incremental split). The other modes are requests (``requests``) whose shares
the next claims take, also before any new segment.
"""
from __future__ import annotations

import time
from typing import Optional

from cdc_lib.errors import ConfigError
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


# The backfill DAG's own params, beside the pipeline settings: name -> (JSON type, what it does).
BACKFILL_ARGS = {
    "mode": ("string", "snapshot (default): 'r' events of every visible row of the state; cql: load the rows "
                       "live tables hold through a CQL scan; sstables: load them from the SSTable snapshot the "
                       "agents shipped (see tag); replay: archived batches again (see purpose)"),
    "tables": ("array", "cql, sstables: the keyspace.table to load (empty: every captured table); replay reemit: "
                        "only these keyspace.table events (empty: all)"),
    "consistency": ("string", "cql: the scan's read consistency level (empty: QUORUM)"),
    "splits": ("integer", "cql: token ranges per table (empty: 16; at least one per node range)"),
    "page_size": ("integer", "cql: rows per page (empty: 1000)"),
    "splits_per_batch": ("integer", "cql: token ranges per pipeline batch (empty: one table's splits)"),
    "parallelism": ("integer", "cql: token ranges scanned at once in the transform's process (empty: 4)"),
    "purpose": ("string", "replay: rebuild (default; archived segments through the transform again) or reemit "
                          "(the batches' events published again, unchanged)"),
    "batches_from": ("integer", "replay: first batch sequence number (empty: the first)"),
    "batches_to": ("integer", "replay: last batch sequence number (empty: the last archived)"),
    "since": ("integer", "replay: batches processed at or after this time (epoch seconds)"),
    "until": ("integer", "replay: batches processed at or before this time (epoch seconds)"),
    "nodes": ("array", "replay rebuild: only these nodes' segments; sstables: only these nodes' snapshots "
                       "(empty: all)"),
    "tag": ("string", "sstables: the snapshot the agents shipped (cassandra-cdc agent snapshot --tag)"),
    "sstables_per_batch": ("integer", "sstables: SSTables per pipeline batch (empty: max_segments; max_bytes of "
                                      "Data.db)"),
}
MODES = {"snapshot": (), "cql": ("tables", "consistency", "splits", "page_size", "splits_per_batch", "parallelism"),
         "sstables": ("tag", "tables", "nodes", "sstables_per_batch"),
         "replay": ("purpose", "batches_from", "batches_to", "since", "until", "nodes", "tables")}


def request_backfill(config: PipelineConfig, mode: Optional[str] = None, **args) -> dict:
    """What the backfill DAG's run asks for: a snapshot, a CQL scan or a replay (``BACKFILL_ARGS``); unknown or
    misplaced arguments are errors that name them."""
    from .bootstrap import request_cql, request_sstables
    from .replay import request_replay
    mode = mode or "snapshot"
    unknown = sorted(set(args) - set(BACKFILL_ARGS))
    if unknown:
        raise ConfigError(f"backfill: unknown argument {unknown[0]!r}")
    if mode not in MODES:
        raise ConfigError(f"backfill: mode {mode!r}: use one of {', '.join(MODES)}")
    given = {k: v for k, v in args.items() if v is not None and v != "" and v != []}
    misplaced = sorted(set(given) - set(MODES[mode]))
    if misplaced:
        owners = {name: [m for m, names in MODES.items() if name in names] for name in misplaced}
        raise ConfigError(f"backfill mode {mode} takes no {', '.join(misplaced)}: "
                          + "; ".join(f"{n} belongs to mode {' and '.join(owners[n])}" for n in misplaced))
    if mode == "snapshot":
        return request_snapshot(config)
    if mode == "cql":
        return request_cql(config, **given)
    if mode == "sstables":
        return request_sstables(config, **given)
    return request_replay(config, **given)


def backfill_params() -> dict:
    """The backfill DAG's params: the pipeline settings (as every DAG) and ``BACKFILL_ARGS``, empty by default."""
    from airflow.sdk import Param

    from .airflow import airflow_params
    out = airflow_params()
    for name, (kind, doc) in BACKFILL_ARGS.items():
        kinds = ["null", kind] + (["string"] if kind == "array" else [])
        out[name] = Param(None, type=kinds, description=doc)
    return out


def backfill_from_airflow_context() -> dict:
    """The backfill DAG's task: its run's settings and arguments, then the request."""
    from airflow.sdk import get_current_context

    from .airflow import config_from_airflow_context
    params = get_current_context()["params"]
    config = config_from_airflow_context(show=True, ignore=tuple(BACKFILL_ARGS))
    return request_backfill(config, **{k: params.get(k) for k in BACKFILL_ARGS})
