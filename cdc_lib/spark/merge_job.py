"""Spark step of the pipeline: one batch of commit-log segments -> Delta state tables and the events outbox.

Runs under ``spark-submit`` (the entry point ``spark_jobs/merge_batch.py``, which the pipeline's ``spark_submit``
mode runs for a claimed batch) and in-process (``run_batch(spark_session(config), ...)``).

Segments are read by whoever decodes them, straight from the store: a local path in place, an object-store URL
(``s3://bucket/cdc/incoming/...``) downloaded by the executor itself (fsspec) into a private temporary file and
checked against the sha256 the batch claimed it with. Nothing is staged through the driver, so a cluster needs no
shared filesystem. A backfill batch has other sources (``source_descriptors``): token ranges of live tables to
scan (``cdc_lib.scan``, the ``cql`` mode) or the SSTables of a snapshot (``cdc_lib.sstable``, the ``sstables``
mode), each read the same way by whoever parses it, into the same cell log; its rows that become visible are
``r`` events (``create_op``).

Data path on Spark (nothing proportional to the batch passes through the driver):

1. **Parse**, segments spread over tasks: the segment list is parallelised in consecutive slices (one per
   segment, at most ``PARSE_TASKS_PER_CORE`` per core: a task has a fixed cost of ~0.1-0.3 s here) and
   ``mapInArrow`` runs ``celllog.read_cell_log`` in the executor. Damaged or undecodable entries are written
   to quarantine by the executor that found them (``storage.Layout.quarantined``, key
   ``quarantined/<cluster>/<node>/<segment>.<position>.<kind>`` plus its ``.reason.json``; the key is
   deterministic, so a retried task rewrites the same object); only a one-row summary per damage (key and
   reason, not the bytes) flows on, so the driver can report them.
2. **Group** by partition: ``repartitionByRange`` into one key range per core of the job and
   ``sortWithinPartitions`` on ``GROUP_ORDER`` (keyspace, table, table id, token, partition key: publish order),
   so each partition's records are contiguous in one task, each task holds one key range and each window's
   prior-state read one token range. Partitions whose
   TTLs run out in ``(prev_now, now]`` join as marker rows (their keys come from the state tables'
   ``_cdc_next_expiry``: the driver holds that key list, bounded by the number of partitions expiring in the
   window).
3. **Reconcile**, ``mapInArrow`` again: per window of up to ``READ_AHEAD_PARTITIONS`` partitions and about
   ``READ_AHEAD_BYTES`` (a token range) the executor reads the prior state of exactly those keys with deltalake,
   once per table (pinned to the table versions the driver saw at the start, so every task and a recomputed task
   read the same state); per chunk of up to ``CHUNK_PARTITIONS`` partitions of the window it runs the compiled state
   engine over the chunk's Arrow rows per table (``sinks.delta.table_outputs``, when ``CASSANDRA_CDC_NATIVE``
   allows; a backfill's tables, with their ``r`` events and scan horizons, stay in Python) or
   ``state.batch.process_partition`` per partition (replica copies dropped in both: the copy kept is the one
   with the smallest source position, a choice Spark's ``dropDuplicates`` cannot make deterministically, and it
   saves a second shuffle), and emits events (one row each, with their sort key) and state change rows (Arrow
   IPC blobs per table and chunk: tables have different typed schemas), both in publish order within the task.
   The result is cached (memory and disk) for step 4.
4. **Write** with delta-spark (``sinks.delta_spark.DeltaSparkStateStore``), in the executors: the events of the
   range-partitioned tasks, concatenated in partition order, are already in publish order, so each task numbers
   its own events (``seq``) from an offset the driver computed from the per-task counts, and appends them to the
   outbox in one commit; then each state table is one ``MERGE INTO`` whose source decodes the table's change-row
   blobs in the executors. The driver holds per-task counts, per-table row counts and the damage keys.

Small batches (``driver_batch_max_bytes`` of segments on a local master: the transform step decides, and calls
``run_batch`` without a session) run steps 1-3 in the calling process and write with delta-rs
(``sinks.delta.DeltaRsStateStore``): the same parse and reconcile functions over the same key order, without a
JVM, task launches or Arrow <-> JVM conversion, and each table's stored rows read once for the whole batch
(``ReadAhead``) rather than once per chunk. The outputs are the same either way (tested).
``LAST_TIMINGS`` holds the last run's seconds per stage.

Atomicity and reruns: see ``cdc_lib.sinks.delta`` (each commit carries the app transaction ``(app_id, batch_seq)``;
committed tables are skipped; the outbox first).
"""
from __future__ import annotations

import io
import itertools
import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_lib.celllog.schema import CELL_LOG_SCHEMA
from cdc_lib.sinks.delta import (OUTBOX_SCHEMA, DeltaRsStateStore, change_rows, merge_source_schema, outbox_row,
                                 rows_to_arrow, states_from_rows, table_outputs)
from cdc_lib.state.batch import process_partition, table_order
from cdc_lib.state.events import OP_CREATE

CHUNK_PARTITIONS = 20_000      # partitions per call of a state engine in a reconcile task (bounds its working set)
# A Spark task reads the stored rows of a window of partitions at once (``ReadAhead``): a state file holds rows of the
# whole ring, so a read decodes every file however few partitions it asks for. A window holds at most this many
# partitions, and about READ_AHEAD_BYTES of input and stored rows (sized by the window before; the first is a chunk)
READ_AHEAD_PARTITIONS = 200_000
READ_AHEAD_BYTES = 256 << 20
RESULT_PREFIX = "cdc-batch-result: "    # the job's last stdout line: this, then its BatchResult as JSON
SWEEP_KIND = "_sweep"          # marker row: load and sweep this partition even without records
REC_CELL, REC_DAMAGE, REC_LOADED = "cell", "damage", "loaded"

log = logging.getLogger(__name__)
LAST_TIMINGS: dict = {}    # seconds per stage of the last ``run_batch`` in this process (benchmarks read it)


@contextmanager
def _timed(timings: dict, stage: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - t0


def _all_nullable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable (Spark's types, and rows with most columns null, need it)."""
    return pa.schema([pa.field(f.name, f.type, nullable=True) for f in schema])


PARSED_SCHEMA = pa.schema(list(_all_nullable(CELL_LOG_SCHEMA)) + [
    pa.field("_record", pa.string()),
    pa.field("_quarantine_key", pa.string()),
    pa.field("_damage_reason", pa.string()),
    pa.field("_loaded", pa.string()),         # a token range scanned or an SSTable read: what it held (JSON,
                                              # ``_load_summary``)
])

OUT_SCHEMA = pa.schema([
    pa.field("out_kind", pa.string()),          # event | state
    pa.field("table_id", pa.string()),
    pa.field("t_keyspace", pa.string()),
    pa.field("t_name", pa.string()),
    pa.field("token", pa.int64()),
    pa.field("partition_key", pa.binary()),
    pa.field("idx", pa.int32()),
    pa.field("event_id", pa.string()),
    pa.field("op", pa.string()),
    pa.field("key_json", pa.string()),
    pa.field("event_json", pa.string()),
    pa.field("ts_us", pa.int64()),
    pa.field("ts_ms", pa.int64()),
    pa.field("payload", pa.binary()),           # state: Arrow IPC stream of change rows
    pa.field("n_rows", pa.int64()),
    # event: the state engine that made it, as ``BatchResult.events_by_engine`` names them: ``compiled``, the
    # compiled engine's path (``sinks.delta.table_outputs``: the partitions it doubts run in Python inside it), or
    # ``python`` (``state.batch.process_partition``: the compiled engine is off or missing, or a backfill table)
    pa.field("engine", pa.string()),
])
GROUP_ORDER = ("keyspace", "table", "table_id", "token", "partition_key")      # cell log columns
# the rows reconcile takes: the cell log's, and the marks of partitions to sweep (``SWEEP_KIND``, most columns null)
CELL_ROWS_SCHEMA = _all_nullable(CELL_LOG_SCHEMA)
EVENT_ORDER = ("t_keyspace", "t_name", "table_id", "token", "partition_key", "idx")     # publish order
EVENT_COLUMNS = ("event_id", "t_keyspace", "t_name", "op", "key_json", "event_json", "ts_us", "ts_ms")
EVENT_SCHEMA = pa.schema([OUT_SCHEMA.field(c) for c in EVENT_COLUMNS])
PARSE_TASKS_PER_CORE = 2
OUTBOX_CHUNK = 10_000          # outbox rows per Arrow batch handed to the Delta writer
MERGE_THREADS = 4              # state tables MERGEd at once by a transform without Spark (each waits on the store)


@dataclass
class BatchResult:
    batch_id: str
    batch_seq: int
    segments: int
    events: int = 0
    outbox_written: bool = False
    tables: dict = field(default_factory=dict)      # qualified name -> change rows merged
    skipped_tables: list = field(default_factory=list)
    damaged: list = field(default_factory=list)     # quarantine keys
    loaded: list = field(default_factory=list)      # token ranges scanned, SSTables read (``_load_summary``)
    # events per state engine (``OUT_SCHEMA``'s ``engine``), counted where they were made (the driver or the Spark tasks): how an
    # operator sees that the compiled engine really ran, on every executor. A retried Spark task's events are
    # counted once (Spark keeps one attempt's output).
    events_by_engine: dict = field(default_factory=dict)


def _spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema
    return from_arrow_schema(_all_nullable(schema))


# -------------------------------------------------------------------------------------------- executors

def segment_source(source: str, checksum: Optional[str], store_options: dict):
    """What ``read_cell_log`` reads for segment ``source``: a local path as it is; an object-store URL's bytes
    (``commitlog.segment.SegmentBytes``, named as its file), read in one request and checked against ``checksum``
    (sha256 hex) when given.

    In memory, not into a local file: a segment is at most ``commitlog_segment_size`` (32 MiB by default) and a
    task reads one at a time. A copy on disk cost a HEAD request, a private directory, the page cache's pages and
    removing them afterwards: 42 generated segments (44 MB) downloaded from the embedded S3 server and decoded on
    2 threads took 0.50-0.62 s and 0.56-0.71 s of CPU that way, 0.45-0.58 s and 0.52-0.66 s in memory.
    """
    if "://" not in source or source.startswith("file://"):
        return source.removeprefix("file://")
    import fsspec

    from cdc_lib.commitlog.segment import SegmentBytes
    from cdc_lib.storage.objects import read_object, sha256_bytes
    fs, path = fsspec.core.url_to_fs(source, **store_options)
    data = read_object(fs, path)
    _check_download(source, sha256_bytes(data), checksum)
    return SegmentBytes(source.rsplit("/", 1)[-1], data)


def _download(source: str, checksum: Optional[str], store_options: dict, path: str) -> None:
    """Write the bytes of ``source`` (an object-store URL) to the new file ``path``, checked against ``checksum``
    (sha256 hex) when given."""
    import hashlib

    import fsspec
    digest = hashlib.sha256()
    with fsspec.open(source, "rb", **store_options) as src, open(path, "xb") as out:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    _check_download(source, digest.hexdigest(), checksum, "file")


def _check_download(source: str, digest: str, checksum: Optional[str], what: str = "segment") -> None:
    """VerificationError when the copy read of ``source`` (sha256 ``digest``) is not what the batch claimed (a
    ``what`` with sha256 ``checksum``)."""
    from cdc_lib.storage.objects import VerificationError
    if checksum is not None and digest != checksum:
        raise VerificationError(f"{source}: the copy read hashes to {digest}, the batch claimed the {what} with "
                                f"sha256 {checksum}")


def _parse_sources(schema, store_url: str, store_options: dict, cluster: str, batch_id: str, scan_settings=None,
                   keys=None):
    """The ``mapInArrow`` function of step 1 (a closure shipped to executors): rows of ``source`` (a source as
    JSON: a segment's path or URL, a token range to scan or an SSTable, see ``source_descriptors``) in; cell-log
    rows, one summary row per damage and one per token range or SSTable out. ``keys``: the ``EncryptionKeys`` of
    encrypted segments (shipped with the closure: the executors decrypt)."""

    def parse(batches):
        from cdc_lib.celllog.reader import read_cell_log
        from cdc_lib.storage.objects import ObjectStore
        from cdc_lib.storage.quarantine import quarantine_damage
        store = None
        for b in batches:
            for text in b.column("source").to_pylist():
                src = json.loads(text)
                if src["kind"] == "cql":
                    if store is None:
                        store = ObjectStore.from_url(store_url, **store_options)
                    yield from _scanned_cells(schema, store, scan_settings, src)
                    continue
                damages = []
                if src["kind"] == "sstable":
                    source = f"{src['node']}/{src['source'].rsplit('/', 1)[-1]}"   # quarantined under its node
                    yield from _sstable_cells(schema, store_options, src, damages)
                else:
                    source = src["path"]
                    segment = segment_source(source, src.get("checksum"), store_options)
                    for cells in read_cell_log(segment, schema, keys=keys, on_damage=damages.append, cdc_only=True):
                        yield _parsed_cells(cells)
                if not damages:
                    continue
                if store is None:
                    store = ObjectStore.from_url(store_url, **store_options)
                rows = []
                for d in damages:
                    key = quarantine_damage(store, cluster, d, source_path=source, batch_id=batch_id)
                    rows.append({"segment": d.segment or "", "segment_id": 0, "position": d.position,
                                 "entry_index": 0, "seq": 0, "table_id": "", "keyspace": "", "table": "",
                                 "partition_key": b"", "token": 0, "clustering": b"", "is_static": False,
                                 "kind": d.kind, "timestamp": 0, "ttl": 0, "local_deletion_time": 0,
                                 "_record": REC_DAMAGE, "_quarantine_key": key, "_damage_reason": d.reason})
                yield pa.RecordBatch.from_pylist(rows, schema=PARSED_SCHEMA)
    return parse


def _scanned_cells(schema, store, settings, src: dict):
    """The cell-log rows of one token range of a live table (``cdc_lib.scan``; scanned once, then read from the
    store), then its summary row (table, rows, whether an earlier scan was read)."""
    from cdc_lib.scan import TableScan, TokenRange, scan_range, scan_session
    from cdc_lib.scan.reader import read_scanned_range
    keyspace, name = src["table"].split(".", 1)
    table = schema.by_name(keyspace, name)
    if table is None:
        from cdc_lib.errors import UnknownTableError
        raise UnknownTableError(f"{src['table']} (to scan) is not in the schema")
    scan = TableScan(table, element_times=src["element_times"])
    rng = TokenRange(src["start"], src["end"])
    t0 = time.monotonic()

    def scan_rows(stats):
        return scan_range(scan_session(settings), scan, rng, settings, src["source"], stats)
    stats: dict = {}
    for cells in read_scanned_range(store, src["key"], scan_rows, stats):
        yield _parsed_cells(cells)
    took = time.monotonic() - t0
    log.info("scan %s: token range %d of %d %s: %d rows in %.1f s%s", src["table"], src["index"] + 1, src["of"],
             f"({rng.start}, {rng.end}]", stats["rows"], took,
             " (the earlier scan, read from the store)" if stats["from_store"] else "")
    yield _loaded_row({"table": src["table"], "table_id": str(table.id), "index": src["index"], "start": rng.start,
                       "end": rng.end, "rows": stats["rows"], "pages": stats["pages"],
                       "from_store": stats["from_store"], "seconds": round(took, 3), "key": src["key"]})


@contextmanager
def sstable_directory(src: dict, store_options: dict):
    """The Data.db path of an SSTable source with its companion files beside it: a local store's files in place;
    an object store's downloaded into ``<new private directory>/<keyspace>/<table>-<id>/`` (the names the reader
    takes the table from), each checked against its sha256."""
    data = next(f for f in src["files"] if f["name"].endswith("-Data.db"))
    if "://" not in data["path"] or data["path"].startswith("file://"):
        yield data["path"].removeprefix("file://")
        return
    from .scratch import private_dir
    with private_dir("sstable", many=True) as directory:    # a killed task's copy: removed by the next task
        target = os.path.join(directory, *data["dir"].split("/"))
        os.makedirs(target)
        for f in src["files"]:
            _download(f["path"], f["checksum"], store_options, os.path.join(target, f["name"]))
        yield os.path.join(target, data["name"])


def _sstable_cells(schema, store_options: dict, src: dict, damages: list):
    """The cell-log rows of one SSTable of a node's snapshot (``cdc_lib.sstable``), then its summary row; damaged
    bytes go to ``damages`` (quarantined by the caller, as a segment's)."""
    from cdc_lib.sstable import read_sstable_cell_log
    t0 = time.monotonic()
    stats: dict = {}
    with sstable_directory(src, store_options) as data_path:
        for cells in read_sstable_cell_log(data_path, schema, on_damage=damages.append, stats=stats):
            yield _parsed_cells(cells)
    took = time.monotonic() - t0
    log.info("load %s: SSTable %s (%d bytes): %d partitions, %d records in %.1f s", src["table"], src["source"],
             src["size"], stats.get("partitions", 0), stats.get("records", 0), took)
    yield _loaded_row({"table": src["table"], "index": src["id"], "bytes": src["size"],
                       "partitions": stats.get("partitions", 0), "records": stats.get("records", 0),
                       "damaged": len(damages), "seconds": round(took, 3)})


def _loaded_row(summary: dict) -> pa.RecordBatch:
    """The summary row of a token range scanned or an SSTable read (``_load_summary`` reads it back)."""
    keyspace, name = summary["table"].split(".", 1)
    return pa.RecordBatch.from_pylist([{
        "segment": "", "segment_id": 0, "position": 0, "entry_index": 0, "seq": 0, "table_id": "",
        "keyspace": keyspace, "table": name, "partition_key": b"", "token": 0, "clustering": b"",
        "is_static": False, "kind": "", "timestamp": 0, "ttl": 0, "local_deletion_time": 0,
        "_record": REC_LOADED, "_loaded": json.dumps(summary)}], schema=PARSED_SCHEMA)


def _parsed_cells(cells) -> pa.RecordBatch:
    """Cell-log rows as rows of ``PARSED_SCHEMA``."""
    n = cells.num_rows
    # a column of one value by repeat: from a Python list of n strings it costs ~0.5 us per record
    return pa.RecordBatch.from_arrays(list(cells.columns) + [pa.repeat(pa.scalar(REC_CELL, pa.string()), n)]
                                      + [pa.nulls(n, pa.string())] * 3, schema=PARSED_SCHEMA)


def source_descriptors(segments, checksums: Optional[dict] = None) -> list:
    """The sources of a batch as the parse step takes them (JSON text): each segment path or URL as
    ``{"kind": "segment", "path", "checksum"}`` (sha256 hex from ``checksums`` to check a download against), and
    a dict (a token range to scan, ``{"kind": "cql", ...}``, or an SSTable, ``{"kind": "sstable", ...}``:
    ``pipeline.bootstrap``) as it is."""
    checksums = checksums or {}
    return [json.dumps(s, sort_keys=True) if isinstance(s, dict) else
            json.dumps({"kind": "segment", "path": str(s), "checksum": checksums.get(str(s))}, sort_keys=True)
            for s in segments]


def _reconcile(schema, root: str, storage_options: dict, app_id: str, versions: dict, now: int,
               prev_now: Optional[int], cluster: str, batch_seq: int, create_op: str, horizons: dict):
    """The ``mapInArrow`` function of step 3 (a closure shipped to executors). ``horizons``: table id -> the
    ``scan.horizon.Horizon`` JSON of a backfill scan (changes older than it make no event).

    Its input arrives sorted by ``GROUP_ORDER``; it is cut into windows (``_WindowSizes``), whose stored rows are
    read once per table (``ReadAhead``), and each window into chunks of ``CHUNK_PARTITIONS``
    partitions, whose tables are reconciled in turn: by the compiled engine (``sinks.delta.table_outputs``, Arrow in
    and out) when ``state.native.enabled()`` in the executor, else, and for a backfill table (``r`` events, a
    scan horizon: the compiled engine does neither), by ``state.batch.process_partition`` per partition. Both
    give the same rows (``tests/test_merge_batch.py``)."""
    import uuid

    from cdc_lib.scan.horizon import Horizon
    from cdc_lib.state import native as native_state
    read_times = {tid: Horizon.from_json(h) for tid, h in horizons.items()}
    cell_names = [f.name for f in CELL_LOG_SCHEMA]

    def python_rows(store, table, tid: str, rows: pa.Table) -> list:
        """OUT_SCHEMA rows (dicts) of one table's partitions in a chunk, by the Python engine."""
        parts = []          # [(partition key, token, records)] in publish order
        for r in rows.to_pylist():
            if not parts or parts[-1][0] != r["partition_key"]:
                parts.append((r["partition_key"], r["token"], []))
            if r["kind"] != SWEEP_KIND:
                parts[-1][2].append(r)
        prior = store.read_partitions(table, [pk for pk, _, _ in parts])
        horizon = read_times.get(tid)
        ks, name = table_order(table)[:2]
        out_rows, change = [], []
        for pk, tok, recs in parts:
            res = process_partition(table, pk, tok, recs, prior.get(pk), now, prev_now=prev_now,
                                    cluster=cluster, create_op=create_op,
                                    quiet_before=horizon.at(tok) if horizon is not None else None)
            for i, e in enumerate(res.events):
                row = outbox_row(table, e, "", 0, 0)
                out_rows.append({"out_kind": "event", "table_id": tid, "t_keyspace": ks, "t_name": name,
                                 "token": tok, "partition_key": pk, "idx": i, "event_id": row["event_id"],
                                 "op": row["op"], "key_json": row["key_json"], "event_json": row["event_json"],
                                 "ts_us": row["ts_us"], "ts_ms": row["ts_ms"], "engine": "python"})
            if res.changed:
                change += change_rows(table, pk, res.prior, res.state, now, batch_seq, tok)
        if change:
            out_rows.append(_state_out_row(table, rows_to_arrow(table, change)))
        return out_rows

    def compiled_rows(store, table, tid: str, rows: pa.Table) -> pa.Table:
        """OUT_SCHEMA rows of one table's partitions in a chunk, by the compiled engine (Arrow only)."""
        sweep = pc.equal(rows.column("kind"), SWEEP_KIND)
        cells = rows.select(cell_names)
        # the chunk's partitions: with records or marked
        keys, tokens, grouping = native_state.partition_keys(rows, threads=_engine_threads())
        expiring = []
        if pc.any(sweep).as_py():       # a copy of the chunk only where marker rows are to be left out
            cells = cells.filter(pc.invert(sweep))
            with_records = pc.unique(cells.column("partition_key"))
            marked = pc.unique(rows.filter(sweep).column("partition_key"))
            expiring = marked.filter(pc.invert(pc.is_in(marked, value_set=with_records))).to_pylist()
        stored = store.read_state_rows(table, keys, tokens=tokens)
        events, source, _ = table_outputs(table, cells, stored, now, prev_now=prev_now, expiring=expiring,
                                          cluster=cluster, batch_seq=batch_seq, threads=_engine_threads(),
                                          grouping=grouping)
        ks, name = table_order(table)[:2]
        n = events.num_rows
        out = pa.table({
            "out_kind": pa.repeat("event", n), "table_id": pa.repeat(tid, n), "t_keyspace": pa.repeat(ks, n),
            "t_name": pa.repeat(name, n), "token": events.column("token"),
            "partition_key": events.column("partition_key"), "idx": events.column("idx").cast(pa.int32()),
            **{c: events.column(c) for c in ("event_id", "op", "key_json", "event_json", "ts_us")},
            # the Python engine's events carry ts_ms = now in ms (process_partition passes no ts_ms)
            "ts_ms": pa.repeat(pa.scalar(now * 1000, pa.int64()), n),
            "payload": pa.nulls(n, pa.binary()), "n_rows": pa.nulls(n, pa.int64()),
            "engine": pa.repeat(pa.scalar("compiled"), n)}, schema=OUT_SCHEMA)
        if source.num_rows:
            out = pa.concat_tables([out, pa.Table.from_pylist([_state_out_row(table, source)], schema=OUT_SCHEMA)])
        return out

    def flush(store, rows: pa.Table) -> list:
        """OUT_SCHEMA batches of a chunk (rows holding whole partitions), tables in publish order."""
        compiled = native_state.enabled() and create_op == OP_CREATE
        out = []
        for tid, mine in _table_runs(rows):          # in order of appearance: publish order
            table = schema.get(uuid.UUID(tid))
            if compiled and tid not in read_times:
                out += compiled_rows(store, table, tid, mine).to_batches()
            else:
                out.append(pa.RecordBatch.from_pylist(python_rows(store, table, tid, mine), schema=OUT_SCHEMA))
        return out

    def reconcile(batches, whole: bool = False):
        """The batches are taken a window of partitions at a time, and each table's stored rows are read once per
        window (``ReadAhead``), then reconciled a chunk at a time. A Spark task's input is a stream: its windows
        are as large as ``_WindowSizes`` says. ``whole``: the batches are the whole batch, in memory (the
        in-process transform, bounded by ``driver_batch_max_bytes``): one window holds them all, and each table's
        stored rows are read once."""
        # a Spark task has one core (``_engine_threads``): its reads pick their rows on its own thread
        store = DeltaRsStateStore(root, storage_options, app_id=app_id, versions=versions,
                                  read_threads=_engine_threads() or 2)
        sizes = _WindowSizes()
        # where the window's partitions begin is found once, as it is cut from the stream, and serves its
        # read-ahead's keys and its chunks (finding them again took 10 of the 23 ms these steps take for a
        # window of 300,000 partitions)
        for window, starts in _partition_runs(batches, float("inf") if whole else sizes.next):
            rows = pa.Table.from_batches(window)
            partitions = batch_partitions(rows, starts)
            ahead = ReadAhead(store, partitions)
            for chunk in _chunks(rows, starts, CHUNK_PARTITIONS):
                yield from flush(ahead, chunk)
            sizes.held(sum(len(keys) for keys, _ in partitions.values()), rows.nbytes + ahead.nbytes)
    return reconcile


class _WindowSizes:
    """How many partitions a Spark task's next window holds: the first a chunk (``CHUNK_PARTITIONS``), each next
    as many as ``READ_AHEAD_BYTES`` holds at the bytes a partition took in the window before (input and stored rows),
    between a chunk and ``READ_AHEAD_PARTITIONS``. A window of wide partitions is then no larger than a chunk was
    when each chunk read its own stored rows."""

    def __init__(self):
        self.limit = CHUNK_PARTITIONS

    def next(self) -> int:
        return self.limit

    def held(self, partitions: int, nbytes: int) -> None:
        per_partition = nbytes / max(partitions, 1)
        self.limit = int(min(READ_AHEAD_PARTITIONS, max(CHUNK_PARTITIONS, READ_AHEAD_BYTES / max(per_partition, 1))))


def _partition_runs(batches, limit):
    """``batches`` (sorted by ``GROUP_ORDER``) as lists of batches, each holding ``limit`` whole partitions (the
    last one the rest): a partition is never split between two lists. ``limit``: a number, or a function giving
    each list's when the list begins. Yields (list, starts): ``starts`` numbers the rows of the list's batches
    taken in order, and says at which of them each of its partitions begins (0 first)."""
    limit_of = limit if callable(limit) else (lambda: limit)
    run: list = []      # input batches of the run's partitions
    run_starts: list = []   # for each, where its partitions begin, as row numbers in the run
    n = 0               # partitions begun in the run
    held = 0            # rows in the run
    last = None         # (table id, partition key) of the last row seen
    cap = limit_of()
    for b in batches:
        if not b.num_rows:
            continue
        starts = _partition_starts(b, last)
        last = (b.column("table_id")[-1].as_py(), b.column("partition_key")[-1].as_py())
        while n + len(starts) > cap:        # the run is full where partition cap + 1 begins
            k = cap - n
            cut = int(starts[k])
            run.append(b.slice(0, cut))
            run_starts.append(starts[:k] + held)
            yield run, np.concatenate(run_starts)
            b, starts, run, run_starts, n, held = b.slice(cut), starts[k:] - cut, [], [], 0, 0
            cap = limit_of()
        run.append(b)
        run_starts.append(starts + held)
        n += len(starts)
        held += b.num_rows
    if run:
        yield run, np.concatenate(run_starts)


def _chunks(rows: pa.Table, starts: np.ndarray, limit: int):
    """``rows`` (whole partitions, beginning at ``starts``, as ``_partition_runs`` gives them) as slices of
    ``limit`` partitions each (the last the rest)."""
    cuts = [*starts[limit::limit].tolist(), rows.num_rows]
    at = 0
    for cut in cuts:
        yield rows.slice(at, cut - at)
        at = cut


class ReadAhead:
    """Reads of a ``DeltaRsStateStore``'s stored rows, each table's answered from one read of all the partitions of
    that table the batch holds, made at its first read (and kept until the batch is reconciled). Reconcile reads
    the prior state chunk by chunk, each chunk one token range; a state file holds rows of the whole ring (MERGE
    and compaction do not cluster them by token), so each chunk's read decoded every file again. In the in-process
    transform the batch is bounded (``driver_batch_max_bytes``) and in memory as a whole: there, one read per
    table. A Spark task's input is a stream: there, one read per table and window (``_WindowSizes``).
    ``partitions``: table id (str) -> (keys, tokens) as ``batch_partitions`` gives them.

    The rows read are kept sorted by token, so that a chunk, a run of the batch's partitions in order, takes its
    rows as a slice: no hashing of the batch's keys for every chunk (about a quarter of a 300,000-partition
    batch's reconcile in chunks of ``CHUNK_PARTITIONS``)."""

    def __init__(self, store: DeltaRsStateStore, partitions: dict):
        self.store = store
        self.partitions = partitions
        self._rows: dict = {}       # table id -> (its stored rows in the batch sorted by token, their tokens)

    def read_state_rows(self, table, keys, columns: Optional[list] = None,
                        tokens: Optional[pa.Array] = None) -> pa.Table:
        if not isinstance(keys, (pa.Array, pa.ChunkedArray)):
            keys = pa.array(list(set(keys)), pa.binary())
        tid = str(table.id)
        batch = self.partitions.get(tid)
        if columns is not None or batch is None:        # other columns, or a table the batch does not hold
            return self.store.read_state_rows(table, keys, columns, tokens=tokens)
        run = _run_of(batch, keys, tokens)
        if run is None and not pc.all(pc.is_in(keys, value_set=batch[0])).as_py():
            return self.store.read_state_rows(table, keys, tokens=tokens)      # a partition the batch does not hold
        rows, row_tokens = self._batch_rows(table, tid, batch)
        if run is None:         # keys of the batch, but not one run of its partitions in order
            return rows.filter(pc.is_in(rows.column("_cdc_partition_key"), value_set=keys))
        start, stop = run
        btok = batch[1]
        lo, hi = btok[start].as_py(), btok[stop - 1].as_py()
        a, b = np.searchsorted(row_tokens, lo, "left"), np.searchsorted(row_tokens, hi, "right")
        mine = rows.slice(a, b - a)
        # a partition of the batch outside the run with the run's first or last token (two keys, one token):
        # its rows are in the slice too
        if (start > 0 and btok[start - 1].as_py() == lo) or (stop < len(btok) and btok[stop].as_py() == hi):
            mine = mine.filter(pc.is_in(mine.column("_cdc_partition_key"), value_set=keys))
        return mine

    @property
    def nbytes(self) -> int:
        """The bytes of the stored rows read so far."""
        return sum(rows.nbytes for rows, _ in self._rows.values())

    def _batch_rows(self, table, tid: str, batch: tuple) -> tuple:
        """The stored rows of all the batch's partitions of ``table``, read at the first call, sorted by token (a
        stable sort: each partition's rows in the order read), and their tokens."""
        if tid not in self._rows:
            rows = self.store.read_state_rows(table, batch[0], tokens=batch[1])
            row_tokens = rows.column("_cdc_token").to_numpy()
            order = np.argsort(row_tokens, kind="stable")
            self._rows[tid] = (rows.take(order), row_tokens[order])
        return self._rows[tid]

    def read_partitions(self, table, keys) -> dict:
        return states_from_rows(self.read_state_rows(table, keys))


def _run_of(batch: tuple, keys, tokens) -> Optional[tuple]:
    """(start, stop): where ``keys`` (with their ``tokens``) are ``batch``'s partitions ``start:stop`` in the same
    order, as a chunk's are; None when they are not (or no tokens are given)."""
    bkeys, btok = batch
    if tokens is None or not len(keys) or len(tokens) != len(keys):
        return None
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    tokens = tokens.combine_chunks() if isinstance(tokens, pa.ChunkedArray) else tokens
    first_token, first_key = tokens[0].as_py(), keys[0].as_py()
    start = int(np.searchsorted(btok.to_numpy(), first_token, "left"))
    while start < len(btok) and btok[start].as_py() == first_token and bkeys[start].as_py() != first_key:
        start += 1          # keys sharing the first token: the run begins at the first key's own place
    stop = start + len(keys)
    if stop > len(bkeys) or not (bkeys.slice(start, len(keys)).equals(keys.cast(bkeys.type))
                                 and btok.slice(start, len(keys)).equals(tokens.cast(btok.type))):
        return None
    return start, stop


def batch_partitions(rows: pa.Table, starts: Optional[np.ndarray] = None) -> dict:
    """Table id -> (keys, tokens) of the distinct partitions of ``rows`` (cell-log rows sorted by ``GROUP_ORDER``:
    each partition's rows are one run). ``starts``: where each partition begins, if known (``_partition_runs``)."""
    if not rows.num_rows:
        return {}
    if starts is None:
        starts = _partition_starts(rows, None)
    firsts = rows.select(["table_id", "partition_key", "token"]).take(starts)
    out = {}
    for tid, part in _table_runs(firsts):
        out[tid] = (part.column("partition_key").combine_chunks(), part.column("token").combine_chunks())
    return out


def _engine_threads() -> Optional[int]:
    """The compiled engine's threads: one in a Spark task (its sibling tasks have the other cores), else every
    core (``None``: the in-driver transform)."""
    if "pyspark" in sys.modules:
        from pyspark import TaskContext
        if TaskContext.get() is not None:
            return 1
    return None


def _table_runs(rows: pa.Table):
    """(table id, its rows) of each table in ``rows``, in order of appearance. The rows come sorted by
    ``GROUP_ORDER``, so each table's rows are one run: a slice, no copy (else, one filter per table)."""
    tids = rows.column("table_id")
    if not len(tids):
        return
    starts = np.concatenate([[0], np.flatnonzero(_changes(tids)) + 1, [len(tids)]])
    names = [tids[int(i)].as_py() for i in starts[:-1]]
    if len(set(names)) == len(names):
        for tid, start, end in zip(names, starts[:-1], starts[1:]):
            yield tid, rows.slice(int(start), int(end - start))
    else:
        for tid in pc.unique(tids).to_pylist():
            yield tid, rows.filter(pc.equal(tids, tid))


def _partition_starts(b, last: Optional[tuple]):
    """Indices of the rows of ``b`` (a record batch or table, sorted by ``GROUP_ORDER``) that begin a partition;
    ``last``: the (table id, partition key) of the row before ``b``, None when ``b`` is the first."""
    tid, pk = b.column("table_id"), b.column("partition_key")
    first = last is None or (tid[0].as_py(), pk[0].as_py()) != last
    return np.flatnonzero(np.concatenate([[first], _changes(tid) | _changes(pk)]))


def _changes(column) -> np.ndarray:
    """Per row after the first of ``column`` (sorted into runs of equal values): whether it differs from the row
    before, i.e. begins a run."""
    return pc.not_equal(column.slice(1), column.slice(0, len(column) - 1)).to_numpy(zero_copy_only=False)


def _state_out_row(table, rows: pa.Table) -> dict:
    """The OUT_SCHEMA row of one table's change rows in a chunk: an Arrow IPC stream of them."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, rows.schema) as w:
        w.write_table(rows)
    return {"out_kind": "state", "table_id": str(table.id), "t_keyspace": table.keyspace, "t_name": table.name,
            "payload": sink.getvalue(), "n_rows": rows.num_rows}


def _number_events(offsets: dict, batch_id: str, batch_seq: int):
    """The ``mapInArrow`` function of step 4's outbox: a task's events (``EVENT_COLUMNS``, in publish order) ->
    outbox rows numbered from the task's offset (``offsets``: Spark partition -> events in the partitions
    before it)."""

    def number(batches):
        from pyspark import TaskContext
        seq = offsets.get(TaskContext.get().partitionId(), 0)
        for b in batches:
            if b.num_rows:
                yield _outbox_batch(b, batch_id, batch_seq, seq)
                seq += b.num_rows
    return number


def _decode_state_rows(table):
    """The ``mapInArrow`` function that turns a table's change-row blobs (``payload``) back into rows (the MERGE
    source of step 4)."""
    schema = merge_source_schema(table)

    def decode(batches):
        for b in batches:
            for payload in b.column("payload").to_pylist():
                for rows in pa.ipc.open_stream(payload):
                    yield rows.cast(schema) if rows.schema != schema else rows
    return decode


# -------------------------------------------------------------------------------------------- driver

def _user_tables(schema) -> list:
    return sorted(schema.captured_tables(), key=table_order)


def run_batch(spark, segments, *, root: str, storage_options: Optional[dict] = None, schema=None,
              schema_file: Optional[str] = None, batch_id: str, batch_seq: int, now: int,
              prev_now: Optional[int] = None, cluster: str = "default", app_id: str = "cassandra-cdc",
              store_url: Optional[str] = None, store_options: Optional[dict] = None,
              checksums: Optional[dict] = None, keys=None, fail_hook=None, create_op: str = "c", scan_settings=None,
              parallelism: int = 1, horizons: Optional[dict] = None, on_loaded=None) -> BatchResult:
    """Reconcile the cell log of ``segments`` (local paths or object-store URLs of segments, or token ranges to
    scan: ``source_descriptors``) into the Delta state tables and the outbox under ``root``.

    ``spark``: a SparkSession (parse and reconcile in its executors, Delta written by delta-spark), or None (the
    whole batch in this process, Delta written by delta-rs). ``now`` (seconds) is the batch's processing time;
    ``prev_now`` the previous batch's, to sweep TTL expiries in between. ``storage_options``: deltalake's for the
    tables; ``store_url``/``store_options``: the store (fsspec) that remote segments are read from and that
    damage is quarantined in (default ``root``) and scanned ranges are kept in; ``checksums``: segment -> sha256
    to check each download against. ``create_op``: the op of an event for a row that becomes visible (``r`` for a
    backfill). ``scan_settings`` (``scan.ScanSettings``): how token ranges are read; ``parallelism``: sources
    read at once without Spark (token ranges: the scan waits on Cassandra, not on this CPU; segments: downloads
    wait on the store, and the compiled decoder releases the GIL). ``horizons``: table
    id -> when a backfill scan read its partitions (``scan.horizon``; older changes make no event);
    ``keys``: the ``EncryptionKeys`` of encrypted segments (``pipeline.resources.encryption_keys``).
    ``on_loaded(loaded)`` is called with ``BatchResult.loaded`` once the sources are read, before anything is
    written.
    Safe to run again with the same arguments after any failure.
    """
    if schema is None:
        if schema_file is None:
            raise TypeError("run_batch needs schema or schema_file")
        from cdc_lib.cql.schema_from_ddl import load_cql_schema
        schema = load_cql_schema(Path(schema_file))
    paths = source_descriptors(segments, checksums)
    timings: dict = {}
    LAST_TIMINGS.clear()
    t_start = time.perf_counter()
    result = BatchResult(batch_id, batch_seq, len(paths))
    storage_options = dict(storage_options or {})
    if spark is None:
        store = DeltaRsStateStore(root, storage_options, app_id=app_id, fail_hook=fail_hook)
    else:
        from cdc_lib.sinks.delta_spark import DeltaSparkStateStore
        store = DeltaSparkStateStore(spark, root, storage_options, app_id=app_id, fail_hook=fail_hook)
    tables = _user_tables(schema)
    # The state as it is now, read from here on at these versions (nothing else writes under the writer lock).
    versions = store.snapshot(tables)
    store.versions.update(versions)
    outbox_done = store.outbox_committed(batch_seq)
    todo = [t for t in tables if not store.is_committed(t, batch_seq, version=versions.get(store.state_uri(t)))]
    result.skipped_tables = [t.qualified_name for t in tables if t not in todo]
    if outbox_done and not todo:
        return result
    with _timed(timings, "prepare"):
        marks = _sweep_marks(store, tables, now, prev_now)
    parse = _parse_sources(schema, store_url or root, dict(store_options or {}), cluster, batch_id, scan_settings,
                           keys)
    reconcile = _reconcile(schema, root, storage_options, app_id, versions, now, prev_now, cluster, batch_seq,
                           create_op, dict(horizons or {}))
    write = dict(store=store, result=result, todo=todo, outbox_done=outbox_done, batch_id=batch_id,
                 batch_seq=batch_seq, timings=timings)
    if spark is None:
        timings["mode"] = "driver"
        result.damaged, result.loaded, events, states, result.events_by_engine = _run_in_driver(
            paths, marks, parse=parse, reconcile=reconcile, timings=timings, parallelism=parallelism)
        if on_loaded is not None and result.loaded:
            on_loaded(result.loaded)
        state_rows = zip(*(states.column(c).to_pylist() for c in ("table_id", "n_rows", "payload")))
        _write_outputs(event_chunks=lambda: events.to_batches(max_chunksize=OUTBOX_CHUNK),
                       state_rows=lambda: state_rows, **write)
    else:
        timings["mode"] = "spark"
        _run_in_spark(spark, paths, marks, parse=parse, reconcile=reconcile, write=write, on_loaded=on_loaded)
    timings["total"] = time.perf_counter() - t_start
    LAST_TIMINGS.update({k: round(v, 3) if isinstance(v, float) else v for k, v in timings.items()})
    log.info("merge_batch %s: %s", batch_id, LAST_TIMINGS)
    return result


def _sweep_marks(store, tables, now: int, prev_now: Optional[int]) -> list:
    """Marker rows (cell-log columns) for the partitions whose TTLs run out in ``(prev_now, now]``."""
    marks = []
    if prev_now is None or now <= prev_now:
        return marks
    from cdc_lib.cql.tokens import token as murmur3_token
    for t in tables:
        for pk in store.expiring_keys(t, prev_now, now):
            marks.append({"segment": "", "segment_id": 0, "position": 0, "entry_index": 0, "seq": 0,
                          "table_id": str(t.id), "keyspace": t.keyspace, "table": t.name,
                          "partition_key": pk, "token": murmur3_token(pk), "clustering": b"",
                          "is_static": False, "kind": SWEEP_KIND, "timestamp": 0, "ttl": 0,
                          "local_deletion_time": 0, "mutation_id": None})     # from no commit-log entry
    return marks


def _run_in_spark(spark, paths: list, marks: list, *, parse, reconcile, write: dict, on_loaded=None) -> None:
    """Steps 1-4 with the parsing, reconciling and writing spread over Spark tasks (any batch size, any master)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    timings, result, store = write["timings"], write["result"], write["store"]
    batch_id, batch_seq = write["batch_id"], write["batch_seq"]
    # 1. parse: consecutive segments per task, at most PARSE_TASKS_PER_CORE tasks per core (a task costs
    # ~0.1-0.3 s here); a token range to scan or an SSTable is a task of its own. The source list is
    # built in the JVM (range + array literal): a Python-RDD source would add a Python worker round trip to every
    # task.
    scans = any(json.loads(p)["kind"] != "segment" for p in paths)
    slices = max(1, len(paths) if scans else
                 min(len(paths), spark.sparkContext.defaultParallelism * PARSE_TASKS_PER_CORE))
    if paths:
        paths_df = spark.range(0, len(paths), 1, slices).select(
            F.element_at(F.array(*[F.lit(p) for p in paths]), (F.col("id") + 1).cast("int")).alias("source"))
    else:
        paths_df = spark.createDataFrame([], "source string")
    parsed = paths_df.mapInArrow(parse, _spark_schema(PARSED_SCHEMA))
    parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        summaries = parsed.filter(F.col("_record") != REC_CELL)
        with _timed(timings, "parse"):      # one job (toLocalIterator would run one per segment)
            rows = summaries.collect()
        result.damaged = [r["_quarantine_key"] for r in rows if r["_record"] == REC_DAMAGE]
        result.loaded = [_load_summary(r.asDict()) for r in rows if r["_record"] == REC_LOADED]
        if on_loaded is not None and result.loaded:
            on_loaded(result.loaded)
        cells = parsed.filter(F.col("_record") == REC_CELL).drop("_record", "_quarantine_key", "_damage_reason",
                                                                  "_loaded")

        # 2. group by partition (+ partitions with expiries to sweep)
        if marks:
            cells = cells.unionByName(spark.createDataFrame(pa.Table.from_pylist(marks, schema=CELL_ROWS_SCHEMA)))
        # Range-partitioned in publish order (table order, then token): each task holds whole partitions of
        # one key range, each chunk's prior-state read covers one token range of a table, and the tasks' events,
        # concatenated in partition order, are already in publish order (no second sort of the events).
        # One range per core of the job (``spark.default.parallelism``), not ``spark.sql.shuffle.partitions``
        # (200 unless set, and adaptive execution did not merge them when measured): a state file holds rows of
        # the whole ring, so every task's read of its stored rows decodes every file of the table; a task per
        # core keeps the cores busy and reads the state no more often than there are cores (a task's input is
        # taken a window at a time: ``_WindowSizes``).
        tasks = max(1, spark.sparkContext.defaultParallelism)
        grouped = cells.repartitionByRange(tasks, *GROUP_ORDER).sortWithinPartitions(*GROUP_ORDER)

        # 3. reconcile in executors
        out = grouped.mapInArrow(reconcile, _spark_schema(OUT_SCHEMA)).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            with _timed(timings, "group_reconcile"):
                # per task: its events (to number them) and, per table, the change rows it holds
                counts = (out.groupBy(F.spark_partition_id().alias("task"), "out_kind", "table_id", "engine")
                             .agg(F.count(F.lit(1)).alias("n"), F.sum("n_rows").alias("rows")).collect())
            events_per_task: dict = {}
            rows_per_table: dict = {}
            log.info("reconcile: %d tasks with output (one key range each)", len({r["task"] for r in counts}))
            for r in counts:
                if r["out_kind"] == "event":
                    events_per_task[r["task"]] = events_per_task.get(r["task"], 0) + r["n"]
                    result.events_by_engine[r["engine"]] = result.events_by_engine.get(r["engine"], 0) + r["n"]
                else:
                    rows_per_table[r["table_id"]] = rows_per_table.get(r["table_id"], 0) + int(r["rows"])
            result.events = sum(events_per_task.values())
            offsets, total = {}, 0
            for task in sorted(events_per_task):
                offsets[task] = total
                total += events_per_task[task]

            # 4. the outbox (numbered in the executors), then one MERGE per table, written by the executors
            with _timed(timings, "outbox"):
                if not write["outbox_done"]:
                    events = (out.filter(F.col("out_kind") == "event")
                                 .sortWithinPartitions(*EVENT_ORDER)      # already so; no shuffle
                                 .select(*EVENT_COLUMNS)
                                 .mapInArrow(_number_events(offsets, batch_id, batch_seq),
                                             _spark_schema(OUTBOX_SCHEMA)))
                    result.outbox_written = store.write_outbox(batch_seq, events, batch_id)
            with _timed(timings, "state_merge"):
                for t in write["todo"]:
                    n = rows_per_table.get(str(t.id), 0)
                    if not n:
                        continue       # nothing changed in this table: nothing to write (a rerun finds the same)
                    source = (out.filter((F.col("out_kind") == "state") & (F.col("table_id") == str(t.id)))
                                 .select("payload")
                                 .mapInArrow(_decode_state_rows(t), _spark_schema(merge_source_schema(t))))
                    if store.commit(t, batch_seq, source):
                        result.tables[t.qualified_name] = n
        finally:
            out.unpersist()
    finally:
        parsed.unpersist()


def _write_outputs(*, store, result: BatchResult, todo: list, outbox_done: bool, batch_id: str, batch_seq: int,
                   timings: dict, event_chunks, state_rows) -> None:
    """Step 4 in this process: the outbox (events in publish order get their ``seq``) in one commit, then one
    MERGE per table, the tables at once.

    ``event_chunks()``: Arrow batches/tables with ``EVENT_COLUMNS`` in publish order; ``state_rows()``: (table
    id, change rows, Arrow IPC stream of them) with each table's rows together, tables in ``table_order``.
    """
    with _timed(timings, "outbox"):
        count = [0]

        def outbox_batches():
            for chunk in event_chunks():
                if chunk.num_rows:
                    yield _outbox_batch(chunk, batch_id, batch_seq, count[0])
                    count[0] += chunk.num_rows
            if count[0] == 0:
                yield pa.RecordBatch.from_pylist([], schema=OUTBOX_SCHEMA)
        if not outbox_done:
            result.outbox_written = store.write_outbox(
                batch_seq, pa.RecordBatchReader.from_batches(OUTBOX_SCHEMA, outbox_batches()), batch_id)
        else:
            for _ in outbox_batches():
                pass
        result.events = count[0]
    with _timed(timings, "state_merge"):
        pending = {str(t.id): t for t in todo}
        merges = []             # (table, [(table id, rows, Arrow IPC stream of them)])
        seen = set()
        for tid, rows in itertools.groupby(state_rows(), key=lambda r: r[0]):
            if tid in seen:     # the stream must hold each table's rows together; never merge a table twice
                raise RuntimeError(f"merge_batch: state rows of table {tid} are not contiguous")
            seen.add(tid)
            t = pending.pop(tid, None)
            rows = list(rows)
            if t is not None:   # else committed by an earlier run of this batch
                merges.append((t, rows))

        def merge(job) -> tuple:
            t, rows = job
            source = pa.RecordBatchReader.from_batches(
                merge_source_schema(t), (b for _, _, payload in rows for b in pa.ipc.open_stream(payload)))
            return t, sum(n for _, n, _ in rows), store.commit(t, batch_seq, source)
        # Each table's MERGE is a commit of its own, in any order (the outbox holds the events already; a rerun
        # merges the tables without this batch's app transaction), and mostly waits on the store: all at once.
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max(1, min(MERGE_THREADS, len(merges))), thread_name_prefix="cdc-merge") as pool:
            for t, n, written in pool.map(merge, merges):
                if written:
                    result.tables[t.qualified_name] = int(n)


def _outbox_batch(chunk, batch_id: str, batch_seq: int, first_seq: int) -> pa.RecordBatch:
    """Outbox rows (``OUTBOX_SCHEMA``) of a chunk of events (``EVENT_SCHEMA``) whose first ``seq`` is given."""
    n = chunk.num_rows
    cols = [chunk.column(c) for c in EVENT_COLUMNS]
    cols = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols]
    return pa.RecordBatch.from_arrays(
        [pa.repeat(pa.scalar(batch_id, pa.string()), n), pa.repeat(pa.scalar(batch_seq, pa.int64()), n),
         pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64))] + cols, schema=OUTBOX_SCHEMA)


def _load_summary(row: dict) -> dict:
    """What the parse step says of one token range scanned (table, table_id, index, start, end, rows, pages:
    ``scan.horizon``, from_store, seconds, key) or one SSTable read (table, index, bytes, partitions, records,
    damaged, seconds): its ``REC_LOADED`` row."""
    return json.loads(row["_loaded"])


def _source_table(paths: list) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"source": paths}, schema=pa.schema([("source", pa.string())]))


def _partition_order(table: pa.Table, order=GROUP_ORDER):
    """The indices that sort ``table`` by ``order`` (``GROUP_ORDER``, or ``EVENT_ORDER``: a table's keyspace, name
    and id, then token, partition key and, for events, their index), equal rows in their order: what Arrow's stable
    ``pc.sort_indices`` gives, computed as a numpy ``lexsort`` of integer keys (the table's rank by keyspace, name
    and id; the token; the partition key's rank among the distinct keys, needed only where two keys share a token;
    the index), several times faster than comparing strings and bytes row by row. Falls back to
    ``pc.sort_indices`` where a table id names more than one keyspace and table, or a key column holds nulls."""
    by = [(c, "ascending") for c in order]
    keyspace, name, table_id, token, partition_key, *rest = order
    if not table.num_rows or any(table.column(c).null_count for c in order):
        return pc.sort_indices(table, sort_keys=by)
    names = table.select([keyspace, name, table_id])
    tables = names.group_by(names.column_names, use_threads=False).aggregate([]).sort_by(by[:3])
    ids = tables.column(table_id)
    if len(pc.unique(ids)) != len(ids):
        return pc.sort_indices(table, sort_keys=by)
    table_rank = pc.index_in(table.column(table_id), value_set=ids).to_numpy()
    tokens = table.column(token).to_numpy()
    then = [table.column(c).to_numpy() for c in rest]      # what orders a partition's rows (events: their index)
    keys = table.column(partition_key)
    # By table and token first: two keys share a token only where murmur3 collides, so the keys need not be ranked
    # (hashing, sorting and looking up every key: 0.13 of 0.24 s for 800,000 records of 400,000 partitions), only
    # compared with their neighbours' where those share the table and the token. Where two keys share one, they are
    # ranked.
    by_token = np.lexsort([*then[::-1], tokens, table_rank])        # stable; lexsort's last key is the first
    rank, tok = table_rank[by_token], tokens[by_token]
    tied = (rank[1:] == rank[:-1]) & (tok[1:] == tok[:-1])
    if not tied.any():
        return by_token
    ordered = keys.take(by_token)
    same_key = pc.equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1)).to_numpy(zero_copy_only=False)
    if not (tied & ~same_key).any():
        return by_token
    distinct = pc.unique(keys)
    distinct = distinct.take(pc.sort_indices(distinct))
    key_rank = pc.index_in(keys, value_set=distinct).to_numpy()
    return np.lexsort([*then[::-1], key_rank, tokens, table_rank])


def _take(table: pa.Table, indices) -> pa.Table:
    """``table.take(indices)``, its columns on as many threads as there are cores: Arrow's take is one column at a
    time on the calling thread, and a batch's copy into partition order is most of the group step (0.24-0.42 s of
    0.6 s for 891,069 cell-log rows of the demo schema; 0.15-0.21 s on 2 threads)."""
    threads = min(os.cpu_count() or 1, table.num_columns)
    if threads < 2 or table.num_rows < 65_536:
        return table.take(indices)
    from concurrent.futures import ThreadPoolExecutor
    indices = pa.array(indices)
    with ThreadPoolExecutor(threads, thread_name_prefix="cdc-take") as pool:
        return pa.table(list(pool.map(lambda column: column.take(indices), table.columns)), schema=table.schema)


@contextmanager
def _scan_sessions_closed():
    """When the block ends, also on failure, close this process's scan sessions (``scan.reader.close_sessions``):
    in a process that runs batches itself, the block's scans are their only users."""
    try:
        yield
    finally:
        from cdc_lib.scan.reader import close_sessions
        close_sessions()


def _run_in_driver(paths: list, marks: list, *, parse, reconcile, timings: dict, parallelism: int = 1):
    """Steps 1-3 in this process with the same executor functions, for a small batch; ``parallelism`` sources
    are read at once (threads: token ranges wait on Cassandra, segment downloads on the store).

    Returns (damage quarantine keys, loaded ranges and SSTables, events table sorted in publish order, state rows of
    ``OUT_SCHEMA``, events per state engine). Memory: the batch's cell log (bounded by ``driver_batch_max_bytes`` of
    segments, or the rows of the token ranges of a backfill batch) and its output.
    """
    import pyarrow.compute as pc
    cell_names = [f.name for f in CELL_LOG_SCHEMA]
    damaged, loaded, cells = [], [], []
    with _timed(timings, "parse"), _scan_sessions_closed():
        if parallelism > 1 and len(paths) > 1:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(min(parallelism, len(paths)), thread_name_prefix="cdc-source") as pool:
                parsed = itertools.chain.from_iterable(
                    pool.map(lambda p: list(parse(iter([_source_table([p])]))), paths))
                parsed = list(parsed)
        else:
            parsed = parse(iter([_source_table(paths)]))
        for b in parsed:
            summary = pc.not_equal(b.column("_record"), REC_CELL)
            if pc.any(summary).as_py():
                for r in b.filter(summary).to_pylist():
                    if r["_record"] == REC_DAMAGE:
                        damaged.append(r["_quarantine_key"])
                    else:
                        loaded.append(_load_summary(r))
                b = b.filter(pc.invert(summary))
            if b.num_rows:
                cells.append(pa.Table.from_batches([b]).select(cell_names))
    with _timed(timings, "group"):
        parts = [t.cast(CELL_ROWS_SCHEMA) for t in cells]
        if marks:
            parts.append(pa.Table.from_pylist(marks, schema=CELL_ROWS_SCHEMA))
        table = pa.concat_tables(parts) if parts else CELL_ROWS_SCHEMA.empty_table()
        del parts, cells[:]     # the sorted copy is all that is needed from here on
        table = _take(table, _partition_order(table))
    with _timed(timings, "reconcile"):
        # the whole batch is here: each table's stored rows read once, not once per chunk
        out = pa.Table.from_batches(list(reconcile(iter(table.to_batches()), whole=True)),
                                    schema=OUT_SCHEMA)
    with _timed(timings, "sort_events"):
        kind = out.column("out_kind")
        is_event = pc.equal(kind, "event")
        # Reconcile emits its events in publish order already (chunks and tables in GROUP_ORDER): sorted by their
        # sort keys alone, and then, when that order holds, the runs of event rows between the state rows are sliced
        # out (the events' JSON is most of the batch's bytes: no copy of it).
        rows = np.flatnonzero(is_event.to_numpy(zero_copy_only=False))
        order = rows[np.asarray(_partition_order(out.select(list(EVENT_ORDER)).take(rows), EVENT_ORDER))]
        events = out.select(list(EVENT_COLUMNS))
        if np.array_equal(order, rows):
            ends = np.flatnonzero(np.diff(rows) != 1) + 1
            events = pa.concat_tables([events.slice(int(run[0]), len(run)) for run in np.split(rows, ends) if len(run)]
                                      or [events.schema.empty_table()])
        else:
            events = events.take(order)
        states = out.filter(pc.equal(kind, "state"))
        engines = pc.value_counts(out.column("engine").filter(is_event)).to_pylist()
        by_engine = {c["values"]: c["counts"] for c in engines}
    return damaged, loaded, events, states, by_engine
