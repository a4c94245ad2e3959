"""Decoder throughput and memory, side by side with the floor any reader must pay.

    .venv/bin/python benchmarks/bench_decode.py [--mb 256] [--distinct 40000] [--dir DIR]

Generates a workload of at least ``--mb`` MB of commit-log segments (32 MiB, descriptor 7, the sample schema:
every CQL type, collections, statics, TTLs, every deletion kind), then measures on one core, in this run:

* floor:      read the segment files and compute the CRC of every entry (what any reader must do);
* container:  our segment reader alone (markers, entry framing, both CRCs per entry);
* reference:  container + ``commitlog.mutation.decode_mutation`` (typed mutations, the reference decoder), and the same
              turned into the Arrow cell log through ``celllog.mutation_records``;
* cell log:   container + the fast path to Arrow (``celllog.read_cell_log``), what the Spark jobs run;

and the peak Python memory of decoding one 32 MiB segment versus a 4 MiB one (streaming: it must not grow).
It prints MB/s and cells/s for each, and the ratio to the floor. Not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cdc_lib import wire  # noqa: E402
from cdc_lib.celllog.reader import read_cell_log  # noqa: E402
from cdc_lib.commitlog.mutation import decode_mutation, encode_mutation  # noqa: E402
from cdc_lib.commitlog.segment import SegmentReader  # noqa: E402
from cdc_lib.commitlog.writer import SegmentFull, SegmentWriter  # noqa: E402
from cdc_lib.demo.workload import Workload, sample_schema  # noqa: E402

SEGMENT = 32 * 1024 * 1024


def generate(directory: str, schema, target_bytes: int, distinct: int, seed: int = 7) -> list:
    """Segments holding at least ``target_bytes`` of entries: ``distinct`` generated mutations, repeated."""
    wl = Workload(schema, seed=seed, partitions=5000)
    pool = [encode_mutation(wl.next_mutation(), schema) for _ in range(distinct)]
    paths, written, i, seg_id = [], 0, 0, 1_700_000_000_000
    w = None
    while written < target_bytes:
        if w is None:
            seg_id += 1
            w = SegmentWriter(directory, seg_id, version=7, segment_size=SEGMENT)
        m = pool[i % len(pool)]
        try:
            w.add(m)
        except SegmentFull:
            w.close()
            paths.append(w.path)
            w = None
            continue
        written += len(m) + 12
        i += 1
        if i % 200 == 0:
            w.sync()
    if w is not None:
        w.close()
        paths.append(w.path)
    return paths


def floor(paths) -> tuple:
    """Read each file and CRC every entry (size CRC + mutation CRC), walking the framing with plain slicing."""
    t = time.perf_counter()
    nbytes = 0
    for p in paths:
        with open(p, "rb") as f:
            buf = f.read()
        pos = 20
        while pos <= len(buf) - 8:
            nxt = wire.be_i32(buf, pos)
            if nxt == 0:
                break
            q = pos + 8
            while q < nxt:
                size = wire.be_i32(buf, q)
                if size == 0:
                    break
                c1 = zlib.crc32(buf[q:q + 4])
                zlib.crc32(buf[q + 8:q + 8 + size], c1)
                q += 12 + size
                nbytes += 12 + size
            pos = nxt
    return nbytes, time.perf_counter() - t


def container(paths):
    t = time.perf_counter()
    n = sum(len(e.data) + 12 for p in paths for e in SegmentReader(p))
    return n, time.perf_counter() - t


def reference(paths, schema):
    t = time.perf_counter()
    nbytes = cells = 0
    for p in paths:
        for e in SegmentReader(p):
            m = decode_mutation(e.data, schema, e.messaging_version)
            nbytes += len(e.data) + 12
            for u in m.updates:
                for r in u.unfiltereds:
                    cells += len(getattr(r, "cells", ())) + 1
                if u.static_row is not None:
                    cells += len(u.static_row.cells)
    return nbytes, cells, time.perf_counter() - t


def reference_cell_log(paths, schema):
    """The reference path to the same Arrow cell log: typed mutations, then records, then Arrow."""
    from cdc_lib.celllog.records import mutation_records, records_to_batch
    t = time.perf_counter()
    nbytes = rows = 0
    for p in paths:
        recs, ei = [], 0
        for e in SegmentReader(p):
            m = decode_mutation(e.data, schema, e.messaging_version)
            m.segment, m.segment_id, m.position = e.segment, e.segment_id, e.position
            recs += mutation_records(m, ei)
            ei += len(m.updates)
            nbytes += len(e.data) + 12
            if len(recs) >= 65536:
                rows += records_to_batch(recs).num_rows
                recs = []
        if recs:
            rows += records_to_batch(recs).num_rows
    return nbytes, rows, time.perf_counter() - t


def cell_log(paths, schema):
    damage = []
    t = time.perf_counter()
    rows = 0
    for batch in read_cell_log(paths, schema, on_damage=damage.append):
        rows += batch.num_rows
    assert not damage, damage[:1]
    return rows, time.perf_counter() - t


def peak_memory(path, schema) -> int:
    tracemalloc.start()
    for batch in read_cell_log([path], schema, on_damage=lambda d: None, batch_rows=16384):
        del batch
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--distinct", type=int, default=40000)
    ap.add_argument("--dir")
    args = ap.parse_args(argv)
    schema = sample_schema()
    d = args.dir or tempfile.mkdtemp(prefix="cdc-bench-")
    t = time.perf_counter()
    paths = generate(d, schema, args.mb * 1_000_000, args.distinct)
    gen_s = time.perf_counter() - t
    size = sum(os.path.getsize(p) for p in paths)
    print(f"workload: {len(paths)} segments of 32 MiB, {size / 1e6:.0f} MB on disk, generated in {gen_s:.0f} s")

    fb, ft = floor(paths)
    print(f"{'floor (read + CRC every entry)':38s} {fb / ft / 1e6:8.1f} MB/s")
    cb, ct = container(paths)
    print(f"{'container (our segment reader)':38s} {cb / ct / 1e6:8.1f} MB/s   {ct / ft:5.2f}x floor time")
    rb, rc, rt = reference(paths[:2], schema)
    print(f"{'reference decoder (typed mutations)':38s} {rb / rt / 1e6:8.1f} MB/s   {rc / rt:10.0f} cells/s"
          f"   (first 2 segments)")
    qb, qrows, qt = reference_cell_log(paths[:2], schema)
    print(f"{'reference decoder -> Arrow cell log':38s} {qb / qt / 1e6:8.1f} MB/s   {qrows / qt:10.0f} cells/s"
          f"   (first 2 segments)")
    rows, lt = cell_log(paths, schema)
    print(f"{'cell log fast path -> Arrow':38s} {fb / lt / 1e6:8.1f} MB/s   {rows / lt:10.0f} cells/s   "
          f"{lt / ft:5.1f}x floor time")
    print(f"entries bytes decoded: {fb / 1e6:.0f} MB, cell-log rows: {rows}")

    small_dir = tempfile.mkdtemp(prefix="cdc-bench-small-")
    small = generate(small_dir, schema, 4_000_000, 5000)[0]
    big = paths[0]
    pb, ps = peak_memory(big, schema), peak_memory(small, schema)
    print(f"peak traced memory decoding one segment: 32 MiB segment {pb / 1e6:.1f} MB, "
          f"{os.path.getsize(small) / 1e6:.0f} MB file with 4 MB of entries {ps / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
