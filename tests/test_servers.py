"""The test servers work for real and are gone when their fixture ends (checked by PID and port)."""
from __future__ import annotations

import re
import socket
import time
import uuid
from pathlib import Path

import psutil
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from servers import ServerStartError, run_kafka_broker, run_s3_server


def read_partition(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> list[bytes]:
    """Every value now readable in partition 0 of ``topic``, from the beginning (no consumer group)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values, deadline = [], time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF: caught up with what is readable
                    return values
                raise AssertionError(msg.error())
            values.append(msg.value())
    finally:
        consumer.close()
    raise AssertionError(f"no end of partition within 10 s; read {values}")


def test_ports_asked_for_together_are_distinct():
    """``free_ports`` keeps each socket bound until all are chosen: ports asked for one after the other could come
    back the same, and a broker given one port for two listeners refuses to start (seen once in CI)."""
    from cdc_lib.demo.servers import free_ports
    for _ in range(50):
        ports = free_ports(8)
        assert len(set(ports)) == 8 and all(1024 <= p < 65536 for p in ports)


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid)


def nothing_listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


# ------------------------------------------------------------------------------------------------- Kafka

def test_idempotent_producer_messages_are_consumed_in_order(kafka_broker, kafka_topic):
    producer = Producer({"bootstrap.servers": kafka_broker, "enable.idempotence": True, "acks": "all"})
    errors = []
    for i in range(50):
        producer.produce(kafka_topic, key=b"k", value=f"v{i}".encode(),
                         on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(10) == 0
    assert errors == []
    assert read_partition(kafka_broker, kafka_topic) == [f"v{i}".encode() for i in range(50)]


def test_read_committed_hides_an_open_transaction_until_commit(kafka_broker, kafka_topic):
    producer = Producer({"bootstrap.servers": kafka_broker, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(kafka_topic, value=b"in-tx")
    producer.flush(10)
    assert read_partition(kafka_broker, kafka_topic, "read_committed") == []
    assert read_partition(kafka_broker, kafka_topic, "read_uncommitted") == [b"in-tx"]
    producer.commit_transaction(10)
    assert read_partition(kafka_broker, kafka_topic, "read_committed") == [b"in-tx"]


def test_aborted_transaction_stays_hidden_from_read_committed_consumers(kafka_broker, kafka_topic):
    producer = Producer({"bootstrap.servers": kafka_broker, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(kafka_topic, value=b"aborted")
    producer.flush(10)  # abort_transaction purges unsent messages: make sure it reached the broker
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(kafka_topic, value=b"committed")
    producer.commit_transaction(10)
    assert read_partition(kafka_broker, kafka_topic, "read_committed") == [b"committed"]
    assert read_partition(kafka_broker, kafka_topic, "read_uncommitted") == [b"aborted", b"committed"]


def test_high_watermark_is_the_log_end_including_transaction_markers(kafka_broker, kafka_topic):
    producer = Producer({"bootstrap.servers": kafka_broker, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    producer.init_transactions(10)
    for n in (3, 2):
        producer.begin_transaction()
        for i in range(n):
            producer.produce(kafka_topic, value=b"%d" % i)
        producer.commit_transaction(10)
    consumer = Consumer({"bootstrap.servers": kafka_broker, "group.id": f"g-{uuid.uuid4().hex}"})
    try:
        # 3 records + a commit marker + 2 records + a commit marker
        assert consumer.get_watermark_offsets(TopicPartition(kafka_topic, 0), timeout=10) == (0, 7)
    finally:
        consumer.close()


def test_group_consumer_joins_and_commits(kafka_broker, kafka_topic):
    producer = Producer({"bootstrap.servers": kafka_broker})
    producer.produce(kafka_topic, value=b"hello")
    assert producer.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": kafka_broker, "group.id": f"g-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([kafka_topic])
    try:
        deadline, msg = time.monotonic() + 20, None
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
        assert msg is not None and not msg.error() and msg.value() == b"hello"
        consumer.commit(msg, asynchronous=False)
        [committed] = consumer.committed([TopicPartition(kafka_topic, 0)], timeout=10)
        assert committed.offset == msg.offset() + 1
    finally:
        consumer.close()


def test_a_stopped_broker_comes_back_with_its_data(tmp_path):
    with run_kafka_broker(tmp_path / "k") as broker:
        topic = broker.create_topic("kept")
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        producer.produce(topic, value=b"before the stop")
        assert producer.flush(10) == 0
        del producer
    assert gone(broker.pid)
    with run_kafka_broker(tmp_path / "k") as again:
        assert again.bootstrap == broker.bootstrap and again.pid != broker.pid
        assert read_partition(again.bootstrap, topic) == [b"before the stop"]


def test_broker_process_is_gone_after_the_context_ends():
    with run_kafka_broker() as broker:
        port = int(broker.bootstrap.rsplit(":", 1)[1])
        assert psutil.Process(broker.pid).is_running()
        topic = broker.create_topic("once")
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        producer.produce(topic, value=b"x")
        assert producer.flush(10) == 0
        assert read_partition(broker.bootstrap, topic) == [b"x"]
    assert gone(broker.pid)
    assert nothing_listens(port)


def test_broker_is_stopped_when_the_test_body_fails():
    with pytest.raises(ZeroDivisionError):
        with run_kafka_broker() as broker:
            1 / 0
    assert gone(broker.pid)


def test_a_broker_that_cannot_start_gives_a_clear_error(tmp_path):
    with pytest.raises(ServerStartError, match=r"(?s)exited with code 1.*Invalid value not-a-number"):
        with run_kafka_broker(tmp_path / "k", attempts=1, properties={"node.id": "not-a-number"}):
            pass


def test_schema_registry_speaks_the_confluent_api(schema_registry):
    import json

    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": schema_registry})
    schema = Schema(json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}), "AVRO")
    subject = f"s-{uuid.uuid4().hex}-value"
    sid = client.register_schema(subject, schema)
    assert client.register_schema(subject, schema) == sid
    assert json.loads(client.get_schema(sid).schema_str)["name"] == "R"
    assert client.get_latest_version(subject).schema_id == sid


# ---------------------------------------------------------------------------------------------------- S3

def test_s3fs_put_get_list_delete(s3_server, s3_bucket):
    fs = s3_server.filesystem()
    fs.pipe(f"{s3_bucket}/dir/a.bin", b"alpha")
    with fs.open(f"{s3_bucket}/dir/b.bin", "wb") as f:  # > 5 MiB: a multipart upload
        f.write(b"b" * (6 * 1024 * 1024))
    assert fs.cat(f"{s3_bucket}/dir/a.bin") == b"alpha"
    assert fs.info(f"{s3_bucket}/dir/b.bin")["size"] == 6 * 1024 * 1024
    assert sorted(fs.ls(f"{s3_bucket}/dir", detail=False)) == [f"{s3_bucket}/dir/a.bin", f"{s3_bucket}/dir/b.bin"]
    fs.rm(f"{s3_bucket}/dir/a.bin")
    fs.invalidate_cache()
    assert fs.find(s3_bucket) == [f"{s3_bucket}/dir/b.bin"]


def test_s3_rejects_a_wrong_secret(s3_server):
    import s3fs

    kwargs = s3_server.s3fs_kwargs() | {"secret": "not-the-secret"}
    with pytest.raises(PermissionError):
        s3fs.S3FileSystem(skip_instance_cache=True, **kwargs).ls(s3_server.bucket)


def test_deltalake_writes_and_reads_a_table_on_s3(s3_server, s3_bucket):
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    uri = f"s3://{s3_bucket}/table"
    options = s3_server.object_store_options()
    write_deltalake(uri, pa.table({"k": [1, 2]}), storage_options=options)
    write_deltalake(uri, pa.table({"k": [3]}), mode="append", storage_options=options)
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table()["k"].to_pylist()) == [1, 2, 3]


def test_s3_server_process_is_gone_after_the_context_ends(tmp_path):
    import tempfile

    def weed_logs_in_tmp():
        return {p.name for p in Path(tempfile.gettempdir()).glob("weed.*")}
    before = weed_logs_in_tmp()
    with run_s3_server(tmp_path / "weed", bucket="solo") as server:
        fs = server.filesystem()
        fs.pipe("solo/k", b"v")
        assert fs.cat("solo/k") == b"v"
        port = int(server.endpoint_url.rsplit(":", 1)[1])
    assert gone(server.pid)
    assert nothing_listens(port)
    # its log files are in its own directory, not in the temporary directory for good
    assert weed_logs_in_tmp() <= before and list((tmp_path / "weed").glob(f"weed.*.log.INFO.*.{server.pid}"))


def test_s3_server_volume_size_sets_when_a_bucket_grows_its_next_volume(tmp_path):
    # bench_pipeline passes large volumes (each fill makes writes wait for weed to grow the next one); the tests'
    # default, 64 MB, keeps one bucket per test within the free space.
    blob = bytes(range(256)) * 4096         # 1 MiB
    for size, grows in ((2, True), (64, False)):
        with run_s3_server(tmp_path / f"weed-{size}", bucket="grow", volume_size_mb=size) as server:
            fs = server.filesystem()
            for i in range(3):
                fs.pipe(f"grow/k{i}", blob)
            assert fs.cat("grow/k2") == blob
            volumes = sorted(p.name for p in server.data_dir.glob("grow_*.dat"))      # the bucket's collection
            assert (len(volumes) >= 2) is grows and volumes, (size, volumes)


def test_s3_server_is_stopped_when_the_test_body_fails(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with run_s3_server(tmp_path / "weed") as server:
            1 / 0
    assert gone(server.pid)


# -------------------------------------------------------------------------------------- Spark and Airflow

def test_spark_session_runs_map_in_arrow_in_the_venv_python(spark_session):
    import pyarrow as pa
    import pyarrow.compute as pc

    def double(batches):
        for batch in batches:
            yield pa.RecordBatch.from_arrays([pc.multiply(batch.column(0), 2)], names=["x"])

    rows = spark_session.range(0, 1000, numPartitions=2).mapInArrow(double, "x long").collect()
    assert sorted(r.x for r in rows) == [2 * i for i in range(1000)]


TRIVIAL_DAG = '''
import pendulum
from airflow.sdk import dag, task


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def servers_smoke():
    @task
    def make() -> int:
        return 21

    @task
    def double(x: int) -> int:
        print(f"doubled={x * 2}")
        return x * 2

    double(make())


servers_smoke()
'''


def test_airflow_dags_test_runs_a_taskflow_dag_on_sqlite(airflow_home, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "smoke_dag.py").write_text(TRIVIAL_DAG)
    env = airflow_home | {"AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path)}
    airflow = Path(sys.executable).parent / "airflow"
    done = subprocess.run([str(airflow), "dags", "test", "servers_smoke"], env=env, capture_output=True,
                          text=True, timeout=400, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "doubled=42" in output
    assert re.search(r"DagRun Finished: dag_id=servers_smoke,.*state=success", output), output[-4000:]
