"""Exactly-once publication to Apache Kafka, with crashes injected at every step (real process kills), with and
without Kafka transactions; Avro in the Confluent wire format against a real registry (Apicurio's ccompat API)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from cdc_lib.sinks.kafka import (BATCH_HEADER, EVENT_ID_HEADER, SEQ_HEADER, KafkaPublisher, LocalLedgerStore,
                                 OutboxEvent, PublishOrderError, PublishVerificationError, schema_change_topic,
                                 table_topic)
from cdc_lib.storage.objects import ObjectStore

REPO = Path(__file__).resolve().parents[1]

# ``kafka_broker`` (conftest.py, tests/servers.py): a session-scoped Apache Kafka broker on 127.0.0.1;
# ``schema_registry``: a session-scoped Apicurio Registry (its Confluent-compatible API).


def make_batch(prefix: str, n: int = 30, keys: int = 5) -> list:
    """n events over two tables and ``keys`` keys, interleaved so that per-key order is meaningful."""
    out = []
    for i in range(n):
        topic = table_topic(prefix, "ks", "t1" if i % 3 else "t2")
        key = f"k{i % keys}".encode()
        value = json.dumps({"i": i}).encode() if i % 11 != 10 else None   # some tombstones
        out.append(OutboxEvent(f"ev-{i:04d}", topic, key, value, seq=i))
    return out


def consume_all(bootstrap: str, topics, isolation: str = "read_committed") -> list:
    """Every record of ``topics`` from the beginning: (topic, partition, offset, key, value, headers)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "t-" + uuid.uuid4().hex, "isolation.level": isolation,
                  "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 10})
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
    """What a read_committed consumer (librdkafka's default) reads: each event once, in batch order per key."""
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
    from cdc_lib.sinks.kafka import KafkaPublisher, OutboxEvent
    from cdc_lib.storage.objects import ObjectStore
    bootstrap, ledger, batch_id, point, index, acked, transactional_id, events = json.load(sys.stdin)
    def fault(p, **info):
        if p == point and (index is None or info.get("index") == index):
            if acked:
                pub._producer.flush(30)   # the background thread got these k events acknowledged
            os._exit(17)          # a crash: no flush, no cleanup, no exception handlers
    pub = KafkaPublisher(bootstrap, ObjectStore.from_url(ledger), num_partitions=3, fault=fault,
                         transactional_id=transactional_id)
    pub.publish_batch(batch_id, [OutboxEvent(e[0], e[1], e[2].encode(), None if e[3] is None else e[3].encode(), e[4])
                                 for e in events])
    os._exit(0)
""")


def run_crashing(bootstrap, ledger, batch_id, batch, point, index=None, acked=False, transactional_id=None) -> int:
    payload = [bootstrap, str(ledger), batch_id, point, index, acked, transactional_id,
               [[e.event_id, e.topic, e.key.decode(), None if e.value is None else e.value.decode(), e.seq]
                for e in batch]]
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT.format(repo=str(REPO))], input=json.dumps(payload),
                          text=True, capture_output=True, timeout=120)
    if proc.returncode != 17:
        print(proc.stderr[-3000:])   # shown by pytest when the test fails
    return proc.returncode


CRASH_POINTS = [("intent_written", None), ("scanned", None), ("produced", 0), ("produced", 12),
                ("before_flush", None), ("delivered", 0), ("delivered", 17),
                ("flushed", None), ("verified", None), ("ledger_written", None)]


@pytest.mark.parametrize("point,index", CRASH_POINTS, ids=[f"{p}-{i}" for p, i in CRASH_POINTS])
def test_process_killed_at_any_step_then_rerun_publishes_each_event_once(kafka_broker, tmp_path, point, index):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix)
    rc = run_crashing(kafka_broker, tmp_path, "seg-1", batch, point, index)
    assert rc == 17, "the injected crash happened"
    pub = KafkaPublisher(kafka_broker, ObjectStore.from_url(str(tmp_path)), num_partitions=3)
    crashed_before_ledger = point != "ledger_written"
    assert pub.is_published("seg-1") is (not crashed_before_ledger), "no archival before the ledger says so"
    result = pub.publish_batch("seg-1", batch)
    assert result.skipped is (not crashed_before_ledger)
    if crashed_before_ledger:
        assert result.already_in_kafka + result.produced == len(batch)
    assert pub.is_published("seg-1")
    assert_exactly_once_in_order(kafka_broker, batch)


@pytest.mark.parametrize("transactional", [False, True])
def test_one_publisher_publishes_batch_after_batch_with_one_reading_client(kafka_broker, tmp_path, transactional):
    # What a run of batches does (pipeline.steps._Batches): one publisher for all of them. Its reads (the intent's
    # end offsets, the verification's watermarks and scans) share one consumer, assigned anew by each scan.
    prefix = "cdc" + uuid.uuid4().hex[:8]
    first = make_batch(prefix)
    second = [OutboxEvent(f"ev2-{e.seq:04d}", e.topic, e.key, e.value, e.seq) for e in make_batch(prefix)]
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3,
                         transactional_id=f"cdc-test-{uuid.uuid4().hex[:8]}" if transactional else None)
    made = []
    new_consumer = pub._new_consumer
    pub._new_consumer = lambda: made.append(new_consumer()) or made[-1]
    for batch_id, batch in (("seg-1", first), ("seg-2", second)):
        result = pub.publish_batch(batch_id, batch)
        assert (result.already_in_kafka, result.produced) == (0, len(batch))
        assert pub.is_published(batch_id)
    assert_exactly_once_in_order(kafka_broker, first + second)
    assert len(made) == 1, "one consumer read for both batches"
    pub.close()
    with pytest.raises(RuntimeError):
        made[0].assignment()        # closed with the publisher


def test_crash_mid_batch_leaves_a_prefix_that_the_rerun_skips(kafka_broker, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix)
    assert run_crashing(kafka_broker, tmp_path, "seg-1", batch, "flushed") == 17
    # Everything was flushed before the crash: the rerun must produce nothing at all.
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3)
    result = pub.publish_batch("seg-1", batch)
    assert (result.already_in_kafka, result.produced) == (len(batch), 0)
    assert_exactly_once_in_order(kafka_broker, batch)


@pytest.mark.parametrize("k", [0, 13, 28])
def test_crash_after_k_acknowledged_events_rerun_produces_only_the_rest(kafka_broker, tmp_path, k):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix)
    assert run_crashing(kafka_broker, tmp_path, "seg-1", batch, "produced", k, acked=True) == 17
    assert len(consume_all(kafka_broker, sorted({e.topic for e in batch}))) == k + 1, "a real prefix is in Kafka"
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3)
    result = pub.publish_batch("seg-1", batch)
    assert (result.already_in_kafka, result.produced) == (k + 1, len(batch) - k - 1)
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


@pytest.mark.parametrize("point,index", [("produced", 9), ("delivered", 5), ("before_flush", None),
                                         ("flushed", None)])
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

    scans = spy_scans(pub)
    with pytest.raises(PublishVerificationError, match="1 duplicated"):
        pub.publish_batch("seg-4", batch)
    assert not pub.is_published("seg-4")
    # the verification read only from the zombie's offset on (the rest is this attempt's acknowledged events)
    assert scans == [None, {(batch[0].topic, 0)}]


def spy_scans(pub) -> list:
    """The partitions each scan of ``pub`` was restricted to (None: every partition of the batch's topics)."""
    scans: list = []
    real = pub._scan

    def scan(*args, only=None):
        scans.append(only)
        return real(*args, only=only)
    pub._scan = scan
    return scans


def test_verification_reads_nothing_back_when_acknowledgements_account_for_every_offset(kafka_broker, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix, n=20)
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=2)
    scans = spy_scans(pub)
    assert pub.publish_batch("seg-v", batch).produced == len(batch)
    assert scans == [], "a first attempt scans nothing before producing, nor reads anything back after"
    assert_exactly_once_in_order(kafka_broker, batch)


def test_the_usual_case_skips_the_per_event_check_only_when_every_offset_is_this_attempts_in_batch_order():
    """The verification concludes without listing every event again only when, since the intent, a partition
    holds this attempt's events and nothing else, at consecutive offsets in batch order (``_fills``); any other
    layout goes to the general check, which names what is wrong."""
    from cdc_lib.sinks.kafka import _fills
    assert _fills([5, 6, 7], 5, 8) and _fills([], 5, 5)
    assert not _fills([5, 7, 6], 5, 8), "out of batch order"
    assert not _fills([6, 7], 5, 8), "a record before them that is not theirs (a zombie's, a marker)"
    assert not _fills([5, 6], 5, 8), "a record after them that is not theirs"
    assert not _fills([5, 5, 7], 5, 8), "an offset acknowledged twice"
    assert not _fills([], 5, 6) and not _fills([5], None, 6), "records since the intent, or a partition unseen"


# ------------------------------------------------------------------------------------- with transactions

TX_CRASH_POINTS = [("produced", 12), ("before_flush", None), ("delivered", 17)]


@pytest.mark.parametrize("point,index", TX_CRASH_POINTS, ids=[f"{p}-{i}" for p, i in TX_CRASH_POINTS])
def test_transactional_batch_killed_midway_is_never_seen_by_read_committed_then_published_once(
        kafka_broker, tmp_path, point, index):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix)
    topics = sorted({e.topic for e in batch})
    txid = f"cdc-test-{uuid.uuid4().hex[:8]}"
    # the dying process got its records to the broker (acknowledged) inside a transaction it never committed
    # (at "delivered" the records are acknowledged by definition; a flush inside the delivery callback would hang)
    assert run_crashing(kafka_broker, tmp_path, "seg-t", batch, point, index, acked=point != "delivered",
                        transactional_id=txid) == 17
    in_log = consume_all(kafka_broker, topics, "read_uncommitted")
    assert in_log, "the crashed transaction's records are in the log"
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3, transactional_id=txid)
    result = pub.publish_batch("seg-t", batch)       # fences the dead producer, aborting its transaction
    assert (result.already_in_kafka, result.produced) == (0, len(batch))
    assert_exactly_once_in_order(kafka_broker, batch)
    # the aborted records stay in the log: a read_uncommitted consumer would see them twice
    assert len(consume_all(kafka_broker, topics, "read_uncommitted")) == len(in_log) + len(batch)


def test_transaction_aborted_by_a_failure_is_invisible_and_the_retry_commits_it(kafka_broker, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix)
    txid = f"cdc-test-{uuid.uuid4().hex[:8]}"

    class Boom(Exception):
        pass

    def fault(p, **info):
        if p == "before_flush":
            pub._producer.flush(10)            # every record is at the broker, uncommitted
            raise Boom(p)

    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3, transactional_id=txid,
                         fault=fault)
    with pytest.raises(Boom):
        pub.publish_batch("seg-a", batch)
    assert consume_all(kafka_broker, sorted({e.topic for e in batch})) == [], "read_committed sees nothing"
    assert not pub.is_published("seg-a")
    retry = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3, transactional_id=txid)
    assert retry.publish_batch("seg-a", batch).produced == len(batch)
    assert_exactly_once_in_order(kafka_broker, batch)


def test_a_committed_transactional_batch_is_found_whole_by_the_rerun(kafka_broker, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix)
    txid = f"cdc-test-{uuid.uuid4().hex[:8]}"
    assert run_crashing(kafka_broker, tmp_path, "seg-c", batch, "flushed", transactional_id=txid) == 17
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=3, transactional_id=txid)
    result = pub.publish_batch("seg-c", batch)
    assert (result.already_in_kafka, result.produced) == (len(batch), 0)
    assert_exactly_once_in_order(kafka_broker, batch)


# ----------------------------------------------------------------------- topics and client settings

def test_topics_are_created_with_partitions_replication_and_configs(kafka_broker, tmp_path):
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix, n=6)
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=2, replication_factor=1,
                         topic_config={"cleanup.policy": "compact", "min.compaction.lag.ms": 1000})
    pub.publish_batch("seg-1", batch)
    admin = AdminClient({"bootstrap.servers": kafka_broker})
    topic = batch[0].topic
    md = admin.list_topics(topic, timeout=10).topics[topic]
    assert len(md.partitions) == 2 and all(len(p.replicas) == 1 for p in md.partitions.values())
    [configs] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    got = configs.result(10)
    assert got["cleanup.policy"].value == "compact" and got["min.compaction.lag.ms"].value == "1000"


def test_a_refused_event_fails_the_batch_without_a_fault_hook(kafka_broker, tmp_path):
    """Without a fault hook (the pipeline's runs): an event the broker refuses (larger than the topic's
    ``max.message.bytes``) fails the batch, and nothing is marked published."""
    from cdc_lib.sinks.kafka import PublishError
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix, n=6)
    big = batch[3]
    batch[3] = OutboxEvent(big.event_id, big.topic, big.key, b"x" * 20_000, big.seq)
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), topic_config={"max.message.bytes": "5000"},
                         timeout_s=10)
    with pytest.raises(PublishError, match="delivery failed|not acknowledged"):
        pub.publish_batch("seg-1", batch)
    assert not pub.is_published("seg-1")


# A topic the broker compacts as soon as it can: every append after 100 ms rolls the log, and the cleaner (which looks
# every second on the test broker) takes any log with a closed segment.
FAST_COMPACTION = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}


def test_a_batch_compacted_between_its_attempts_is_published_once(kafka_broker, tmp_path):
    """On compacted topics the broker removes a key's older records once a newer one is in a closed segment, so
    a batch being published can lose records that are delivered: here the first attempt dies after half the
    batch was acknowledged, the retry's records roll the log, the broker compacts the first attempt's away, and
    the retry dies before its verification; the third attempt finds the batch whole (a key's record in Kafka
    vouches for its earlier events in the batch), produces nothing, verifies and marks it published. Before,
    the scan refused the batch as out of order, and no retry could ever publish it."""
    from confluent_kafka.admin import AdminClient, NewTopic
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = make_batch(prefix, n=30, keys=5)
    topics = sorted({e.topic for e in batch})
    admin = AdminClient({"bootstrap.servers": kafka_broker})     # topics an operator made compacted
    for fut in admin.create_topics([NewTopic(t, 1, 1, config=FAST_COMPACTION) for t in topics]).values():
        fut.result(10)
    assert run_crashing(kafka_broker, tmp_path, "seg-k", batch, "produced", 14, acked=True) == 17
    time.sleep(0.2)                                   # past segment.ms: the retry's first record rolls the log

    class Crash(Exception):
        pass

    def compacted_then_crash(point, **info):
        if point == "flushed":
            deadline = time.monotonic() + 30
            while len(consume_all(kafka_broker, topics)) == len(batch):
                assert time.monotonic() < deadline, "the broker compacted nothing"
                time.sleep(0.2)
            raise Crash(point)

    retry = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), fault=compacted_then_crash)
    with pytest.raises(Crash):
        retry.publish_batch("seg-k", batch)
    last = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path))
    result = last.publish_batch("seg-k", batch)
    assert result.produced == 0 and last.is_published("seg-k")
    kept = consume_all(kafka_broker, topics)
    ids = [r[5][EVENT_ID_HEADER].decode() for r in kept]
    assert len(ids) == len(set(ids)) < len(batch), "compacted, and no event twice"
    by_key: dict = {}
    for e in batch:
        by_key.setdefault((e.topic, e.key), []).append(e)
    for (topic, key), events in by_key.items():
        seqs = [int(r[5][SEQ_HEADER]) for r in sorted(kept, key=lambda r: r[2]) if (r[0], r[3]) == (topic, key)]
        assert seqs == sorted(seqs) and seqs[-1] == events[-1].seq, f"{topic} {key}: the latest is kept, in order"


def test_without_leave_to_read_topic_configs_the_configured_cleanup_policy_counts(tmp_path):
    """A Kafka user the brokers refuse DescribeConfigs: the topics are taken as compacted if and only if the
    pipeline's own topic configuration compacts (and the refusal is logged, not raised)."""
    from concurrent.futures import Future

    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    class RefusingAdmin:
        def describe_configs(self, resources, **_):
            refused = Future()
            refused.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
            return {ConfigResource(ResourceType.TOPIC, r.name): refused for r in resources}

    ledger = LocalLedgerStore(tmp_path)
    compacting = KafkaPublisher("127.0.0.1:9", ledger, topic_config={"cleanup.policy": "compact,delete"})
    assert compacting._compacted_among(RefusingAdmin(), ["a", "b"]) == {"a", "b"}
    assert KafkaPublisher("127.0.0.1:9", ledger)._compacted_among(RefusingAdmin(), ["a"]) == set()


def _first_batch_compression(log_dirs: Path, topic: str) -> int:
    """The compression codec of the first record batch in partition 0's log (attributes bits 0-2)."""
    import struct
    data = (log_dirs / f"{topic}-0" / "00000000000000000000.log").read_bytes()
    # record batch v2: baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8, crc int32,
    # attributes int16
    assert data[16] == 2, "a record batch of magic 2"
    return struct.unpack(">h", data[21:23])[0] & 0x07


def test_producer_settings_reach_the_broker(kafka_server, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    batch = [e for e in make_batch(prefix, n=30) if e.topic.endswith(".t1")]
    pub = KafkaPublisher(kafka_server.bootstrap, LocalLedgerStore(tmp_path),
                         client_config={"compression.type": "zstd", "client.id": "cdc-compression-test"})
    pub.publish_batch("seg-z", batch)
    assert _first_batch_compression(kafka_server.log_dirs, batch[0].topic) == 4, "zstd, as the setting asked"
    assert_exactly_once_in_order(kafka_server.bootstrap, batch)


@pytest.mark.parametrize("key", ["acks", "enable.idempotence", "max.in.flight.requests.per.connection",
                                 "transactional.id"])
def test_settings_exactly_once_depends_on_cannot_be_overridden(kafka_broker, tmp_path, key):
    from cdc_lib.errors import ConfigError
    with pytest.raises(ConfigError, match=key):
        KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), client_config={key: "1"})


def test_sasl_credentials_from_the_airflow_connection_reach_kafka_and_nowhere_else(tmp_path, caplog):
    """The Kafka connection's login/password and extras (security protocol, mechanism, compression) become the
    client settings; the broker takes them; the password is never in the settings' shown or logged form."""
    from collections import namedtuple

    from cdc_lib.pipeline.airflow import describe_settings, pipeline_config
    from servers import run_kafka_broker
    Conn = namedtuple("Conn", "host port login password extra_dejson")
    password = "s3cr3t-" + uuid.uuid4().hex
    with run_kafka_broker(tmp_path / "k", sasl_users={"cdc": password}) as broker:
        conns = {"cassandra_cdc_kafka": Conn(broker.sasl_bootstrap, None, "cdc", password, {
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "compression.type": "lz4"})}
        config, sources = pipeline_config({"store_url": str(tmp_path)}, None, conns.get, env={})
        assert config.kafka_config == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                       "compression.type": "lz4", "sasl.username": "cdc", "sasl.password": password}
        shown = describe_settings(config, sources) + json.dumps(config.to_dict())
        assert password not in shown and "kafka_config" in shown
        prefix = "cdc" + uuid.uuid4().hex[:8]
        batch = make_batch(prefix, n=10)
        pub = KafkaPublisher(config.kafka_bootstrap, LocalLedgerStore(tmp_path / "l1"), num_partitions=2,
                             client_config=config.kafka_config, timeout_s=20)
        assert pub.publish_batch("seg-s", batch).produced == len(batch)
        pub.close()
        records = consume_all(broker.bootstrap, sorted({e.topic for e in batch}))
        assert sorted(r[5][EVENT_ID_HEADER].decode() for r in records) == sorted(e.event_id for e in batch)
        wrong = KafkaPublisher(config.kafka_bootstrap, LocalLedgerStore(tmp_path / "l2"), timeout_s=5,
                               client_config={**config.kafka_config, "sasl.password": "wrong"})
        with pytest.raises(Exception, match="(?i)auth"):
            wrong.publish_batch("seg-w", make_batch("cdc" + uuid.uuid4().hex[:8], n=2))
        assert password not in caplog.text


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


# ------------------------------------------------------------------------------------ serialization

from confluent_kafka.schema_registry.avro import AvroDeserializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

from cdc_lib.cql.schema_from_ddl import load_cql_schema  # noqa: E402
from cdc_lib.errors import FormatError  # noqa: E402
from cdc_lib.sinks.avro import from_avro_envelope, table_schema_dicts  # noqa: E402
from cdc_lib.sinks.kafka import (AvroCodec, JsonCodec, SchemaRegistryError, confluent_unframe,  # noqa: E402
                                 outbox_events, schema_change_outbox_event, schema_fingerprint,
                                 schema_registry_client, single_object_unframe)


@pytest.fixture
def registry(schema_registry):
    """A registry client; each test publishes under its own topic prefix, so subjects never collide."""
    return schema_registry_client(schema_registry)


@pytest.fixture(scope="module")
def orders():
    return load_cql_schema("""
        CREATE KEYSPACE shop WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};
        CREATE TABLE shop.orders (id uuid, line int, price decimal, tags set<text>, at timestamp,
            PRIMARY KEY (id, line)) WITH ID = 6a1c395e-b41f-11e5-9f22-ba0be0483c18;
    """).by_name("shop", "orders")


def order_events(table, n=6):
    import datetime
    import decimal
    out = []
    ids = [uuid.UUID(int=i + 1) for i in range(2)]
    for i in range(n):
        row = {"id": ids[i % 2], "line": 1, "price": decimal.Decimal(f"{i}.{i}0"), "tags": None,
               "at": datetime.datetime(2024, 1, 1, 0, 0, i, tzinfo=datetime.timezone.utc)}
        before = None if i < 2 else dict(row, price=decimal.Decimal(f"{i - 2}.{i - 2}0"))
        op = "c" if before is None else ("d" if i == n - 1 else "u")
        after = None if op == "d" else row
        out.append({"id": f"ev{i}", "op": op, "key": {"id": row["id"], "line": 1}, "before": before,
                    "after": after, "changed": ["price"],
                    "source": {"connector": "cassandra-cdc", "cluster": "c", "node": "n", "keyspace": "shop",
                               "table": "orders", "segment": "CommitLog-7-5.log", "position": 100 + i,
                               "ts_us": 1_000_000 + i, "expired": False},
                    "ts_ms": 2_000 + i})
    return out


def test_avro_with_registry_uses_confluent_framing_and_registers_once(registry, schema_registry, orders):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    codec = AvroCodec(registry)
    outbox = outbox_events(codec, prefix, orders, order_events(orders))
    assert {e.topic for e in outbox} == {f"{prefix}.shop.orders"}
    subjects = sorted(x for x in registry.get_subjects() if x.startswith(prefix))
    assert subjects == [f"{prefix}.shop.orders-key", f"{prefix}.shop.orders-value"]
    assert all(registry.get_versions(x) == [1] for x in subjects), "one version per subject"
    value_id = registry.get_latest_version(f"{prefix}.shop.orders-value").schema_id
    # confluent-kafka's own deserializer reads what we wrote, with nothing but the registry
    reader = AvroDeserializer(schema_registry_client(schema_registry))
    for ev, ob in zip(order_events(orders), outbox):
        sid, _ = confluent_unframe(ob.value)
        assert sid == value_id
        fresh = AvroCodec(schema_registry_client(schema_registry))   # a consumer that only has the registry
        back = from_avro_envelope(orders, fresh.decode(ob.value))
        assert back["id"] == ev["id"] and back["after"] == ev["after"] and back["before"] == ev["before"]
        datum = reader(ob.value, SerializationContext(ob.topic, MessageField.VALUE))
        assert datum["id"] == ev["id"] and datum["op"] == ev["op"]
    # same key -> same bytes (the partitioner must send a key's events to one partition)
    assert outbox[0].key == outbox[2].key != outbox[1].key


def test_avro_without_registry_uses_single_object_encoding(tmp_path, orders):
    store = LocalLedgerStore(tmp_path)
    codec = AvroCodec(schema_store=store)
    ob = outbox_events(codec, "cdc", orders, order_events(orders))[3]
    fp, _ = single_object_unframe(ob.value)
    assert fp == schema_fingerprint(table_schema_dicts(orders).envelope)
    assert store.exists(f"schemas/{fp.hex()}.avsc")
    consumer = AvroCodec(schema_store=store)       # knows nothing but the store
    assert from_avro_envelope(orders, consumer.decode(ob.value))["id"] == "ev3"
    with pytest.raises(SchemaRegistryError):
        AvroCodec().decode(ob.value)
    with pytest.raises(FormatError):
        single_object_unframe(b"\x00\x00\x00\x00\x01xyz")


def test_json_codec_and_tombstones(orders):
    outbox = outbox_events(JsonCodec(), "cdc", orders, order_events(orders), start_seq=10, tombstones=True)
    assert [e.seq for e in outbox] == list(range(10, 17))
    assert outbox[-1].value is None and outbox[-1].event_id == "ev5.tombstone" and outbox[-1].key == outbox[-2].key
    doc = json.loads(outbox[2].value)
    assert doc["op"] == "u" and doc["after"]["price"] == "2.20" and doc["before"]["price"] == "0.00"
    assert json.loads(outbox[0].key) == {"id": str(uuid.UUID(int=1)), "line": 1}


def test_json_outbox_rows_re_encode_as_avro(registry, orders):
    from cdc_lib.sinks.avro import to_json_event, to_json_key
    from cdc_lib.sinks.kafka import avro_from_json_outbox
    prefix = "cdc" + uuid.uuid4().hex[:8]
    topic = f"{prefix}.shop.orders"
    codec = AvroCodec(registry)
    direct = outbox_events(codec, prefix, orders, order_events(orders))
    for ev, ob in zip(order_events(orders), direct):
        key, value = avro_from_json_outbox(codec, orders, topic, json.dumps(to_json_key(orders, ev["key"])),
                                           json.dumps(to_json_event(orders, ev)))
        assert (key, value) == (ob.key, ob.value), "byte-identical to encoding the typed event"
    assert avro_from_json_outbox(codec, orders, topic, json.dumps(to_json_key(orders, ev["key"])),
                                 None)[1] is None


def test_registry_errors_are_typed(registry, orders):
    with pytest.raises(SchemaRegistryError, match="schema id 999999"):
        AvroCodec(registry).decode(b"\x00" + (999999).to_bytes(4, "big") + b"\x00")
    with pytest.raises(SchemaRegistryError, match="registering a schema under subject"):
        outbox_events(AvroCodec(schema_registry_client("http://127.0.0.1:9")), "cdc", orders, order_events(orders))


def test_an_incompatible_schema_is_refused_with_the_subject_and_its_level(registry, orders):
    """A subject at BACKWARD compatibility whose versions our envelope cannot read: the registry refuses it (409)
    and the error says which subject, under which level, and that nothing was published."""
    from confluent_kafka.schema_registry import Schema
    prefix = "cdc" + uuid.uuid4().hex[:8]
    subject = f"{prefix}.shop.orders-value"
    envelope = table_schema_dicts(orders).envelope
    older = {"type": "record", "name": envelope["name"], "namespace": envelope.get("namespace"),
             "fields": [{"name": "op", "type": "int"}]}          # 'op' was an int: a string reader cannot read it
    registry.register_schema(subject, Schema(json.dumps(older), "AVRO"))
    registry.set_compatibility(subject, "BACKWARD")
    with pytest.raises(SchemaRegistryError, match=rf"(?s)subject {subject}.*incompatible.*BACKWARD.*Nothing of the batch"):
        outbox_events(AvroCodec(registry), prefix, orders, order_events(orders))
    assert registry.get_versions(subject) == [1]


def test_avro_events_published_and_read_back_end_to_end(kafka_broker, registry, orders, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    codec = AvroCodec(registry)
    events = order_events(orders)
    batch = outbox_events(codec, prefix, orders, events)
    change = {"id": "sc1", "keyspace": "shop", "table": "orders", "kind": "alter_table",
              "detail": "ADD note text", "table_id": orders.id, "ts_us": 5, "ts_ms": 6}
    batch.append(schema_change_outbox_event(codec, prefix, change, seq=len(batch)))
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=2)
    pub.publish_batch("seg-avro", batch)
    records = consume_all(kafka_broker, [table_topic(prefix, "shop", "orders"), schema_change_topic(prefix)])
    consumer = AvroCodec(registry)
    got = {}
    for topic, _, _, key, value, headers in records:
        datum = consumer.decode(value)
        got[headers[EVENT_ID_HEADER].decode()] = (topic, datum)
    assert got["sc1"][1]["detail"] == "ADD note text" and got["sc1"][0] == f"{prefix}.schema-changes"
    for ev in events:
        assert from_avro_envelope(orders, got[ev["id"]][1])["after"] == ev["after"]


def test_empty_batch_is_recorded_as_published(kafka_broker, tmp_path):
    with KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path)) as pub:
        assert pub.publish_batch("seg-empty", []).events == 0
        assert pub.is_published("seg-empty")


def test_local_ledger_store_is_atomic_and_rejects_escaping_keys(tmp_path):
    store = LocalLedgerStore(tmp_path)
    store.put_bytes("ledger/a.json", b"1")
    store.put_bytes("ledger/a.json", b"22")
    assert store.get_bytes("ledger/a.json") == b"22" and store.exists("ledger/a.json")
    assert [p.name for p in (tmp_path / "ledger").iterdir()] == ["a.json"], "no temp file left behind"
    from cdc_lib.errors import ConfigError
    with pytest.raises(ConfigError):
        store.put_bytes("../x", b"")
