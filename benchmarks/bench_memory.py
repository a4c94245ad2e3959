"""Peak memory of decoding one 32 MiB segment and of a 1M-change batch, each beside a baseline, one process a figure.

    nice .venv/bin/python benchmarks/bench_memory.py [--changes 1000000] [--state-rows N] [--only decode|batch]
                                                     [--batch-tracemalloc] [--dir DIR]

1. **Decoding one 32 MiB commit-log segment** to the Arrow cell log (the segment is written by
   ``commitlog.writer`` from the sample schema, with ``bench_decode.generate``: every CQL type, collections,
   statics, TTLs, every deletion kind). Batches are streamed as the parse step streams them (``read_cell_log``'s
   default 65,536 rows), so the figure is the decoder's working memory; the cell log's own Arrow size, which the
   in-driver transform then holds for the whole batch, is printed beside it. Baseline: read the file's bytes and
   CRC every entry (``bench_decode.floor``, the floor any reader pays); then the reference decoder
   (``bench_decode.reference_cell_log``), the pure-Python fast path (``CASSANDRA_CDC_NATIVE=0``) and the compiled
   reader (``CASSANDRA_CDC_NATIVE=1``; without the compiled module the output says so and gives no figure).
2. **A batch of ``--changes`` changes** (``bench_merge.py``'s workload and engine: ``UPDATE kv SET n = ?, v = ?
   WHERE id = ?`` on distinct ids, a fifth of them new, into a state of ``--state-rows`` rows) through
   ``sinks.delta.run_store_batch``: read the prior state, reconcile, build the events and their outbox rows, the
   state rows, then the outbox append and the state MERGE, once with the Python engine (``CASSANDRA_CDC_NATIVE=0``)
   and once with the compiled one (``=1``). Baselines: the same changes held as an Arrow table of
   ``(id, v, n)`` rows, the batch's cell log as Arrow (what the engine starts from), and a plain deltalake upsert
   of the ``(id, v, n)`` rows into a plain table of as many rows (as ``bench_merge.py`` times it).

Each figure comes from a fresh subprocess that imports and prepares what is not measured (the schema, the ids of
the changes), runs the same work once on a small input (a 0.2 MB segment, 100 changes into a table of their own:
what a process pays once, such as Arrow's memory pool and thread pools or the Delta runtime, is not the work's),
resets the kernel's RSS high-water mark (``/proc/self/clear_refs``), takes its RSS, runs the work, and reports
``getrusage(RUSAGE_SELF).ru_maxrss`` minus that RSS: the work's own growth. Every measured piece of work builds its
input (cell log, Arrow rows) itself, so the figures compare alike. This parent imports nothing heavy: a child's
``ru_maxrss`` starts at its parent's size. The Python paths are run a second time under ``tracemalloc`` (in
another process: tracing slows them and costs memory of its own) for the Python heap's peak, which does not see
Arrow's or Rust's memory; for the batch only with ``--batch-tracemalloc`` (several times slower, and the tracing's
own memory is large: the 1M-change batch under it passed 15 GiB). Not a test: nothing here asserts a limit.
"""
from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from typing import Optional
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
MIB = 1024 * 1024
SEGMENT_ENTRIES = 32_000_000     # bytes of entries: one 32 MiB segment filled as bench_decode fills each of its own


# --- the measured work, run in the child process ---------------------------------------------------------------

def _import_paths():
    for p in (ROOT, BENCH):
        if p not in sys.path:
            sys.path.insert(0, p)


def _decode_work(a):
    """Set up one decoding measurement: (the work on a segment, or None without the compiled module)."""
    _import_paths()
    if a.measure in ("python", "native"):
        os.environ["CASSANDRA_CDC_NATIVE"] = "1" if a.measure == "native" else "0"
    from bench_decode import floor, reference_cell_log
    from cdc_lib.celllog import native, read_cell_log
    from cdc_lib.demo.workload import sample_schema
    schema = sample_schema()
    if a.measure == "floor":
        return lambda seg: {"entry_bytes": floor([seg])}
    if a.measure == "reference":
        def reference(seg):
            nbytes, rows = reference_cell_log([seg], schema)
            return {"entry_bytes": nbytes, "rows": rows}
        return reference
    if a.measure == "native" and not native.native_available():
        return None

    def cell_log(seg):
        stats, damage, rows, arrow = {}, [], 0, 0
        for batch in read_cell_log([seg], schema, on_damage=damage.append, stats=stats):
            rows += batch.num_rows
            arrow += batch.nbytes
        if damage:
            raise SystemExit(f"the generated segment decoded with damage: {damage[0]}")
        return {"rows": rows, "arrow_bytes": arrow, "entries": stats["entries"]}
    return cell_log


def _batch_work(a):
    """Set up one measurement of the batch: (the work on the batch's ids and values)."""
    _import_paths()
    from bench_merge import CQL, TS0, cdc_batch, change_records, plain_upsert, upsert_rows
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    from cdc_lib.sinks import delta as delta_store
    schema = load_cql_schema(CQL)
    table = schema.by_name("bench", "kv")
    if a.measure == "arrow-rows":
        return lambda root, ids, nvals: {"arrow_bytes": upsert_rows(ids, nvals).nbytes}
    if a.measure == "arrow-cells":
        return lambda root, ids, nvals: {"arrow_bytes": change_records(table, ids, TS0 + 1_000_000, "w",
                                                                       nvals).nbytes}
    if a.measure == "plain-upsert":
        def upsert(root, ids, nvals):
            uri = os.path.join(root, "plain")
            if not os.path.isdir(uri):          # the warm-up's own table
                from deltalake import write_deltalake
                write_deltalake(uri, upsert_rows(ids[:1], nvals[:1]))
            plain_upsert(uri, upsert_rows(ids, nvals))
            return {}
        return upsert
    return lambda root, ids, nvals: {"events": cdc_batch(delta_store.DeltaRsStateStore(root), schema, table, ids,
                                                         nvals)["events"]}


def _measured(work, trace: bool, *args) -> dict:
    """Run ``work(*args)`` from a fresh high-water mark: its figures, time, RSS before and peak RSS."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:   # the high-water mark restarts from the RSS of now
        f.write("5")
    before = _status_kib("VmRSS")
    if trace:
        import tracemalloc
        tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    out = work(*args)
    out.update(seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0)
    if trace:
        out["traced_peak_bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out.update(rss_before_kib=before, maxrss_kib=peak, growth_kib=peak - before)
    return out


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def child(a) -> None:
    """One measurement: warm up on a small input (imports done inside functions, Arrow's memory pool and thread
    pools, the Delta runtime: costs paid once per process, not per batch), then measure the work."""
    if a.segment:
        work = _decode_work(a)
        if work is None:
            print(json.dumps({"unavailable": "cdc_native is not installed (scripts/setup.sh builds it)"}))
            return
        work(a.warm_segment)
        out = _measured(work, a.trace, a.segment)
    else:
        _import_paths()
        from bench_merge import change_ids

        from cdc_lib.state import native as native_state
        if a.measure == "cdc-native" and not native_state.available():
            print(json.dumps({"unavailable": "the compiled state engine is not installed (scripts/setup.sh)"}))
            return
        work = _batch_work(a)
        ids, nvals, _ = change_ids(a.state_rows, a.changes, a.new_fraction, a.seed)
        work(os.path.join(a.store, "warm-up"), ids[:100], nvals[:100])
        out = _measured(work, a.trace, a.store, ids, nvals)
    print(json.dumps(out))


# --- the parent: prepare, run each measurement in a process of its own, print ---------------------------------

def run_child(args: list, env: Optional[dict] = None) -> dict:
    """Run this script with ``args`` in a fresh process (``env``: variables to set in it): what it printed last
    (a JSON object), or {}."""
    r = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise SystemExit(f"measurement {args} failed:\n{r.stderr[-4000:]}")
    lines = r.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def prepare(a) -> None:
    """In a child too (see the module doc): the 32 MiB segment, or the state and plain tables of the batch."""
    _import_paths()
    if a.prepare == "segment":
        from bench_decode import generate
        from cdc_lib.demo.workload import sample_schema
        generate(a.dir, sample_schema(), SEGMENT_ENTRIES, 40000)
        os.makedirs(os.path.join(a.dir, "warm-up"))
        generate(os.path.join(a.dir, "warm-up"), sample_schema(), 200_000, 2000)
        return
    from bench_merge import CQL, build_plain, build_state, check_generator
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    table = load_cql_schema(CQL).by_name("bench", "kv")
    check_generator(table)
    build_state(a.dir, table, a.state_rows, 1_000_000)
    build_plain(a.dir, a.state_rows, 1_000_000)


def mib(kib: int) -> float:
    return kib / 1024


def decode_section(work: str, tracemalloc: bool) -> None:
    seg_dir = os.path.join(work, "segment")
    segs = sorted(glob.glob(os.path.join(seg_dir, "CommitLog-*.log")))
    if not segs:
        os.makedirs(seg_dir, exist_ok=True)
        run_child(["--prepare", "segment", "--dir", seg_dir])
        segs = sorted(glob.glob(os.path.join(seg_dir, "CommitLog-*.log")))
    seg = segs[0]
    warm = glob.glob(os.path.join(seg_dir, "warm-up", "CommitLog-*.log"))[0]
    size = os.path.getsize(seg)
    print(f"1. decoding one segment to the Arrow cell log: {os.path.basename(seg)}, {size / MIB:.1f} MiB "
          f"(batches of 65,536 rows streamed; growth = peak RSS of the process minus its RSS before the work)")
    print(f"   {'path':44s} {'MB of entries':>13s} {'cells':>10s} {'RSS before':>10s} {'peak RSS +':>10s} "
          f"{'MiB/MiB':>7s} {'Python heap':>11s} {'CPU s':>6s}")
    rows_seen = arrow = entry_mb = None
    for name, label in (("floor", "baseline: read the file + CRC every entry"),
                        ("reference", "reference decoder -> Arrow cell log"),
                        ("python", "fast path, pure Python (NATIVE=0)"),
                        ("native", "compiled reader (NATIVE=1)")):
        r = run_child(["--measure", name, "--segment", seg, "--warm-segment", warm])
        if "unavailable" in r:
            print(f"   {label:44s} no figure: {r['unavailable']}")
            continue
        traced = ""
        if tracemalloc and name in ("reference", "python"):
            t = run_child(["--measure", name, "--segment", seg, "--warm-segment", warm, "--trace"])
            traced = f"{t['traced_peak_bytes'] / MIB:8.1f} MiB"
        rows = r.get("rows")
        rows_seen = rows_seen or rows
        arrow = arrow or r.get("arrow_bytes")
        entry_mb = entry_mb or r["entry_bytes"] / 1e6        # the floor's: every path decodes all of them
        cells = f"{rows:,}" if rows is not None else ""
        print(f"   {label:44s} {entry_mb:13.1f} {cells:>10s} {mib(r['rss_before_kib']):6.0f} MiB "
              f"{mib(r['growth_kib']):6.1f} MiB {mib(r['growth_kib']) / (size / MIB):7.2f} {traced:>11s} "
              f"{r['cpu_seconds']:6.1f}")
    if arrow:
        print(f"   the segment's cell log: {rows_seen:,} rows, {arrow / MIB:.1f} MiB of Arrow "
              f"({arrow / MIB / (size / MIB):.2f} MiB per MiB of segment), held whole by the in-driver transform")


def batch_section(work: str, a) -> None:
    pristine = os.path.join(work, f"tables-{a.state_rows}")
    if not os.path.isdir(pristine):
        shutil.rmtree(pristine + ".tmp", ignore_errors=True)     # what an interrupted run left
        os.makedirs(pristine + ".tmp")
        run_child(["--prepare", "tables", "--dir", pristine + ".tmp", "--state-rows", str(a.state_rows)])
        os.rename(pristine + ".tmp", pristine)
    common = ["--changes", str(a.changes), "--state-rows", str(a.state_rows), "--new-fraction",
              str(a.new_fraction), "--seed", str(a.seed)]
    print(f"2. a batch of {a.changes:,} changes (UPDATE kv SET n, v WHERE id, {a.new_fraction:.0%} new) into a "
          f"state of {a.state_rows:,} rows")
    print(f"   {'work':62s} {'RSS before':>10s} {'peak RSS +':>11s} {'per change':>10s} {'Python heap':>11s} "
          f"{'CPU s':>6s}")
    runs = [("arrow-rows", "baseline: the changes as an Arrow table (id, v, n)", False),
            ("arrow-cells", "the batch's cell log as Arrow (2 records a change)", False),
            ("plain-upsert", "baseline: plain deltalake upsert of the (id, v, n) rows", False),
            ("cdc", "cdc batch, Python engine (NATIVE=0): run_store_batch", a.batch_tracemalloc),
            ("cdc-native", "cdc batch, compiled engine (NATIVE=1): run_store_batch", False)]
    for name, label, traced in runs:
        results = []
        for with_trace in (False, True) if traced else (False,):
            store = os.path.join(work, "run")
            shutil.rmtree(store, ignore_errors=True)
            if name in ("plain-upsert", "cdc", "cdc-native"):
                shutil.copytree(pristine, store)       # each run writes into a fresh copy of the tables
            results.append(run_child(["--measure", name, "--store", store, *common]
                                     + (["--trace"] if with_trace else []),
                                     env={"CASSANDRA_CDC_NATIVE": "1" if name == "cdc-native" else "0"}))
            shutil.rmtree(store, ignore_errors=True)
        r = results[0]
        if "unavailable" in r:
            print(f"   {label:62s} no figure: {r['unavailable']}")
            continue
        heap = f"{results[1]['traced_peak_bytes'] / MIB:7.1f} MiB" if len(results) > 1 else ""
        extra = ""
        if "arrow_bytes" in r:
            extra = f"  (the table: {r['arrow_bytes'] / MIB:.1f} MiB)"
        if "events" in r:
            extra = f"  ({r['events']:,} events)"
        print(f"   {label:62s} {mib(r['rss_before_kib']):6.0f} MiB {mib(r['growth_kib']):7.1f} MiB "
              f"{r['growth_kib'] * 1024 / a.changes:8,.0f} B {heap:>11s} {r['cpu_seconds']:6.1f}{extra}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--changes", type=int, default=1_000_000, help="changes in the batch (default 1,000,000)")
    p.add_argument("--state-rows", type=int, default=None, help="rows of the state before the batch (default: "
                   "as many as --changes, so four in five changes update a row and one in five adds one)")
    p.add_argument("--new-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", choices=("decode", "batch"), help="run one of the two sections")
    p.add_argument("--batch-tracemalloc", action="store_true",
                   help="also run the cdc batch under tracemalloc for its Python heap peak (several times slower "
                   "and larger: use it with --changes 100000 or so)")
    p.add_argument("--no-tracemalloc", dest="tracemalloc", action="store_false",
                   help="skip the tracemalloc runs of the Python decoders")
    p.add_argument("--dir", help="work directory, kept (reused by the next run); default a temporary one")
    # a child process: one measurement (--measure) or preparing the inputs (--prepare)
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--prepare", help=argparse.SUPPRESS)
    p.add_argument("--segment", help=argparse.SUPPRESS)
    p.add_argument("--warm-segment", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.state_rows is None:
        a.state_rows = a.changes
    if a.prepare:
        prepare(a)
        return 0
    if a.measure:
        child(a)
        return 0
    work = a.dir or tempfile.mkdtemp(prefix="cdc-bench-memory-")
    os.makedirs(work, exist_ok=True)
    try:
        print(f"peak memory, one fresh process per figure (Python {sys.version.split()[0]}, "
              f"load average {os.getloadavg()[0]:.1f})")
        if a.only in (None, "decode"):
            decode_section(work, a.tracemalloc)
            sys.stdout.flush()
        if a.only in (None, "batch"):
            batch_section(work, a)
    finally:
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
