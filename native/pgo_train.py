"""The workload a profile-guided build of the compiled core learns from (``native/build.py``).

    python native/pgo_train.py WORKDIR [--demo-mutations N] [--kv-rows N]

Run by ``build.py`` with an instrumented build of ``cdc_native`` first on ``sys.path``: what the compiled code
does here, branch by branch, is what the optimised build is laid out for. So it does what a pipeline batch does,
through the package's own entry points, on the demo's schema (every CQL type, clustering and static columns,
collections, UDTs, counters, TTLs, row, range and partition deletions: ``cdc_lib.demo.workload``) written by 3
nodes at RF 3:

* decoding: the nodes' segments, plain and LZ4-compressed, to the Arrow cell log (``celllog.read_cell_log``, the
  parse step's reader);
* the state engine: two batches through ``sinks.delta.run_store_batch`` into a local Delta store, the second over
  the first's state and after the 60 s TTLs have expired (updates with prior rows, replica copies, TTL expiry);
* and a batch of single-row updates of a key-value table into stored rows, the shape most tables have and the
  one ``benchmarks/bench_merge.py`` measures, decoded from segments like the rest.

It checks that the compiled core did the work (a build that silently fell back to Python would train nothing)
and prints what it ran. The figures it produces are not kept: only the profile the instrumented build writes.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NODES_MUTATIONS = 6000      # demo-schema writes (x3 replicas: ~18,000 commit-log entries, a few MB)
KV_ROWS = 60_000            # key-value rows, each written once then updated once


def _require_compiled() -> None:
    os.environ["CASSANDRA_CDC_NATIVE"] = "1"
    import cdc_native
    want = os.environ.get("CDC_NATIVE_TRAINING_BUILD")
    if want and not Path(cdc_native.__file__).resolve().is_relative_to(Path(want).resolve()):
        sys.exit(f"pgo_train: imported {cdc_native.__file__}, not the instrumented build in {want}")


def _cells(paths, schema) -> list:
    from cdc_lib.celllog.reader import read_cell_log
    damage = []
    batches = list(read_cell_log(paths, schema, on_damage=damage.append, cdc_only=True))
    if damage:
        sys.exit(f"pgo_train: generated segments read as damaged: {damage[:3]}")
    return batches


def _segments(cw) -> tuple[list, list]:
    """Each node's segments split in two halves: (first batch's, second batch's)."""
    first, second = [], []
    for paths in cw.segments.values():
        half = (len(paths) + 1) // 2
        first += paths[:half]
        second += paths[half:]
    return first, second


def demo_batches(work: Path, mutations: int = NODES_MUTATIONS) -> int:
    from cdc_lib.demo.workload import START_US, sample_schema, write_cluster_segments
    from cdc_lib.sinks.delta import DeltaRsStateStore, run_store_batch
    schema = sample_schema()
    plain = write_cluster_segments(work / "segments", schema, mutations, seed=11, segment_size=1 << 20)
    lz4 = write_cluster_segments(work / "segments-lz4", schema, max(1, mutations // 4), seed=12,
                                 compression="LZ4Compressor", segment_id_base=1_764_000_000_000)
    _cells([p for ps in lz4.segments.values() for p in ps], schema)       # decoded only: the LZ4 sections' path
    store = DeltaRsStateStore(str(work / "delta"))
    first, second = _segments(plain)
    t0 = START_US // 1_000_000
    events = 0
    for seq, (paths, now, prev) in enumerate([(first, t0 + 30, None), (second, t0 + 4000, t0 + 30)], start=1):
        res = run_store_batch(store, schema, _cells(paths, schema), batch_id=f"train-{seq}", batch_seq=seq,
                              now=now, prev_now=prev)
        events += res["events"]
    return events


KV_CQL = """
CREATE KEYSPACE train WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3};
CREATE TABLE train.kv (id bigint PRIMARY KEY, v text, n int) WITH ID = 5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e98
    AND cdc = true;
"""


class _KvWrites:
    """``write_cluster_segments``' workload for the key-value table: row i's write, in order (an INSERT with its row
    marker, or an UPDATE of the cells only)."""

    def __init__(self, schema, ts: int, insert: bool, tag: str):
        import random
        self.table, self.ts, self.insert, self.tag = schema.by_name("train", "kv"), ts, insert, tag
        self.rnd, self.i = random.Random(5), 0

    def next_mutation(self):
        from cdc_lib.commitlog.model import Cell, LivenessInfo, Mutation, PartitionUpdate, Row
        from cdc_lib.commitlog.mutation import finish_update
        from cdc_lib.demo.workload import encode_value
        cols, i, ts = self.table.columns, self.i, self.ts + self.i
        self.i += 1
        cells = [Cell("n", encode_value(cols["n"].type, self.rnd.randrange(1 << 30)), ts),
                 Cell("v", encode_value(cols["v"].type, f"value {self.tag}-{i:08d}"), ts)]
        row = Row((), liveness=LivenessInfo(ts) if self.insert else None, cells=cells)
        key = encode_value(cols["id"].type, i * 7919)
        return Mutation([finish_update(PartitionUpdate(self.table.id, key, self.table, unfiltereds=[row]))])


def kv_batches(work: Path, rows: int = KV_ROWS) -> int:
    """``rows`` inserts, then an update of each: the second batch replaces stored rows one for one."""
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    from cdc_lib.demo.workload import START_US, write_cluster_segments
    from cdc_lib.sinks.delta import DeltaRsStateStore, run_store_batch
    schema = load_cql_schema(KV_CQL)
    store = DeltaRsStateStore(str(work / "delta-kv"))
    events = 0
    for seq in (1, 2):
        ts = START_US + seq * 1_000_000
        written = write_cluster_segments(work / f"kv-{seq}", schema, rows, nodes=1, rf=1,
                                         workload=_KvWrites(schema, ts, insert=seq == 1, tag=str(seq)),
                                         segment_id_base=1_765_000_000_000 + seq * 1000)
        paths = [p for ps in written.segments.values() for p in ps]
        res = run_store_batch(store, schema, _cells(paths, schema), batch_id=f"kv-{seq}", batch_seq=seq,
                              now=ts // 1_000_000 + 10)
        events += res["events"]
    return events


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workdir", type=Path)
    p.add_argument("--demo-mutations", type=int, default=NODES_MUTATIONS)
    p.add_argument("--kv-rows", type=int, default=KV_ROWS)
    a = p.parse_args(argv)
    a.workdir.mkdir(parents=True, exist_ok=True)
    _require_compiled()
    sys.path.insert(0, str(ROOT))
    from cdc_lib.state import native as native_state
    if not native_state.enabled():
        sys.exit("pgo_train: the compiled state engine is not enabled")
    t0 = time.perf_counter()
    demo = demo_batches(a.workdir, a.demo_mutations)
    kv = kv_batches(a.workdir, a.kv_rows)
    print(f"pgo_train: {demo:,} demo-schema events and {kv:,} key-value events in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
