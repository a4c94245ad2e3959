"""Benchmark (not a test): batches of churn, with and without the maintenance step, side by side.

    .venv/bin/python benchmarks/bench_churn.py [--batches 500] [--every 50] [--inserts 200] [--lifetime 10]
                                               [--maintenance-every 60] [--gc-grace 600] [--zorder]

Churn is keys inserted, then deleted again (a queue, sessions, a cache): ``churn.items (k int, c int, v text, n int,
PRIMARY KEY (k, c)) WITH gc_grace_seconds = <--gc-grace>``, four rows per partition. Each batch ``INSERT``s
``--inserts`` new rows (row marker and two cells), sets ``v = null`` (a cell tombstone) on half of the rows
inserted ``--lifetime``/2 batches before, and deletes the rows inserted ``--lifetime`` batches before: a quarter
of their partitions by partition ``DELETE``, the rest row by row. The live table stays the same size; what
Cassandra (and the state) keeps of the deleted rows is tombstones. Batches come a minute apart (the batch's
``now``), so the default maintenance interval, 60 batches, is the maintenance DAG's hourly run.

Each batch runs in process without Spark, as the pipeline runs a small batch (``sinks.delta.run_store_batch``: read
the prior state, reconcile, events, outbox append, state MERGE), into two local stores fed the same cell log:

* **baseline**: no maintenance at all (tombstones kept for ever, files never compacted);
* **maintained**: the maintenance step every ``--maintenance-every`` batches (``pipeline.maintenance.maintain_delta``:
  tombstone purge after ``gc_grace_seconds``, outbox retention of two hours of batches, compaction, vacuum);
* with ``--zorder``, a third store: the same maintenance, then ``optimize.z_order`` of the state table on
  ``_cdc_token``, the lead column of the merge key (to compare with plain compaction).

Every ``--every`` batches it prints, per store, the state table's size in its current version (bytes, files, rows),
the outbox's (rows, files) and the mean batch time of the last ``--every`` batches; then the maintenance runs'
times. With the purge both must stay flat; the baseline's grow.
"""
from __future__ import annotations

import argparse
import random
import shutil
import statistics
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# before pyarrow, as in the pipeline's processes: importing cdc_lib settles how mimalloc maps and purges memory
# (cdc_lib.allocator), and pyarrow's mimalloc reads that when it loads
import cdc_lib  # noqa: E402,F401

import pyarrow as pa  # noqa: E402

from cdc_lib.celllog.records import mutation_records, records_to_batch  # noqa: E402
from cdc_lib.commitlog.model import (Cell, DeletionTime, LivenessInfo, Mutation, PartitionUpdate,  # noqa: E402
                                     Row)
from cdc_lib.cql.schema_from_ddl import load_cql_schema  # noqa: E402
from cdc_lib.pipeline.maintenance import maintain_delta  # noqa: E402
from cdc_lib.sinks.delta import DeltaRsStateStore, run_store_batch  # noqa: E402

CQL = """
CREATE KEYSPACE churn WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 3}};
CREATE TABLE churn.items (k int, c int, v text, n int, PRIMARY KEY (k, c))
    WITH ID = 7d0c5a10-1a2b-11f0-8c3d-5b1f0e2d3c4a AND gc_grace_seconds = {gc_grace};
"""
NOW0 = 1_763_000_000
BATCH_INTERVAL_S = 60
OUTBOX_RETENTION_BATCHES = 120          # two hours of batches a minute apart
ROWS_PER_PARTITION = 4


def _int(v: int) -> bytes:
    return struct.pack(">i", v)


def churn_batch(table, rng: random.Random, inserts: int, lifetime: int, now: int, seq: int) -> pa.RecordBatch:
    """The cell log of batch ``seq`` of churn (see the module docstring), written at ``now``."""
    mutations = []

    def write(k: int, update: PartitionUpdate) -> None:
        mutations.append(Mutation([update], f"CommitLog-7-{seq}.log", seq, 64 + len(mutations),
                                  mutation_id=uuid.uuid4().bytes))

    def rows_of(batch: int) -> range:
        return range((batch - 1) * inserts, batch * inserts) if batch >= 1 else range(0)

    for row in rows_of(seq):                       # new rows
        ts = now * 1_000_000 + len(mutations)
        write(row, PartitionUpdate(table.id, _int(row // ROWS_PER_PARTITION), table=table, unfiltereds=[
            Row((_int(row % ROWS_PER_PARTITION),), liveness=LivenessInfo(ts), cells=[
                Cell("n", _int(rng.randrange(1000)), ts), Cell("v", f"value {seq}-{row}".encode(), ts)])]))
    for row in rows_of(seq - lifetime // 2):       # half-way through their life: SET v = null on half of them
        if rng.random() < 0.5:
            ts = now * 1_000_000 + len(mutations)
            write(row, PartitionUpdate(table.id, _int(row // ROWS_PER_PARTITION), table=table, unfiltereds=[
                Row((_int(row % ROWS_PER_PARTITION),), cells=[
                    Cell("v", b"", ts, local_deletion_time=now, is_tombstone=True)])]))
    old = rows_of(seq - lifetime)                  # the end of their life: DELETE
    for k in range(old.start // ROWS_PER_PARTITION, old.stop // ROWS_PER_PARTITION):
        ts = now * 1_000_000 + len(mutations)
        if k % 4 == 0:                             # the whole partition
            write(k, PartitionUpdate(table.id, _int(k), table=table, partition_deletion=DeletionTime(ts, now)))
            continue
        for c in range(ROWS_PER_PARTITION):        # row by row
            ts = now * 1_000_000 + len(mutations)
            write(k, PartitionUpdate(table.id, _int(k), table=table, unfiltereds=[
                Row((_int(c),), deletion=DeletionTime(ts, now))]))
    records = []
    for i, m in enumerate(mutations):
        records += mutation_records(m, i)
    return records_to_batch(records)


def table_size(uri: str) -> dict:
    """Bytes, files and rows of the table's current version (what a reader reads; vacuum frees the rest)."""
    from deltalake import DeltaTable
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    return {"bytes": sum(actions["size_bytes"].to_pylist()), "files": actions.num_rows,
            "rows": sum(actions["num_records"].to_pylist())}


class Run:
    def __init__(self, name: str, root: Path, maintain: bool, zorder: bool = False):
        self.name, self.maintain, self.zorder = name, maintain, zorder
        self.store = DeltaRsStateStore(str(root))
        self.times: list = []
        self.maintenance_s: list = []

    def batch(self, schema, cells, seq: int, now: int, prev_now) -> None:
        t0 = time.perf_counter()
        run_store_batch(self.store, schema, [cells], batch_id=f"b-{seq:010d}", batch_seq=seq, now=now,
                        prev_now=prev_now)
        self.times.append(time.perf_counter() - t0)

    def maintenance(self, schema, table, seq: int, now: int) -> None:
        t0 = time.perf_counter()
        maintain_delta(self.store, schema, [table.qualified_name], now,
                       outbox_through=max(0, seq - OUTBOX_RETENTION_BATCHES), vacuum_retention_hours=168)
        if self.zorder:
            from deltalake import DeltaTable
            DeltaTable(self.store.state_uri(table)).optimize.z_order(["_cdc_token"])
        self.maintenance_s.append(time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=500)
    ap.add_argument("--every", type=int, default=50, help="print the figures every this many batches")
    ap.add_argument("--inserts", type=int, default=200, help="rows inserted per batch")
    ap.add_argument("--lifetime", type=int, default=10, help="batches from a row's insert to its delete")
    ap.add_argument("--maintenance-every", type=int, default=60, help="batches between two maintenance runs")
    ap.add_argument("--gc-grace", type=int, default=600, help="the table's gc_grace_seconds")
    ap.add_argument("--zorder", action="store_true", help="also a store z-ordered on _cdc_token by maintenance")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-churn-"))
    cql = work / "churn.cql"
    cql.write_text(CQL.format(gc_grace=a.gc_grace))
    schema = load_cql_schema(cql)
    table = schema.by_name("churn", "items")
    runs = [Run("baseline", work / "baseline", maintain=False), Run("maintained", work / "maintained", maintain=True)]
    if a.zorder:
        runs.append(Run("z-ordered", work / "zorder", maintain=True, zorder=True))
    rng = random.Random(a.seed)
    print(f"{a.batches} batches a minute apart, each inserting {a.inserts} rows and deleting those of "
          f"{a.lifetime} batches before; gc_grace_seconds {a.gc_grace}; maintenance every {a.maintenance_every} "
          f"batches; stores under {work}")
    header = "batch " + "".join(f"| {r.name:>10}: state MB  files    rows  outbox rows files  batch ms "
                                for r in runs)
    print(header)
    prev_now = None
    try:
        for seq in range(1, a.batches + 1):
            now = NOW0 + seq * BATCH_INTERVAL_S
            cells = churn_batch(table, rng, a.inserts, a.lifetime, now, seq)
            for r in runs:
                r.batch(schema, cells, seq, now, prev_now)
                if r.maintain and seq % a.maintenance_every == 0:
                    r.maintenance(schema, table, seq, now)
            prev_now = now
            if seq % a.every == 0:
                line = f"{seq:5d} "
                for r in runs:
                    s = table_size(r.store.state_uri(table))
                    o = table_size(r.store.events_uri())
                    line += (f"| {'':10}  {s['bytes'] / 1e6:8.2f} {s['files']:6d} {s['rows']:7d}  "
                             f"{o['rows']:11d} {o['files']:5d}  {1000 * statistics.mean(r.times[-a.every:]):8.1f} ")
                print(line, flush=True)
        for r in runs:
            if r.maintenance_s:
                print(f"{r.name}: {len(r.maintenance_s)} maintenance runs, "
                      f"{statistics.mean(r.maintenance_s):.2f} s each on average (max {max(r.maintenance_s):.2f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
