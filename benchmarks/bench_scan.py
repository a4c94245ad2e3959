"""CQL-scan throughput of the ``cql`` backfill on a real Cassandra 5.0 node, beside what the same rows cost otherwise.

    .venv/bin/python benchmarks/bench_scan.py [--rows 200000] [--splits 16] [--parallelism 4] [--page-size 1000]
    .venv/bin/python benchmarks/bench_scan.py --hosts 127.0.0.1 --port 9042     (a running node instead)

It starts one local Cassandra 5.0 node (``cdc_lib.demo.cassandra``; or uses ``--hosts``), writes ``--rows`` rows
into a table of ordinary width (int key and clustering, text, bigint, double, timestamp, a set and a map), flushes
it, and measures, in this run:

* driver ``SELECT *``: one paged query through cassandra-driver, values decoded into the driver's Python types
  (what any client reading the table pays: the baseline);
* the scan, 1 range at a time and ``--parallelism`` at once: ``scan.scan_range`` over ``--splits`` token ranges,
  every column with its ``WRITETIME()`` and ``TTL()``, values kept as bytes, rows turned into cell-log records and
  Arrow batches (what a ``cql`` backfill batch runs before it merges);
* the SSTable reader on the same table's flushed SSTables (``read_sstable_cell_log``, what the ``sstables`` mode
  runs).

Rows/s is wall clock (Cassandra runs on the same machine and shares its cores), beside the CPU seconds of this
process. Not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KS, TABLE = "bench_scan", "t"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_rows(session, rows: int) -> float:
    from cassandra.concurrent import execute_concurrent_with_args
    session.execute(f"DROP KEYSPACE IF EXISTS {KS}")
    session.execute(f"CREATE KEYSPACE {KS} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
    session.execute(f"CREATE TABLE {KS}.{TABLE} (k int, c int, v text, n bigint, d double, ts timestamp, "
                    "st set<text>, m map<text, int>, PRIMARY KEY (k, c)) WITH cdc = true")
    ins = session.prepare(f"INSERT INTO {KS}.{TABLE} (k, c, v, n, d, ts, st, m) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
    import datetime
    t0 = time.monotonic()
    args = ((i // 20, i % 20, f"value {i}", i * 7, i / 3, datetime.datetime(2025, 1, 1) + datetime.timedelta(seconds=i),
             {f"a{i % 5}", "b"}, {"x": i, "y": -i}) for i in range(rows))
    execute_concurrent_with_args(session, ins, args, concurrency=64, raise_on_first_error=True)
    return time.monotonic() - t0


def driver_select(session) -> int:
    from cassandra.query import SimpleStatement
    n = 0
    for _ in session.execute(SimpleStatement(f"SELECT * FROM {KS}.{TABLE}", fetch_size=1000)):
        n += 1
    return n


def scan(settings, table, splits: int, parallelism: int, ring) -> tuple:
    from cdc_lib.scan import TableScan, scan_range, scan_session, split_ring
    scan_ = TableScan(table)
    ranges = split_ring(ring, splits)
    session = scan_session(settings)

    def one(rng):
        stats: dict = {}
        records = sum(b.num_rows for b in scan_range(session, scan_, rng, settings, "bench", stats))
        return stats["rows"], records
    with ThreadPoolExecutor(parallelism) as pool:
        done = list(pool.map(one, ranges))
    return sum(r for r, _ in done), sum(c for _, c in done)


def sstables(cluster, schema) -> tuple:
    """Records and Data.db bytes of the table's SSTables, read from a snapshot (what the ``sstables`` mode reads;
    the live directory changes under a reader while compaction runs)."""
    from cdc_lib.sstable import read_sstable_cell_log
    cluster.nodetool(1, "snapshot", "-t", "bench", "-kt", f"{KS}.{TABLE}")
    table_dir = next((cluster.node(1).dir / "data" / KS).glob(f"{TABLE}-*"))
    files = [f for f in (table_dir / "snapshots" / "bench").iterdir() if f.name.endswith("-Data.db")]
    records = sum(b.num_rows for b in read_sstable_cell_log(files, schema, strict=True))
    return records, sum(f.stat().st_size for f in files)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--splits", type=int, default=16)
    ap.add_argument("--parallelism", type=int, default=4)
    ap.add_argument("--page-size", type=int, default=1000)
    ap.add_argument("--hosts", help="a running cluster's contact points (default: start a local node)")
    ap.add_argument("--port", type=int, default=9042)
    a = ap.parse_args(argv)
    from cdc_lib.cql.schema_from_cluster import load_from_cluster
    from cdc_lib.scan import ScanSettings
    cluster = None
    tmp = tempfile.TemporaryDirectory(prefix="bench-scan-")
    try:
        if a.hosts:
            from cdc_lib.scan.reader import open_cluster
            hosts, port = tuple(a.hosts.split(",")), a.port
            session = open_cluster(ScanSettings(hosts=hosts, port=port)).connect()
        else:
            from cdc_lib.demo.cassandra import LocalCassandra
            cluster = LocalCassandra(Path(tmp.name) / "c", 1, cluster_name="bench_scan")
            t0 = time.monotonic()
            cluster.start()
            print(f"Cassandra 5.0 node started in {time.monotonic() - t0:.0f} s")
            hosts, port = tuple(cluster.contact_points), cluster.native_port
            session = cluster.session()
        session.default_timeout = 120
        took = write_rows(session, a.rows)
        print(f"wrote {a.rows:,} rows in {took:.1f} s ({a.rows / took:,.0f} rows/s)")
        table = load_from_cluster(session, [KS]).by_name(KS, TABLE)
        ring = [t.value for t in session.cluster.metadata.token_map.ring]
        settings = ScanSettings(hosts=hosts, port=port, consistency="ONE", page_size=a.page_size)
        driver_select(session)                                          # warm the node's caches and the JIT
        print(f"\n{'path':58} {'rows/s (wall)':>14} {'records/s':>11} {'CPU s':>7}")

        def line(name, t, c, rows, records=None):
            rec = f"{records / t:11,.0f}" if records else " " * 11
            print(f"{name:58} {rows / t:14,.0f} {rec} {c:7.1f}")
        t0, c0 = time.monotonic(), cpu()
        n = driver_select(session)
        line("driver SELECT * (paged, the driver's types)", time.monotonic() - t0, cpu() - c0, n)
        for par in (1, a.parallelism):
            t0, c0 = time.monotonic(), cpu()
            rows, records = scan(settings, table, a.splits, par, ring)
            assert rows == a.rows, (rows, a.rows)
            line(f"scan: {a.splits} ranges, {par} at once (+WRITETIME/TTL, cell log)", time.monotonic() - t0,
                 cpu() - c0, rows, records)
        if cluster is not None:
            schema = load_from_cluster(session, [KS])
            t0, c0 = time.monotonic(), cpu()
            records, size = sstables(cluster, schema)
            t = time.monotonic() - t0
            line(f"SSTable reader, the same rows ({size / 1e6:.1f} MB Data.db, a snapshot)", t, cpu() - c0, a.rows,
                 records)
        session.execute(f"DROP KEYSPACE {KS}")
    finally:
        if cluster is not None:
            cluster.stop(graceful=False)
        tmp.cleanup()


if __name__ == "__main__":
    main()
