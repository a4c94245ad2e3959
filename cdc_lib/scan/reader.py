"""Scan one token range of a table through cassandra-driver, page by page, into cell-log batches.

``scan_range`` runs ``TableScan.query`` for one ``TokenRange`` at the consistency level of ``ScanSettings``
(``QUORUM`` by default: the rows a majority of replicas agree on, as a client reading at QUORUM sees them), fetching
``page_size`` rows per request (the driver's paging: the coordinator holds nothing between pages), and turns each
page into records as it arrives: memory holds one page and the records not yet handed out.

``read_scanned_range`` makes a scan a fixed input: the first time, it scans the range into an Arrow IPC stream
file in the object store (with its ``.sha256`` sidecar, written last: a file without one is an upload cut short);
any later read (a rerun of the batch after a crash, a recomputed Spark task) reads that file instead of the live
table, which has moved on. So the events a batch published and the state it wrote always come from the same rows.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

import pyarrow as pa

from cdc_lib.celllog.schema import CELL_LOG_SCHEMA

from .ranges import TokenRange
from .rows import RecordColumns, TableScan

log = logging.getLogger("cassandra_cdc.scan")

SCAN_METADATA = b"cassandra-cdc.scan"      # custom metadata of a scanned range file's last (empty) batch:
                                            # {"rows": n, "pages": [[last token, microseconds], ...]}
BATCH_RECORDS = 65_536                      # records per Arrow batch handed out
PAGES_KEPT = 64                             # page read times kept per range (``coarse_pages``)


@dataclass(frozen=True)
class ScanSettings:
    """Where and how to read: contact points and credentials, consistency level, rows per page."""

    hosts: tuple
    port: int = 9042
    username: Optional[str] = None
    password: Optional[str] = field(default=None, repr=False)
    consistency: str = "QUORUM"
    page_size: int = 1000

    def __post_init__(self):
        from cassandra import ConsistencyLevel
        from cdc_lib.errors import ConfigError
        if not self.hosts:
            raise ConfigError("a CQL scan needs cassandra_hosts (or the Cassandra connection)")
        if getattr(ConsistencyLevel, str(self.consistency).upper(), None) is None or \
                str(self.consistency).upper().startswith(("SERIAL", "LOCAL_SERIAL")):
            raise ConfigError(f"consistency {self.consistency!r}: use a read consistency level such as ONE, "
                              "LOCAL_QUORUM, QUORUM or ALL")
        if not 1 <= int(self.page_size) <= 100_000:
            raise ConfigError(f"page_size must be 1..100000 rows, got {self.page_size}")


_sessions: dict = {}
_sessions_lock = threading.Lock()


def open_cluster(settings: ScanSettings):
    """A cassandra-driver ``Cluster`` on ``settings.hosts`` (the caller shuts it down)."""
    from cassandra.cluster import Cluster
    options = {}
    if settings.username:
        from cassandra.auth import PlainTextAuthProvider
        options["auth_provider"] = PlainTextAuthProvider(settings.username, settings.password or "")
    return Cluster(list(settings.hosts), port=settings.port, connect_timeout=30, control_connection_timeout=30,
                   **options)


def scan_session(settings: ScanSettings):
    """This process's scan session for ``settings`` (one per contact points and user, kept open: a Spark worker
    scans many ranges): result rows arrive as bytes (``raw``), as plain tuples."""
    from cassandra.query import tuple_factory

    from .raw import RawRowsProtocolHandler
    key = (tuple(settings.hosts), settings.port, settings.username)
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None or session.is_shutdown:
            session = open_cluster(settings).connect()
            session.client_protocol_handler = RawRowsProtocolHandler
            session.row_factory = tuple_factory
            session.default_timeout = 120
            _sessions[key] = session
    return session


def close_sessions() -> int:
    """Shut down this process's scan sessions; returns how many there were. A batch run in the pipeline's own
    process calls it once its sources are read: an open session would otherwise keep its connections, its
    reconnection attempts and the cluster's event pushes alive in that process until it exits. (A Spark worker
    keeps its session for the ranges of later tasks.)"""
    with _sessions_lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    for session in sessions:
        session.cluster.shutdown()
    return len(sessions)


def scan_range(session, scan: TableScan, rng: TokenRange, settings: ScanSettings, source: str,
               stats: Optional[dict] = None) -> Iterator[pa.RecordBatch]:
    """Cell-log batches of the rows of ``scan.table`` whose token is in ``rng``; ``stats["rows"]`` counts rows,
    ``stats["pages"]`` says when each page was read (``horizon``: ``[(last token, microseconds)]``)."""
    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement
    stats = stats if stats is not None else {}
    stats.setdefault("rows", 0)
    pages = stats["pages"] = []
    statement = SimpleStatement(scan.query, fetch_size=int(settings.page_size),
                                consistency_level=getattr(ConsistencyLevel, settings.consistency.upper()))
    out = RecordColumns()
    asked = time.time_ns() // 1000      # before the request: TTL() counts down from the read's own time
    result = session.execute(statement, (rng.start, rng.end))
    while True:
        page = result.current_rows
        scan.records(page, asked // 1_000_000, source, stats["rows"], out)
        stats["rows"] += len(page)
        if not result.has_more_pages:
            pages.append((rng.end, asked))        # the last page covers the rest of the range
            break
        if page:
            pages.append((out.last_token, asked))
        if len(out) >= BATCH_RECORDS:
            yield out.take()
        asked = time.time_ns() // 1000
        result.fetch_next_page()
    if len(out):
        yield out.take()
    stats["pages"] = coarse_pages(pages, PAGES_KEPT)


def coarse_pages(pages: list, keep: int) -> list:
    """At most ``keep`` of a range's ``(last token, read time)`` pages: consecutive pages merged, each group with
    its last token and its first page's time (the earliest: a horizon may only be earlier than the read, never
    later, or a change the scan did not see would make no event). Every stream batch reads the horizons, so they
    stay small: a range read in 100,000 pages keeps 64 entries."""
    if len(pages) <= keep:
        return pages
    step = -(-len(pages) // keep)
    return [(pages[min(i + step, len(pages)) - 1][0], pages[i][1]) for i in range(0, len(pages), step)]


def read_scanned_range(store, key: str, scan_rows, stats: dict) -> Iterator[pa.RecordBatch]:
    """The cell-log batches of one scanned range: read from ``key`` in ``store`` when a complete copy is there,
    else ``scan_rows(stats)`` (``scan_range`` of the range) written there first and then read back.

    ``stats``: ``rows`` and ``pages`` of the scan (``scan_range``), ``from_store`` (1 when an earlier scan was
    read).
    """
    from cdc_lib.storage.objects import sha256_file
    stats["from_store"] = 0
    if store.exists(key) and store.info(key).checksum is not None:
        stats["from_store"] = 1
        with store.open(key) as f:
            yield from _read_file(f, stats, key)
        return
    directory = tempfile.mkdtemp(prefix="cdc-scan-")
    path = os.path.join(directory, "range.arrow")
    try:
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, CELL_LOG_SCHEMA) as writer:
            for batch in scan_rows(stats):
                writer.write_batch(batch)
            writer.write_batch(pa.RecordBatch.from_pylist([], schema=CELL_LOG_SCHEMA), custom_metadata={
                SCAN_METADATA: json.dumps({"rows": stats["rows"], "pages": stats["pages"]}).encode()})
        checksum, _ = sha256_file(path)
        store.put_file(path, key, checksum=checksum)
        with open(path, "rb") as f:
            yield from _read_file(f, dict(stats), key)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _read_file(f, stats: dict, key: str) -> Iterator[pa.RecordBatch]:
    """The batches of a scanned range file; its ``rows`` and ``pages`` into ``stats``."""
    closed = False
    reader = pa.ipc.open_stream(f)
    while True:
        try:
            item = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            break
        meta = item.custom_metadata
        if meta is not None and SCAN_METADATA in meta:
            scanned = json.loads(meta[SCAN_METADATA])
            stats["rows"], stats["pages"] = scanned["rows"], scanned["pages"]
            closed = True
        if item.batch.num_rows:
            yield item.batch
    if not closed:
        from cdc_lib.errors import FormatError
        raise FormatError("a scanned range file without its closing batch (written by something else?)", key)
