"""The pipeline on a real Spark standalone cluster: a Master and two Workers (separate JVMs started from pip's
pyspark, ``demo.servers.run_spark_cluster``), the transform submitted with ``spark-submit`` the way the DAG's
``spark_submit`` mode runs it, segments and Delta tables on the S3 server, events to Apache Kafka with
transactions. The executors open the segments from the store themselves (there is no local copy anywhere: the
store is S3) and write the Delta tables with delta-spark. A job that fails (here on a local master) says why in the
error and the task log."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_faults import (_assert_exactly_once_in_order, _assert_topics_replay_to_the_model, _config,  # noqa: F401
                         _fresh_raw, _ship, segments)

from cdc_lib import pipeline as P
from cdc_lib.demo.servers import run_spark_cluster
from cdc_lib.storage.layout import Layout

pytest.importorskip("pyspark")


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    with run_spark_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as cluster:
        yield cluster


def _shipped_to_cluster(spark_cluster, segments, tmp_path, s3_server, s3_bucket, kafka_broker) -> P.PipelineConfig:
    """The settings of a pipeline that runs its batches with spark-submit on ``spark_cluster`` (transactions on; a
    ``local[1]`` master without one), after the agents shipped the segments."""
    cfg = _config(tmp_path, s3_server, kafka_broker, s3_bucket, max_segments=100, spark_submit=True,
                  spark_master=spark_cluster.master_url if spark_cluster else "local[1]", kafka_transactions=True,
                  spark_submit_bin=str(Path(sys.executable).parent / "spark-submit"),
                  spark_conf={"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2",
                              "spark.databricks.delta.snapshotPartitions": "2"})
    assert _ship(_fresh_raw(segments, tmp_path), cfg, tmp_path / "agent") >= 6
    return cfg


def test_pipeline_on_a_two_worker_cluster_publishes_each_event_once(spark_cluster, segments, tmp_path, s3_server,
                                                                   s3_bucket, kafka_broker, monkeypatch, caplog):
    for key, value in spark_cluster.env.items():          # what a worker machine's spark-env.sh would say
        monkeypatch.setenv(key, value)
    cfg = _shipped_to_cluster(spark_cluster, segments, tmp_path, s3_server, s3_bucket, kafka_broker)
    caplog.set_level("INFO", logger="cassandra_cdc")
    done = P.run_until_idle(cfg)
    assert done and all(b.state == "archived" for b in done)
    modes = {b.steps["transform"]["mode"] for b in done if b.segments}
    assert modes == {"spark-submit"}, modes
    # the secret key never was on a command line (spark-submit's argv is logged whole)
    assert s3_server.secret_key not in caplog.text and "spark-submit --master spark://" in caplog.text
    # both workers ran executors of the job
    for wdir in spark_cluster.worker_dirs:
        assert list(Path(wdir).glob("app-*/*/stderr")), f"no executor ran on {wdir}"
    store = P.open_store(cfg)
    assert store.list(Layout.area_prefix(Layout.INCOMING, cfg.cluster)) == []
    assert _assert_exactly_once_in_order(cfg) > 100
    _assert_topics_replay_to_the_model(cfg, segments[1].mutations)


def test_a_failed_job_says_why_in_the_error_and_the_task_log(segments, tmp_path, s3_server, s3_bucket, kafka_broker,
                                                            caplog):
    """A segment rewritten in the store after the batch claimed it (a second writer; a bucket restored from another
    copy): its parse task fails the executor's sha256 check, so the job fails. The error the
    transform task raises, and the job's lines in the task log, say which segment and why, not only an exit
    status; the batch stays claimed and nothing of it is committed, so a retry starts it afresh. On a local master
    (no executors to start: the report is the same on the cluster, where Spark first retries the task 3 times)."""
    import logging

    from deltalake import DeltaTable

    from cdc_lib.sinks.delta import events_table_uri
    from cdc_lib.spark.submit import SparkJobError
    cfg = _shipped_to_cluster(None, segments, tmp_path, s3_server, s3_bucket, kafka_broker)
    caplog.set_level("INFO", logger="cassandra_cdc")
    batch = P.claim(cfg)
    store = P.open_store(cfg)
    victim = batch.segments[-1]
    store.put_bytes(victim["key"], store.get_bytes(victim["key"])[:-100])      # cut short by a second writer
    with pytest.raises(SparkJobError) as failed:
        P.transform(cfg, batch)
    why = f"{store.url_for(victim['key'])}: the copy read hashes to"
    said = str(failed.value)
    assert "spark-submit failed (exit status 1)" in said
    assert why in said and f"the batch claimed the segment with sha256 {victim['checksum']}" in said, said
    job_errors = [r.getMessage() for r in caplog.records
                  if r.name == "cassandra_cdc.spark.job" and r.levelno >= logging.ERROR]
    assert any(why in line for line in job_errors), "the task log does not show the job's failure as an error"
    assert P.read_batch(store, batch.batch_id).state == "claimed"
    assert not DeltaTable.is_deltatable(events_table_uri(P.delta_root(cfg, store)), cfg.delta_options())


def _kill_first_executor_of(worker_dir: Path, killed: list, stop) -> None:
    """SIGKILL the first executor JVM of ``worker_dir`` as soon as it runs a Python task (it has started its Python
    worker daemon: the job's parse tasks are Python); in a thread."""
    import os
    import signal
    import time

    import psutil
    while not stop.is_set():
        for proc in psutil.process_iter(["cmdline", "cwd"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if "CoarseGrainedExecutorBackend" in cmd and str(proc.info["cwd"] or "").startswith(str(worker_dir)):
                try:
                    busy = any("pyspark.daemon" in " ".join(c.cmdline()) for c in proc.children(recursive=True))
                except psutil.Error:
                    continue
                if busy:
                    os.kill(proc.pid, signal.SIGKILL)
                    killed.append(proc.pid)
                    return
        time.sleep(0.1)


def test_an_executor_killed_mid_job_is_retried_and_nothing_is_written_twice(spark_cluster, segments, tmp_path,
                                                                           s3_server, s3_bucket, kafka_broker,
                                                                           monkeypatch, caplog):
    import threading
    for key, value in spark_cluster.env.items():
        monkeypatch.setenv(key, value)
    cfg = _shipped_to_cluster(spark_cluster, segments, tmp_path, s3_server, s3_bucket, kafka_broker)
    caplog.set_level("INFO", logger="cassandra_cdc")
    killed: list = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_first_executor_of, args=(spark_cluster.worker_dirs[1], killed, stop))
    killer.start()
    try:
        done = P.run_until_idle(cfg)
    finally:
        stop.set()
        killer.join()
    assert killed, "no executor was killed"
    assert "Lost task" in caplog.text, "Spark retried no task (the job's log says what was lost)"
    assert done and all(b.state == "archived" for b in done)
    assert _assert_exactly_once_in_order(cfg) > 100
    _assert_topics_replay_to_the_model(cfg, segments[1].mutations)
