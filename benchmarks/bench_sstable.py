"""SSTable reader throughput and memory, side by side with the floor any reader must pay for the same bytes.

    .venv/bin/python benchmarks/bench_sstable.py [--mb 64] [--codec LZ4Compressor] [--version oa]
    .venv/bin/python benchmarks/bench_sstable.py --sstables DIR_OR_DATA_DB ...     (real SSTables instead)
    .venv/bin/python benchmarks/bench_sstable.py --cqlite KEYSPACE.cql [--expected F] TABLE_DIR ...
                                              (beside cqlite-py on real 5.0 SSTables: benchmarks/cqlite_compare.py)

By default it writes SSTables of the sample schema (every CQL type, collections, statics, TTLs, every deletion
kind) with the tests' SSTable writer (``tests/sstable_writer.py``), then measures on one core, in this run:

* floor:        read Data.db and check every chunk's CRC32 (compressed) or CRC.db (uncompressed);
* floor + codec: the same and decompress every chunk, which any reader of a compressed SSTable must do;
* reference:    ``SSTable.mutations()``, typed partitions (what ``inspect`` prints);
* cell log:     ``read_sstable_cell_log``, the fast path to Arrow (what a backfill runs);

and the peak Python memory of the cell-log path on the largest SSTable versus a small one (streaming: it must
not grow with the file). MB/s are Data.db bytes as stored per second. Not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
import tracemalloc
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from cdc_lib.commitlog.compression import compressor_for  # noqa: E402
from cdc_lib.sstable import SSTable, find_data_files, read_sstable_cell_log  # noqa: E402
from cdc_lib.sstable.chunks import read_compression_info, read_crc_db  # noqa: E402
from cdc_lib.sstable.descriptor import parse_data_path  # noqa: E402


def generate(root: Path, mb: int, codec: str | None, version: str, seed: int = 5) -> list:
    """One SSTable per sample-schema table, about ``mb`` MB of partitions in all."""
    from sstable_writer import write_sstable

    from cdc_lib.demo.workload import Workload, sample_schema
    schema = sample_schema()
    wl = Workload(schema, seed=seed, partitions=20000)
    by_table = collections.defaultdict(list)
    approx = 0
    while approx < mb * 1_000_000:
        for u in wl.next_mutation().updates:
            by_table[u.table_id].append(u)
            approx += sum(len(c.value) + 24 for r in u.rows for c in r.cells) + 40 * (len(u.unfiltereds) + 1)
    fmt = "bti" if version == "da" else "big"
    out = []
    for tid, updates in by_table.items():
        updates.sort(key=lambda u: u.partition_key)
        w = write_sstable(root, schema.table(tid), updates, version=version, fmt=fmt, compressor=codec,
                          chunk_length=16384)
        out.append(w.data)
    return out, schema


class Timer:
    """Wall and CPU seconds of a block: on a shared machine the CPU time is the steadier figure."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def floor(paths, decompress: bool) -> int:
    """Read every Data.db and check its CRCs (and decompress its chunks); returns the bytes read."""
    total = 0
    for p in paths:
        desc = parse_data_path(p)
        data = p.read_bytes()
        total += len(data)
        ci = read_compression_info(desc)
        if ci is None:
            crcs = read_crc_db(desc)
            if crcs is not None:
                size = crcs[0]
                for i in range(0, len(data), size):
                    zlib.crc32(data[i:i + size])
            continue
        codec = compressor_for(ci.compressor, ci.options)
        for i in range(ci.data_chunks):
            a = ci.offset(i)
            b = ci.offset(i + 1) if i + 1 < ci.chunk_count else len(data)
            payload = data[a:b - 4]
            zlib.crc32(payload)
            if decompress:
                codec.decompress(payload, min(ci.chunk_length, ci.data_length - i * ci.chunk_length))
    return total


def reference(paths, schema) -> int:
    cells = 0
    for p in paths:
        for m in SSTable(p, schema).mutations():
            for u in m.updates:
                cells += sum(len(getattr(r, "cells", ())) + 1 for r in u.unfiltereds)
    return cells


def warm_up(paths, schema) -> None:
    for _ in read_sstable_cell_log(paths[:1], schema, on_damage=lambda d: None, batch_rows=1):
        break                                   # pyarrow's lazy imports are not the reader's cost


def cell_log(paths, schema) -> int:
    damage = []
    rows = sum(b.num_rows for b in read_sstable_cell_log(paths, schema, on_damage=damage.append))
    assert not damage, damage[:1]
    return rows


def peak_memory(path, schema) -> int:
    tracemalloc.start()
    for batch in read_sstable_cell_log([path], schema, on_damage=lambda d: None, batch_rows=16384):
        del batch
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--codec", default="LZ4Compressor", help="compressor class, or 'none'")
    ap.add_argument("--version", default="oa", choices=["ma", "mb", "mc", "md", "me", "na", "nb", "oa", "da"])
    ap.add_argument("--sstables", nargs="*", help="real SSTables (Data.db files or table directories)")
    ap.add_argument("--cqlite", metavar="KEYSPACE_CQL",
                    help="compare with cqlite-py on the table directories given by --sstables (their schema DDL)")
    ap.add_argument("--expected", help="expected.json of the SSTables: SELECT * as Cassandra returned it")
    args = ap.parse_args(argv)
    if args.cqlite:
        from cqlite_compare import compare
        return compare(args.sstables or [], args.cqlite, args.expected, floor)
    schema = None
    if args.sstables:
        paths = [f for p in args.sstables for f in find_data_files(p)]
        print(f"workload: {len(paths)} real SSTables")
    else:
        codec = None if args.codec == "none" else args.codec
        t = time.perf_counter()
        paths, schema = generate(Path(tempfile.mkdtemp(prefix="cdc-bench-sst-")), args.mb, codec, args.version)
        print(f"workload: {len(paths)} SSTables ({args.version}, {args.codec}) of the sample schema, "
              f"written in {time.perf_counter() - t:.0f} s")
    size = sum(os.path.getsize(p) for p in paths)
    dlen = sum(SSTable(p, schema).length for p in paths)
    print(f"Data.db: {size / 1e6:.1f} MB on disk, {dlen / 1e6:.1f} MB uncompressed")

    warm_up(paths, schema)
    print(f"{'':38s} {'MB/s':>8s} {'MB/s cpu':>9s} {'per s (cpu)':>12s} {'x floor (cpu)':>14s}")
    with Timer() as f:
        floor(paths, decompress=False)
    with Timer() as fd:
        floor(paths, decompress=True)
    with Timer() as r:
        cells = reference(paths, schema)
    with Timer() as c:
        rows = cell_log(paths, schema)

    def line(name, t, count=None, unit=""):
        per = f"{count / t.cpu:8.0f} {unit}" if count is not None else ""
        print(f"{name:38s} {size / t.wall / 1e6:8.1f} {size / t.cpu / 1e6:9.1f} {per:>12s} {t.cpu / f.cpu:10.1f}x")
    line("floor: read + CRC every chunk", f)
    line("floor + decompress every chunk", fd)
    line("reference decoder -> typed partitions", r, cells, "cells")
    line("fast path -> Arrow cell log", c, rows, "recs")
    print(f"(uncompressed: the fast path decodes {dlen / c.cpu / 1e6:.1f} MB/s of D per CPU second)")
    by_size = sorted(paths, key=os.path.getsize)
    small, big = by_size[0], by_size[-1]
    pb, ps = peak_memory(big, schema), peak_memory(small, schema)
    print(f"peak traced memory, cell-log path: {os.path.getsize(big) / 1e6:.1f} MB SSTable {pb / 1e6:.1f} MB, "
          f"{os.path.getsize(small) / 1e6:.2f} MB SSTable {ps / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
