"""Benchmark (not a test): what reading one batch's outbox rows costs, per outbox layout.

    .venv/bin/python benchmarks/bench_outbox.py [--batches 1000] [--events 50]

The same ``--batches`` batches of ``--events`` events (about 300 bytes of JSON each) are appended, one commit per
batch as the transform writes them, to:

* **partitioned by batch_id**: what earlier versions wrote, one partition (directory, file) per batch; also after
  compaction, which cannot merge files of different partitions;
* **unpartitioned**: what ``DeltaRsStateStore.write_outbox`` writes now, before any maintenance;
* the same **after the maintenance step** (``compact_and_vacuum``: small files merged, in batch order);
* the partitioned one **after its rewrite** (``unpartition_outbox``) and the maintenance step.

For each it prints the number of files and the time ``read_outbox`` takes for the newest batch (what the publish
step reads) and for old ones (what a re-emit reads): median over ``--reads`` batches, each read opening the table
as a new process would.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# before pyarrow, as in the pipeline's processes: importing cdc_lib settles how mimalloc maps and purges memory
# (cdc_lib.allocator), and pyarrow's mimalloc reads that when it loads
import cdc_lib  # noqa: E402,F401

import pyarrow as pa  # noqa: E402

from cdc_lib.sinks.delta import OUTBOX_SCHEMA, DeltaRsStateStore, read_outbox  # noqa: E402


def batch_rows(seq: int, events: int) -> pa.Table:
    bid = f"b-{seq:010d}"
    return pa.Table.from_pylist([
        {"batch_id": bid, "batch_seq": seq, "seq": i, "event_id": f"{seq:08x}{i:08x}", "keyspace": "shop",
         "table": "orders", "op": "u", "key_json": json.dumps({"id": i}),
         "event_json": json.dumps({"before": {"id": i, "v": "x" * 100}, "after": {"id": i, "v": "y" * 100}}),
         "ts_us": seq * 1_000_000 + i, "ts_ms": seq * 1000} for i in range(events)], schema=OUTBOX_SCHEMA)


def read_ms(root: str, seqs: list) -> float:
    """Median milliseconds of ``read_outbox`` over the batches ``seqs``."""
    times = []
    for seq in seqs:
        t0 = time.perf_counter()
        n = len(list(read_outbox(root, f"b-{seq:010d}")))
        times.append(1000 * (time.perf_counter() - t0))
        assert n > 0, seq
    return statistics.median(times)


def files(store: DeltaRsStateStore) -> int:
    from deltalake import DeltaTable
    return len(DeltaTable(store.events_uri()).file_uris())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=1000)
    ap.add_argument("--events", type=int, default=50)
    ap.add_argument("--reads", type=int, default=15)
    a = ap.parse_args()
    from deltalake import CommitProperties, Transaction, write_deltalake
    work = Path(tempfile.mkdtemp(prefix="bench-outbox-"))
    old = DeltaRsStateStore(str(work / "partitioned"))
    new = DeltaRsStateStore(str(work / "unpartitioned"))
    try:
        for seq in range(1, a.batches + 1):
            rows = batch_rows(seq, a.events)
            new.write_outbox(seq, rows, f"b-{seq:010d}")
            write_deltalake(old.events_uri(), rows, mode="append", partition_by=["batch_id"],
                            commit_properties=CommitProperties(app_transactions=[Transaction(old.app_id, seq)]))
        old_seqs = random.Random(1).sample(range(1, a.batches), a.reads)
        print(f"{a.batches} batches of {a.events} events; read_outbox, median ms")
        print(f"{'layout':46s} {'files':>6s} {'newest batch':>13s} {'old batches':>12s}")

        def show(label, store, newest=a.batches):
            print(f"{label:46s} {files(store):6d} {read_ms(store.root, [newest] * a.reads):13.1f} "
                  f"{read_ms(store.root, old_seqs):12.1f}", flush=True)
        show("partitioned by batch_id (before)", old)
        old.compact_and_vacuum(old.events_uri(), 168)
        show("partitioned by batch_id, compacted", old)   # compaction stays within a partition: one file each
        show("unpartitioned, before maintenance", new)
        new.compact_and_vacuum(new.events_uri(), 168)
        show("unpartitioned, after maintenance (compacted)", new)
        old.unpartition_outbox()
        old.compact_and_vacuum(old.events_uri(), 168)
        show("partitioned, rewritten and compacted", old)
        seq = a.batches + 1
        new.write_outbox(seq, batch_rows(seq, a.events), f"b-{seq:010d}")
        show("compacted, then one more batch appended", new, seq)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
