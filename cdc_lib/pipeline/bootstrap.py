"""Bootstrap: load the rows a table held before CDC was enabled, as ``op = 'r'`` events and state (backfill DAG
``mode = cql`` and ``mode = sstables``).

``request_sstables`` loads them from the SSTable snapshots the nodes' agents shipped (``agent.snapshot``): each
SSTable is an item, read by ``cdc_lib.sstable`` with its real write times, TTLs and tombstones (the snapshot holds
every write before it, so the commit log's older changes merge into it without bringing anything back).
``request_cql`` scans the live tables:

A table that already holds data when CDC is enabled is empty for the pipeline: the first update of an old row
would be a ``c`` event whose ``after`` holds only the updated column. ``request_cql`` asks for a **parallel scan
through CQL**: every chosen table is cut into token ranges (``scan.split_ring``: ``splits`` per table, aligned with
the nodes' ranges), and each range is read with ``WRITETIME()`` and ``TTL()`` of every column, at ``consistency``
(``QUORUM`` by default), ``page_size`` rows per page (``cdc_lib.scan``). The ranges are a backfill request
(``requests``): the next ``cassandra_cdc`` runs claim them, ``splits_per_batch`` per batch, before any new segment,
and each batch scans its ranges (``parallelism`` at once in the transform's process; one Spark task each on a
cluster), keeps what it read in the store (``backfill/<cluster>/<request>/<keyspace>.<table>/<n>.arrow``, so a
rerun merges the same rows), and merges the rows into the state like any cell log: with their real write times,
so whatever the commit log brings before or after wins or loses exactly as in Cassandra. A row that becomes
visible is an ``r`` event; a row the stream had already made visible gets a ``u`` if the scan changes it.

The handoff, without a gap or a duplicate:

1. ``ALTER TABLE ... WITH cdc = true``: from here on every write is in the commit log the agents ship.
2. The backfill request (this module). It refuses a table whose ``cdc`` is not on in the cluster (writes before
   the ALTER would be in no commit log the pipeline reads, so a scan started earlier could miss them).
3. The scan batches run first; writes that land during the scan are both in the rows read (or not, depending on
   when their range was read) and in the commit log, and the merge keeps whichever is newer, by write time. Each
   range records when it read each page (``record_horizons``: ``backfill/<cluster>/horizons/``): a commit-log
   change written before the scan read its partition is merged without an event (it is in what the scan read;
   merged again, it could bring back for a moment what a later deletion removed: ``scan.horizon``), a later one
   is an event after the ``r``.

What must not happen between 1 and 2 is a ``cassandra_cdc`` batch that processes writes to the table: its
events for old rows would carry partial rows. Pause the ``cassandra_cdc`` DAG while you enable CDC and trigger the
backfill (or trigger the backfill before its next run); the scan's events still follow, and the state is right
either way.
"""
from __future__ import annotations

import logging
from typing import Optional

from cdc_lib.errors import ConfigError
from cdc_lib.settings import PipelineConfig
from cdc_lib.storage.layout import Layout

from .batches import Batch, batch_id_for, read_batch
from .requests import new_request_id, put_request
from .resources import load_schema, open_store

log = logging.getLogger("cassandra_cdc.pipeline")

DEFAULT_SPLITS = 16
DEFAULT_PARALLELISM = 4


def _table_names(value) -> Optional[list]:
    if value is None or value == "" or value == []:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(v).strip() for v in items if str(v).strip()] or None


def _positive(name: str, value, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"cql backfill: {name} must be a whole number, not {value!r}") from None
    if n < 1:
        raise ConfigError(f"cql backfill: {name} must be at least 1, got {n}")
    return n


def scan_settings(config: PipelineConfig, consistency: str = "QUORUM", page_size: int = 1000):
    """``scan.ScanSettings`` from the pipeline's Cassandra settings (contact points, port, credentials)."""
    from cdc_lib.scan import ScanSettings
    return ScanSettings(hosts=tuple(config.cassandra_hosts), port=config.cassandra_port,
                        username=config.cassandra_username, password=config.cassandra_password,
                        consistency=str(consistency).upper(), page_size=int(page_size))


def request_cql(config: PipelineConfig, *, tables=None, consistency=None, splits=None, page_size=None,
                splits_per_batch=None, parallelism=None) -> dict:
    """Ask the next ``cassandra_cdc`` runs to load ``tables`` (``keyspace.table``; empty: every captured table)
    through a CQL scan. Returns the plan: tables, token ranges, batches. Errors name the table or setting."""
    from cdc_lib.scan import ScanError, TableScan, split_ring
    from cdc_lib.scan.reader import open_cluster
    splits = _positive("splits", splits, DEFAULT_SPLITS)
    page_size = _positive("page_size", page_size, 1000)
    parallelism = _positive("parallelism", parallelism, DEFAULT_PARALLELISM)
    settings = scan_settings(config, consistency or "QUORUM", page_size)
    schema = load_schema(config)
    captured = {t.qualified_name: t for t in schema.captured_tables()}
    chosen = _table_names(tables)
    skipped_counters = []
    if chosen is None:
        chosen = sorted(captured)
        for name in list(chosen):
            try:
                TableScan(captured[name])
            except ScanError:
                chosen.remove(name)
                skipped_counters.append(name)
    for name in chosen:
        if name not in captured:
            raise ConfigError(f"cql backfill: {name} is not a captured table (unknown, cdc = false in the schema, "
                              "or left out by the include/exclude settings)")
        TableScan(captured[name])        # ScanError for counter tables: says to use mode sstables
    if not chosen:
        raise ConfigError("cql backfill: no table to scan" + (f" (counter tables {', '.join(skipped_counters)} "
                                                              "need mode sstables)" if skipped_counters else ""))
    cluster = open_cluster(settings)
    try:
        try:
            session = cluster.connect()
        except Exception as e:  # noqa: BLE001 - NoHostAvailable, authentication
            raise ConfigError(f"cql backfill: cannot connect to {', '.join(settings.hosts)} port {settings.port}: "
                              f"{type(e).__name__}: {e}") from e
        release = session.execute("SELECT release_version FROM system.local").one()[0]
        element_times = int(str(release).split(".")[0]) >= 5
        per_table = {}
        for name in chosen:
            ks, tname = name.split(".", 1)
            row = session.execute("SELECT cdc FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
                                  (ks, tname)).one()
            if row is None:
                raise ConfigError(f"cql backfill: table {name} does not exist in the cluster")
            if not row[0]:
                raise ConfigError(f"cql backfill: {name} has cdc = false in the cluster: enable CDC first (ALTER "
                                  f"TABLE {name} WITH cdc = true), then request the backfill; writes made before "
                                  "would be in no commit log the pipeline reads")
            per_table[name] = {"element_times": element_times}
        ring = [t.value for t in cluster.metadata.token_map.ring] if cluster.metadata.token_map else []
    finally:
        cluster.shutdown()
    ranges = split_ring(ring, splits)
    store = open_store(config)
    request_id = new_request_id("cql")
    items = []
    for name in chosen:
        ks, tname = name.split(".", 1)
        for i, r in enumerate(ranges):
            items.append({"id": f"{name}/{i}", "kind": "cql", "table": name, "index": i, "of": len(ranges),
                          "start": r.start, "end": r.end, "source": f"cql:{request_id}/{name}/{i}",
                          "key": Layout.scanned_range(config.cluster, request_id, ks, tname, i),
                          **per_table[name]})
    per_batch = _positive("splits_per_batch", splits_per_batch, len(ranges))
    put_request(store, request_id, "cql", items, per_batch=per_batch,
                batch={"consistency": settings.consistency, "page_size": page_size, "parallelism": parallelism})
    answer = {"mode": "cql", "request_id": request_id, "tables": chosen, "token_ranges_per_table": len(ranges),
              "items": len(items), "batches": -(-len(items) // per_batch), "consistency": settings.consistency,
              "cassandra": str(release), "element_times": element_times, "skipped_counter_tables": skipped_counters}
    log.info("cql backfill requested: %s", answer)
    return answer


def request_sstables(config: PipelineConfig, *, tag=None, tables=None, nodes=None, sstables_per_batch=None) -> dict:
    """Ask the next ``cassandra_cdc`` runs to load ``tables`` (empty: every captured table in the snapshot) from
    the SSTable snapshot ``tag`` that the nodes' agents shipped (``agent snapshot``; every node that shipped one,
    or ``nodes``). Each SSTable is an item: ``sstables_per_batch`` of them per batch (default ``max_segments``),
    within ``max_bytes`` of Data.db."""
    from cdc_lib.sstable.descriptor import is_data_file
    if not tag:
        raise ConfigError("sstables backfill: give the snapshot's tag (agent snapshot --tag)")
    store = open_store(config)
    schema = load_schema(config)
    captured = {t.qualified_name: t for t in schema.captured_tables()}
    chosen = _table_names(tables)
    for name in chosen or ():
        if name not in captured:
            raise ConfigError(f"sstables backfill: {name} is not a captured table (unknown, cdc = false in the "
                              "schema, or left out by the include/exclude settings)")
    wanted_nodes = _table_names(nodes)
    manifests = []
    for key in store.list(f"{Layout.SNAPSHOTS}/{config.cluster}/"):
        parts = key.split("/")
        if len(parts) == 5 and parts[3] == tag and parts[4] == "snapshot.json" and \
                (wanted_nodes is None or parts[2] in wanted_nodes):
            manifests.append(store.get_json(key))
    if not manifests:
        raise ConfigError(f"sstables backfill: no complete snapshot {tag!r} of cluster {config.cluster} in the store"
                          + (f" from nodes {', '.join(wanted_nodes)}" if wanted_nodes else "")
                          + " (run cassandra-cdc agent snapshot --tag on the nodes first)")
    items, not_captured = [], set()
    for m in sorted(manifests, key=lambda m: m["node"]):
        for name, snap in sorted(m["tables"].items()):
            if chosen is not None and name not in chosen:
                continue
            if name not in captured:
                not_captured.add(name)
                continue
            by_sstable: dict = {}
            for f in snap["files"]:
                if f["name"].count("-") == 3:           # <version>-<id>-<format>-<component>
                    by_sstable.setdefault(f["name"].rsplit("-", 1)[0], []).append(f)
            for prefix, files in sorted(by_sstable.items()):
                data = [f for f in files if is_data_file(f["name"])]
                if not data:
                    continue                            # components without their Data.db: nothing to read
                items.append({"id": f"{m['node']}/{files[0]['dir']}/{prefix}", "kind": "sstable", "table": name,
                              "node": m["node"], "files": files, "size": data[0]["size"],
                              "source": f"{m['node']}/{files[0]['dir']}/{data[0]['name']}"})
    if chosen is not None:
        missing = sorted(set(chosen) - {i["table"] for i in items})
        if missing:
            raise ConfigError(f"sstables backfill: snapshot {tag!r} holds no SSTable of {', '.join(missing)}")
    if not items:
        raise ConfigError(f"sstables backfill: snapshot {tag!r} holds no SSTable of a captured table")
    per_table = {}
    for i in items:
        t = per_table.setdefault(i["table"], {"sstables": 0, "bytes": 0})
        t["sstables"] += 1
        t["bytes"] += i["size"]
    for i in items:
        i["of"], i["of_bytes"] = per_table[i["table"]]["sstables"], per_table[i["table"]]["bytes"]
    request_id = new_request_id("sstables")
    per_batch = _positive("sstables_per_batch", sstables_per_batch, config.max_segments)
    put_request(store, request_id, "sstables", items, per_batch=per_batch, batch={"tag": tag})
    answer = {"mode": "sstables", "request_id": request_id, "tag": tag, "nodes": sorted(m["node"] for m in manifests),
              "tables": per_table, "items": len(items), "not_captured_in_snapshot": sorted(not_captured)}
    log.info("sstables backfill requested: %s", answer)
    return answer


def sstable_sources(store, batch: Batch) -> list:
    """The SSTables a ``sstables`` backfill batch reads, as ``spark.merge_job`` sources: each file where the
    readers find it (a local store's path, else its URL) with the sha256 to check a download against."""
    import os
    out = []
    for item in batch.backfill["items"]:
        files = [{**f, "path": os.path.join(store.root, *f["key"].split("/")) if store.local else
                  store.url_for(f["key"])} for f in item["files"]]
        out.append({**item, "files": files})
    return out


def record_horizons(store, cluster: str, scanned: list) -> None:
    """Add what a batch's scans read, and when (``scan.horizon``), to the tables' horizon files."""
    from cdc_lib.scan.horizon import Horizon
    by_table: dict = {}
    for s in scanned:
        by_table.setdefault((s["table"], s["table_id"]), []).append(s)
    for (name, table_id), ranges in sorted(by_table.items()):
        ks, tname = name.split(".", 1)
        key = Layout.horizon(cluster, ks, tname)
        known = store.get_json(key) if store.exists(key) else {}
        horizon = Horizon.from_json(known.get("ranges") if known.get("table_id") == table_id else None)
        for r in ranges:
            horizon = horizon.merged(r["start"], r["end"], r["pages"])
        store.put_json(key, {"table": name, "table_id": table_id, "ranges": horizon.to_json()})


def read_horizons(store, cluster: str) -> dict:
    """{table id: horizon JSON} of every table a backfill scanned (for the batches that merge segments)."""
    out = {}
    for key in store.list(Layout.horizons_prefix(cluster)):
        if key.endswith(".json"):
            data = store.get_json(key)
            out[data["table_id"]] = data["ranges"]
    return out


def scan_sources(batch: Batch) -> list:
    """The token ranges a ``cql`` backfill batch scans, as ``spark.merge_job`` sources."""
    return [dict(item) for item in batch.backfill["items"]]


def load_progress(store, batch: Batch, loaded: list) -> dict:
    """Log and return what a backfill batch loaded, per table: its token ranges (``cql``) or SSTables
    (``sstables``) done of the total, its rows (``cql``) or Data.db bytes (``sstables``), this batch's and the
    request's so far (the previous batch of the same request carries them: the request's batches run back to
    back)."""
    so_far: dict = {}
    if batch.batch_seq > 1:
        try:
            prev = read_batch(store, batch_id_for(batch.batch_seq - 1))
        except Exception:  # noqa: BLE001 - no previous manifest: nothing so far
            prev = None
        if prev is not None and prev.backfill.get("request_id") == batch.backfill["request_id"]:
            so_far = {t: dict(v) for t, v in (prev.steps.get("transform") or {}).get("loaded", {}).items()}
    scan = batch.backfill["mode"] == "cql"
    what, size = ("token ranges", "rows") if scan else ("SSTables", "bytes")
    totals = {item["table"]: item for item in batch.backfill["items"]}
    for s in loaded:
        t = so_far.setdefault(s["table"], {"done": 0, size: 0})
        t["done"] += 1
        t[size] += s[size]
    for table in sorted({s["table"] for s in loaded}):
        mine = [s for s in loaded if s["table"] == table]
        item = totals.get(table, {})
        of = f" of {item['of_bytes']:,}" if not scan and "of_bytes" in item else ""
        again = sum(s.get("from_store", 0) for s in mine)
        log.info("backfill %s: %s: %d of %d %s done (this batch: %d %s, %d %s%s; so far %d%s %s)",
                 batch.backfill["request_id"], table, so_far[table]["done"], item.get("of", 0), what, len(mine),
                 what, sum(s[size] for s in mine), size,
                 f", {again} read back from an earlier attempt" if again else "", so_far[table][size], of, size)
    return so_far


def describe(batch: Batch) -> str:
    """What a ``cql`` or ``sstables`` backfill batch does, for the transform's first log line."""
    b = batch.backfill
    tables = ", ".join(sorted({i["table"] for i in b["items"]}))
    if b["mode"] == "sstables":
        return (f"backfill {b['request_id']}: load {len(b['items'])} SSTables of {tables} from snapshot {b['tag']} "
                f"({sum(i['size'] for i in b['items']) / 1e6:.1f} MB of Data.db; {b['remaining']} of {b['total']} "
                "SSTables left after this batch)")
    return (f"backfill {b['request_id']}: scan {len(b['items'])} token ranges of {tables} at {b['consistency']} "
            f"({b['remaining']} of {b['total']} ranges left after this batch)")
