"""Real servers for tests: pytest fixtures over ``cdc_lib.demo.servers`` (Apache Kafka, SeaweedFS S3, Apicurio
Registry) and ``cdc_lib.demo.spark_cluster`` (a Spark standalone cluster).

The process management (start on free 127.0.0.1 ports, readiness checks, stop by PID) lives in ``cdc_lib.demo``
so that the demo and the benchmarks use the same code.

Pytest fixtures (session-scoped servers, function-scoped names):
    kafka_broker -> str bootstrap address (kafka_server: its KafkaBroker); kafka_topic -> a new 1-partition topic
    s3_server -> S3Server; s3_bucket -> a new empty bucket name on it
    schema_registry -> str URL of a Confluent-compatible registry (Apicurio's ccompat API)
Reading what the pipeline published:
    consume_topic(bootstrap, topic) -> [Record(event_id, batch, key, value)] of partition 0, to its end
Not servers, but the same kind of environment plumbing:
    spark_session -> the process's one local[2] SparkSession (LOCAL_SPARK_CONF; PYSPARK_PYTHON = this
                     interpreter); getOrCreate per test, stopped at the end of the session
    airflow_home (session) -> env dict for `airflow dags test` on SQLite (airflow_env(); `airflow db migrate` done)
"""
from __future__ import annotations

import contextlib
import os
from collections import namedtuple
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from cdc_lib.demo.servers import (LOOPBACK, KafkaBroker, S3Server, SchemaRegistry, ServerProcess, ServerStartError,
                                  free_port, run_kafka_broker, run_s3_server, run_schema_registry, weed_binary)

__all__ = [
    "ServerStartError", "ServerProcess", "KafkaBroker", "S3Server", "SchemaRegistry",
    "run_kafka_broker", "run_s3_server", "run_schema_registry", "weed_binary", "free_port",
    "QUICK_JVM", "LOCAL_SPARK_CONF", "get_local_spark_session", "local_spark_session", "airflow_env", "migrated_airflow_home",
    "kafka_broker", "kafka_server", "kafka_topic", "s3_server", "s3_bucket", "schema_registry", "spark_session", "airflow_home",
    "consume_topic",
]


Record = namedtuple("Record", "event_id batch key value")


def consume_topic(bootstrap: str, topic: str) -> list:
    """Every record of ``topic`` partition 0: its ``cdc-event-id`` and ``cdc-batch`` headers, key text and value
    JSON (None for a tombstone)."""
    import json

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 10})
    out = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        while True:
            m = c.poll(5)
            assert m is not None, f"no end of partition from {topic}"
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                return out
            headers = dict(m.headers())
            out.append(Record(headers["cdc-event-id"].decode(), headers["cdc-batch"].decode(), m.key().decode(),
                              json.loads(m.value()) if m.value() is not None else None))
    finally:
        c.close()


# ------------------------------------------------------------------------------------------ Spark and Airflow

#: SparkSession settings that work on this 2-core machine: no UI, loopback only, 2 shuffle partitions.
#: JVM flags for the short-lived Spark JVMs of tests: the C1 JIT only and the serial GC (C2's compiler threads take
#: about half the CPU of a short job on 2 cores; measured 65-70 -> 35-42 CPU-seconds for a trivial job).
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

LOCAL_SPARK_CONF = {
    "spark.driver.extraJavaOptions": QUICK_JVM,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.bindAddress": LOOPBACK,
    "spark.driver.host": LOOPBACK,
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "2g",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def get_local_spark_session(workdir: Path, app_name: str = "cassandra-cdc-tests"):
    """The process's ``local[2]`` SparkSession, with Delta Lake (``cdc_lib.spark.session.local_session``: one JVM per
    process, so every test gets the same kind of session whichever starts it) and LOCAL_SPARK_CONF."""
    from cdc_lib.spark.conf import DELTA_SESSION_CONF, spark_jars
    from cdc_lib.spark.session import local_session

    spark = local_session(app_name, cores=2, properties={
        "spark.jars": ",".join(spark_jars(None)), **DELTA_SESSION_CONF, **LOCAL_SPARK_CONF,
        "spark.local.dir": str(workdir / "local"), "spark.sql.warehouse.dir": str(workdir / "warehouse")})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextlib.contextmanager
def local_spark_session(workdir: Path | None = None, app_name: str = "cassandra-cdc-tests") -> Iterator:
    """A ``local[2]`` SparkSession (see get_local_spark_session), stopped when the block ends."""
    owned = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="spark-")) if owned else workdir
    spark = get_local_spark_session(workdir, app_name)
    try:
        yield spark
    finally:
        spark.stop()
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)


def airflow_env(home: Path, dags_folder: Path) -> dict[str, str]:
    """Environment for the `airflow` CLI (or an `import airflow` in a fresh process): SQLite, no examples."""
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
    }


def migrated_airflow_home(home: Path, dags_folder: Path, timeout: float = 300.0) -> dict[str, str]:
    """Run `airflow db migrate` for a SQLite metadata DB under ``home``; return the env to use with it."""
    home.mkdir(parents=True, exist_ok=True)
    env = airflow_env(home, dags_folder)
    airflow = Path(sys.executable).parent / "airflow"
    done = subprocess.run([str(airflow), "db", "migrate"], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ServerStartError(f"`airflow db migrate` failed ({done.returncode}):\n{done.stdout[-3000:]}"
                               f"\n{done.stderr[-3000:]}")
    return env


# ------------------------------------------------------------------------------------------- pytest fixtures

@pytest.fixture(scope="session")
def kafka_server(tmp_path_factory) -> Iterator[KafkaBroker]:
    """The Kafka broker shared by the whole session (``KafkaBroker``: its PID, log file, log dirs)."""
    with run_kafka_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_broker(kafka_server) -> str:
    """Bootstrap address ("127.0.0.1:PORT") of the session's Kafka broker."""
    return kafka_server.bootstrap


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory) -> Iterator[str]:
    """URL of a Confluent-compatible schema registry (Apicurio, in memory) shared by the whole session."""
    with run_schema_registry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry.url


@pytest.fixture
def kafka_topic(kafka_broker) -> str:
    """A new, empty, 1-partition topic on the session broker (unique name per test)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"t-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker})
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(10)
    return name


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """A SeaweedFS S3 endpoint (with bucket ``cdc-test``) shared by the whole session."""
    with run_s3_server(tmp_path_factory.mktemp("weed")) as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server) -> str:
    """A new, empty bucket on the session S3 server (unique name per test)."""
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3_server.filesystem().mkdir(name)
    return name


@pytest.fixture(scope="session")
def real_cassandra(tmp_path_factory):
    """One real Cassandra 5.0 node on 127.0.0.1 (``cdc_lib.demo.cassandra``: CDC on, 1 MiB segments, its logs in
    ``<tmp>/cassandra*/node1/logs``), started once per session when a test asks for it and always stopped by PID.

    Missing Java or jars (``bash scripts/setup.sh`` fetches them) make the tests that use it fail, never skip.
    The real-workload scenario drains the node at its end: a later user that writes must restart it
    (``stop_node(1)``, ``start_node(1)``).
    """
    from cdc_lib.demo.cassandra import LocalCassandra
    cluster = LocalCassandra(tmp_path_factory.mktemp("cassandra"), 1)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop(graceful=False)        # its data is thrown away: SIGKILL, no shutdown drain to wait for


@pytest.fixture(scope="session")
def _spark_workdir(tmp_path_factory) -> Iterator[Path]:
    workdir = tmp_path_factory.mktemp("spark")
    yield workdir
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@pytest.fixture
def spark_session(_spark_workdir):
    """The local[2] SparkSession, shared by all tests (a JVM start costs 10-40 s on 2 cores).

    Fetched per test with getOrCreate, so a test (or another module's fixture) that stopped it only costs a
    restart; stopped at the end of the test session.
    """
    return get_local_spark_session(_spark_workdir)


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> dict[str, str]:
    """Env for `airflow dags test` against the repo's dags/ folder, with a migrated SQLite DB.

    Use it for subprocesses: ``subprocess.run([venv/bin/airflow, "dags", "test", DAG_ID], env=airflow_home)``.
    """
    dags = Path(__file__).resolve().parents[1] / "dags"
    return migrated_airflow_home(tmp_path_factory.mktemp("airflow"), dags)
