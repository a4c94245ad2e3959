"""The maintenance DAG's work: ask for a TTL-expiry sweep, compact and vacuum the Delta tables.

Compaction and vacuum commit to the same Delta tables as a batch's transform; both hold the store's Delta writer
lock (``storage.lock.DELTA_WRITER_LOCK``) while they write, so they never commit at the same time: upkeep waits for
a running batch to finish its writes, and the next batch waits for upkeep.
"""
from __future__ import annotations

import os
import time

from cdc_lib.settings import PipelineConfig
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.lock import DELTA_WRITER_LOCK, store_lock

from .batches import SWEEP_REQUEST_KEY, record_metrics
from .resources import delta_root, open_store


def request_sweep(config: PipelineConfig) -> dict:
    """Ask the next ``cassandra_cdc`` run to sweep TTL expiries even without new segments (maintenance DAG).

    The sweep itself runs inside ``cassandra_cdc`` as a batch without segments, so it is serialized with the
    other batches (one ``batch_seq`` sequence per Delta table) and published exactly once like them.
    """
    store = open_store(config)
    store.put_json(SWEEP_REQUEST_KEY, {"requested_at": int(time.time())})
    return {"sweep_requested": 1}


def delta_upkeep(config: PipelineConfig) -> dict:
    """Compact small files and vacuum old ones in every Delta table under ``delta/`` (maintenance DAG).

    Vacuum keeps ``vacuum_retention_hours`` of history (default 168: Delta's 7 days), so a reader pinned to a
    recent version (a Spark task of a running batch) never loses its files.
    """
    vacuum_retention_hours = config.vacuum_retention_hours
    from deltalake import DeltaTable
    store = open_store(config)
    root = delta_root(config, store)
    from cdc_lib.sinks.delta import events_table_uri
    uris = [events_table_uri(root)]
    tables_dir = f"{Layout.DELTA}/state/"
    names = set()
    for key in store.list(tables_dir):
        parts = key[len(tables_dir):].split("/")
        if len(parts) > 1 and parts[1] == "_delta_log":
            names.add(parts[0])
    sep = "/" if "://" in root else os.sep
    uris += [root.rstrip("/") + sep + Layout.DELTA + sep + "state" + sep + n for n in sorted(names)]
    out = {"tables": 0, "files_added": 0, "files_removed": 0, "vacuumed": 0}
    with store_lock(store, DELTA_WRITER_LOCK, "the maintenance DAG (compact and vacuum)",
                    wait_s=config.delta_lock_wait_s, ttl_s=config.delta_lock_ttl_s):
        for uri in uris:
            try:
                dt = DeltaTable(uri, storage_options=config.delta_options() or None)
            except Exception:  # noqa: BLE001 - TableNotFoundError: nothing written yet
                continue
            m = dt.optimize.compact()
            out["tables"] += 1
            out["files_added"] += int(m.get("numFilesAdded", 0))
            out["files_removed"] += int(m.get("numFilesRemoved", 0))
            out["vacuumed"] += len(dt.vacuum(retention_hours=vacuum_retention_hours, dry_run=False,
                                             enforce_retention_duration=vacuum_retention_hours >= 168))
    record_metrics(store, "maintenance", out)
    return out
