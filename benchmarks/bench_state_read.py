"""Benchmark (not a test): read the stored rows of a batch's partitions from a Delta state, next to decoding it all.

    .venv/bin/python benchmarks/bench_state_read.py --state-rows 10000000 --keys 10000,65536,300000,1000000

The state is ``bench_merge.py``'s (``bench.kv``, one row a partition, files of ``--chunk`` rows) with each file's
rows in random order, the worst case (``bench_merge.py`` keeps them sorted by token, as a first load writes them;
a MERGE by deltalake 1.6.6 keeps the rows it rewrites nearly in that order too: 359 descents among 1.1M rows after
one, docs/benchmarks.md, "The round after 70dfef1"). For each number of
keys (distinct partitions, one in five absent from the state, with their murmur3 tokens in token order, as
``partition_keys`` gives them), in one run, alternating, ``--repeat`` times:

* **decode all** (the baseline): every stored row's metadata columns, no filter (``Dataset.to_table``): what
  any read of partitions spread over the ring pays at least, since a state file holds rows of the whole ring.
* **set in scan**: the scan filters by the token range and the tokens as a set (``isin``), then keeps the rows of
  the keys asked for: how ``read_state_rows`` read any number of keys up to 5ff9a1b.
* **sorted lookup**: the scan filters by the token range, ``sinks.delta.PartitionSet.rows_of`` picks the rows.
* **read_state_rows**: as the store reads (the set in the scan up to ``SCAN_ISIN_MAX`` keys, then the lookup).

Medians of seconds of wall time on this machine; the rows read are checked equal, in the same order.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cdc_lib  # noqa: E402,F401  (before pyarrow, as in the pipeline's processes: cdc_lib.allocator)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from bench_merge import CQL, _be64, build_state, change_ids  # noqa: E402

from cdc_lib.cql.schema_from_ddl import load_cql_schema  # noqa: E402
from cdc_lib.cql.tokens import token as murmur3_token  # noqa: E402
from cdc_lib.sinks import delta as delta_store  # noqa: E402


def asked(rows: int, keys: int, seed: int) -> tuple:
    """(keys, tokens) of ``keys`` distinct partitions (``bench_merge.change_ids``: one in five absent), in token
    order."""
    k = _be64(change_ids(rows, keys, 0.2, seed)[0])            # bigint keys, as the state's
    tok = np.array([murmur3_token(x) for x in k.to_pylist()], np.int64)
    order = np.argsort(tok, kind="stable")
    return k.take(pa.array(order)), pa.array(tok[order])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-rows", type=int, default=10_000_000)
    p.add_argument("--keys", default="10000,65536,300000,1000000", help="numbers of keys to read, comma-separated")
    p.add_argument("--chunk", type=int, default=1_000_000, help="rows per file of the state")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after; a "
                                               "directory given is kept, and its state reused)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    table = load_cql_schema(CQL).by_name("bench", "kv")
    work = a.dir or tempfile.mkdtemp(prefix="bench-state-read-")
    try:
        store = delta_store.DeltaRsStateStore(work)
        if store._dataset(table) is None:
            t0 = time.perf_counter()
            build_state(work, table, a.state_rows, a.chunk, shuffle_seed=a.seed)
            print(f"built {a.state_rows:,} rows in {time.perf_counter() - t0:.1f} s")
        ds = store._dataset(table)
        cols = [c for c in delta_store.META_COLUMNS if c in ds.schema.names]
        print(f"state: {ds.count_rows():,} rows in {len(ds.files)} files; SCAN_ISIN_MAX "
              f"{delta_store.SCAN_ISIN_MAX:,}")

        def decode_all(keys, tokens):
            return ds.to_table(columns=cols)

        def set_in_scan(keys, tokens):
            lo, hi = pc.min_max(tokens).values()
            f = ((pc.field("_cdc_token") >= lo) & (pc.field("_cdc_token") <= hi)
                 & pc.field("_cdc_token").isin(tokens))
            t = ds.to_table(columns=cols, filter=f)
            wanted = pc.is_in(t["_cdc_partition_key"], value_set=keys)
            return t if pc.all(wanted).as_py() else t.filter(wanted)

        def forced(limit):
            def read(keys, tokens):
                old = delta_store.SCAN_ISIN_MAX
                delta_store.SCAN_ISIN_MAX = limit
                try:
                    return store.read_state_rows(table, keys, tokens=tokens)
                finally:
                    delta_store.SCAN_ISIN_MAX = old
            return read

        ways = {"decode all": decode_all, "set in scan": set_in_scan, "sorted lookup": forced(0),
                "read_state_rows": lambda k, t: store.read_state_rows(table, k, tokens=t)}
        print(f"{'keys':>10s} " + " ".join(f"{w:>16s}" for w in ways) + "   (median s)")
        for n in (int(x) for x in a.keys.split(",")):
            keys, tokens = asked(a.state_rows, n, a.seed)
            times = {w: [] for w in ways}
            got = {}
            for _ in range(a.repeat):
                for w, read in ways.items():
                    t0 = time.perf_counter()
                    got[w] = read(keys, tokens)
                    times[w].append(time.perf_counter() - t0)
            rows = got["set in scan"]
            assert all(got[w].equals(rows) for w in ("sorted lookup", "read_state_rows")), "different rows"
            print(f"{n:>10,d} " + " ".join(f"{statistics.median(times[w]):16.3f}" for w in ways)
                  + f"   {rows.num_rows:,} rows read", flush=True)
    finally:
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
