"""Decoder throughput and memory, side by side with the floor any reader must pay.

    .venv/bin/python benchmarks/bench_decode.py [--mb 256] [--distinct 40000] [--dir DIR] [--repeat 3]

Generates a workload of at least ``--mb`` MB of commit-log segments (32 MiB, descriptor 7, the sample schema:
every CQL type, collections, statics, TTLs, every deletion kind), then measures on one core, in this run:

* floor:      read the segment files and compute the CRC of every entry (what any reader must do);
* container:  our segment reader alone (markers, entry framing, both CRCs per entry);
* reference:  container + ``commitlog.mutation.decode_mutation`` (typed mutations, the reference decoder), and
              the same turned into the Arrow cell log through ``celllog.mutation_records``;
* cell log, Python: ``celllog.read_cell_log`` with ``CASSANDRA_CDC_NATIVE=0`` (the pure-Python fast path);
* cell log, native: ``celllog.read_cell_log`` with ``CASSANDRA_CDC_NATIVE=1`` (the compiled reader), checked to
  give the Python path's rows;
* the same two on LZ4-compressed segments (decompression stays in the lz4 library, called once per section);

and the peak memory of decoding one 32 MiB segment versus a 4 MB one, on both paths (a subprocess each: peak RSS
above the process's RSS after imports, the anonymous memory, and tracemalloc's Python-heap peak, which does not
see Arrow's memory pool). The machine may be shared: each figure is the best of ``--repeat`` runs, given both as
wall-clock MB/s and as MB per CPU-second of this process (the per-core figure, steady under load). Not a test:
nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from cdc_lib import wire  # noqa: E402
from cdc_lib.celllog import native, read_cell_log  # noqa: E402
from cdc_lib.commitlog.mutation import decode_mutation, encode_mutation  # noqa: E402
from cdc_lib.commitlog.segment import SegmentReader  # noqa: E402
from cdc_lib.commitlog.writer import SegmentFull, SegmentWriter  # noqa: E402
from cdc_lib.demo.workload import Workload, sample_schema  # noqa: E402

SEGMENT = 32 * 1024 * 1024


def generate(directory: str, schema, target_bytes: int, distinct: int, seed: int = 7, compression=None) -> list:
    """Segments holding at least ``target_bytes`` of entries: ``distinct`` generated mutations, repeated."""
    wl = Workload(schema, seed=seed, partitions=5000)
    pool = [encode_mutation(wl.next_mutation(), schema) for _ in range(distinct)]
    paths, written, i, seg_id = [], 0, 0, 1_700_000_000_000
    w = None
    while written < target_bytes:
        if w is None:
            seg_id += 1
            w = SegmentWriter(directory, seg_id, version=7, segment_size=SEGMENT, compression=compression)
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


class Timed:
    """Wall-clock and CPU time of a block (best of several runs is taken by the caller)."""

    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.w
        self.cpu = time.process_time() - self.c


def best(fn, repeat: int):
    """Run fn() ``repeat`` times: (result, best wall seconds, best CPU seconds)."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        with Timed() as t:
            out = fn()
        walls.append(t.wall)
        cpus.append(t.cpu)
    return out, min(walls), min(cpus)


def floor(paths) -> int:
    """Read each file and CRC every entry (size CRC + mutation CRC), walking the framing with plain slicing."""
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
    return nbytes


def container(paths) -> int:
    return sum(len(e.data) + 12 for p in paths for e in SegmentReader(p))


def reference(paths, schema):
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
    return nbytes, cells


def reference_cell_log(paths, schema):
    from cdc_lib.celllog import mutation_records, records_to_batch
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
    return nbytes, rows


def cell_log(path: str, paths, schema) -> int:
    """Rows of ``read_cell_log`` on ``path`` (python or native)."""
    os.environ[native.ENV] = "1" if path == "native" else "0"
    damage = []
    rows = 0
    for batch in read_cell_log(paths, schema, on_damage=damage.append):
        rows += batch.num_rows
    assert not damage, damage[:1]
    return rows


def entry_bytes(paths) -> int:
    return sum(len(e.data) + 12 for p in paths for e in SegmentReader(p))


_PEAK = r"""
import os, sys, json, tracemalloc
sys.path.insert(0, %(root)r)
os.environ["CASSANDRA_CDC_NATIVE"] = %(env)r
from cdc_lib.demo.workload import sample_schema
from cdc_lib.celllog import read_cell_log
schema = sample_schema()
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
base, anon0 = status("VmHWM"), status("RssAnon")
anon = anon0
tracemalloc.start()
for batch in read_cell_log([%(path)r], schema, on_damage=lambda d: None, batch_rows=16384):
    anon = max(anon, status("RssAnon"))     # sampled while each batch is alive (the high points)
    del batch
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(json.dumps({"rss_mb": (status("VmHWM") - base) / 1024, "anon_mb": (anon - anon0) / 1024,
                  "traced_mb": peak / 1e6}))
"""


def peak_memory(path: str, native_path: bool) -> dict:
    r = subprocess.run([sys.executable, "-c", _PEAK % {"root": ROOT, "env": "1" if native_path else "0",
                                                       "path": path}],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--distinct", type=int, default=40000)
    ap.add_argument("--dir")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python-segments", type=int, default=2,
                    help="segments the (slow) Python paths decode; MB/s are per byte decoded")
    args = ap.parse_args(argv)
    schema = sample_schema()
    d = args.dir or tempfile.mkdtemp(prefix="cdc-bench-")
    t = time.perf_counter()
    paths = sorted(glob.glob(os.path.join(d, "plain", "CommitLog-*.log")))
    if not paths:
        os.makedirs(os.path.join(d, "plain"), exist_ok=True)
        paths = generate(os.path.join(d, "plain"), schema, args.mb * 1_000_000, args.distinct)
    lz4 = sorted(glob.glob(os.path.join(d, "lz4", "CommitLog-*.log")))
    if not lz4:
        os.makedirs(os.path.join(d, "lz4"), exist_ok=True)
        lz4 = generate(os.path.join(d, "lz4"), schema, 64_000_000, args.distinct, compression="LZ4Compressor")
    gen_s = time.perf_counter() - t
    size = sum(os.path.getsize(p) for p in paths)
    print(f"workload: {len(paths)} segments of 32 MiB, {size / 1e6:.0f} MB on disk, prepared in {gen_s:.0f} s; "
          f"best of {args.repeat} runs; MB/s wall-clock | MB per CPU-second")
    py_paths = paths[:args.python_segments]
    py_bytes = entry_bytes(py_paths)

    def line(label, nbytes, wall, cpu, floor_wall=None, floor_cpu=None, rows=None, extra=""):
        s = f"{label:44s} {nbytes / wall / 1e6:8.1f} | {nbytes / cpu / 1e6:8.1f} MB/s"
        if rows is not None:
            s += f"  {rows / wall:11,.0f} | {rows / cpu:11,.0f} cells/s"
        if floor_wall is not None:
            s += f"  {wall / nbytes / floor_wall:6.2f}x | {cpu / nbytes / floor_cpu:5.2f}x floor time"
        print(s + extra)

    fb, fw, fc = best(lambda: floor(paths), args.repeat)
    fwr, fcr = fw / fb, fc / fb          # floor seconds per byte (wall, CPU)
    line("floor (read + CRC every entry)", fb, fw, fc)
    cb, cw, cc = best(lambda: container(paths), args.repeat)
    line("container (our segment reader)", cb, cw, cc, fwr, fcr)
    (rb, rc), rw, rcpu = best(lambda: reference(py_paths, schema), 1)
    line("reference decoder (typed mutations)", rb, rw, rcpu, fwr, fcr, rc, f"  ({len(py_paths)} segments)")
    (qb, qrows), qw, qc = best(lambda: reference_cell_log(py_paths, schema), 1)
    line("reference decoder -> Arrow cell log", qb, qw, qc, fwr, fcr, qrows, f"  ({len(py_paths)} segments)")
    rows, lw, lc = best(lambda: cell_log("python", py_paths, schema), 1)
    line("cell log, Python fast path -> Arrow", py_bytes, lw, lc, fwr, fcr, rows, f"  ({len(py_paths)} segments)")
    if not native.native_available():
        print("cdc_native is not installed: no native figures (scripts/setup.sh builds it)")
        return
    nrows, nw, nc = best(lambda: cell_log("native", paths, schema), args.repeat)
    line("cell log, native -> Arrow", fb, nw, nc, fwr, fcr, nrows)
    rows_py_same = cell_log("native", py_paths, schema)
    assert rows_py_same == rows, (rows_py_same, rows)
    print(f"  native vs floor: {fw / nw * 100:.0f}% of the floor's wall-clock throughput, "
          f"{fc / nc * 100:.0f}% per CPU-second; native vs Python fast path: "
          f"{(fb / nw) / (py_bytes / lw):.0f}x (wall), {(fb / nc) / (py_bytes / lc):.0f}x (CPU)")
    lb = entry_bytes(lz4)
    lrows, lzw, lzc = best(lambda: cell_log("native", lz4, schema), args.repeat)
    line("LZ4 segments: cell log, native -> Arrow", lb, lzw, lzc, fwr, fcr, lrows)
    one = lz4[:1]
    prow, pw, pc = best(lambda: cell_log("python", one, schema), 1)
    line("LZ4 segments: cell log, Python fast path", entry_bytes(one), pw, pc, fwr, fcr, prow, "  (1 segment)")
    print(f"entry bytes decoded: {fb / 1e6:.0f} MB, cell-log rows: {nrows}")

    small_dir = tempfile.mkdtemp(prefix="cdc-bench-small-")
    small = generate(small_dir, schema, 4_000_000, 5000)[0]
    big = paths[0]
    for native_path in (False, True):
        pb, ps = peak_memory(big, native_path), peak_memory(small, native_path)
        print(f"peak memory decoding one segment ({'native' if native_path else 'Python'} path, batch_rows=16384): "
              f"32 MiB segment: peak RSS +{pb['rss_mb']:.1f} MB (of which the mmap'd file; anonymous "
              f"+{pb['anon_mb']:.1f} MB; Python heap {pb['traced_mb']:.1f} MB); {os.path.getsize(small) / 1e6:.0f} MB "
              f"file with 4 MB of entries: peak RSS +{ps['rss_mb']:.1f} MB (anonymous +{ps['anon_mb']:.1f} MB; "
              f"Python heap {ps['traced_mb']:.1f} MB)")


if __name__ == "__main__":
    main()
