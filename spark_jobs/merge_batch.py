"""``spark-submit`` entry point of the transform step: one batch (commit-log segments, or the SSTables of a
``sstables`` backfill) -> Delta state + outbox.

A batch the pipeline claimed (what its ``spark_submit`` mode runs, through ``cdc_lib.spark.submit``): the job reads
the batch's manifest (segments, checksums, processing time, sequence number) from the store::

    spark-submit ... spark_jobs/merge_batch.py --store-url s3://bucket/cdc --batch-id b-0000000042 \\
        --schema-file schema.cql --cluster prod

Segments given by hand (local paths or URLs), for a one-off run::

    spark-submit ... spark_jobs/merge_batch.py --segments a.log b.log --root /data/cdc --schema-file schema.cql \\
        --batch-id b-000042 --batch-seq 42 --now 1763000000

The Delta and s3a jars and the Spark settings come from spark-submit (``cdc_lib.spark.submit`` passes them). The
store's S3 endpoint and credentials are read from the session's ``spark.hadoop.fs.s3a.*`` properties (which
``cdc_lib.spark.submit`` hands over in a properties file only its user can read), never from the command line.
The job itself is ``cdc_lib.spark.merge_job.run_batch``; this file reads the arguments, gets the session and prints
the result as JSON on its last stdout line, after ``RESULT_PREFIX``.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:       # spark-submit runs this file as a script
    sys.path.insert(0, str(REPO_ROOT))

from cdc_lib.pipeline.resources import encryption_keys  # noqa: E402
from cdc_lib.settings import PipelineConfig  # noqa: E402
from cdc_lib.spark.conf import s3_settings_from_spark  # noqa: E402
from cdc_lib.spark.merge_job import LAST_TIMINGS, RESULT_PREFIX, run_batch  # noqa: E402
from cdc_lib.spark.session import ship_cdc_lib  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Merge one batch of commit-log segments into Delta state + outbox")
    p.add_argument("--store-url", help="the pipeline's store: run the batch its manifest describes (--batch-id)")
    p.add_argument("--segments", nargs="+", help="segment paths or URLs (instead of --store-url)")
    p.add_argument("--root", help="with --segments: where the Delta tables are (local directory or s3:// URL)")
    p.add_argument("--schema-file", required=True, help="CQL schema (DESCRIBE output)")
    p.add_argument("--batch-id", required=True)
    p.add_argument("--batch-seq", type=int, help="with --segments: increasing batch number (Delta txn version)")
    p.add_argument("--now", type=int, help="with --segments: processing time, seconds since the epoch")
    p.add_argument("--prev-now", type=int, default=None, help="with --segments: previous batch's --now")
    p.add_argument("--cluster", default="default")
    p.add_argument("--app-id", default="cassandra-cdc")
    p.add_argument("--keystore", help="keystore of encrypted commit logs; its passwords in the files below or in "
                                      "CASSANDRA_CDC_KEYSTORE_PASSWORD / CASSANDRA_CDC_KEY_PASSWORD")
    p.add_argument("--keystore-password-file")
    p.add_argument("--key-password-file")
    a = p.parse_args(argv)
    if bool(a.store_url) == bool(a.segments):
        p.error("give either --store-url (a claimed batch) or --segments")
    if a.segments and (a.root is None or a.batch_seq is None or a.now is None):
        p.error("--segments needs --root, --batch-seq and --now")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")

    from pyspark.sql import SparkSession
    spark = SparkSession.builder.appName("cdc-merge-batch").getOrCreate()
    if not spark.sparkContext.master.startswith("local"):
        ship_cdc_lib(spark)
    conf = dict(spark.sparkContext.getConf().getAll())
    store_url = a.store_url or a.root
    config = PipelineConfig(store_url=store_url, cluster=a.cluster, app_id=a.app_id, keystore=a.keystore,
                            keystore_password_file=a.keystore_password_file, key_password_file=a.key_password_file,
                            **s3_settings_from_spark(conf))
    common = dict(storage_options=config.delta_options(), schema_file=a.schema_file, cluster=a.cluster,
                  app_id=a.app_id, store_options=config.fs_options(), keys=encryption_keys(config))
    if a.store_url:
        from cdc_lib.pipeline.batches import read_batch, segment_sources
        from cdc_lib.pipeline.bootstrap import read_horizons, sstable_sources
        from cdc_lib.pipeline.resources import delta_root, open_store
        store = open_store(config)
        batch = read_batch(store, a.batch_id)
        if batch.backfill.get("mode") == "sstables":       # a backfill from SSTable snapshots
            sources, checksums, extra = sstable_sources(store, batch), None, {"create_op": "r"}
        elif batch.backfill.get("mode") == "cql":
            p.error(f"batch {batch.batch_id} scans live tables: it runs in the pipeline's process, not here")
        else:
            sources, checksums = segment_sources(store, batch)
            extra = {"horizons": read_horizons(store, a.cluster)}
        res = run_batch(spark, sources, root=delta_root(config, store), batch_id=batch.batch_id,
                        batch_seq=batch.batch_seq, now=batch.now, prev_now=batch.prev_now, store_url=store.url,
                        checksums=checksums, **extra, **common)
    else:
        res = run_batch(spark, a.segments, root=a.root, batch_id=a.batch_id, batch_seq=a.batch_seq, now=a.now,
                        prev_now=a.prev_now, **common)
    # the seconds per stage ride along: the driver that submitted the job (and the benchmark) can show them
    print(RESULT_PREFIX + json.dumps({**res.__dict__, "timings": dict(LAST_TIMINGS)}, sort_keys=True), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
