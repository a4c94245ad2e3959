"""What the pipeline reports about itself, read from the store: Prometheus text and the status page's data.

The steps write one model (``batches.record_metrics``: ``checkpoints/metrics.json`` with totals, the last run
of each step and histograms; and the batch manifests, one per batch, with each step's counters). This module
only reads it, so every view (``cassandra-cdc metrics``, ``cassandra-cdc status`` and its ``/metrics``) shows the
same numbers.
"""
from __future__ import annotations

import math

from cdc_lib.metrics import Exposition, quantile
from cdc_lib.storage.objects import ObjectStore

from .batches import METRICS_KEY, batch_id_for, read_batch, read_pointer
from .maintenance import MAINTENANCE

STEPS = ("claim", "transform", "publish", "archive")


def read_metrics_json(store: ObjectStore) -> dict:
    return store.get_json(METRICS_KEY) if store.exists(METRICS_KEY) else {}


def pipeline_exposition(m: dict, cluster: str) -> str:
    """``checkpoints/metrics.json`` as one Prometheus scrape (``cassandra_cdc_*``, labelled with the cluster)."""
    totals, last, hists = m.get("totals", {}), m.get("last", {}), m.get("histograms", {})
    c = {"cluster": cluster}
    e = Exposition()
    e.histogram("end_to_end_lag_seconds", "from a segment's close on the node (Cassandra completed it) to its "
                                          "events in Kafka, per segment",
                hists.get("end_to_end_lag_seconds"), c)
    e.counter("end_to_end_lag_unknown_segments", "segments published without a close time (shipped by an agent "
                                                 "that did not record it): not in end_to_end_lag_seconds",
              totals.get("publish.segments_without_close_time", 0), c)
    e.histogram("lag_seconds", "from a segment's arrival in the store to its events in Kafka (the pipeline's own "
                               "part of end_to_end_lag_seconds)",
                hists.get("lag_seconds"), c)
    for step in STEPS + (MAINTENANCE,):
        e.histogram("step_duration_seconds", "duration of a pipeline step per batch (maintenance: per run)",
                    hists.get(f"step_duration_seconds.{step}"), {**c, "step": step})
    for table, ops in sorted((totals.get("publish.by_table_op") or {}).items()):
        keyspace, _, name = table.partition(".")
        for op, n in sorted(ops.items()):
            e.counter("events", "change events published to Kafka, per table and op (c, u, d, r)", n,
                      {**c, "keyspace": keyspace, "table": name, "op": op})
    claim = last.get("claim", {})
    for node, backlog in sorted((claim.get("backlog") or {}).items()):
        e.gauge("backlog_segments", "complete segments in incoming/ not processed yet, per node (at the last claim)",
                backlog["segments"], {**c, "node": node})
        e.gauge("backlog_bytes", "bytes of those segments", backlog["bytes"], {**c, "node": node})
    e.counter("quarantined_entries", "commit-log entries quarantined (damaged or of an unknown table)",
              totals.get("transform.quarantined_entries", 0), c)
    e.counter("quarantined_segments", "segments moved to quarantined/ (damaged bytes)",
              totals.get("archive.quarantined_segments", 0), c)
    e.counter("segments_processed", "segments archived after their events reached Kafka",
              totals.get("archive.archived", 0) + totals.get("archive.quarantined_segments", 0), c)
    e.counter("events_published", "events published, all tables", totals.get("publish.events", 0), c)
    e.gauge("last_batch_seq", "sequence number of the last claimed batch", claim.get("batch_seq"), c)
    e.gauge("seconds_since_last_arrival", "seconds without a new segment for this cluster (at the last claim)",
            claim.get("quiet_s"), c)
    for step in STEPS + (MAINTENANCE,):
        if step in last:
            e.gauge("last_run_timestamp_seconds", "when the step last finished (unix time)", last[step].get("at"),
                    {**c, "step": step})
    _maintenance(e, totals, last.get(MAINTENANCE), c)
    return e.text()


def _maintenance(e: Exposition, totals: dict, last: dict | None, c: dict) -> None:
    """The maintenance DAG's counters (``pipeline.maintenance.delta_upkeep``), summed over its runs."""
    if last is None:
        return                      # never ran: no family rather than zeros that look like a run
    for table, counts in sorted((totals.get(f"{MAINTENANCE}.purge_by_table") or {}).items()):
        keyspace, _, name = table.partition(".")
        labels = {**c, "keyspace": keyspace, "table": name}
        for kind in ("deleted", "rewritten"):
            e.counter("maintenance_purged_records", "state-table records the tombstone purge deleted (nothing was "
                                                    "left) or rewrote (they lost purged parts), per table",
                      counts.get(kind, 0), {**labels, "kind": kind})
        e.counter("maintenance_purge_examined_records", "state-table records the purge read, per table",
                  counts.get("examined", 0), labels)
    e.counter("maintenance_purge_skipped_runs", "maintenance runs that skipped the purge (a batch was half-written)",
              totals.get(f"{MAINTENANCE}.purge_skipped", 0), c)
    e.gauge("maintenance_last_purge_skipped", "1 when the last maintenance run skipped the purge, else 0",
            last.get("purge_skipped"), c)
    e.gauge("maintenance_last_duration_seconds", "duration of the last maintenance run", last.get("duration_s"), c)
    e.counter("maintenance_outbox_rows_deleted", "outbox rows deleted by the retention",
              totals.get(f"{MAINTENANCE}.outbox_rows_deleted", 0), c)
    e.counter("maintenance_files_compacted", "small files that compaction merged (removed), all Delta tables",
              totals.get(f"{MAINTENANCE}.files_removed", 0), c)
    e.counter("maintenance_files_vacuumed", "unused files that vacuum deleted, all Delta tables",
              totals.get(f"{MAINTENANCE}.vacuumed", 0), c)


def status_data(store: ObjectStore, cluster: str, last_batches: int = 50) -> dict:
    """What the status page shows: the metrics, the last ``last_batches`` batches (newest last) with their step
    times, lag, backlog and events, and the entries quarantined by them with their reasons."""
    m = read_metrics_json(store)
    seq = int(read_pointer(store).get("batch_seq", 0))
    batches, quarantined = [], []
    for s in range(max(1, seq - last_batches + 1), seq + 1):
        try:
            b = read_batch(store, batch_id_for(s))
        except Exception:  # noqa: BLE001 - a manifest removed by hand: skip it, show the others
            continue
        steps = b.steps
        backlog = (steps.get("claim") or {}).get("backlog") or {}
        batches.append({
            "batch_id": b.batch_id, "batch_seq": b.batch_seq, "state": b.state, "time": b.now,
            "segments": len(b.segments), "bytes": sum(x["size"] for x in b.segments),
            "kind": "snapshot" if b.snapshot else "sweep" if b.sweep else "segments",
            "durations": {st: (steps.get(st) or {}).get("duration_s") for st in STEPS},
            "events": (steps.get("publish") or {}).get("events"),
            "by_table": (steps.get("publish") or {}).get("by_table") or {},
            "lag_max_s": (steps.get("publish") or {}).get("lag_max_s"),
            "end_to_end_lag_max_s": (steps.get("publish") or {}).get("end_to_end_lag_max_s"),
            "backlog_segments": sum(n["segments"] for n in backlog.values()),
            "backlog_bytes": sum(n["bytes"] for n in backlog.values()),
            "quarantined_entries": (steps.get("transform") or {}).get("quarantined_entries", 0),
        })
        for q in steps.get("quarantined") or []:
            quarantined.append({"batch_id": b.batch_id, **{k: q.get(k) for k in ("key", "kind", "reason")}})
    lag = (m.get("histograms") or {}).get("lag_seconds")
    end_to_end = (m.get("histograms") or {}).get("end_to_end_lag_seconds")
    backlog_now = ((m.get("last") or {}).get("claim") or {}).get("backlog")
    return {"cluster": cluster, "store": store.url, "batches": batches, "quarantined": quarantined,
            "backlog_segments": None if backlog_now is None else sum(n["segments"] for n in backlog_now.values()),
            "events_by_table": (m.get("totals") or {}).get("publish.by_table") or {},
            "lag_p50_s": _bound(lag, 0.5), "lag_p95_s": _bound(lag, 0.95),
            "end_to_end_lag_p50_s": _bound(end_to_end, 0.5), "end_to_end_lag_p95_s": _bound(end_to_end, 0.95),
            "end_to_end_lag_unknown_segments": (m.get("totals") or {}).get("publish.segments_without_close_time", 0),
            "totals": m.get("totals", {})}


def _bound(hist: dict | None, q: float):
    """The quantile's bucket bound, or "> <last bound>" when it is past the last bucket (JSON has no infinity)."""
    value = quantile(hist, q) if hist else None
    if value is not None and math.isinf(value):
        return f"> {hist['le'][-1]:g}"
    return value
