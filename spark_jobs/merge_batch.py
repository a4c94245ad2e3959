"""``spark-submit`` entry point of the transform step: one batch of commit-log segments -> Delta state + outbox.

    spark-submit spark_jobs/merge_batch.py --segments a.log b.log --root /data/cdc --schema-file schema.cql \\
        --batch-id b-000042 --batch-seq 42 --now 1763000000

The job itself is ``cdc_lib.spark.merge_job.run_batch`` (the pipeline also runs it in-process); this file only
reads the arguments, gets a session and prints the result as JSON on its last stdout line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:       # spark-submit runs this file as a script
    sys.path.insert(0, str(REPO_ROOT))

from cdc_lib.spark.merge_job import run_batch  # noqa: E402
from cdc_lib.spark.session import local_session, ship_cdc_lib  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Merge one batch of commit-log segments into Delta state + outbox")
    p.add_argument("--segments", nargs="+", required=True, help="segment paths (local or URLs)")
    p.add_argument("--root", required=True, help="store root (local directory or s3:// URL)")
    p.add_argument("--schema-file", required=True, help="CQL schema (DESCRIBE output)")
    p.add_argument("--batch-id", required=True)
    p.add_argument("--batch-seq", type=int, required=True, help="increasing batch number (Delta txn version)")
    p.add_argument("--now", type=int, required=True, help="processing time, seconds since the epoch")
    p.add_argument("--prev-now", type=int, default=None, help="previous batch's --now (TTL sweep window)")
    p.add_argument("--cluster", default="default")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="deltalake storage option (repeatable), e.g. AWS_ENDPOINT_URL=http://127.0.0.1:8333")
    p.add_argument("--local", action="store_true", help="start a local[2] session instead of spark-submit's")
    a = p.parse_args(argv)
    opts = dict(kv.split("=", 1) for kv in a.storage_option)
    if a.local:
        spark = local_session()
    else:
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.appName("cdc-merge-batch").getOrCreate()
        ship_cdc_lib(spark)
    res = run_batch(spark, a.segments, root=a.root, storage_options=opts, schema_file=a.schema_file,
                    batch_id=a.batch_id, batch_seq=a.batch_seq, now=a.now, prev_now=a.prev_now, cluster=a.cluster)
    print(json.dumps(res.__dict__, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
