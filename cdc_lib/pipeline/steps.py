"""The pipeline's steps, as plain idempotent functions the Airflow tasks call: claim -> transform -> publish -> archive.

One run at a time (the DAG runs with ``max_active_runs=1``); inside a run that takes several batches, a batch is
published and archived while the next is claimed and transformed (``overlap_batches``), so at most two batches
are unfinished. Every step reads and writes the batch manifest ``ledger/batches/<batch_id>.json`` in the object
store, so a retry or a rerun after a crash at any instant finds what is done and does the rest:

1. ``claim``: if a batch is not archived (a crash), return *that* batch again, the older one first: exactly-once
   needs deterministic batches (same segments, same ``now``, same ``batch_seq``). Otherwise list the complete
   incoming segments (sidecar present), oldest first per node, up to ``max_segments`` / ``max_bytes``, write
   the manifest (state ``claimed``), then move the pointer ``checkpoints/pipeline.json``. Nothing new: an
   empty batch, returned fast, without writing anything; unless a TTL sweep is due (``sweep_interval_s`` since
   the last batch, or a sweep requested by the maintenance DAG): then a batch without segments sweeps expiries.
2. ``transform``: ``spark.merge_job.run_batch``: a small batch on a local master in this process without Spark
   (delta-rs), a larger one on Spark (delta-spark), in-process or with ``spark-submit``; the readers take the
   segments straight from the store. A sweep batch runs the Spark-free ``sinks.delta.run_store_batch``. Damaged
   entries and entries of unknown tables are written to ``quarantined/`` with a ``.reason.json`` by the job; the
   rest of the batch proceeds. Delta commits carry the app transaction ``(app_id, batch_seq)``: a rerun writes
   nothing twice. The step holds the store's Delta writer lock while it writes (the maintenance DAG waits).
3. ``publish``: ``sinks.kafka.KafkaPublisher.publish_batch`` on the batch's outbox rows (exactly once: the
   publisher's own intent/scan/verify protocol and its ledger marker ``ledger/<batch_id>.json``).
4. ``archive``: only once the publisher's marker exists: each segment moves ``incoming/`` -> ``archived/``
   (copy, verify, then delete; ``ARCHIVE_THREADS`` segments at once, the deletes all together at the end); a
   segment in which bytes were damaged moves to ``quarantined/`` with a reason naming every damaged position
   instead (its readable entries were processed).

``run_once`` is the four steps of one batch in one process; ``run_for`` takes batch after batch for a window (a
scheduled run's ``follow`` task, ``pipeline.follow``), overlapping them (``_Batches``).

Backfill, replay and maintenance batches run through the same steps (see ``backfill``, ``replay`` and
``maintenance``); a pending replay request is claimed before new segments.

Counters of every step are logged, returned (the DAG task logs them) and accumulated in
``checkpoints/metrics.json`` so a user can read them (``cat``/``aws s3 cp``).

Fault injection: every step takes ``fault``, called as ``fault(point)`` at named points (see ``FAULT_POINTS``;
publisher points arrive as ``publish:<point>``); tests raise from it or ``os._exit`` to simulate a crash.
"""
from __future__ import annotations

import collections
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Optional

from cdc_lib.commitlog.segment import DAMAGE_KINDS
from cdc_lib.errors import CdcError, ConfigError
from cdc_lib.gcpause import gc_paused
from cdc_lib.settings import PipelineConfig
from cdc_lib.spark.session import spark_session
from cdc_lib.spark.submit import run_job
from cdc_lib.storage.layout import CLOSED_AT_ATTRIBUTE, Layout, parse_segment_name
from cdc_lib.storage.lock import DELTA_WRITER_LOCK, store_lock
from cdc_lib.storage.objects import ObjectStore
from cdc_lib.storage.quarantine import quarantined_records

from .backfill import snapshot_outbox
from .bootstrap import describe as describe_load
from .bootstrap import (load_progress, read_horizons, record_horizons, scan_settings, scan_sources,
                        sstable_sources)
from .batches import (POINTER_KEY, SNAPSHOT_REQUEST_KEY, STATES, SWEEP_REQUEST_KEY, Batch, Fault, PipelineError,
                      batch_id_for, manifest_key, no_fault, processing_time, read_batch, read_pointer, record_metrics,
                      reload_batch, save_batch, segment_sources)
from .health import arrival_warnings, check_run_settings, open_existing_store
from .replay import describe as describe_replay
from .replay import reemit_outbox
from .requests import claim_share, consume_share
from .resources import MiB, delta_root, encryption_keys, load_schema, open_store

log = logging.getLogger("cassandra_cdc.pipeline")
ARCHIVE_THREADS = 8         # segments the archive step moves at once (each move waits on the store's round trips)
# Segments a transform without Spark reads at once: a download waits on the store, and the compiled decoder releases
# the GIL, so reads overlap downloads and use both cores (bench_pipeline: the parse stage 1.83 s -> 1.06 s for
# 100 MB in 3 batches); what they give is taken in the batch's order.
SEGMENT_READERS = 4
LOADS = ("cql", "sstables")      # backfill modes whose batches load live data (bootstrap)


# ------------------------------------------------------------------------------------------------ 1. claim


def _candidates(store: ObjectStore, config: PipelineConfig, incoming: dict) -> tuple[list, int]:
    """Complete segments of this cluster among the ``incoming/`` objects (``ObjectStore.listing``: key -> size and
    sidecar time), in claim order: per-node rank first, so no node waits behind another. With
    ``local_datacenter``, segments of nodes in other datacenters are left out (and left in ``incoming/``). Their
    sidecars are not read here: ``_read_sidecars`` reads those of the segments a batch takes.

    Returns (segments, incomplete uploads seen, segments of other datacenters).
    """
    by_node: dict = {}
    incomplete = 0
    prefix = Layout.area_prefix(Layout.INCOMING, config.cluster)
    other_dc = _other_datacenter_nodes(store, config, incoming) if config.local_datacenter else {}
    for key in incoming:
        if not key.startswith(prefix):
            continue
        try:
            _, _, node, name = Layout.parse_segment_key(key)
            _, seg_id = parse_segment_name(name)
        except CdcError:
            continue  # not a segment (e.g. a stray file): never claimed
        if node in other_dc:
            other_dc[node][1] += 1
            continue
        if incoming[key].committed_at is None:
            incomplete += 1       # no sidecar: an upload cut short, or still running: the next run sees it complete
            continue
        seg = {"key": key, "node": node, "name": name, "size": incoming[key].size,
               "shipped_at": incoming[key].committed_at}        # where the publish step's lag starts
        if incoming[key].etag is not None:
            seg["etag"] = incoming[key].etag        # archive checks its copy against it, without a HEAD
        by_node.setdefault(node, []).append((seg_id, seg))
    ranked = []
    for node, segs in by_node.items():
        for rank, (seg_id, seg) in enumerate(sorted(segs, key=lambda s: s[0])):
            ranked.append(((rank, node), seg))
    skipped = {node: n for node, (dc, n) in other_dc.items() if n}
    if skipped:
        log.info("claim: %d segment(s) of other datacenters than %s left in incoming/ (%s)", sum(skipped.values()),
                 config.local_datacenter, ", ".join(f"{node} ({other_dc[node][0]}): {n}"
                                                    for node, n in sorted(skipped.items())))
    return [s for _, s in sorted(ranked, key=lambda r: r[0])], incomplete, sum(skipped.values())


def _read_sidecars(store: ObjectStore, chosen: list) -> tuple[list, int]:
    """The ``chosen`` segments (claim order) with their sidecar's checksum and close time, the sidecars read
    ``ARCHIVE_THREADS`` at once. A sidecar gone since the listing (the segment is no longer complete) leaves that
    segment, and the node's later ones, for a later batch: a node's segments are taken oldest first.

    Returns (segments, segments left for lack of a sidecar).
    """
    with ThreadPoolExecutor(min(ARCHIVE_THREADS, len(chosen) or 1), thread_name_prefix="cdc-claim") as pool:
        sidecars = list(pool.map(lambda seg: store.sidecar(seg["key"]), chosen))
    out, gone = [], set()
    for seg, (checksum, attributes) in zip(chosen, sidecars):
        if checksum is None or seg["node"] in gone:
            gone.add(seg["node"])
            continue
        seg["checksum"], seg["attributes"] = checksum, attributes     # archive writes them beside the archived copy
        closed_at = _closed_at(attributes.get(CLOSED_AT_ATTRIBUTE))
        if closed_at is not None:
            seg["closed_at"] = closed_at       # where the end-to-end lag starts (absent: an older agent shipped it)
        out.append(seg)
    return out, len(chosen) - len(out)


def _closed_at(attribute: str | None) -> float | None:
    """The agent's ``closed_at`` sidecar attribute as unix seconds; None when absent or not a time (unknown lag is
    counted as unknown, never guessed)."""
    try:
        value = float(attribute) if attribute is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _other_datacenter_nodes(store: ObjectStore, config: PipelineConfig, incoming: list) -> dict:
    """{node: [datacenter, segments skipped]} of this cluster's nodes whose agent says another datacenter than
    ``local_datacenter``. A node whose agent said nothing (no ``--datacenter``) is processed, with a warning:
    leaving it out could lose the only copy of its writes."""
    said = {}
    for key in store.list(f"{Layout.NODES}/{config.cluster}/"):
        try:
            info = store.get_json(key)
            said[info["node"]] = info["datacenter"]
        except Exception:  # noqa: BLE001 - unreadable: treated as a node that said nothing
            continue
    prefix = Layout.area_prefix(Layout.INCOMING, config.cluster)
    silent = sorted({k.split("/")[2] for k in incoming if k.startswith(prefix) and k.count("/") == 3} - set(said))
    if silent:
        log.warning("claim: WARNING: local_datacenter is %s but the agents of %s did not say their datacenter "
                    "(agent --datacenter): their segments are processed", config.local_datacenter, ", ".join(silent))
    return {node: [dc, 0] for node, dc in said.items() if dc != config.local_datacenter}


def claim(config: PipelineConfig, run_id: str = "", *, fault: Fault = no_fault,
          wall_clock: Optional[float] = None, in_flight: Optional[Batch] = None) -> Batch:
    """The batch this run works on: the oldest unfinished one after a crash, else new segments; may be empty.

    ``in_flight``: a batch this process is publishing and archiving at the same time (``run_for`` and
    ``run_until_idle`` with ``overlap_batches``); it counts as finished, and its segments, still in
    ``incoming/``, are not taken again. So at most two batches are ever unfinished, and after a crash the
    older one is resumed first: Kafka gets batches in order.

    First fails at once if the settings cannot work, and warns about what agents ship (``health``);
    ``wall_clock`` (seconds) replaces ``time.time()`` for those warnings.
    """
    t0 = time.monotonic()
    check_run_settings(config)
    store = open_existing_store(config)
    incoming = store.listing(Layout.INCOMING + "/")
    warnings, health = arrival_warnings(store, config, list(incoming), wall_clock)
    health["warnings"] = warnings
    ptr = read_pointer(store)
    seq = int(ptr.get("batch_seq", 0))
    # A manifest written just before a crash, before the pointer moved: that batch is the current one.
    nxt = batch_id_for(seq + 1)
    if store.exists(manifest_key(nxt)):
        store.put_json(POINTER_KEY, {"batch_seq": seq + 1, "batch_id": nxt})
        seq += 1
    last = read_batch(store, batch_id_for(seq)) if seq else None
    flying = in_flight.batch_id if in_flight is not None and not in_flight.empty else None
    if last is not None and last.state != "archived" and last.batch_id != flying:
        # Overlapping batches leave the one before unfinished too when they die: that one goes first.
        before = read_batch(store, batch_id_for(seq - 1)) if seq > 1 else None
        if before is not None and before.state != "archived" and before.batch_id != flying:
            last = before
        last.resumed = True
        record_metrics(store, "claim", {"batch_seq": last.batch_seq, "segments": len(last.segments),
                                         "resumed": 1, "repeat": True, **health,
                                         "duration_s": round(time.monotonic() - t0, 3)})
        log.warning("claim: resuming unfinished batch %s (state %s, %d segments)", last.batch_id, last.state,
                    len(last.segments))
        return last

    if flying is not None:
        taken = {seg["key"] for seg in in_flight.segments}
        incoming = {key: obj for key, obj in incoming.items() if key not in taken}
    candidates, incomplete, other_dc = _candidates(store, config, incoming)
    health["backlog"] = _backlog(candidates)
    if config.local_datacenter:
        health["other_datacenter_segments"] = other_dc
    chosen, size = [], 0
    share = claim_share(store, config, last)      # a requested backfill goes before new segments
    if share is not None:
        chosen, backfill = share                  # (no shipped_at: a backfill is not lag)
        size = sum(s["size"] for s in chosen)
    else:
        backfill = {}
        max_bytes = batch_max_bytes(config)
        for seg in candidates:
            if chosen and (len(chosen) >= config.max_segments or size + seg["size"] > max_bytes):
                break
            chosen.append(seg)
            size += seg["size"]
        chosen, left = _read_sidecars(store, chosen)
        if left:
            incomplete += left
            size = sum(s["size"] for s in chosen)
    now = processing_time(config)
    prev_now = last.now if last is not None else None
    if prev_now is not None:
        now = max(now, prev_now)     # processing time never goes back (TTL sweep windows)
    sweep = snapshot = False
    if not chosen and not backfill:
        if store.exists(SNAPSHOT_REQUEST_KEY):
            snapshot = True     # a batch of its own between two stream batches: see snapshot_outbox
        elif last is not None:
            requested = store.exists(SWEEP_REQUEST_KEY)
            sweep = now > prev_now and (requested or now - prev_now >= config.sweep_interval_s)
    if not chosen and not sweep and not snapshot and not backfill:
        counters = {"batch_seq": seq, "segments": 0, "bytes": 0, "pending": 0, "incomplete_uploads": incomplete,
                    **health,
                    "duration_s": round(time.monotonic() - t0, 3)}
        record_metrics(store, "claim", counters)
        return Batch(steps={"claim": counters})
    if snapshot:
        now = prev_now if prev_now is not None else now   # the state as the last batch left it
    batch = Batch(batch_id_for(seq + 1), seq + 1, "claimed", chosen, now, prev_now, sweep=sweep, snapshot=snapshot,
                  backfill=backfill, claimed_by=run_id)
    counters = {"batch_seq": batch.batch_seq, "segments": len(chosen), "bytes": size,
                "pending": len(candidates) - (0 if backfill else len(chosen)), "incomplete_uploads": incomplete,
                "sweep": int(sweep), "snapshot": int(snapshot), "backfill": int(bool(backfill)), **health,
                "duration_s": round(time.monotonic() - t0, 3)}
    batch.steps["claim"] = counters
    save_batch(store, batch)
    fault("claim:manifest_written")
    store.put_json(POINTER_KEY, {"batch_seq": batch.batch_seq, "batch_id": batch.batch_id})
    if sweep and store.exists(SWEEP_REQUEST_KEY):
        store.delete(SWEEP_REQUEST_KEY)
    if snapshot:
        store.delete(SNAPSHOT_REQUEST_KEY)
    if backfill:
        consume_share(store, batch)
    fault("claim:pointer_written")
    record_metrics(store, "claim", counters)
    return batch


def batch_max_bytes(config: PipelineConfig) -> int:
    """The most bytes of segments claim puts in a batch: ``max_bytes``, and on a local master (no spark_submit)
    at most ``driver_batch_max_bytes``, so that every stream batch runs in the transform's own process: there,
    with the compiled engine, a batch is faster than on Spark's local tasks and pays no session start, which is
    what keeps a segment's wait short (``run_for``). ``driver_batch_max_bytes`` 0 (always Spark) lifts the cap."""
    if config.spark_submit or not config.spark_master.startswith("local") or not config.driver_batch_max_bytes:
        return config.max_bytes
    return min(config.max_bytes, config.driver_batch_max_bytes)


def _backlog(candidates: list) -> dict:
    """{node: {"segments": n, "bytes": b}}: complete segments in ``incoming/`` not processed yet (this claim's
    included)."""
    out: dict = {}
    for seg in candidates:
        node = out.setdefault(seg["node"], {"segments": 0, "bytes": 0})
        node["segments"] += 1
        node["bytes"] += seg["size"]
    return out


# ------------------------------------------------------------------------------------------------ 2. transform


def transform_mode(config: PipelineConfig, batch: Batch) -> str:
    """Where the batch's segments are decoded and reconciled: ``driver`` (this process, without Spark: a local
    master and at most ``driver_batch_max_bytes`` of segments; a backfill scan on a local master unless
    ``driver_batch_max_bytes`` is 0), ``spark`` (a session in this process) or ``spark-submit``."""
    if config.spark_submit:
        return "spark-submit"
    if batch.backfill.get("mode") == "cql":
        return "driver" if config.spark_master.startswith("local") and config.driver_batch_max_bytes else "spark"
    size = sum(s.get("size", 0) for s in batch.segments + batch.backfill.get("items", []))
    if config.spark_master.startswith("local") and size <= config.driver_batch_max_bytes:
        return "driver"
    return "spark"


def _describe(batch: Batch, config: PipelineConfig) -> str:
    """One line saying what the transform of ``batch`` is about to do (the first line of its task log)."""
    head = f"batch {batch.batch_id} (seq {batch.batch_seq}, processing time {batch.now})"
    if batch.snapshot:
        return f"{head}: backfill snapshot of every visible row (no segments)"
    if batch.backfill.get("mode") in LOADS:
        how = {"driver": "in this process", "spark": f"Spark {config.spark_master}",
               "spark-submit": f"spark-submit --master {config.spark_master}"}[transform_mode(config, batch)]
        return f"{head}: {describe_load(batch)} {how}"
    if batch.backfill:
        return f"{head}: {describe_replay(batch)}"
    if not batch.segments:
        return f"{head}: TTL expiry sweep (no segments)"
    nodes = sorted({s["node"] for s in batch.segments})
    size = sum(s["size"] for s in batch.segments)
    how = {"driver": "in this process (a small batch: no Spark)",
           "spark": f"Spark {config.spark_master}",
           "spark-submit": f"spark-submit --master {config.spark_master}"}[transform_mode(config, batch)]
    return (f"{head}: {len(batch.segments)} segments, {size / MiB:.1f} MiB from {len(nodes)} nodes "
            f"({', '.join(nodes)}) {how}")


def transform(config: PipelineConfig, batch, *, fault: Fault = no_fault, spark=None) -> Batch:
    """Decode, dedupe and reconcile the batch into Delta state tables + outbox (idempotent per ``batch_seq``).

    Holds the store's Delta writer lock (``storage.lock``) while it writes, so the maintenance DAG never commits
    at the same time. ``spark``: the session to use when the batch runs on Spark in this process.
    """
    store = open_store(config)
    batch = reload_batch(store, batch)
    if batch.empty:
        return batch
    if STATES.index(batch.state) >= STATES.index("transformed"):
        log.info("transform: %s already transformed", batch.batch_id)
        return batch
    log.info("transform: %s", _describe(batch, config))
    t0 = time.monotonic()
    fault("transform:before")
    schema = load_schema(config)
    root = delta_root(config, store)

    def hook(kind, name):
        fault(f"transform:{kind}")

    counters: dict = {"segments": len(batch.segments), "bytes": sum(s["size"] for s in batch.segments)}
    with store_lock(store, DELTA_WRITER_LOCK, f"the transform of batch {batch.batch_id}",
                    wait_s=config.delta_lock_wait_s, ttl_s=config.delta_lock_ttl_s):
        if batch.snapshot:
            counters.update(events=snapshot_outbox(config, root, schema, batch, hook))
        elif batch.backfill.get("purpose") == "reemit":
            counters.update(events=reemit_outbox(config, root, batch, hook))
        elif batch.backfill.get("mode") in LOADS:
            counters.update(_run_transform(config, store, root, schema, batch, hook, spark))
        elif batch.sweep or not batch.segments:
            from cdc_lib.sinks.delta import DeltaRsStateStore, run_store_batch
            st = DeltaRsStateStore(root, config.delta_options(), app_id=config.app_id, fail_hook=hook)
            res = run_store_batch(st, schema, [], batch_id=batch.batch_id, batch_seq=batch.batch_seq,
                                  now=batch.now, prev_now=batch.prev_now, cluster=config.cluster)
            counters.update(events=res["events"], partitions_written=sum(res["tables"].values()))
        else:
            counters.update(_run_transform(config, store, root, schema, batch, hook, spark))
    quarantined = quarantined_records(store, config.cluster, batch.segments, batch.batch_id)
    damaged_segments = sorted({(q["node"], q["segment"]) for q in quarantined if q["kind"] in DAMAGE_KINDS})
    counters.update(
        quarantined_entries=len(quarantined),
        damaged=sum(1 for q in quarantined if q["kind"] in DAMAGE_KINDS),
        unknown_table_entries=sum(1 for q in quarantined if q["kind"] == "unknown_table"),
        damaged_segments=len(damaged_segments),
        duration_s=round(time.monotonic() - t0, 3))
    for q in quarantined:
        log.warning("transform: quarantined %s (%s: %s)", q["key"], q["kind"], q["reason"])
    batch.steps["transform"] = counters
    batch.steps["quarantined"] = quarantined
    fault("transform:done")
    batch.state = "transformed"
    save_batch(store, batch)
    record_metrics(store, "transform", counters)
    return batch


def _run_transform(config: PipelineConfig, store: ObjectStore, root: str, schema, batch: Batch, hook,
                   spark) -> dict:
    """The Spark job of a batch with segments, token ranges to scan or SSTables, where ``transform_mode`` says;
    returns its counters."""
    mode = transform_mode(config, batch)
    load = batch.backfill.get("mode")
    if load not in LOADS:
        load = None
    if mode == "spark-submit" and load == "cql":
        raise ConfigError("a cql backfill batch runs in the transform's own process or Spark session, not with "
                          "spark-submit (the job would need the Cassandra credentials): set spark_submit false "
                          "for the cassandra_cdc runs of the backfill")
    if mode == "spark-submit":
        if config.schema_source != "cql":
            raise ConfigError("spark_submit runs the job with a schema file: set schema_source 'cql' and "
                              "schema_file (the job cannot reach Cassandra for the schema)")
        keystore = [arg for flag, value in (("--keystore", config.keystore),
                                            ("--keystore-password-file", config.keystore_password_file),
                                            ("--key-password-file", config.key_password_file)) if value
                    for arg in (flag, str(value))]      # paths only: the passwords stay in their files or env
        res = run_job(config, ["--store-url", store.url, "--batch-id", batch.batch_id, "--schema-file",
                               str(config.schema_file), "--cluster", config.cluster, "--app-id", config.app_id,
                               *keystore])
        return {"mode": mode, "events": res.get("events", 0), "events_by_engine": res.get("events_by_engine", {}),
                "state_rows_written": sum(res.get("tables", {}).values()), "job_stages_s": res.get("timings", {})}
    from cdc_lib.spark.merge_job import run_batch
    counters: dict = {"mode": mode}
    session = None
    if mode == "spark":
        t1 = time.monotonic()
        session = spark or spark_session(config)
        counters["spark_start_s"] = round(time.monotonic() - t1, 3)
    if load == "cql":
        b = batch.backfill
        sources, checksums = scan_sources(batch), None
        extra = dict(create_op="r", scan_settings=scan_settings(config, b["consistency"], b["page_size"]),
                     parallelism=b["parallelism"],
                     on_loaded=lambda loaded: record_horizons(store, config.cluster, loaded))
    elif load == "sstables":
        sources, checksums = sstable_sources(store, batch), None
        extra = dict(create_op="r")
    else:
        sources, checksums = segment_sources(store, batch)
        extra = dict(horizons=read_horizons(store, config.cluster), parallelism=SEGMENT_READERS)
    res = run_batch(session, sources, root=root, storage_options=config.delta_options(), schema=schema,
                    batch_id=batch.batch_id, batch_seq=batch.batch_seq, now=batch.now, prev_now=batch.prev_now,
                    cluster=config.cluster, app_id=config.app_id, store_url=store.url,
                    store_options=config.fs_options(), checksums=checksums, keys=encryption_keys(config),
                    fail_hook=hook, **extra)
    counters.update(events=res.events, events_by_engine=res.events_by_engine,
                    state_rows_written=sum(res.tables.values()))
    if load == "cql":
        counters.update(loaded=load_progress(store, batch, res.loaded), scanned_ranges=len(res.loaded),
                        scanned_rows=sum(s["rows"] for s in res.loaded))
    elif load == "sstables":
        counters.update(loaded=load_progress(store, batch, res.loaded), sstables=len(res.loaded),
                        sstable_bytes=sum(s["bytes"] for s in res.loaded), damaged_sstable_entries=len(res.damaged))
        for key in res.damaged:
            log.warning("transform: quarantined %s (damaged bytes in an SSTable of the snapshot)", key)
    return counters


# ------------------------------------------------------------------------------------------------ 3. publish

def _codec(config: PipelineConfig, store):
    """None for JSON (the outbox's own bytes are published), else the Avro codec."""
    if config.kafka_format == "json":
        return None
    if config.kafka_format != "avro":
        raise ConfigError(f"kafka_format {config.kafka_format!r}: use 'json' or 'avro'")
    from cdc_lib.sinks.kafka import AvroCodec, schema_registry_client
    registry = (schema_registry_client(config.schema_registry_url, config.schema_registry_config)
                if config.schema_registry_url else None)
    return AvroCodec(registry, schema_store=store)


def _outbox_events(config: PipelineConfig, root: str, batch: Batch, tally: dict, codec=None) -> list:
    """The batch's outbox rows as ``sinks.kafka.OutboxEvent``: the JSON bytes exactly as the outbox holds them, or
    the same events in Avro (``sinks.kafka.avro_from_json_outbox`` restores the typed values)."""
    import pyarrow as pa

    from cdc_lib.sinks.delta import read_outbox_table
    from cdc_lib.sinks.kafka import OutboxEvent, avro_from_json_outbox, table_topic
    schema = load_schema(config) if codec is not None else None
    rows = read_outbox_table(root, batch.batch_id, config.delta_options())
    # Column by column: JSON keys and values as the UTF-8 bytes Arrow holds them (no str decode and re-encode).
    as_bytes = pa.binary() if codec is None else pa.string()
    ids, keyspaces, tables, ops, keys, values = (
        rows.column(c).cast(as_bytes).to_pylist() if c in ("key_json", "event_json") else rows.column(c).to_pylist()
        for c in ("event_id", "keyspace", "table", "op", "key_json", "event_json"))
    tombstones = config.publishes_tombstones
    counts = collections.Counter(zip(keyspaces, tables, ops))     # (keyspace, table, op) -> events
    if codec is None and not (tombstones and any(op == "d" for _, _, op in counts)):
        # JSON and no tombstone to add (the usual case): an event per row, seq = row number, built a column at a
        # time (2.1-2.3 us an event for 200,000 events against 3.1 us for the loop below)
        topic_of = {pair: table_topic(config.topic_prefix, *pair) for pair in set(zip(keyspaces, tables))}
        out = list(map(OutboxEvent, ids, map(topic_of.__getitem__, zip(keyspaces, tables)), keys, values,
                       range(len(ids))))
        _tally(tally, counts)
        return out
    topics: dict = {}           # (keyspace, table) -> (topic, schema table)
    out = []
    seq = 0
    for event_id, ks, name, op, key, value in zip(ids, keyspaces, tables, ops, keys, values):
        target = topics.get((ks, name))
        if target is None:
            target = topics[(ks, name)] = (table_topic(config.topic_prefix, ks, name),
                                           None if codec is None else _avro_table(schema, ks, name, event_id))
        topic, table = target
        if codec is not None:
            key, value = avro_from_json_outbox(codec, table, topic, key, value)
        out.append(OutboxEvent(event_id, topic, key, value, seq))
        seq += 1
        if tombstones and op == "d":
            out.append(OutboxEvent(f"{event_id}.tombstone", topic, key, None, seq))
            seq += 1
    _tally(tally, counts)
    return out


def _tally(tally: dict, counts: collections.Counter) -> None:
    """Add a batch's events per (keyspace, table, op) to the publish step's ``tally``."""
    for (ks, name, op), n in counts.items():
        tally["by_op"][op] = tally["by_op"].get(op, 0) + n
        tname = f"{ks}.{name}"
        tally["by_table"][tname] = tally["by_table"].get(tname, 0) + n
        table_ops = tally["by_table_op"].setdefault(tname, {})
        table_ops[op] = table_ops.get(op, 0) + n


def _avro_table(schema, keyspace: str, name: str, event_id: str):
    """The schema's table of an outbox row to encode as Avro; PipelineError when Avro cannot carry its events."""
    table = schema.by_name(keyspace, name)
    if table is None:
        raise PipelineError(f"publish: table {keyspace}.{name} of event {event_id} is not in the schema; cannot "
                            "encode it as Avro")
    hashed = [c.name for c in table.columns.values() if c.mask is not None and
              c.mask.function == "mask_hash" and c.type.kind not in ("blob", "text", "ascii")]
    if hashed:
        raise PipelineError(f"publish: {table.qualified_name}.{hashed[0]} is masked with mask_hash, whose "
                            f"result is a blob, not the column's {table.columns[hashed[0]].type.cql}: the "
                            "table's Avro schema cannot carry it; use kafka_format json or another mask")
    return table


def transactional_id(config: PipelineConfig) -> str:
    """The Kafka transactional id of a pipeline (``kafka_transactions``): stable across its runs, so each run fences
    the producers of runs that crashed, and its own: pipelines publishing other prefixes or clusters never fence
    each other."""
    return f"{config.app_id}.{config.topic_prefix}.{config.cluster}"


def publisher_for(config: PipelineConfig, store: ObjectStore, fault: Fault = no_fault):
    """The ``sinks.kafka.KafkaPublisher`` of the pipeline's settings, its ledger in ``store``."""
    from cdc_lib.sinks.kafka import KafkaPublisher
    hook = None if fault is no_fault else lambda point, **info: fault(f"publish:{point}")
    return KafkaPublisher(config.kafka_bootstrap, store, ledger_prefix=Layout.LEDGER,
                          num_partitions=config.kafka_partitions,
                          replication_factor=config.kafka_replication_factor,
                          topic_config=config.kafka_topic_config, client_config=config.kafka_config,
                          transactional_id=transactional_id(config) if config.kafka_transactions else None,
                          timeout_s=config.kafka_timeout_s, fault=hook)


def publish(config: PipelineConfig, batch, *, fault: Fault = no_fault, publisher=None) -> Batch:
    """Publish the batch's outbox to Kafka exactly once (``sinks.kafka.KafkaPublisher``). ``publisher``: one
    from ``publisher_for`` with the same settings and fault, kept by the caller across batches (its clients'
    connections, topics known and transactions started are then paid once); else one is made and closed here."""
    store = open_store(config)
    batch = reload_batch(store, batch)
    if batch.empty:
        return batch
    if batch.state == "claimed":
        raise PipelineError(f"publish: batch {batch.batch_id} is not transformed yet")
    if STATES.index(batch.state) >= STATES.index("published"):
        log.info("publish: %s already published", batch.batch_id)
        return batch
    codec = _codec(config, store)
    t0 = time.monotonic()
    fault("publish:before")
    tally: dict = {"by_op": {}, "by_table": {}, "by_table_op": {}}
    # An event object per outbox row, all held until Kafka has them: acyclic, and the cyclic collector would only
    # rescan them.
    with gc_paused():
        events = _outbox_events(config, delta_root(config, store), batch, tally, codec)
        own = publisher is None
        publisher = publisher_for(config, store, fault) if own else publisher
        try:
            res = publisher.publish_batch(batch.batch_id, events)
        finally:
            del events
            if own:
                publisher.close(deliver=False)
    in_kafka = time.time()
    # Lag per segment, to its events in Kafka: from its close on the node (end_to_end_lag_seconds; clocks of node
    # and pipeline host both count) and from its arrival in the store (lag_seconds). A batch published before (a
    # rerun) adds none: its events were in Kafka already. A replay's segments (no shipped_at) are not lag.
    streamed = [] if res.skipped else [s for s in batch.segments if "shipped_at" in s]
    lags = [max(0.0, in_kafka - s["shipped_at"]) for s in streamed]
    end_to_end = [max(0.0, in_kafka - s["closed_at"]) for s in streamed if "closed_at" in s]
    counters = {"events": res.events, "produced": res.produced, "already_in_kafka": res.already_in_kafka,
                "skipped_duplicates": res.already_in_kafka, "ledger_skipped": int(res.skipped),
                "by_op": tally["by_op"], "by_table": tally["by_table"], "by_table_op": tally["by_table_op"],
                "lag_max_s": round(max(lags), 3) if lags else None,
                "end_to_end_lag_max_s": round(max(end_to_end), 3) if end_to_end else None,
                "segments_without_close_time": len(streamed) - len(end_to_end),
                "duration_s": round(time.monotonic() - t0, 3)}
    fault("publish:done")
    batch.steps["publish"] = counters
    batch.state = "published"
    save_batch(store, batch)
    record_metrics(store, "publish", counters, {"lag_seconds": lags, "end_to_end_lag_seconds": end_to_end})
    return batch


# ------------------------------------------------------------------------------------------------ 4. archive

def archive(config: PipelineConfig, batch, *, fault: Fault = no_fault) -> Batch:
    """Move the batch's segments out of ``incoming/``: only after Kafka has every event of the batch."""
    store = open_store(config)
    batch = reload_batch(store, batch)
    if batch.empty:
        return batch
    if batch.state == "archived":
        return batch
    if batch.state != "published" or not store.exists(Layout.ledger(batch.batch_id)):
        raise PipelineError(f"archive: batch {batch.batch_id} is not published (state {batch.state}); "
                            "nothing archived")
    t0 = time.monotonic()
    fault("archive:before")
    if batch.backfill:      # a replay's segments were read from archived/ and stay there; a scan has none
        return _finish_archive(store, batch, {"archived": 0, "quarantined_segments": 0,
                                              "replayed_segments": len(batch.segments)}, t0, fault)
    damaged: dict = {}
    for q in batch.steps.get("quarantined", []):
        if q["kind"] in DAMAGE_KINDS:
            damaged.setdefault((q["node"], q["segment"]), []).append(
                {"position": q["position"], "kind": q["kind"], "reason": q["reason"], "entry_key": q["key"]})

    def move(s: dict) -> str:
        if (s["node"], s["name"]) in damaged:
            dst = Layout.quarantined(config.cluster, s["node"], s["name"])
            store.quarantine(s["key"], dst, {
                "batch_id": batch.batch_id, "segment": s["name"], "node": s["node"], "checksum": s["checksum"],
                "reason": "damaged bytes; the readable entries were processed, the damaged ones are quarantined "
                          "separately (entry_key)",
                "damage": damaged[(s["node"], s["name"])]})
            return "quarantined_segments"
        # the sidecar and the ETag as claim read them (the bytes the batch processed were checked against that
        # checksum): two requests less per segment; a batch claimed by an older version asks again
        sidecar = (s["checksum"], s["attributes"]) if "attributes" in s else None
        listed = (s["size"], s["etag"]) if sidecar and "etag" in s else None
        store.move(s["key"], Layout.archived(config.cluster, s["node"], s["name"]), keep_source=True,
                   sidecar=sidecar, listed=listed)
        return "archived"

    # Each move is independent (copy, verify, dst's sidecar: crash-safe on its own) and mostly waits on the store:
    # several at once. The fault point is reached in this thread, once per segment moved. The archived segments'
    # sources are deleted together at the end (two requests on S3, not two per segment): until then a segment is
    # complete in both places, and a rerun after a crash moves it again.
    counters = {"archived": 0, "quarantined_segments": 0}
    with ThreadPoolExecutor(min(ARCHIVE_THREADS, len(batch.segments) or 1), thread_name_prefix="cdc-archive") as pool:
        moves = [pool.submit(move, s) for s in batch.segments]
        try:
            for done in as_completed(moves):
                counters[done.result()] += 1
                fault("archive:segment")
        except BaseException:
            for m in moves:
                m.cancel()      # the moves not begun; those under way finish (each is whole or not begun)
            raise
    store.delete_many([s["key"] for s in batch.segments if (s["node"], s["name"]) not in damaged])
    return _finish_archive(store, batch, counters, t0, fault)


def _finish_archive(store: ObjectStore, batch: Batch, counters: dict, t0: float, fault: Fault) -> Batch:
    counters["duration_s"] = round(time.monotonic() - t0, 3)
    batch.steps["archive"] = counters
    batch.state = "archived"
    save_batch(store, batch)
    fault("archive:done")
    record_metrics(store, "archive", counters)
    return batch


# ------------------------------------------------------------------------------------------------ whole runs

def run_once(config: PipelineConfig, run_id: str = "", *, fault: Fault = no_fault, spark=None) -> Batch:
    """claim -> transform -> publish -> archive in this process (what one DAG run does)."""
    batch = claim(config, run_id, fault=fault)
    if batch.empty:
        return batch
    batch = transform(config, batch, fault=fault, spark=spark)
    batch = publish(config, batch, fault=fault)
    return archive(config, batch, fault=fault)


class _Batches:
    """Batch after batch through the four steps in this process (``run_for``, ``run_until_idle``).

    With ``overlap_batches``, a transformed batch is published and archived on a second thread while the next one
    is claimed and transformed. The halves use different things: the transform the cores and the Delta tables,
    publish and archive mostly the round trips to Kafka and the store; one after the other, each half leaves the
    machine idle while it waits. Only one batch is in flight, and it is finished before the next one publishes,
    so Kafka gets batches in order; claim leaves the in-flight batch's segments alone and, after a crash, resumes
    the older unfinished batch first. Without it, each batch is finished before the next is claimed. One Kafka
    publisher serves all the batches: its clients connect, and its transactions start, once.

    Use as a context manager: on the way out the batch in flight finishes (its error is raised, unless one is
    already on its way out), and ``done`` holds the finished batches in order.
    """

    def __init__(self, config: PipelineConfig, run_id: str, fault: Fault, spark):
        self.config, self.run_id, self.fault, self.spark = config, run_id, fault, spark
        self.done: list = []
        self._pool = (ThreadPoolExecutor(1, thread_name_prefix="cdc-publish") if config.overlap_batches
                      else None)
        self._in_flight: Optional[tuple] = None      # (batch, the future of its publish and archive)
        self._publisher = None      # one for all the batches (``publisher_for``), made by the first publish

    def take(self) -> Batch:
        """Claim and transform the next batch, and publish and archive it (on the second thread: started, not
        waited for); returns the claimed batch, empty when there was nothing to do."""
        in_flight = self._in_flight[0] if self._in_flight is not None else None
        batch = claim(self.config, self.run_id, fault=self.fault, in_flight=in_flight)
        if batch.empty:
            return batch
        batch = transform(self.config, batch, fault=self.fault, spark=self.spark)
        self.land()
        if self._pool is None:
            self.done.append(self._finish(batch))
        else:
            self._in_flight = (batch, self._pool.submit(self._finish, batch))
        return batch

    def _finish(self, batch: Batch) -> Batch:
        if self._publisher is None:
            self._publisher = publisher_for(self.config, open_store(self.config), self.fault)
        batch = publish(self.config, batch, fault=self.fault, publisher=self._publisher)
        return archive(self.config, batch, fault=self.fault)

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def land(self) -> None:
        """Wait for the batch in flight to be archived (its error is raised here)."""
        if self._in_flight is not None:
            future = self._in_flight[1]
            self._in_flight = None
            self.done.append(future.result())

    def __enter__(self) -> "_Batches":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.land()
            elif self._in_flight is not None:
                # the transform of the next batch failed: the batch before still finishes (nothing is left for the
                # rerun that need not be), and the transform's error is the one raised
                try:
                    self.land()
                except Exception:  # noqa: BLE001 - logged; the error already on its way out is the one raised
                    log.exception("the batch in flight failed too, after %s", exc_type.__name__)
        finally:
            if self._pool is not None:
                self._pool.shutdown()
            if self._publisher is not None:
                self._publisher.close(deliver=False)    # each publish waited for Kafka to have its batch


def run_for(config: PipelineConfig, seconds: float, run_id: str = "", *, fault: Fault = no_fault, spark=None,
            clock=time.monotonic, sleep=time.sleep) -> list:
    """Take batches for ``seconds``, in this process; returns the batches processed.

    What a scheduled run does after its first batch (``follow_schedule``), so that a segment uploaded during the
    schedule interval waits for the next poll, not for the next run: batches follow one another while claim finds
    work (overlapping: ``_Batches``); when it finds none, ``incoming/`` is listed every ``follow_poll_s`` and claim
    runs again once the listing changed (or while an upload is incomplete), so an idle window writes nothing to the
    store. No new batch starts after ``seconds``; the batches in flight then finish. What is paid once per process
    is paid once per window: the imports, the store client, and the Spark session when a batch runs on Spark.

    Each batch goes through the same steps as a run_once (claim's manifest and pointer first), so a crash anywhere
    leaves batches that the next claims resume, exactly as after a crashed run. ``clock``/``sleep``: monotonic
    seconds and waiting (tests pass their own).
    """
    deadline = clock() + seconds
    store = open_store(config)
    incoming = Layout.area_prefix(Layout.INCOMING, config.cluster)
    idle_listing = None         # incoming/ as the last claim that found nothing saw it
    with _Batches(config, run_id, fault, spark) as batches:
        while clock() < deadline:
            listing = store.list(incoming)
            if listing != idle_listing:
                batch = batches.take()
                if not batch.empty:
                    idle_listing = None
                    continue
                if batches.in_flight:
                    # nothing to overlap it with: the batch in flight finishes now, and the next poll claims
                    # again, with its segments gone from the listing
                    batches.land()
                    idle_listing = None
                else:
                    # an upload still without its sidecar completes without changing the listing: look again at
                    # the next poll
                    idle_listing = None if batch.steps["claim"].get("incomplete_uploads") else listing
            sleep(max(0.0, min(config.follow_poll_s, deadline - clock())))
    return batches.done


def run_until_idle(config: PipelineConfig, *, max_runs: int = 100, spark=None, fault: Fault = no_fault) -> list:
    """Take batches (overlapping: ``_Batches``) until claim finds nothing to do; returns the batches processed."""
    with _Batches(config, "", fault, spark) as batches:
        for _ in range(max_runs):
            if batches.take().empty:
                break
    return batches.done
