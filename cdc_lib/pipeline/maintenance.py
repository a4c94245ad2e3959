"""The maintenance DAG's work: ask for a TTL-expiry sweep, and keep the Delta tables bounded and fast.

``delta_upkeep``, in this order, while holding the store's Delta writer lock (``storage.lock.DELTA_WRITER_LOCK``), so
that it never commits at the same time as a batch's transform (upkeep waits for a running batch to finish its
writes, and the next batch waits for upkeep):

1. **Tombstone purge** (``sinks.delta.DeltaRsStateStore.purge``, rules in ``state.purge``): what Cassandra's
   compaction would drop after each table's ``gc_grace_seconds`` leaves the state tables. It emits nothing (nothing
   visible changes). It is skipped while a batch is half-written (its outbox committed, its state tables not all):
   the rerun of that batch must find the state its outbox was computed from.
2. **Outbox retention**: the rows of batches published and archived more than ``outbox_retention_hours`` ago are
   deleted. An outbox an earlier version partitioned by ``batch_id`` is rewritten without partitions, once.
3. **Compaction**: small files are merged (``optimize.compact``) in every table; each batch adds a few.
4. **Vacuum** of files older than ``vacuum_retention_hours`` that no current version uses.

Why here and not inside a batch: a purge has to visit every partition with an old tombstone, also the many that no
batch touches again (a key deleted for good); that is a pass over a table's old records, an hourly job's work, not
something to add to every batch's latency. Under the writer lock it cannot race a batch.
"""
from __future__ import annotations

import logging
import time

from cdc_lib.settings import PipelineConfig
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.lock import DELTA_WRITER_LOCK, store_lock
from cdc_lib.storage.objects import ObjectStore

from .batches import (SWEEP_REQUEST_KEY, batch_id_for, manifest_key, processing_time, read_batch, read_pointer,
                      record_metrics)
from .resources import delta_root, load_schema, open_store

log = logging.getLogger("cassandra_cdc.pipeline")

MAINTENANCE = "maintenance"        # the step name of delta_upkeep's counters in checkpoints/metrics.json


def request_sweep(config: PipelineConfig) -> dict:
    """Ask the next ``cassandra_cdc`` run to sweep TTL expiries even without new segments (maintenance DAG).

    The sweep itself runs inside ``cassandra_cdc`` as a batch without segments, so it is serialized with the
    other batches (one ``batch_seq`` sequence per Delta table) and published exactly once like them.
    """
    store = open_store(config)
    store.put_json(SWEEP_REQUEST_KEY, {"requested_at": int(time.time())})
    return {"sweep_requested": 1}


def state_table_names(store: ObjectStore) -> list:
    """``<keyspace>.<table>`` of every state table under ``delta/state/``."""
    tables_dir = f"{Layout.DELTA}/state/"
    names = set()
    for key in store.list(tables_dir):
        parts = key[len(tables_dir):].split("/")
        if len(parts) > 1 and parts[1] == "_delta_log":
            names.add(parts[0])
    return sorted(names)


def delta_upkeep(config: PipelineConfig) -> dict:
    """Purge, outbox retention, compaction and vacuum of every Delta table under ``delta/`` (maintenance DAG).

    Vacuum keeps ``vacuum_retention_hours`` of history (default 168: Delta's 7 days), so a reader pinned to a
    recent version (a Spark task of a running batch) never loses its files.
    """
    from cdc_lib.sinks.delta import DeltaRsStateStore
    t0 = time.monotonic()
    store = open_store(config)
    root = delta_root(config, store)
    schema = load_schema(config)
    now = processing_time(config)
    st = DeltaRsStateStore(root, config.delta_options(), app_id=config.app_id)
    with store_lock(store, DELTA_WRITER_LOCK, "the maintenance DAG (purge, outbox retention, compact, vacuum)",
                    wait_s=config.delta_lock_wait_s, ttl_s=config.delta_lock_ttl_s):
        half_written = _half_written_batch(store, st)
        if half_written:
            log.warning("maintenance: batch %s is half-written (its outbox is committed, its state tables are not "
                        "all): no tombstone purge until its transform has run again", half_written)
        out = maintain_delta(st, schema, state_table_names(store), now, purge=not half_written,
                             outbox_through=_outbox_retention_limit(store, config, now),
                             vacuum_retention_hours=config.vacuum_retention_hours)
    out["purge_skipped"] = int(bool(half_written))
    out["duration_s"] = round(time.monotonic() - t0, 3)
    record_metrics(store, MAINTENANCE, out)
    return out


def maintain_delta(st, schema, state_tables: list, now: int, *, purge: bool = True, outbox_through: int = 0,
                   vacuum_retention_hours: int = 168) -> dict:
    """The Delta work of ``delta_upkeep`` (the caller holds the writer lock): purge the state tables ``state_tables``
    (``<keyspace>.<table>``) at ``now`` when ``purge``, delete the outbox rows of batches up to ``outbox_through``,
    compact and vacuum every table. ``st``: a ``sinks.delta.DeltaRsStateStore``. Returns the counters, the purge's
    also per table (``purge_by_table``: {``<keyspace>.<table>``: {"deleted", "rewritten", "examined"}})."""
    from cdc_lib.sinks.delta import state_table_uri
    out = {"tables": 0, "purged_records": 0, "purge_rewritten_records": 0, "purge_examined_records": 0,
           "outbox_rows_deleted": 0, "outbox_rows_repartitioned": 0, "files_added": 0, "files_removed": 0,
           "vacuumed": 0, "purge_by_table": {}}
    uris = []
    for name in state_tables:
        keyspace, _, table_name = name.partition(".")
        table = schema.by_name(keyspace, table_name)
        uris.append(state_table_uri(st.root, keyspace, table_name))
        if table is None:
            log.info("maintenance: %s is not in the schema (dropped, or left out): not purged", name)
        elif purge:
            counts = st.purge(table, now)
            out["purge_by_table"][name] = counts
            out["purged_records"] += counts["deleted"]
            out["purge_rewritten_records"] += counts["rewritten"]
            out["purge_examined_records"] += counts["examined"]
    if outbox_through > 0:
        out["outbox_rows_deleted"] = st.trim_outbox(outbox_through)
    out["outbox_rows_repartitioned"] = st.unpartition_outbox()
    for uri in [st.events_uri()] + uris:
        counts = st.compact_and_vacuum(uri, vacuum_retention_hours)
        if counts is not None:
            out["tables"] += 1
            for k, v in counts.items():
                out[k] += v
    return out


def _half_written_batch(store: ObjectStore, st) -> str:
    """The id of the current batch when its transform committed the outbox but did not finish (a rerun is due), or
    ""."""
    seq = int(read_pointer(store).get("batch_seq", 0))
    if not seq or not store.exists(manifest_key(batch_id_for(seq))):
        return ""
    batch = read_batch(store, batch_id_for(seq))
    return batch.batch_id if batch.state == "claimed" and st.outbox_committed(seq) else ""


def _outbox_retention_limit(store: ObjectStore, config: PipelineConfig, now: int) -> int:
    """The last batch whose outbox rows may go: archived (so published), processed more than
    ``outbox_retention_hours`` before ``now``; 0 for none."""
    if config.outbox_retention_hours is None:
        return 0
    seq = int(read_pointer(store).get("batch_seq", 0))
    if not seq:
        return 0
    done = seq if read_batch(store, batch_id_for(seq)).state == "archived" else seq - 1
    cutoff = now - config.outbox_retention_hours * 3600
    # a batch's now never goes back (claim), so the batches old enough are a prefix: binary search it
    lo, hi = 0, done
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if read_batch(store, batch_id_for(mid)).now < cutoff:
            lo = mid
        else:
            hi = mid - 1
    return lo
