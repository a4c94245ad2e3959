"""Benchmark (not a test): merge N changes into an M-row Delta state, next to a plain deltalake upsert.

    .venv/bin/python benchmarks/bench_merge.py --state-rows 10000000 --changes 1000000

Table ``bench.kv (id bigint PRIMARY KEY, v text, n int)``. The state table (typed columns plus the ``_cdc_*``
metadata, exactly as ``cdc_lib.sinks.delta`` writes it) is generated vectorised with Arrow (checked against
``sinks.delta.partition_rows`` on a sample), so building it is not what is measured. A change is
``UPDATE kv SET v = ?, n = ? WHERE id = ?`` (one mutation: two cell-log records) on distinct ids,
``--new-fraction`` of them new. Measured, in one run:

* **cdc merge**: the whole batch as the pipeline runs it (``sinks.delta.run_store_batch``): read the prior
  state of the touched partitions from Delta, reconcile, build events, append the outbox, MERGE the state.
  Phases are timed separately. Each engine runs the batch's records in two orders (``--orders``), each on its own
  copy of the state: **pipeline** order, by token and partition key, as the Spark job's shuffle
  (``repartitionByRange``/``sortWithinPartitions`` on ``merge_job.GROUP_ORDER``) hands each chunk to the engine;
  and **commit-log** order, the changes shuffled over the ring as a node writes them, as ``run_store_batch``
  gets them when called without Spark. The compiled engine groups records by partition either way; on records
  in token order it reads the cell log front to back instead of jumping across it, which this machine's caches
  reward, so both figures are printed.
* **plain upsert**: ``DeltaTable.merge`` of the same number of ``(id, v, n)`` rows into a plain table of the
  same number of rows (``when_matched_update_all`` / ``when_not_matched_insert_all`` on ``id``), ``--upserts``
  times, each on its own copy of the table; the median is the baseline. One upsert's time moves by up to three
  quarters from one run to the next on this VM (0.24 to 0.42 s for 1M rows within ten minutes), far more than
  the cdc merge's, and a process's first upsert is no slower than its later ones, so the median of a few
  stands for the upsert better than any one of them.
* **merges in one process** (``--merges``, 3 by default): the cdc merge runs that many times in this process, each
  on its own copy of the state. The first is a process's first batch: it first touches every byte of its
  outputs, which on this VM costs more than all else (see fresh memory below). The later ones reuse memory the
  earlier ones freed, as a long-lived worker does batch after batch (``follow``, a reused Spark Python worker).
  The phases printed are the first merge's; the ratio is given for the first and for the median of all, the
  median being measured as the upsert's is. For each merge it also prints the CPU seconds (user + system, all
  threads) and page faults of the process while the compiled engine ran, and for each upsert its CPU seconds: on
  this VM the same merge's wall time moves from run to run with the machine's state as well as with the code
  (fresh memory below), and the faults and CPU seconds show how much of it was the kernel's.
* **the state's order** (``--state-order``): the state files' rows in token order (``token``, the default: as a
  first load writes them, and as a MERGE keeps them: the rows it rewrites stay where they were, nearly all in
  order), or in no order (``shuffled``: the worst case, of a state written some other way). The engine reads the
  stored rows of the batch's partitions in the order the files hold them: in token order front to back,
  otherwise gathered from all over them.
* **plain replace**: the same rows as delete + append in one commit (``write_deltalake(mode="overwrite",
  predicate="id IN (...)")``), the alternative to MERGE for replacing partitions, on at most
  ``--replace-max`` keys (the keys go into an SQL IN list; delta-rs 1.6.6 segfaults parsing 200,000 of them).
* **fresh memory**: writing as many bytes as the compiled engine's outputs (events and state rows) into memory
  the process has not used, on two threads, mapped as the engine's allocator maps it (``cdc_lib.allocator``):
  the part of the engine's time that first touching its outputs takes on this machine, whatever the work
  (measured after the upsert, so an indication, not the same pages). On a
  VM whose balloon reports free memory to the host, it depends on how long the memory has been free: pages the
  host took back fault in again at about 1 GB/s, pages freed a moment ago about twenty times faster.
* **output floor** (needs cargo; ``--no-floor`` skips it): ``benchmarks/state_floor``, a small Rust program built
  on first use, writes what the engine writes for this batch at the same sizes (event ids: SHA-256 over inputs as
  long as the ids', two at a time as the engine hashes them; event JSON with full before and after rows; key
  JSON; state-row columns) on as many threads as the engine, best of three rounds, and nothing else: no grouping,
  decoding or merging. The least any engine pays for these outputs, so ``plain upsert / floor`` bounds the ratio
  any engine can reach on this machine.
  ``fresh``: into newly allocated memory (as the engine's outputs); ``warm``: into buffers already written. Every
  change is written as an update of an existing row (the ``--new-fraction`` creates have a shorter event), so it
  errs a little high.

Rates are changes (rows) per second of wall time on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# before pyarrow, as in the pipeline's processes: importing cdc_lib settles how mimalloc maps and purges memory
# (cdc_lib.allocator), and pyarrow's mimalloc reads that when it loads
import cdc_lib  # noqa: E402,F401

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from cargo_build import cargo_build  # noqa: E402

from cdc_lib.celllog.schema import CELL_LOG_SCHEMA  # noqa: E402
from cdc_lib.commitlog.model import NO_DELETION_TIME  # noqa: E402
from cdc_lib.cql.schema import Schema  # noqa: E402
from cdc_lib.cql.schema_from_ddl import load_cql_schema  # noqa: E402
from cdc_lib.cql.tokens import token as murmur3_token  # noqa: E402
from cdc_lib.sinks import delta as delta_store  # noqa: E402
from cdc_lib.state import native as native_state  # noqa: E402

CQL = """
CREATE KEYSPACE bench WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3};
CREATE TABLE bench.kv (id bigint PRIMARY KEY, v text, n int) WITH ID = 5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e99;
"""
TS0 = 1_763_000_000_000_000
NOW = TS0 // 1_000_000 + 10


def _be64(ids: np.ndarray) -> pa.Array:
    raw = ids.astype(">i8").tobytes()
    offsets = np.arange(0, 8 * (len(ids) + 1), 8, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), len(ids), [None, pa.py_buffer(offsets), pa.py_buffer(raw)])


def _be32(vals: np.ndarray) -> pa.Array:
    raw = vals.astype(">i4").tobytes()
    offsets = np.arange(0, 4 * (len(vals) + 1), 4, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), len(vals), [None, pa.py_buffer(offsets), pa.py_buffer(raw)])


def _texts(ids: np.ndarray, tag: str) -> pa.Array:
    return pa.array([f"{tag}-{i}" for i in ids.tolist()], pa.string())


def state_chunk(table, ids: np.ndarray, ts: int) -> pa.Table:
    """State rows of partitions ``id`` each holding one row (v, n written at ``ts``), vectorised."""
    schema = delta_store.state_arrow_schema(table)
    n = len(ids)
    nvals = (ids % 1000).astype(np.int32)
    v = _texts(ids, "v")
    pk = _be64(ids)
    tokens = pa.array([murmur3_token(k) for k in pk.to_pylist()], pa.int64())
    cell_t = schema.field("_cdc_cells").type.value_type
    # two cells per row, sorted by column: n, v
    col = pa.array(np.tile(np.array(["n", "v"], dtype=object), n), pa.string())
    vbytes = pa.compute.cast(v, pa.binary())
    values = pa.chunked_array([_be32(nvals), vbytes]).combine_chunks()
    # interleave n and v: take indices
    idx = np.empty(2 * n, dtype=np.int64)
    idx[0::2] = np.arange(n)
    idx[1::2] = np.arange(n) + n
    values = values.take(pa.array(idx))
    cells = pa.StructArray.from_arrays(
        [col, pa.nulls(2 * n, pa.binary()), values, pa.array(np.full(2 * n, ts, np.int64)),
         pa.array(np.zeros(2 * n, np.int32)), pa.array(np.full(2 * n, NO_DELETION_TIME, np.int64)),
         pa.array(np.zeros(2 * n, bool))], fields=list(cell_t))
    cells = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)), cells)
    empty_list = lambda f: pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)),  # noqa: E731
                                                    pa.array([], schema.field(f).type.value_type))
    cols = {
        "id": pa.array(ids, pa.int64()), "n": pa.array(nvals, pa.int32()), "v": v,
        "_cdc_partition_key": pk, "_cdc_row_kind": pa.array(["row"] * n, pa.string()),
        "_cdc_clustering": pa.array([b""] * n, pa.binary()),
        "_cdc_cells": cells, "_cdc_complex_deletions": empty_list("_cdc_complex_deletions"),
        "_cdc_range_tombstones": empty_list("_cdc_range_tombstones"), "_cdc_token": tokens,
        "_cdc_live": pa.array(np.ones(n, bool)), "_cdc_updated_batch": pa.array(np.zeros(n, np.int64)),
        delta_store.OLDEST_DELETION: pa.array(np.full(n, NO_DELETION_TIME, np.int64)),   # no deletion, no TTL
    }
    arrays = [cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema).sort_by("_cdc_token")


def check_generator(table) -> None:
    """The vectorised rows equal what delta_store writes for the same partitions."""
    from cdc_lib.state.reconcile import apply_records
    ids = np.array([1, 2, 77, 123456789], dtype=np.int64)
    got = state_chunk(table, ids, TS0).to_pylist()
    recs = change_records(table, ids, TS0, "v", np.asarray(ids % 1000, dtype=np.int32)).to_pylist()
    states: dict = {}
    apply_records(table, states, recs)
    want = []
    for pk, part in states.items():
        want += delta_store.partition_rows(table, pk, part, NOW, 0)
    key = lambda r: r["_cdc_token"]  # noqa: E731
    for g, w in zip(sorted(got, key=key), sorted(want, key=key)):
        w = {k: w.get(k) for k in g}
        assert g == w, (g, w)


def _mutation_ids(ids: np.ndarray, ts: int) -> pa.Array:
    """A distinct 16-byte mutation id per change (the key and the timestamp), as the cell log carries one."""
    raw = np.empty((len(ids), 2), dtype=">i8")
    raw[:, 0] = ids
    raw[:, 1] = ts
    offsets = np.arange(0, 16 * (len(ids) + 1), 16, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), len(ids), [None, pa.py_buffer(offsets), pa.py_buffer(raw.tobytes())])


def change_records(table, ids: np.ndarray, ts: int, tag: str, nvals: np.ndarray) -> pa.Table:
    """Cell-log records of ``UPDATE kv SET n = ?, v = ? WHERE id = ?`` for each id: one mutation (one segment
    position, one mutation id) of two records each."""
    n = len(ids)
    pk = _be64(ids)
    tokens = pa.array([murmur3_token(k) for k in pk.to_pylist()], pa.int64())
    rep = lambda a: pa.array(np.repeat(np.asarray(a), 2))  # noqa: E731
    idx2 = pa.array(np.repeat(np.arange(n), 2))
    values = pa.chunked_array([_be32(nvals), pa.compute.cast(_texts(ids, tag), pa.binary())]).combine_chunks()
    order = np.empty(2 * n, dtype=np.int64)
    order[0::2] = np.arange(n)
    order[1::2] = np.arange(n) + n
    cols = {
        "segment": pa.array(["CommitLog-7-1.log"] * (2 * n)), "segment_id": pa.array(np.ones(2 * n, np.int64)),
        "position": rep(np.arange(n, dtype=np.int64) * 100 + 64),
        "entry_index": rep(np.arange(n, dtype=np.int32)),
        "seq": pa.array(np.tile(np.array([0, 1], np.int32), n)),
        "table_id": pa.array([str(table.id)] * (2 * n)), "keyspace": pa.array(["bench"] * (2 * n)),
        "table": pa.array(["kv"] * (2 * n)), "partition_key": pk.take(idx2), "token": tokens.take(idx2),
        "clustering": pa.array([b""] * (2 * n), pa.binary()), "is_static": pa.array(np.zeros(2 * n, bool)),
        "kind": pa.array(["cell"] * (2 * n)), "column": pa.array(np.tile(np.array(["n", "v"], object), n)),
        "path": pa.nulls(2 * n, pa.binary()), "value": values.take(pa.array(order)),
        "timestamp": pa.array(np.full(2 * n, ts, np.int64)), "ttl": pa.array(np.zeros(2 * n, np.int32)),
        "local_deletion_time": pa.array(np.full(2 * n, NO_DELETION_TIME, np.int64)),
        "mutation_id": _mutation_ids(ids, ts).take(idx2),
    }
    return pa.Table.from_arrays([cols[f.name] if f.name in cols else pa.nulls(2 * n, f.type)
                                 for f in CELL_LOG_SCHEMA], schema=CELL_LOG_SCHEMA)


def build_state(root: str, table, rows: int, chunk: int, shuffle_seed: int | None = None) -> None:
    """A state of ``rows`` partitions in files of ``chunk`` rows, each file's rows in token order, or in random
    order with ``shuffle_seed`` (as a MERGE leaves them)."""
    from deltalake import write_deltalake
    uri = delta_store.state_table_uri(root, table.keyspace, table.name)
    DeltaRs = delta_store.DeltaRsStateStore(root)
    DeltaRs.ensure_table(table)
    rng = None if shuffle_seed is None else np.random.default_rng(shuffle_seed)
    for start in range(0, rows, chunk):
        ids = np.arange(start, min(rows, start + chunk), dtype=np.int64) * 2   # even ids exist, odd are new
        t = state_chunk(table, ids, TS0)
        if rng is not None:
            t = t.take(pa.array(rng.permutation(t.num_rows)))
        write_deltalake(uri, t, mode="append",     # the files as the pipeline's
                        writer_properties=delta_store.writer_properties())


def build_plain(root: str, rows: int, chunk: int) -> str:
    from deltalake import write_deltalake
    uri = os.path.join(root, "plain")
    for start in range(0, rows, chunk):
        ids = np.arange(start, min(rows, start + chunk), dtype=np.int64) * 2
        t = pa.table({"id": pa.array(ids), "v": _texts(ids, "v"), "n": pa.array((ids % 1000).astype(np.int32))})
        write_deltalake(uri, t, mode="append")
    return uri


def cpu_seconds(before, after) -> float:
    """The process's CPU seconds (user + system, all threads) between two ``resource.getrusage`` readings."""
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def cdc_merge(root: str, schema, cells: pa.Table, engine: str) -> tuple:
    """The whole batch as the pipeline runs it (``sinks.delta.run_store_batch``) with ``engine`` (python: the
    reference engine, native: the compiled one): (seconds, events, phase timings, finer Python timings, bytes of the
    compiled engine's outputs, {calls, cpu, faults}: its calls and the process's CPU seconds and page faults while
    it ran)."""
    os.environ["CASSANDRA_CDC_NATIVE"] = {"python": "0", "native": "1"}[engine]
    store = delta_store.DeltaRsStateStore(root)
    timings: dict = {}
    read = store.read_state_rows

    def timed_read(*x, **k):
        s = time.perf_counter()
        out = read(*x, **k)
        timings["read prior state"] = timings.get("read prior state", 0.0) + time.perf_counter() - s
        return out
    store.read_state_rows = timed_read      # the Delta read only: turning rows into states is the engine's
    write_outbox, commit = store.write_outbox, store.commit

    def timed_outbox(*x, **k):
        s = time.perf_counter()
        r = write_outbox(*x, **k)
        timings["outbox append"] = time.perf_counter() - s
        return r

    def timed_commit(*x, **k):
        s = time.perf_counter()
        r = commit(*x, **k)
        timings["state MERGE"] = time.perf_counter() - s
        return r
    store.write_outbox, store.commit = timed_outbox, timed_commit
    # finer breakdown of the pure-Python part: wrap the module-level steps run_store_batch calls
    fine: dict = {}

    def accumulate(name, f):
        def wrapped(*x, **k):
            s = time.perf_counter()
            try:
                return f(*x, **k)
            finally:
                fine[name] = fine.get(name, 0.0) + time.perf_counter() - s
        return wrapped
    wrapped_names = {"states_from_rows": "  (of which) states_from_rows",
                     "process_cell_log": "  (of which) reconcile + events",
                     "outbox_row": "  (of which) outbox rows (JSON)",
                     "change_rows": "  (of which) state rows (change_rows)",
                     "rows_to_arrow": "  (of which) state rows -> Arrow",
                     "table_outputs": "  (of which) compiled engine, outputs to Arrow"}
    originals = {n: getattr(delta_store, n) for n in wrapped_names}
    for n, label in wrapped_names.items():
        setattr(delta_store, n, accumulate(label, originals[n]))
    timed_outputs = delta_store.table_outputs
    output_bytes = [0]      # of what the engine hands back: events and state rows
    # the process's CPU seconds (user + system) and page faults while the compiled engine runs: how much of its
    # wall time was work on the two cores, and how much of that the kernel's
    engine_use = {"calls": 0, "cpu": 0.0, "faults": 0}

    def sized_outputs(*x, **k):
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        out = timed_outputs(*x, **k)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        engine_use["calls"] += 1
        engine_use["cpu"] += cpu_seconds(r0, r1)
        engine_use["faults"] += r1.ru_minflt - r0.ru_minflt + r1.ru_majflt - r0.ru_majflt
        output_bytes[0] += out[0].nbytes + out[1].nbytes
        return out
    delta_store.table_outputs = sized_outputs
    t0 = time.perf_counter()
    res = delta_store.run_store_batch(store, schema, cells.to_batches(max_chunksize=65536),
                                      batch_id="bench-1", batch_seq=1, now=NOW + 5)
    cdc = time.perf_counter() - t0
    for n, f in originals.items():
        setattr(delta_store, n, f)
    timings["reconcile + events + rows"] = cdc - sum(timings.values())

    return cdc, res["events"], timings, fine, output_bytes[0], engine_use


ORDERS = ("pipeline", "commitlog")


def in_order(cells: pa.Table, order: str) -> pa.Table:
    """The batch's records in ``order``: ``pipeline`` (by token, then partition key, each partition's records in
    log order: Arrow's sort is stable) or ``commitlog`` (as written)."""
    if order == "commitlog":
        return cells
    return cells.take(pc.sort_indices(cells, [("token", "ascending"), ("partition_key", "ascending")]))


def fresh_memory_seconds(nbytes: int, threads: int = 2) -> float:
    """Seconds to write ``nbytes`` of memory this process has not used yet, on ``threads`` threads, one byte per 4
    KB page: what first touching the engine's outputs costs on this machine, whatever work writes them. The memory
    is mapped as the engine's allocator maps it: with transparent huge pages advised only if ``MIMALLOC_ALLOW_THP``
    allows them (``cdc_lib.allocator``). (numpy lets go of the GIL while it fills.)"""
    import mmap
    from concurrent.futures import ThreadPoolExecutor
    maps = [mmap.mmap(-1, nbytes // threads) for _ in range(threads)]
    if os.environ.get("MIMALLOC_ALLOW_THP", "1") != "0":
        for m in maps:
            m.madvise(mmap.MADV_HUGEPAGE)
    bufs = [np.frombuffer(m, np.uint8) for m in maps]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda b: b[::4096].fill(1), bufs))
    seconds = time.perf_counter() - t0
    del bufs
    for m in maps:
        m.close()
    return seconds


FLOOR_CRATE = Path(__file__).resolve().parent / "state_floor"


def output_floor(changes: int, threads: int, rounds: int = 3) -> dict | None:
    """``benchmarks/state_floor``'s answer (built with cargo on first use, into its ignored ``target/``): the
    seconds to write the outputs of ``changes`` changes on ``threads`` threads; None (and why, on stderr) without
    cargo or when the build fails."""
    why_not = cargo_build(FLOOR_CRATE / "Cargo.toml", FLOOR_CRATE / "target")
    if why_not is not None:
        print(f"output floor: skipped ({why_not})", file=sys.stderr)
        return None
    exe = FLOOR_CRATE / "target" / "release" / "state-floor"
    ran = subprocess.run([str(exe), "--changes", str(changes), "--threads", str(threads), "--rounds", str(rounds)],
                         capture_output=True, text=True, check=True)
    return json.loads(ran.stdout)


def change_ids(state_rows: int, changes: int, new_fraction: float, seed: int) -> tuple:
    """(ids, n values, how many ids are new) of a batch: distinct ids, ``new_fraction`` of them odd (not in a
    state built by ``build_state``), the rest even (rows of it), shuffled."""
    rng = np.random.default_rng(seed)
    n_new = int(changes * new_fraction)
    existing = rng.choice(state_rows, size=changes - n_new, replace=False).astype(np.int64) * 2
    new = rng.choice(state_rows, size=n_new, replace=False).astype(np.int64) * 2 + 1
    ids = np.concatenate([existing, new])
    rng.shuffle(ids)
    nvals = rng.integers(-1000, 1000, size=len(ids)).astype(np.int32)
    return ids, nvals, n_new


def engine_batch(table, changes: int, new_fraction: float, seed: int, order: str) -> tuple:
    """(cell log, stored rows, how many changes are new) of the batch ``engine_phases.py`` and
    ``engine_instructions.py`` hand the compiled engine alone (``sinks.delta.table_outputs``): ``changes`` changes
    (``change_ids``) as cell-log records in ``order`` and in record batches of 64K records, as this benchmark hands
    them to the pipeline, and the stored rows of the changed ids that are not new (the even ones)."""
    ids, nvals, n_new = change_ids(changes, changes, new_fraction, seed)
    cells = in_order(change_records(table, ids, TS0 + 1_000_000, "w", nvals), order)
    cells = pa.Table.from_batches(cells.to_batches(max_chunksize=65536))
    return cells, state_chunk(table, ids[ids % 2 == 0], TS0), n_new


def cdc_batch(store, schema: Schema, table, ids: np.ndarray, nvals: np.ndarray) -> dict:
    """The batch of changes ``ids``/``nvals`` as the pipeline runs it without Spark (``run_store_batch``)."""
    cells = change_records(table, ids, TS0 + 1_000_000, "w", nvals)
    return delta_store.run_store_batch(store, schema, cells.to_batches(max_chunksize=65536),
                                       batch_id="bench-1", batch_seq=1, now=NOW + 5)


def upsert_rows(ids: np.ndarray, nvals: np.ndarray) -> pa.Table:
    """The plain table's rows ``(id, v, n)`` of the same changes."""
    return pa.table({"id": pa.array(ids), "v": _texts(ids, "w"), "n": pa.array(nvals)})


def plain_upsert(uri: str, src: pa.Table) -> None:
    from deltalake import DeltaTable
    (DeltaTable(uri).merge(src, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all().when_not_matched_insert_all().execute())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-rows", type=int, default=10_000_000)
    p.add_argument("--changes", type=int, default=1_000_000)
    p.add_argument("--new-fraction", type=float, default=0.2)
    p.add_argument("--chunk", type=int, default=1_000_000, help="rows per file when building the tables")
    p.add_argument("--state-order", choices=("token", "shuffled"), default="token",
                   help="the state files' rows in token order (as a first load writes them and a MERGE keeps "
                        "them) or in no order (the worst case)")
    p.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--engines", default="python,native",
                   help="state engines to time, comma-separated: python (the reference), native (compiled)")
    p.add_argument("--orders", default=",".join(ORDERS),
                   help="orders of the batch's records to time each engine on, comma-separated: pipeline (by "
                        "token, as the Spark job hands them over), commitlog (as written)")
    p.add_argument("--no-compare-replace", dest="compare_replace", action="store_false",
                   help="skip timing delete+append (overwrite with predicate) against MERGE")
    p.add_argument("--replace-max", type=int, default=20_000, help="keys in the delete+append comparison")
    p.add_argument("--upserts", type=int, default=3,
                   help="times the plain upsert runs, each on a copy of the plain table (its median is the baseline)")
    p.add_argument("--merges", type=int, default=3,
                   help="times the cdc merge runs in this process, each on a copy of the state, as a long-lived "
                        "worker runs batch after batch; the first and the median are compared with the upsert")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="skip the output floor (benchmarks/state_floor, built with cargo on first use)")
    a = p.parse_args(argv)
    for order in a.orders.split(","):
        if order not in ORDERS:
            p.error(f"--orders: {order!r} is none of {', '.join(ORDERS)}")
    schema: Schema = load_cql_schema(CQL)
    table = schema.by_name("bench", "kv")
    check_generator(table)
    work = a.dir or tempfile.mkdtemp(prefix="bench-merge-")
    try:
        t0 = time.perf_counter()
        build_state(work, table, a.state_rows, a.chunk,
                    shuffle_seed=a.seed if a.state_order == "shuffled" else None)
        plain = build_plain(work, a.state_rows, a.chunk)
        print(f"built 2 x {a.state_rows:,} rows in {time.perf_counter() - t0:.1f} s")

        ids, nvals, n_new = change_ids(a.state_rows, a.changes, a.new_fraction, a.seed)

        # --- cdc merge: the whole batch, by each engine on its own copy of the state
        cells = change_records(table, ids, TS0 + 1_000_000, "w", nvals)
        merges = {}       # {engine and order: every merge's cdc_merge figures, the first merge's first}
        for engine in a.engines.split(","):
            for order in a.orders.split(","):
                name, batch = f"{engine}, {order} order", in_order(cells, order)
                for i in range(max(a.merges, 1)):
                    root = os.path.join(work, f"cdc-{engine}-{order}-{i}")
                    shutil.copytree(os.path.join(work, "delta"), os.path.join(root, "delta"))
                    merges.setdefault(name, []).append(cdc_merge(root, schema, batch, engine))
                    shutil.rmtree(root, ignore_errors=True)
        results = {name: runs[0] for name, runs in merges.items()}      # the phases printed are the first merge's
        merge_times = {name: [r[2]["reconcile + events + rows"] for r in runs] for name, runs in merges.items()}

        # --- plain upsert of the same number of rows
        src = upsert_rows(ids, nvals)
        upserts, upsert_cpu = [], []
        for i in range(max(a.upserts, 1)):
            target = os.path.join(work, f"plain-upsert-{i}")
            shutil.copytree(plain, target)
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            plain_upsert(target, src)
            upserts.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            upsert_cpu.append(cpu_seconds(r0, r1))
            shutil.rmtree(target, ignore_errors=True)
        plain_s = float(np.median(upserts))

        print(f"state rows {a.state_rows:,} (files' rows in {a.state_order} order), changes {a.changes:,} "
              f"({n_new:,} new)")
        if "native" in a.engines.split(","):
            import cdc_native
            print("compiled engine: " + ("profile-guided build (native/build.py)" if getattr(
                cdc_native, "PROFILE_GUIDED", False) else "plain build (not profile-guided: native/build.py)"))
        for engine, (cdc, events, timings, fine, *_) in results.items():
            print(f"cdc merge ({engine}) {cdc:8.1f} s  {a.changes / cdc:12,.0f} changes/s  ({events:,} events)")
            for k, v in timings.items():
                print(f"  {k:26s} {v:8.1f} s")
            # nested: states_from_rows is inside "read prior state"; the rest inside "reconcile + events + rows"
            # (commit_states calls change_rows, then rows_to_arrow, then the timed MERGE)
            for k, v in fine.items():
                print(f"  {k:38s} {v:8.2f} s")
            rec = timings["reconcile + events + rows"]
            print(f"  reconcile + events + rows: {a.changes / rec:12,.0f} changes/s")
            if len(merge_times[engine]) > 1:
                each = " / ".join(f"{x:.2f}" for x in merge_times[engine])
                print(f"  reconcile + events + rows, merge by merge in this process: {each} s")
            uses = [r[5] for r in merges[engine]]
            if any(u["calls"] for u in uses):     # the compiled engine ran (not the Python one)
                cpu = " / ".join(f"{u['cpu']:.2f}" for u in uses)
                faults = " / ".join(f"{u['faults']:,}" for u in uses)
                print(f"  compiled engine, merge by merge: {cpu} s of CPU (the process's, user + system), "
                      f"{faults} page faults")
        each = " / ".join(f"{x:.3f}" for x in upserts)
        print(f"plain upsert  {plain_s:8.1f} s  {a.changes / plain_s:12,.0f} rows/s  (deltalake MERGE on id; "
              f"median of {len(upserts)}: {each} s; CPU {' / '.join(f'{c:.2f}' for c in upsert_cpu)} s)")
        for engine, (*_, output_bytes, _) in results.items():
            if output_bytes:
                fresh = fresh_memory_seconds(output_bytes)
                print(f"fresh memory ({engine}): {fresh:.2f} s to first write as many bytes as its outputs "
                      f"({output_bytes / 1e6:,.0f} MB) on 2 threads, one byte per page")
        floor = output_floor(a.changes, threads=native_state.default_threads()) if a.floor else None
        fresh_s = min(floor["fresh_s"]) if floor else None      # the floor's time, as the engine's: fresh memory
        if floor:
            warm_s = min(floor["warm_s"])
            print(f"output floor: {fresh_s:.2f} s into fresh memory, {warm_s:.2f} s warm, "
                  f"on {floor['threads']} threads ({floor['bytes'] / 1e6:,.0f} MB: ids, event JSON, key JSON, "
                  f"state rows; no grouping, decoding or merging): any engine's reconcile + events + rows "
                  f"at most {plain_s / fresh_s:.3f}x ({plain_s / warm_s:.3f}x warm)")
        for engine, (cdc, events, timings, fine, *_) in results.items():
            rec = timings["reconcile + events + rows"]
            extra = f"; {rec / fresh_s:.1f}x the output floor's time" if floor else ""
            first = ", the first merge" if len(merge_times[engine]) > 1 else ""
            print(f"ratio ({engine}){first}: reconcile + events + rows at {plain_s / rec:.3f}x the plain upsert's "
                  f"rate; the whole cdc merge at {plain_s / cdc:.3f}x{extra}")
            if len(merge_times[engine]) > 1:
                med = float(np.median(merge_times[engine]))
                print(f"ratio ({engine}), median of {len(merge_times[engine])} merges in this process (as the "
                      f"upsert's): reconcile + events + rows at {plain_s / med:.3f}x the plain upsert's rate")
        sys.stdout.flush()

        # --- the same kind of upsert as delete + append in one commit (overwrite with a predicate), on a
        # copy. The keys must go into the predicate as an SQL IN list: delta-rs crashes (stack overflow
        # while parsing the predicate) at 200,000 keys, so this uses at most --replace-max of them.
        if a.compare_replace:
            plain2 = os.path.join(work, "plain2")
            shutil.copytree(plain, plain2)
            from deltalake import write_deltalake
            k = min(len(ids), a.replace_max)
            t0 = time.perf_counter()
            pred = "id IN (" + ",".join(map(str, ids[:k].tolist())) + ")"
            write_deltalake(plain2, src.slice(0, k), mode="overwrite", predicate=pred)
            replace_s = time.perf_counter() - t0
            print(f"plain replace {replace_s:8.1f} s  {k / replace_s:12,.0f} rows/s  (delete + append of "
                  f"{k:,} rows in one commit: overwrite with predicate id IN (...))")
    finally:
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
