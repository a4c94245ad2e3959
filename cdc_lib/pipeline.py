"""The pipeline's steps, as plain idempotent functions the Airflow tasks call: claim -> transform -> publish -> archive.

One batch at a time (the DAG runs with ``max_active_runs=1``). Every step reads and writes the batch manifest
``ledger/batches/<batch_id>.json`` in the object store, so a retry or a rerun after a crash at any instant
finds what is done and does the rest:

1. ``claim``: if the last batch is not archived (a crash), return *that* batch again: exactly-once needs
   deterministic batches (same segments, same ``now``, same ``batch_seq``). Otherwise list the complete
   incoming segments (sidecar present), oldest first per node, up to ``max_segments`` / ``max_bytes``, write
   the manifest (state ``claimed``), then move the pointer ``checkpoints/pipeline.json``. Nothing new: an
   empty batch, returned fast, without writing anything; unless a TTL sweep is due (``sweep_interval_s`` since
   the last batch, or a sweep requested by the maintenance DAG): then a batch without segments sweeps expiries.
2. ``transform``: ``spark_jobs.merge_batch.run_batch`` (in-process local Spark, the embedded default, or
   ``spark-submit``); a sweep batch runs the Spark-free ``delta_store.run_store_batch``. Damaged entries and
   entries of unknown tables are written to ``quarantined/`` with a ``.reason.json`` by the job; the rest of the
   batch proceeds. Delta commits carry the app transaction ``(app_id, batch_seq)``: a rerun writes nothing twice.
3. ``publish``: ``publish.KafkaPublisher.publish_batch`` on the batch's outbox rows (exactly once: the
   publisher's own intent/scan/verify protocol and its ledger marker ``ledger/<batch_id>.json``).
4. ``archive``: only once the publisher's marker exists: each segment moves ``incoming/`` -> ``archived/``
   (copy, verify, then delete); a segment in which bytes were damaged moves to ``quarantined/`` with a reason
   naming every damaged position instead (its readable entries were processed).

Backfill (snapshot + stream, after SeaTunnel's snapshot/incremental split): ``request_snapshot`` makes the next
claim a *snapshot batch* ``k`` without segments whose outbox is an ``op = 'r'`` event for every visible row of
the state tables as batch ``k-1`` committed them. Batches are one serialized sequence and each is published
whole before the next is claimed, so in every topic the snapshot's events sit after every event of batches
``< k`` and before every event of batches ``> k``: the low and the high watermark are the same batch boundary.
A consumer that starts at the snapshot's first record sees every row once, then every later change, with no
gap (every segment not in batches ``< k`` is in a later batch) and no duplicate (changes up to ``k-1`` are in
the state the snapshot read, not re-emitted). ``cluster_snapshot_events`` reads a live table with the driver
instead (paged SELECT) for a first load.

Counters of every step are logged, returned (the DAG task logs them) and accumulated in
``checkpoints/metrics.json`` so a user can read them (``cat``/``aws s3 cp``).

Fault injection: every step takes ``fault``, called as ``fault(point)`` at named points (see ``FAULT_POINTS``;
publisher points arrive as ``publish:<point>``); tests raise from it or ``os._exit`` to simulate a crash.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .errors import CdcError, ConfigError
from .storage import REASON_SUFFIX, Layout, ObjectStore, parse_segment_name, sha256_file

log = logging.getLogger("cassandra_cdc.pipeline")

MiB = 1 << 20
POINTER_KEY = Layout.checkpoint("pipeline")
METRICS_KEY = Layout.checkpoint("metrics")
SWEEP_REQUEST_KEY = Layout.checkpoint("sweep-request")
SNAPSHOT_REQUEST_KEY = Layout.checkpoint("snapshot-request")
DAMAGE_KINDS = frozenset({"header", "bad_marker", "bad_entry", "crc_mismatch", "compression", "encryption",
                          "undecodable"})
STATES = ("claimed", "transformed", "published", "archived")
FAULT_POINTS = ("claim:manifest_written", "claim:pointer_written", "transform:before", "transform:outbox",
                "transform:state", "transform:done", "publish:before", "publish:<publisher point>",
                "publish:done", "archive:before", "archive:segment", "archive:done")

Fault = Callable[[str], None]


class PipelineError(CdcError):
    """A step cannot go on (e.g. archive asked before the batch was published)."""


# ------------------------------------------------------------------------------------------------ settings

@dataclass
class PipelineConfig:
    """Pipeline settings: the DAG builds one from its params and Airflow connections (``from_mapping``)."""

    store_url: str = "./cdc-data"              # local directory (embedded default) or s3://bucket/prefix
    s3_endpoint_url: Optional[str] = None      # S3 endpoint (SeaweedFS, MinIO...); None: AWS / AWS_* env
    s3_access_key: Optional[str] = None
    s3_secret_key: Optional[str] = None
    s3_region: str = "us-east-1"
    s3_timeout_s: float = 30.0                 # connect/read timeout of one S3 request
    cluster: str = "cluster1"
    schema_source: str = "cql"                 # cql (schema_file) | driver (cassandra_hosts)
    schema_file: Optional[str] = None          # CQL DDL with `ID = ...` table options (DESCRIBE output)
    cassandra_hosts: list = field(default_factory=list)
    cassandra_port: int = 9042
    cassandra_username: Optional[str] = None
    cassandra_password: Optional[str] = None
    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_format: str = "json"                 # json | avro (Confluent wire format with schema_registry_url,
                                               # Avro single-object encoding without)
    topic_prefix: str = "cdc"
    schema_registry_url: Optional[str] = None
    kafka_partitions: int = 1
    kafka_timeout_s: float = 30.0
    kafka_tombstones: bool = False             # a Kafka tombstone after each delete (log compaction)
    max_segments: int = 64                     # per batch
    max_bytes: int = 256 * MiB                 # per batch (at least one segment is always taken)
    spark_master: str = "local[2]"
    spark_submit: bool = False                 # run the job with spark-submit instead of in-process
    spark_submit_bin: str = "spark-submit"
    staging_dir: Optional[str] = None          # where segments of a remote store are fetched to
    now: Optional[int] = None                  # fixed processing time (seconds) for tests/demo; None: wall clock
    sweep_interval_s: int = 300                # an empty run sweeps TTL expiries this long after the last batch
    app_id: str = "cassandra-cdc"

    @classmethod
    def from_mapping(cls, values: dict) -> "PipelineConfig":
        """Known keys of ``values`` (params, JSON); None/"" keep the default; unknown keys are ignored."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        kw = {}
        for k, v in (values or {}).items():
            if k in names and v is not None and v != "":
                kw[k] = v
        for k in ("s3_timeout_s", "kafka_timeout_s"):
            if k in kw:
                kw[k] = float(kw[k])
        for k in ("max_segments", "max_bytes", "kafka_partitions", "sweep_interval_s", "cassandra_port"):
            if k in kw:
                kw[k] = int(kw[k])
        if "now" in kw:
            kw["now"] = int(kw["now"])
        for k in ("spark_submit", "kafka_tombstones"):
            if isinstance(kw.get(k), str):
                kw[k] = kw[k].strip().lower() in ("1", "true", "yes", "on")
        if isinstance(kw.get("cassandra_hosts"), str):
            kw["cassandra_hosts"] = [h.strip() for h in kw["cassandra_hosts"].split(",") if h.strip()]
        return cls(**kw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["s3_secret_key"] = "***" if self.s3_secret_key else None
        d["cassandra_password"] = "***" if self.cassandra_password else None
        return d

    @property
    def remote(self) -> bool:
        return "://" in self.store_url and not self.store_url.startswith("file://")

    def fs_options(self) -> dict:
        """fsspec/s3fs options for ``ObjectStore.from_url``."""
        if not self.remote:
            return {}
        opts: dict = {}
        if self.s3_access_key:
            opts["key"] = self.s3_access_key
        if self.s3_secret_key:
            opts["secret"] = self.s3_secret_key
        client = {"region_name": self.s3_region}
        if self.s3_endpoint_url:
            client["endpoint_url"] = self.s3_endpoint_url
        opts["client_kwargs"] = client
        opts["config_kwargs"] = {"connect_timeout": min(5.0, self.s3_timeout_s), "read_timeout": self.s3_timeout_s,
                                 "retries": {"max_attempts": 2}}
        return opts

    def delta_options(self) -> dict:
        """deltalake (object_store crate) ``storage_options``."""
        if not self.remote:
            return {}
        opts = {"AWS_REGION": self.s3_region, "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
                "timeout": f"{int(max(1, self.s3_timeout_s))}s"}
        if self.s3_endpoint_url:
            opts["AWS_ENDPOINT_URL"] = self.s3_endpoint_url
            if self.s3_endpoint_url.startswith("http://"):
                opts["AWS_ALLOW_HTTP"] = "true"
        if self.s3_access_key:
            opts["AWS_ACCESS_KEY_ID"] = self.s3_access_key
        if self.s3_secret_key:
            opts["AWS_SECRET_ACCESS_KEY"] = self.s3_secret_key
        return opts


def open_store(config: PipelineConfig) -> ObjectStore:
    return ObjectStore.from_url(config.store_url, **config.fs_options())


def delta_root(config: PipelineConfig, store: ObjectStore) -> str:
    """The root Delta tables live under: the store's directory, or its s3:// URL."""
    return store.root if store.local else store.url


def load_schema(config: PipelineConfig):
    """The CQL schema the decoder types values with (``schema_source``)."""
    if config.schema_source == "cql":
        if not config.schema_file:
            raise ConfigError("schema_source 'cql' needs schema_file (a CQL file with table IDs)")
        from .schema_cql import load_cql_schema
        return load_cql_schema(Path(config.schema_file))
    if config.schema_source == "driver":
        from . import schema_driver
        if not config.cassandra_hosts:
            raise ConfigError("schema_source 'driver' needs cassandra_hosts (or the Cassandra connection)")
        options = {}
        if config.cassandra_username:
            from cassandra.auth import PlainTextAuthProvider
            options["auth_provider"] = PlainTextAuthProvider(config.cassandra_username,
                                                             config.cassandra_password or "")
        return schema_driver.load_from_cluster(config.cassandra_hosts, port=config.cassandra_port, **options)
    raise ConfigError(f"schema_source must be 'cql' or 'driver', got {config.schema_source!r}")


# ------------------------------------------------------------------------------------------------ batches

@dataclass
class Batch:
    """One batch as its manifest stores it. ``segments``: [{key, node, name, size, checksum}]."""

    batch_id: str = ""
    batch_seq: int = 0
    state: str = "empty"
    segments: list = field(default_factory=list)
    now: int = 0
    prev_now: Optional[int] = None
    sweep: bool = False
    snapshot: bool = False                        # a backfill: 'r' events for every live row (no segments)
    resumed: bool = False
    claimed_by: str = ""
    steps: dict = field(default_factory=dict)     # step -> its counters (as the step returned them)

    @property
    def empty(self) -> bool:
        return not self.batch_id

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Batch":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})


def batch_id_for(seq: int) -> str:
    return f"b-{seq:010d}"


def manifest_key(batch_id: str) -> str:
    Layout.ledger(batch_id)   # validates the name
    return f"{Layout.LEDGER}/batches/{batch_id}.json"


def _save(store: ObjectStore, batch: Batch) -> None:
    store.put_json(manifest_key(batch.batch_id), batch.to_dict())


def read_batch(store: ObjectStore, batch_id: str) -> Batch:
    return Batch.from_dict(store.get_json(manifest_key(batch_id)))


def _reload(store: ObjectStore, batch) -> Batch:
    """The manifest as stored (a task gets the batch from XCom, which may be older than the store)."""
    b = batch if isinstance(batch, Batch) else Batch.from_dict(batch)
    if b.empty:
        return b
    return read_batch(store, b.batch_id)


def _noop(point: str) -> None:
    pass


def _clock(config: PipelineConfig) -> int:
    return int(config.now) if config.now is not None else int(time.time())


# ------------------------------------------------------------------------------------------------ metrics

def _record_metrics(store: ObjectStore, step: str, counters: dict) -> None:
    """Log the step's counters and fold them into ``checkpoints/metrics.json`` (totals + last run per step)."""
    log.info("%s: %s", step, json.dumps(counters, sort_keys=True))
    try:
        m = store.get_json(METRICS_KEY) if store.exists(METRICS_KEY) else {}
    except Exception:  # noqa: BLE001 - a broken metrics file must not stop the pipeline; it is rewritten
        m = {}
    m.setdefault("totals", {})
    m.setdefault("last", {})
    m["last"][step] = {**counters, "at": int(time.time())}
    summable = {"resumed"} if counters.get("repeat") else None    # a resumed step's work is counted once
    for k, v in counters.items():
        if summable is None or k in summable:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.endswith("_s") and k != "batch_seq":
                key = f"{step}.{k}"
                m["totals"][key] = m["totals"].get(key, 0) + v
    store.put_json(METRICS_KEY, m)


def read_metrics(config: PipelineConfig) -> dict:
    store = open_store(config)
    return store.get_json(METRICS_KEY) if store.exists(METRICS_KEY) else {}


# ------------------------------------------------------------------------------------------------ 1. claim

def _pointer(store: ObjectStore) -> dict:
    return store.get_json(POINTER_KEY) if store.exists(POINTER_KEY) else {"batch_seq": 0}


def _candidates(store: ObjectStore, config: PipelineConfig) -> tuple[list, int]:
    """Complete incoming segments, in claim order: per-node rank first, so no node waits behind another.

    Returns (segments, incomplete uploads seen).
    """
    by_node: dict = {}
    incomplete = 0
    for key in store.list(Layout.area_prefix(Layout.INCOMING, config.cluster)):
        try:
            _, _, node, name = Layout.parse_segment_key(key)
            _, seg_id = parse_segment_name(name)
        except CdcError:
            continue  # not a segment (e.g. a stray file): never claimed
        info = store.info(key)
        if info.checksum is None:
            incomplete += 1       # an upload cut short, or still running: the next run sees it complete
            continue
        by_node.setdefault(node, []).append((seg_id, {"key": key, "node": node, "name": name, "size": info.size,
                                                      "checksum": info.checksum}))
    ranked = []
    for node, segs in by_node.items():
        for rank, (seg_id, seg) in enumerate(sorted(segs, key=lambda s: s[0])):
            ranked.append(((rank, node), seg))
    return [s for _, s in sorted(ranked, key=lambda r: r[0])], incomplete


def claim(config: PipelineConfig, run_id: str = "", *, fault: Fault = _noop) -> Batch:
    """The batch this run works on: the unfinished one after a crash, else new segments; may be empty."""
    t0 = time.monotonic()
    store = open_store(config)
    ptr = _pointer(store)
    seq = int(ptr.get("batch_seq", 0))
    # A manifest written just before a crash, before the pointer moved: that batch is the current one.
    nxt = batch_id_for(seq + 1)
    if store.exists(manifest_key(nxt)):
        store.put_json(POINTER_KEY, {"batch_seq": seq + 1, "batch_id": nxt})
        seq += 1
    last = read_batch(store, batch_id_for(seq)) if seq else None
    if last is not None and last.state != "archived":
        last.resumed = True
        _record_metrics(store, "claim", {"batch_seq": last.batch_seq, "segments": len(last.segments),
                                         "resumed": 1, "repeat": True, "duration_s": time.monotonic() - t0})
        log.warning("claim: resuming unfinished batch %s (state %s, %d segments)", last.batch_id, last.state,
                    len(last.segments))
        return last

    candidates, incomplete = _candidates(store, config)
    chosen, size = [], 0
    for seg in candidates:
        if chosen and (len(chosen) >= config.max_segments or size + seg["size"] > config.max_bytes):
            break
        chosen.append(seg)
        size += seg["size"]
    now = _clock(config)
    prev_now = last.now if last is not None else None
    if prev_now is not None:
        now = max(now, prev_now)     # processing time never goes back (TTL sweep windows)
    sweep = snapshot = False
    if not chosen and store.exists(SNAPSHOT_REQUEST_KEY):
        snapshot = True     # a batch of its own between two stream batches: see _snapshot_outbox
    elif not chosen and last is not None:
        requested = store.exists(SWEEP_REQUEST_KEY)
        sweep = now > prev_now and (requested or now - prev_now >= config.sweep_interval_s)
    if not chosen and not sweep and not snapshot:
        counters = {"segments": 0, "bytes": 0, "pending": 0, "incomplete_uploads": incomplete,
                    "duration_s": round(time.monotonic() - t0, 3)}
        _record_metrics(store, "claim", counters)
        return Batch(steps={"claim": counters})
    if snapshot:
        now = prev_now if prev_now is not None else now   # the state as the last batch left it
    batch = Batch(batch_id_for(seq + 1), seq + 1, "claimed", chosen, now, prev_now, sweep, snapshot, False, run_id)
    counters = {"batch_seq": batch.batch_seq, "segments": len(chosen), "bytes": size,
                "pending": len(candidates) - len(chosen), "incomplete_uploads": incomplete, "sweep": int(sweep),
                "snapshot": int(snapshot),
                "duration_s": round(time.monotonic() - t0, 3)}
    batch.steps["claim"] = counters
    _save(store, batch)
    fault("claim:manifest_written")
    store.put_json(POINTER_KEY, {"batch_seq": batch.batch_seq, "batch_id": batch.batch_id})
    if sweep and store.exists(SWEEP_REQUEST_KEY):
        store.delete(SWEEP_REQUEST_KEY)
    if snapshot:
        store.delete(SNAPSHOT_REQUEST_KEY)
    fault("claim:pointer_written")
    _record_metrics(store, "claim", counters)
    return batch


def request_sweep(config: PipelineConfig) -> dict:
    """Ask the next ``cassandra_cdc`` run to sweep TTL expiries even without new segments (maintenance DAG).

    The sweep itself runs inside ``cassandra_cdc`` as a batch without segments, so it is serialized with the
    other batches (one ``batch_seq`` sequence per Delta table) and published exactly once like them.
    """
    store = open_store(config)
    store.put_json(SWEEP_REQUEST_KEY, {"requested_at": int(time.time())})
    return {"sweep_requested": 1}


# ------------------------------------------------------------------------------------------------ 2. transform

_SPARK = None


def spark_session(config: PipelineConfig):
    """The process's SparkSession (started once; local mode by default)."""
    global _SPARK
    if _SPARK is None:
        from spark_jobs.merge_batch import local_session
        m = re.fullmatch(r"local\[(\d+|\*)\]", config.spark_master)
        if m:
            cores = (os.cpu_count() or 2) if m.group(1) == "*" else int(m.group(1))
            _SPARK = local_session(cores=cores)
        else:
            from pyspark.sql import SparkSession
            from spark_jobs.merge_batch import ship_cdc_lib
            _SPARK = SparkSession.builder.master(config.spark_master).appName("cdc-merge-batch").getOrCreate()
            ship_cdc_lib(_SPARK)
    return _SPARK


def stop_spark() -> None:
    global _SPARK
    if _SPARK is not None:
        _SPARK.stop()
        _SPARK = None


def _stage_segments(store: ObjectStore, config: PipelineConfig, batch: Batch) -> tuple[list, Optional[str]]:
    """Local paths ``.../<node>/<segment>`` of the batch's segments (the job reads local files).

    A local store is read in place. A remote store's segments are fetched (bounded by ``max_bytes``) and checked
    against their sidecar checksum. Returns (paths, staging directory to remove afterwards).
    """
    if store.local:
        return [os.path.join(store.root, *s["key"].split("/")) for s in batch.segments], None
    base = Path(config.staging_dir or tempfile.gettempdir()) / f"cdc-stage-{batch.batch_id}"
    paths = []
    for s in batch.segments:
        dest = base / s["node"] / s["name"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not (dest.exists() and sha256_file(dest)[0] == s["checksum"]):
            with store.open(s["key"]) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out, MiB)
            got = sha256_file(dest)[0]
            if got != s["checksum"]:
                raise PipelineError(f"{s['key']}: fetched copy hashes to {got}, sidecar says {s['checksum']}")
        paths.append(str(dest))
    return paths, str(base)


def _quarantined_for(store: ObjectStore, config: PipelineConfig, batch: Batch) -> list:
    """Quarantine records (key, node, segment, kind, reason) the job wrote for this batch's segments.

    Read back from the store rather than from the job's result, so a rerun that finds the job done still knows.
    """
    out = []
    names = {(s["node"], s["name"]) for s in batch.segments}
    for node in sorted({s["node"] for s in batch.segments}):
        for key in store.list(Layout.area_prefix(Layout.QUARANTINED, config.cluster, node)):
            name = key.rsplit("/", 1)[-1]
            if name.endswith(REASON_SUFFIX):
                continue
            m = re.fullmatch(r"(CommitLog-\d+-\d+\.log)\.(\d+)\.([A-Za-z_]+)", name)
            if not m or (node, m.group(1)) not in names:
                continue
            try:
                reason = store.get_json(Layout.reason(key))
            except Exception:  # noqa: BLE001
                reason = {}
            if reason.get("batch_id") not in (None, batch.batch_id):
                continue
            out.append({"key": key, "node": node, "segment": m.group(1), "position": int(m.group(2)),
                        "kind": m.group(3), "reason": reason.get("reason", "")})
    return out


def _spark_submit(config: PipelineConfig, paths: list, root: str, batch: Batch) -> dict:
    """Run the job with ``spark-submit`` (the job's CLI); its last stdout line is the result as JSON."""
    job = Path(__file__).resolve().parents[1] / "spark_jobs" / "merge_batch.py"
    argv = [config.spark_submit_bin, "--master", config.spark_master, str(job), "--segments", *paths,
            "--root", root, "--schema-file", str(config.schema_file), "--batch-id", batch.batch_id,
            "--batch-seq", str(batch.batch_seq), "--now", str(batch.now), "--cluster", config.cluster]
    if batch.prev_now is not None:
        argv += ["--prev-now", str(batch.prev_now)]
    for k, v in config.delta_options().items():
        argv += ["--storage-option", f"{k}={v}"]
    log.info("transform: %s", " ".join(a if "SECRET" not in a else a.split("=")[0] + "=***" for a in argv))
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PipelineError(f"spark-submit failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def transform(config: PipelineConfig, batch, *, fault: Fault = _noop, spark=None) -> Batch:
    """Decode, dedupe and reconcile the batch into Delta state tables + outbox (idempotent per ``batch_seq``)."""
    store = open_store(config)
    batch = _reload(store, batch)
    if batch.empty:
        return batch
    if STATES.index(batch.state) >= STATES.index("transformed"):
        log.info("transform: %s already transformed", batch.batch_id)
        return batch
    t0 = time.monotonic()
    fault("transform:before")
    schema = load_schema(config)
    root = delta_root(config, store)

    def hook(kind, name):
        fault(f"transform:{kind}")

    counters: dict = {"segments": len(batch.segments), "bytes": sum(s["size"] for s in batch.segments)}
    if batch.snapshot:
        counters.update(events=_snapshot_outbox(config, root, schema, batch, hook))
    elif batch.sweep or not batch.segments:
        from .delta_store import DeltaRsStateStore, run_store_batch
        st = DeltaRsStateStore(root, config.delta_options(), app_id=config.app_id, fail_hook=hook)
        res = run_store_batch(st, schema, [], batch_id=batch.batch_id, batch_seq=batch.batch_seq, now=batch.now,
                              prev_now=batch.prev_now, cluster=config.cluster)
        counters.update(events=res["events"], partitions_written=sum(res["tables"].values()))
    else:
        paths, staged = _stage_segments(store, config, batch)
        try:
            if config.spark_submit:
                res = _spark_submit(config, paths, root, batch)
                counters.update(events=res.get("events", 0), partitions_written=sum(res.get("tables", {}).values()))
            else:
                from spark_jobs.merge_batch import run_batch
                t1 = time.monotonic()
                session = spark or spark_session(config)
                counters["spark_start_s"] = round(time.monotonic() - t1, 3)
                res = run_batch(session, paths, root=root, storage_options=config.delta_options(), schema=schema,
                                batch_id=batch.batch_id, batch_seq=batch.batch_seq, now=batch.now,
                                prev_now=batch.prev_now, cluster=config.cluster, app_id=config.app_id,
                                quarantine_url=store.url, quarantine_options=config.fs_options(), fail_hook=hook)
                counters.update(events=res.events, state_rows_written=sum(res.tables.values()))
        finally:
            if staged:
                shutil.rmtree(staged, ignore_errors=True)
    quarantined = _quarantined_for(store, config, batch)
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
    _save(store, batch)
    _record_metrics(store, "transform", counters)
    return batch


def _snapshot_outbox(config: PipelineConfig, root: str, schema, batch: Batch, hook) -> int:
    """Outbox of a snapshot batch: an 'r' event for every visible row of every state table, in publish order.

    Reads each table's state as the previous batch committed it (batches are serialized, so nothing writes in
    between) and holds one table's state at a time in the driver's memory.
    """
    import pyarrow as pa

    from .batch import partition_order, table_order
    from .delta_store import OUTBOX_SCHEMA, DeltaRsStateStore, outbox_row, read_state, states_from_rows
    from .events import snapshot_events
    from .murmur3 import token
    st = DeltaRsStateStore(root, config.delta_options(), app_id=config.app_id, fail_hook=hook)
    if st.outbox_committed(batch.batch_seq):
        return 0  # written by an earlier attempt (publish counts the events)
    rows: list = []
    for table in sorted((t for t in schema.tables.values() if not t.keyspace.startswith("system")),
                        key=table_order):
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


# ------------------------------------------------------------------------------------------------ 3. publish

def _codec(config: PipelineConfig, store):
    """None for JSON (the outbox's own bytes are published), else the Avro codec."""
    if config.kafka_format == "json":
        return None
    if config.kafka_format != "avro":
        raise ConfigError(f"kafka_format {config.kafka_format!r}: use 'json' or 'avro'")
    from .publish import AvroCodec, SchemaRegistryClient
    registry = SchemaRegistryClient(config.schema_registry_url) if config.schema_registry_url else None
    return AvroCodec(registry, schema_store=store)


def _outbox_events(config: PipelineConfig, root: str, batch: Batch, tally: dict, codec=None) -> list:
    """The batch's outbox rows as ``publish.OutboxEvent``: the JSON bytes exactly as the outbox holds them, or
    the same events in Avro (``publish.avro_from_json_outbox`` restores the typed values)."""
    from .publish import OutboxEvent, avro_from_json_outbox, table_topic
    from .delta_store import read_outbox
    schema = load_schema(config) if codec is not None else None
    out = []
    seq = 0
    for r in read_outbox(root, batch.batch_id, config.delta_options()):
        topic = table_topic(config.topic_prefix, r["keyspace"], r["table"])
        if codec is None:
            key, value = r["key_json"].encode(), r["event_json"].encode()
        else:
            table = schema.by_name(r["keyspace"], r["table"])
            if table is None:
                raise PipelineError(f"publish: table {r['keyspace']}.{r['table']} of event {r['event_id']} is not "
                                    "in the schema; cannot encode it as Avro")
            key, value = avro_from_json_outbox(codec, table, topic, r["key_json"], r["event_json"])
        out.append(OutboxEvent(r["event_id"], topic, key, value, seq))
        seq += 1
        tally["by_op"][r["op"]] = tally["by_op"].get(r["op"], 0) + 1
        tname = f"{r['keyspace']}.{r['table']}"
        tally["by_table"][tname] = tally["by_table"].get(tname, 0) + 1
        if config.kafka_tombstones and r["op"] == "d":
            out.append(OutboxEvent(f"{r['event_id']}.tombstone", topic, key, None, seq))
            seq += 1
    return out


def publish(config: PipelineConfig, batch, *, fault: Fault = _noop) -> Batch:
    """Publish the batch's outbox to Kafka exactly once (``publish.KafkaPublisher``)."""
    from .publish import KafkaPublisher
    store = open_store(config)
    batch = _reload(store, batch)
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
    tally: dict = {"by_op": {}, "by_table": {}}
    events = _outbox_events(config, delta_root(config, store), batch, tally, codec)
    publisher = KafkaPublisher(config.kafka_bootstrap, store, ledger_prefix=Layout.LEDGER,
                               num_partitions=config.kafka_partitions, timeout_s=config.kafka_timeout_s,
                               fault=lambda point, **info: fault(f"publish:{point}"))
    res = publisher.publish_batch(batch.batch_id, events)
    counters = {"events": res.events, "produced": res.produced, "already_in_kafka": res.already_in_kafka,
                "skipped_duplicates": res.already_in_kafka, "ledger_skipped": int(res.skipped),
                "by_op": tally["by_op"], "by_table": tally["by_table"],
                "duration_s": round(time.monotonic() - t0, 3)}
    fault("publish:done")
    batch.steps["publish"] = counters
    batch.state = "published"
    _save(store, batch)
    _record_metrics(store, "publish", counters)
    return batch


# ------------------------------------------------------------------------------------------------ 4. archive

def archive(config: PipelineConfig, batch, *, fault: Fault = _noop) -> Batch:
    """Move the batch's segments out of ``incoming/``: only after Kafka has every event of the batch."""
    store = open_store(config)
    batch = _reload(store, batch)
    if batch.empty:
        return batch
    if batch.state == "archived":
        return batch
    if batch.state != "published" or not store.exists(Layout.ledger(batch.batch_id)):
        raise PipelineError(f"archive: batch {batch.batch_id} is not published (state {batch.state}); "
                            "nothing archived")
    t0 = time.monotonic()
    fault("archive:before")
    damaged: dict = {}
    for q in batch.steps.get("quarantined", []):
        if q["kind"] in DAMAGE_KINDS:
            damaged.setdefault((q["node"], q["segment"]), []).append(
                {"position": q["position"], "kind": q["kind"], "reason": q["reason"], "entry_key": q["key"]})
    archived = quarantined = 0
    for s in batch.segments:
        if (s["node"], s["name"]) in damaged:
            dst = Layout.quarantined(config.cluster, s["node"], s["name"])
            store.quarantine(s["key"], dst, {
                "batch_id": batch.batch_id, "segment": s["name"], "node": s["node"], "checksum": s["checksum"],
                "reason": "damaged bytes; the readable entries were processed, the damaged ones are quarantined "
                          "separately (entry_key)",
                "damage": damaged[(s["node"], s["name"])]})
            quarantined += 1
        else:
            store.move(s["key"], Layout.archived(config.cluster, s["node"], s["name"]))
            archived += 1
        fault("archive:segment")
    counters = {"archived": archived, "quarantined_segments": quarantined,
                "duration_s": round(time.monotonic() - t0, 3)}
    batch.steps["archive"] = counters
    batch.state = "archived"
    _save(store, batch)
    fault("archive:done")
    _record_metrics(store, "archive", counters)
    return batch


# ------------------------------------------------------------------------------------------------ whole runs

def run_once(config: PipelineConfig, run_id: str = "", *, fault: Fault = _noop, spark=None) -> Batch:
    """claim -> transform -> publish -> archive in this process (what one DAG run does)."""
    batch = claim(config, run_id, fault=fault)
    if batch.empty:
        return batch
    batch = transform(config, batch, fault=fault, spark=spark)
    batch = publish(config, batch, fault=fault)
    return archive(config, batch, fault=fault)


def run_until_idle(config: PipelineConfig, *, max_runs: int = 100, spark=None) -> list:
    """Repeat ``run_once`` until a run finds nothing to do; returns the batches processed."""
    done = []
    for _ in range(max_runs):
        b = run_once(config, spark=spark)
        if b.empty:
            break
        done.append(b)
    return done


# ------------------------------------------------------------------------------------------------ Delta upkeep

def delta_upkeep(config: PipelineConfig, *, vacuum_retention_hours: int = 168) -> dict:
    """Compact small files and vacuum old ones in every Delta table under ``delta/`` (maintenance DAG).

    Vacuum keeps ``vacuum_retention_hours`` of history (Delta's 7-day default), so a reader pinned to a recent
    version (a Spark task of a running batch) never loses its files.
    """
    from deltalake import DeltaTable
    store = open_store(config)
    root = delta_root(config, store)
    from .delta_store import events_table_uri
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
    _record_metrics(store, "maintenance", out)
    return out


# ------------------------------------------------------------------------------------------------ Airflow glue

def config_from_params(params: dict, connection: Callable[[str], Any]) -> PipelineConfig:
    """A PipelineConfig from DAG params, with Kafka/S3/Cassandra settings from Airflow connections.

    ``connection(conn_id)`` returns an object with ``host``, ``port``, ``login``, ``password``,
    ``extra_dejson`` (an Airflow ``Connection``), or None when that connection is not defined: the params'
    values (the embedded defaults) then stand. Connections: ``kafka_conn_id`` (host = bootstrap servers, extra
    ``schema_registry_url``), ``s3_conn_id`` (login/password = access/secret key, extra ``endpoint_url``,
    ``region_name``), ``cassandra_conn_id`` (host = comma-separated contact points, port, login, password).
    """
    values = dict(params or {})
    kafka = connection(values.get("kafka_conn_id") or "cassandra_cdc_kafka")
    if kafka is not None and kafka.host:
        values["kafka_bootstrap"] = kafka.host if (":" in kafka.host or not kafka.port) \
            else f"{kafka.host}:{kafka.port}"
        extra = kafka.extra_dejson or {}
        if extra.get("schema_registry_url"):
            values["schema_registry_url"] = extra["schema_registry_url"]
    s3 = connection(values.get("s3_conn_id") or "cassandra_cdc_s3")
    if s3 is not None:
        extra = s3.extra_dejson or {}
        values["s3_access_key"] = s3.login or extra.get("aws_access_key_id") or values.get("s3_access_key")
        values["s3_secret_key"] = s3.password or extra.get("aws_secret_access_key") or values.get("s3_secret_key")
        values["s3_endpoint_url"] = (extra.get("endpoint_url") or (extra.get("config_kwargs") or {}).get(
            "endpoint_url") or s3.host or values.get("s3_endpoint_url"))
        values["s3_region"] = extra.get("region_name") or values.get("s3_region")
    cass = connection(values.get("cassandra_conn_id") or "cassandra_cdc_cassandra")
    if cass is not None and cass.host:
        values["cassandra_hosts"] = cass.host
        values["cassandra_port"] = cass.port or values.get("cassandra_port")
        values["cassandra_username"] = cass.login
        values["cassandra_password"] = cass.password
    return PipelineConfig.from_mapping(values)


def default_params() -> dict:
    """The DAG params (and their defaults): every PipelineConfig field plus the connection ids."""
    d = dataclasses.asdict(PipelineConfig())
    d["cassandra_hosts"] = ""
    d.update(kafka_conn_id="cassandra_cdc_kafka", s3_conn_id="cassandra_cdc_s3",
             cassandra_conn_id="cassandra_cdc_cassandra")
    return d


def airflow_connection(conn_id: str):
    """The Airflow connection ``conn_id``, or None when it is not defined (the DAG params then apply)."""
    from airflow.sdk import BaseHook
    try:
        return BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - AirflowNotFoundException (or a task-SDK variant): not configured
        return None


def config_from_airflow_context() -> PipelineConfig:
    """The PipelineConfig of the running Airflow task (its params + connections)."""
    from airflow.sdk import get_current_context
    return config_from_params(dict(get_current_context()["params"]), airflow_connection)


def airflow_params() -> dict:
    """``default_params`` as Airflow ``Param`` objects (the DAGs' ``params``)."""
    from airflow.sdk import Param
    types = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    out = {}
    for k, v in default_params().items():
        t = types.get(type(v))
        out[k] = Param(v, type=["null", t] if t else ["null", "string", "integer", "number", "boolean"])
    return out
