"""The pipeline on a real Spark standalone cluster: a Master and two Workers (separate JVMs started from pip's
pyspark, ``demo.servers.run_spark_cluster``), the transform submitted with ``spark-submit`` the way the DAG's
``spark_submit`` mode runs it, segments and Delta tables on the S3 server, events to Apache Kafka with
transactions. The executors open the segments from the store themselves (there is no local copy anywhere: the
store is S3) and write the Delta tables with delta-spark. The pipeline killed while its job is between Delta commits
(its job dies with it), then rerun, losing an executor mid-task that Spark replaces: no Delta table is written
twice, each event is published once. (One scenario, so that the module runs the cluster job twice, not three
times: each run costs minutes on the 2-core CI machine.) On a local master, submitted the same way: a job that
fails says why in the error and the task log; S3 frozen while the job MERGEs fails it within s3a's and delta-rs's
timeouts (``s3_timeout_s``), and the retry publishes each event once; a job that hangs is stopped after
``spark_submit_timeout_s``."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_faults import (_assert_exactly_once_in_order, _assert_topics_replay_to_the_model, _config,  # noqa: F401
                         _fresh_raw, _ship, segments)

from cdc_lib import pipeline as P
from cdc_lib.demo.servers import run_s3_server, run_spark_cluster
from cdc_lib.spark import scratch
from cdc_lib.storage.layout import Layout



@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    with run_spark_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as cluster:
        yield cluster


def _shipped_to_cluster(spark_cluster, segments, tmp_path, s3_server, s3_bucket, kafka_broker,
                        **settings) -> P.PipelineConfig:
    """The settings of a pipeline that runs its batches with spark-submit on ``spark_cluster`` (transactions on; a
    ``local[1]`` master without one), after the agents shipped the segments."""
    cfg = _config(tmp_path, s3_server, kafka_broker, s3_bucket, max_segments=100, spark_submit=True, **settings,
                  spark_master=spark_cluster.master_url if spark_cluster else "local[1]", kafka_transactions=True,
                  spark_submit_bin=str(Path(sys.executable).parent / "spark-submit"),
                  spark_conf={"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2",
                              "spark.databricks.delta.snapshotPartitions": "2"})
    assert _ship(_fresh_raw(segments, tmp_path), cfg, tmp_path / "agent") >= 6
    return cfg


def _kill_first_executor_of(worker_dir: Path, killed: list, stop, old_apps=frozenset()) -> None:
    """SIGKILL the first executor JVM of ``worker_dir`` (but of none of the applications ``old_apps``, their
    directories there) as soon as it runs a Python task (it has started its Python worker daemon: the job's parse
    tasks are Python); in a thread."""
    import psutil
    while not stop.is_set():
        for proc in psutil.process_iter(["cmdline", "cwd"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            cwd = Path(proc.info["cwd"] or "/")
            if ("CoarseGrainedExecutorBackend" in cmd and cwd.is_relative_to(worker_dir)
                    and cwd.parent not in old_apps):
                try:
                    busy = any("pyspark.daemon" in " ".join(c.cmdline()) for c in proc.children(recursive=True))
                except psutil.Error:
                    continue
                if busy:
                    os.kill(proc.pid, signal.SIGKILL)
                    killed.append(proc.pid)
                    return
        time.sleep(0.1)


RUN_ONCE = """
import json, sys
from cdc_lib import pipeline as P
P.run_once(P.PipelineConfig(**json.loads(sys.argv[1])))
"""


def _delta_commits(cfg: P.PipelineConfig) -> dict:
    """{Delta table (its key in the store): [for each of its commits in order, the pipeline's app transaction
    version (its batch_seq), or None for a commit without one (the metadata commit creating the table)]}, read from
    the tables' own logs."""
    store = P.open_store(cfg)
    out: dict = {}
    for key in sorted(store.list(f"{Layout.DELTA}/")):
        table, sep, name = key.partition("/_delta_log/")
        if sep and re.fullmatch(r"\d{20}\.json", name):
            actions = [json.loads(line) for line in store.get_bytes(key).decode().splitlines() if line.strip()]
            txn = [a["txn"]["version"] for a in actions if "txn" in a and a["txn"]["appId"] == cfg.app_id]
            out.setdefault(table, []).append(txn[0] if txn else None)
    return out


def _holding(commits: dict, batch_seq: int) -> dict:
    """The tables of ``commits`` (``_delta_commits``) holding batch ``batch_seq``."""
    return {table: versions for table, versions in commits.items() if batch_seq in versions}


def _jobs_of(store_url: str) -> list:
    """The processes of spark-submit jobs working for the store at ``store_url`` (driver JVM, its Python)."""
    import psutil
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if any(arg.endswith("merge_batch.py") for arg in cmd) and store_url in cmd:
            found.append(proc)
    return found


@pytest.mark.timeout(900)
def test_pipeline_killed_between_delta_commits_then_a_rerun_losing_an_executor_publishes_each_event_once(
        spark_cluster, segments, tmp_path, s3_server, s3_bucket, kafka_broker, monkeypatch, caplog):
    """The transform task's process SIGKILLed while its spark-submit job, on the two workers, has committed the outbox
    and some state tables but not the others: the job dies with it (it would otherwise write on unsupervised).
    The rerun (once the dead run's Delta writer lease ran out) finishes the batch although one of its executors is
    SIGKILLed in the middle of its Python tasks (Spark retries them): no table gets a second commit of the batch
    (the tables committed before are left alone: their app transaction says so), both workers run executors, no
    secret is on a command line, and each event is published exactly once and replays to the model."""
    import threading
    for key, value in spark_cluster.env.items():          # what a worker machine's spark-env.sh would say
        monkeypatch.setenv(key, value)
    cfg = _shipped_to_cluster(spark_cluster, segments, tmp_path, s3_server, s3_bucket, kafka_broker,
                              delta_lock_ttl_s=15)
    store = P.open_store(cfg)
    events_table = Layout.events_table()
    with open(tmp_path / "killed-run.log", "wb") as out:
        killed = subprocess.Popen([sys.executable, "-c", RUN_ONCE, json.dumps(dataclasses.asdict(cfg))],
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        while not (events_table in (tables := _holding(_delta_commits(cfg), 1)) and len(tables) >= 2):
            assert killed.poll() is None, ("the run ended before its job committed a state table:\n"
                                           + (tmp_path / "killed-run.log").read_text()[-3000:])
            time.sleep(0.2)
        os.kill(killed.pid, signal.SIGKILL)         # the outbox and a state table are committed
    finally:
        killed.kill()
        killed.wait()
    deadline = time.monotonic() + 60
    while _jobs_of(store.url):
        assert time.monotonic() < deadline, "the killed run's spark-submit job is still running"
        time.sleep(0.5)
    # the killed task ran no clean-up: its job's secrets file is still in the temporary directory
    secrets_left = list(Path(tempfile.gettempdir()).glob(scratch.prefix("spark-submit", killed.pid) + "*"))
    assert [p.name for d in secrets_left for p in d.iterdir()] == ["secret.properties"]
    before = _delta_commits(cfg)
    assert P.read_batch(store, P.batch_id_for(1)).state == "claimed"
    committed = _holding(before, 1)
    assert all(versions.count(1) == 1 for versions in committed.values()), before
    apps_before = {wdir: set(Path(wdir).glob("app-*")) for wdir in spark_cluster.worker_dirs}

    caplog.set_level("INFO", logger="cassandra_cdc")
    killed_executors: list = []
    stop = threading.Event()
    victim = spark_cluster.worker_dirs[1]
    killer = threading.Thread(target=_kill_first_executor_of,
                              args=(victim, killed_executors, stop, apps_before[victim]))
    killer.start()
    try:
        done = P.run_until_idle(cfg)
    finally:
        stop.set()
        killer.join()
    assert killed_executors, "no executor was killed"
    assert "Lost task" in caplog.text, "Spark retried no task (the job's log says what was lost)"
    assert done and all(b.state == "archived" for b in done)
    assert {b.steps["transform"]["mode"] for b in done if b.segments} == {"spark-submit"}
    after = _delta_commits(cfg)
    for table, versions in after.items():
        assert versions.count(1) <= 1, f"{table}: the batch committed twice"
    assert {t: after[t] for t in committed} == committed, "the rerun wrote a table the killed job had committed"
    assert set(_holding(after, 1)) - set(committed), "the killed job had committed every table already"
    assert not any(d.exists() for d in secrets_left), "the rerun's job left the killed one's secrets file"
    # the secret key never was on a command line (spark-submit's argv is logged whole)
    assert s3_server.secret_key not in caplog.text and "spark-submit --master spark://" in caplog.text
    # both workers ran executors of the rerun's job
    for wdir in spark_cluster.worker_dirs:
        assert any(list(app.glob("*/stderr")) for app in set(Path(wdir).glob("app-*")) - apps_before[wdir]), \
            f"no executor of the rerun ran on {wdir}"
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


@pytest.mark.timeout(600)
def test_s3_frozen_while_the_job_commits_fails_the_run_in_bounded_time_then_retry_publishes_once(
        segments, tmp_path, kafka_broker):
    """The S3 server frozen (SIGSTOP) once the spark-submit job has committed the outbox, while it MERGEs the state
    tables (s3a in the driver and the executors, fsspec and delta-rs in the Python workers): the job gives up by
    itself (s3a's timeouts come from ``s3_timeout_s``), long before ``spark_submit_timeout_s``, and the transform
    fails with the job's error naming what timed out; the batch stays claimed, nothing is published or archived.
    With S3 back, the retry skips what the frozen job committed and publishes each event once. (A ``local[1]``
    master: the s3a settings are the same on a cluster, where Spark retries a failed task first. The retry runs in
    the pipeline's process, a small batch's mode, which saves a second job here: a spark-submit rerun after partial
    commits is the test above's.)"""
    import threading

    from cdc_lib.spark.submit import SparkJobError, SparkJobTimeout
    with run_s3_server(tmp_path / "weed", bucket="cdc") as s3:
        # a short lease: the failed transform cannot release the Delta writer lock, the retry takes it over
        cfg = _shipped_to_cluster(None, segments, tmp_path, s3, "cdc", kafka_broker, s3_timeout_s=2,
                                  delta_lock_ttl_s=3, spark_submit_timeout_s=420)
        store = P.open_store(cfg)
        batch = P.claim(cfg)
        frozen_at: list = []
        give_up = threading.Event()

        def freeze_once_the_outbox_is_committed() -> None:
            while not give_up.is_set():
                if Layout.events_table() in _holding(_delta_commits(cfg), batch.batch_seq):
                    os.kill(s3.pid, signal.SIGSTOP)
                    frozen_at.append(time.monotonic())
                    return
                time.sleep(0.1)

        freezer = threading.Thread(target=freeze_once_the_outbox_is_committed)
        freezer.start()
        try:
            with pytest.raises(SparkJobError) as failed:
                P.transform(cfg, batch)
            failed_at = time.monotonic()
        finally:
            give_up.set()
            freezer.join()
            os.kill(s3.pid, signal.SIGCONT)
        assert frozen_at, f"the job ended before it committed the outbox: {failed.value}"
        said = str(failed.value)
        assert not isinstance(failed.value, SparkJobTimeout), said
        # which request: delta-rs's (in the job's Python) or s3a's (in its JVM) on a Delta table of the store
        assert re.search(rf"({re.escape(s3.endpoint_url)}|s3a:/)/cdc/cdc/delta/\S+", said) and \
            re.search(r"operation timed out|did not complete before the specified timeout", said), \
            f"the error does not say which S3 request timed out:\n{said}"
        print(f"S3 frozen: the job failed {failed_at - frozen_at[0]:.0f} s later")
        assert P.read_batch(store, batch.batch_id).state == "claimed"
        assert not store.exists(Layout.ledger(batch.batch_id))
        assert store.list(Layout.area_prefix(Layout.ARCHIVED, cfg.cluster)) == []
        at_failure = _holding(_delta_commits(cfg), batch.batch_seq)

        retry = dataclasses.replace(cfg, spark_submit=False)
        done = P.run_until_idle(retry)               # the retry: the claimed batch first, then the rest
        assert done[0].batch_id == batch.batch_id and all(b.state == "archived" for b in done)
        after = _delta_commits(cfg)
        for table, versions in after.items():
            assert versions.count(batch.batch_seq) <= 1, f"{table}: the batch committed twice"
        assert set(_holding(after, batch.batch_seq)) - set(at_failure), "the frozen job had committed every table"
        assert _assert_exactly_once_in_order(cfg) > 100
        _assert_topics_replay_to_the_model(cfg, segments[1].mutations)


def test_a_job_that_never_ends_is_stopped_after_spark_submit_timeout_s(tmp_path, monkeypatch):
    """A spark-submit that hangs (a stand-in here: it prints a line, then waits on a child that holds its output
    open, ignoring SIGTERM) is stopped once ``spark_submit_timeout_s`` is up: SIGTERM, then SIGKILL to its whole
    process group, and the transform's error says so, with the job's output; no process of it is left."""
    from cdc_lib.settings import PipelineConfig
    from cdc_lib.spark import submit
    monkeypatch.setattr(submit, "STOP_GRACE_S", 1.0)
    child_pid = tmp_path / "child.pid"
    hung = tmp_path / "spark-submit"
    hung.write_text("#!/bin/sh\necho 'INFO SparkContext: Running Spark version 4.2.0'\ntrap '' TERM\n"
                    f"sleep 600 &\necho $! > {child_pid}\nwait\n")
    hung.chmod(0o755)
    config = PipelineConfig(store_url=str(tmp_path), spark_submit=True, spark_submit_bin=str(hung),
                            spark_jars="none", spark_submit_timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(submit.SparkJobTimeout) as stopped:
        submit.run_job(config, ["--batch-id", "b-0000000001"])
    assert time.monotonic() - t0 < 60, "the job was not stopped"
    said = str(stopped.value)
    assert "spark-submit ran longer than spark_submit_timeout_s (1 s) and was stopped" in said, said
    assert "INFO SparkContext: Running Spark version 4.2.0" in said
    import psutil
    child = int(child_pid.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, \
        "the job's child outlived it"


def test_s3_timeout_s_reaches_s3a_and_the_jobs_fsspec_and_delta_rs():
    """What spark-submit hands the job: s3a's timeouts in Hadoop's units (a bare number would be milliseconds),
    raised to hadoop-aws's 15 s floor, overridable by ``spark_conf``; the job's own store options (fsspec,
    delta-rs) equal the pipeline's."""
    from cdc_lib.settings import PipelineConfig
    from cdc_lib.spark.conf import s3_settings_from_spark
    from cdc_lib.spark.session import session_properties
    cfg = PipelineConfig(store_url="s3://b/p", s3_endpoint_url="http://127.0.0.1:9000", s3_access_key="k",
                         s3_secret_key="s", s3_timeout_s=20, spark_jars="none",
                         spark_conf={"spark.hadoop.fs.s3a.retry.limit": "4"})
    props = session_properties(cfg)
    hadoop = {k[len("spark.hadoop."):]: v for k, v in props.items() if k.startswith("spark.hadoop.fs.s3a.")}
    assert {k: v for k, v in hadoop.items() if "timeout" in k} == {
        "fs.s3a.connection.timeout": "20000ms", "fs.s3a.connection.request.timeout": "20000ms",
        "fs.s3a.connection.acquisition.timeout": "20000ms", "fs.s3a.connection.establish.timeout": "15000ms"}
    assert hadoop["fs.s3a.retry.limit"] == "4"
    job = PipelineConfig(store_url=cfg.store_url, **s3_settings_from_spark(props))
    assert job.s3_timeout_s == 20
    assert (job.fs_options(), job.delta_options()) == (cfg.fs_options(), cfg.delta_options())


def test_executors_get_the_allocator_setting_and_spark_conf_can_change_it(monkeypatch):
    """A cluster's executors do not inherit the driver's environment: ``cdc_lib.allocator``'s setting goes with the
    job as ``spark.executorEnv``, with the value this process holds (the user's, when set), and ``spark_conf``
    still has the last word."""
    from cdc_lib.settings import PipelineConfig
    from cdc_lib.spark.session import session_properties
    key = "spark.executorEnv.MIMALLOC_PURGE_DECOMMITS"
    monkeypatch.delenv("MIMALLOC_PURGE_DECOMMITS", raising=False)
    assert session_properties(PipelineConfig(store_url="/s", spark_jars="none"))[key] == "0"
    monkeypatch.setenv("MIMALLOC_PURGE_DECOMMITS", "1")
    assert session_properties(PipelineConfig(store_url="/s", spark_jars="none"))[key] == "1"
    assert session_properties(PipelineConfig(store_url="/s", spark_jars="none", spark_conf={key: "0"}))[key] == "0"
    monkeypatch.delenv("MIMALLOC_ALLOW_THP", raising=False)
    assert session_properties(PipelineConfig(store_url="/s", spark_jars="none"))[
        "spark.executorEnv.MIMALLOC_ALLOW_THP"] == "0"


def test_a_sigkilled_worker_started_again_registers_with_the_master(spark_cluster):
    """What the soak's ``spark-worker`` fault does (``benchmarks/soak.py --spark-cluster``): worker 2's JVM
    SIGKILLed is gone and reaped, then started again on its work directory as a new JVM that the master lists
    ALIVE beside worker 1 (the dead one no longer); ``pids`` follow. (Last in the module: the tests above count on
    the cluster as it started.)"""
    from cdc_lib.demo.servers import _alive_worker_ports
    master, worker1, worker2 = spark_cluster.pids
    assert spark_cluster.kill_worker(2) == worker2
    assert spark_cluster.worker_pid(2) is None and spark_cluster.worker_pid(1) == worker1
    new = spark_cluster.start_worker(2)
    assert new != worker2 and spark_cluster.pids == (master, worker1, new) and spark_cluster.worker_pid(2) == new
    deadline = time.monotonic() + 60
    while len(_alive_worker_ports(spark_cluster.web_url) or ()) != 2:
        assert time.monotonic() < deadline, f"the master lists {_alive_worker_ports(spark_cluster.web_url)} ALIVE"
        time.sleep(0.5)
