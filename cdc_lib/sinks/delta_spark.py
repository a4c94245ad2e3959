"""The state tables and the events outbox written by Spark itself (delta-spark): ``StateStore`` for the Spark path.

The same tables, rows and app transactions as ``sinks.delta.DeltaRsStateStore`` (a test writes the same batches
through both and compares the tables), but the writes run where the data is: the outbox is a DataFrame append and
each state table one SQL ``MERGE INTO`` whose source is a DataFrame, so on a cluster the executors write the
Parquet files and no row passes through the driver. The source may also be Arrow data the driver holds (a table,
batches or a reader), as ``DeltaRsStateStore`` takes it.

Idempotence: every commit carries Delta's app transaction ``(app_id, batch_seq)``: the outbox append through the
writer options ``txnAppId``/``txnVersion``, a MERGE through the session settings
``spark.databricks.delta.write.txnAppId``/``txnVersion``, which Delta checks at commit time and which are removed
again right after (they would otherwise make every later write of the session a no-op). A table that already
holds the batch is skipped before anything runs (``is_committed``), and Delta skips it again if a commit races.

Reads (the prior state of a chunk of partitions, expiring keys, committed versions) and the two metadata-only
commits that create a table or add columns to it (``ensure_table``) are ``DeltaRsStateStore``'s: delta-rs reads a
handful of partitions from a table without a JVM, which is what an executor's reconcile task needs, and one
definition of the table schema serves both stores. The tables stay at reader/writer protocol 1/2 without
deletion vectors (``cdc_lib.spark.conf.DELTA_SESSION_CONF``), so every engine reads what either store wrote.

Object stores: Spark writes through Hadoop filesystems, so ``s3://`` tables are opened as ``s3a://`` (the same
objects). Delta's S3 log store lets one Spark driver at a time write a table (it cannot use S3's conditional PUT);
the pipeline runs one batch at a time and holds the store's Delta writer lock (``storage.lock``) while it
writes, so no other writer (the maintenance DAG, another pipeline) commits at the same time.
"""
from __future__ import annotations

import contextlib
import json
import threading
import uuid
from typing import Optional

import pyarrow as pa

from .delta import (DEFAULT_APP_ID, DELETE_FLAG, MERGE_KEY, OUTBOX_SCHEMA, DeltaRsStateStore, _as_reader,
                    merge_source_schema)

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def hadoop_uri(uri: str) -> str:
    """The URI Spark opens a table at: ``s3://`` through s3a (Hadoop's S3 filesystem), anything else as is."""
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class DeltaSparkStateStore(DeltaRsStateStore):
    """``StateStore`` whose writes run in Spark (see the module docstring); reads as ``DeltaRsStateStore``."""

    _session_lock = threading.Lock()      # the app-transaction settings are per session: one write at a time

    def __init__(self, spark, root: str, storage_options: Optional[dict] = None, *, app_id: str = DEFAULT_APP_ID,
                 fail_hook=None):
        super().__init__(root, storage_options, app_id=app_id, fail_hook=fail_hook)
        self.spark = spark

    def _frame(self, data, schema: pa.Schema):
        """A DataFrame of ``data``: itself when it is one, else Arrow data the driver holds."""
        if hasattr(data, "sparkSession"):
            return data
        return self.spark.createDataFrame(_as_reader(data, schema).read_all())

    @contextlib.contextmanager
    def _app_transaction(self, batch_seq: int, **meta):
        """The session settings that make the Delta commits in the block carry ``(app_id, batch_seq)``."""
        conf = self.spark.conf
        with self._session_lock:
            conf.set(TXN_APP_ID, self.app_id)
            conf.set(TXN_VERSION, str(batch_seq))
            conf.set(USER_METADATA, json.dumps({"cdc.batch_seq": str(batch_seq), **meta}, sort_keys=True))
            try:
                yield
            finally:
                for key in (TXN_APP_ID, TXN_VERSION, USER_METADATA):
                    conf.unset(key)

    def write_outbox(self, batch_seq: int, rows, batch_id: str = "") -> bool:
        """Append the batch's outbox rows (a DataFrame with ``OUTBOX_SCHEMA``'s columns, or Arrow data) in one
        commit; False when the outbox already holds this batch (nothing written)."""
        if self.outbox_committed(batch_seq):
            return False
        df = self._frame(rows, OUTBOX_SCHEMA).select(*OUTBOX_SCHEMA.names)
        # no partitionBy: a new outbox is unpartitioned, one written by an earlier version keeps its own layout
        (df.write.format("delta").mode("append")
           .option("txnAppId", self.app_id).option("txnVersion", str(batch_seq))
           .option("userMetadata", json.dumps({"cdc.batch_id": batch_id, "cdc.batch_seq": str(batch_seq)},
                                              sort_keys=True))
           .save(hadoop_uri(self.events_uri())))
        if self.fail_hook:
            self.fail_hook("outbox", "events")
        return True

    def commit(self, table, batch_seq: int, source) -> bool:
        """MERGE the batch's change rows (``delta.change_rows``: a DataFrame with ``merge_source_schema``'s
        columns, or Arrow data) into the table in one commit; False when it already holds this batch."""
        if self.is_committed(table, batch_seq):
            return False
        dt = self.ensure_table(table)
        target = [f.name for f in dt.schema().fields]
        columns = set(merge_source_schema(table).names)
        view = f"cdc_merge_source_{uuid.uuid4().hex}"
        self._frame(source, merge_source_schema(table)).createOrReplaceTempView(view)
        # Columns the table has and the CQL table no longer has (dropped) are written as null, as delta-rs does.
        values = {n: (f"s.{_ident(n)}" if n in columns else "NULL") for n in target}
        on = " AND ".join(f"t.{k} = s.{k}" for k in MERGE_KEY)
        sql = (f"MERGE INTO delta.{_ident(hadoop_uri(self.state_uri(table)))} t USING {view} s ON {on} "
               f"WHEN MATCHED AND s.{DELETE_FLAG} THEN DELETE "
               f"WHEN MATCHED THEN UPDATE SET {', '.join(f't.{_ident(n)} = {v}' for n, v in values.items())} "
               f"WHEN NOT MATCHED AND NOT s.{DELETE_FLAG} THEN INSERT ({', '.join(map(_ident, values))}) "
               f"VALUES ({', '.join(values.values())})")
        try:
            with self._app_transaction(batch_seq):
                self.spark.sql(sql)
        finally:
            self.spark.catalog.dropTempView(view)
        if self.fail_hook:
            self.fail_hook("state", table.qualified_name)
        return True
