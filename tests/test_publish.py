"""Exactly-once publication to a real Kafka-compatible broker (Tansu), with crashes injected at every step."""
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

# ``kafka_broker`` (conftest.py, tests/servers.py): a session-scoped memory-only Tansu broker on 127.0.0.1.


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
    bootstrap, ledger, batch_id, point, index, acked, events = json.load(sys.stdin)
    def fault(p, **info):
        if p == point and (index is None or info.get("index") == index):
            if acked:
                pub._producer.flush(30)   # the background thread got these k events acknowledged
            os._exit(17)          # a crash: no flush, no cleanup, no exception handlers
    pub = KafkaPublisher(bootstrap, ObjectStore.from_url(ledger), num_partitions=3, fault=fault)
    pub.publish_batch(batch_id, [OutboxEvent(e[0], e[1], e[2].encode(), None if e[3] is None else e[3].encode(), e[4])
                                 for e in events])
    os._exit(0)
""")


def run_crashing(bootstrap, ledger, batch_id, batch, point, index=None, acked=False) -> int:
    payload = [bootstrap, str(ledger), batch_id, point, index, acked,
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


# ------------------------------------------------------------------------------------ serialization

import threading  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

from cdc_lib.cql.schema_from_ddl import load_cql_schema  # noqa: E402
from cdc_lib.errors import FormatError  # noqa: E402
from cdc_lib.sinks.avro import from_avro_envelope, table_schema_dicts  # noqa: E402
from cdc_lib.sinks.kafka import (AvroCodec, JsonCodec, SchemaRegistryClient, SchemaRegistryError, confluent_unframe,
                                 outbox_events, schema_change_outbox_event, schema_fingerprint, single_object_unframe)


class FakeRegistry:
    """The two Schema Registry endpoints a producer uses, on 127.0.0.1 (same schema -> same id)."""

    def __init__(self):
        self.ids: dict = {}
        self.subjects: dict = {}
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                parts = self.path.strip("/").split("/")
                if len(parts) != 3 or parts[0] != "subjects" or parts[2] != "versions":
                    return self._answer(404, {"error_code": 404, "message": "not found"})
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    json.loads(req["schema"])
                except ValueError:
                    return self._answer(422, {"error_code": 42201, "message": "Invalid schema"})
                sid = registry.ids.setdefault(req["schema"], len(registry.ids) + 1)
                registry.subjects.setdefault(parts[1], []).append(sid)
                self._answer(200, {"id": sid})

            def do_GET(self):
                parts = self.path.strip("/").split("/")
                by_id = {v: k for k, v in registry.ids.items()}
                if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and int(parts[2]) in by_id:
                    return self._answer(200, {"schema": by_id[int(parts[2])]})
                self._answer(404, {"error_code": 40403, "message": "Schema not found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def registry():
    r = FakeRegistry()
    yield r
    r.close()


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


def test_avro_with_registry_uses_confluent_framing_and_registers_once(registry, orders):
    codec = AvroCodec(SchemaRegistryClient(registry.url))
    outbox = outbox_events(codec, "cdc", orders, order_events(orders))
    assert {e.topic for e in outbox} == {"cdc.shop.orders"}
    assert sorted(registry.subjects) == ["cdc.shop.orders-key", "cdc.shop.orders-value"]
    assert all(len(v) == 1 for v in registry.subjects.values()), "ids are cached: one registration per subject"
    value_id = registry.subjects["cdc.shop.orders-value"][0]
    for ev, ob in zip(order_events(orders), outbox):
        sid, _ = confluent_unframe(ob.value)
        assert sid == value_id
        fresh = AvroCodec(SchemaRegistryClient(registry.url))   # a consumer that only has the registry
        back = from_avro_envelope(orders, fresh.decode(ob.value))
        assert back["id"] == ev["id"] and back["after"] == ev["after"] and back["before"] == ev["before"]
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
    codec = AvroCodec(SchemaRegistryClient(registry.url))
    direct = outbox_events(codec, "cdc", orders, order_events(orders))
    for ev, ob in zip(order_events(orders), direct):
        key, value = avro_from_json_outbox(codec, orders, "cdc.shop.orders", json.dumps(to_json_key(orders, ev["key"])),
                                           json.dumps(to_json_event(orders, ev)))
        assert (key, value) == (ob.key, ob.value), "byte-identical to encoding the typed event"
    assert avro_from_json_outbox(codec, orders, "cdc.shop.orders", json.dumps(to_json_key(orders, ev["key"])),
                                 None)[1] is None


def test_registry_errors_are_typed(registry):
    client = SchemaRegistryClient(registry.url)
    with pytest.raises(SchemaRegistryError, match="404"):
        client.schema(999)
    with pytest.raises(SchemaRegistryError):
        SchemaRegistryClient("http://127.0.0.1:9", timeout_s=1).register("x-value", {"type": "string"})


def test_avro_events_published_and_read_back_end_to_end(kafka_broker, registry, orders, tmp_path):
    prefix = "cdc" + uuid.uuid4().hex[:8]
    codec = AvroCodec(SchemaRegistryClient(registry.url))
    events = order_events(orders)
    batch = outbox_events(codec, prefix, orders, events)
    change = {"id": "sc1", "keyspace": "shop", "table": "orders", "kind": "alter_table",
              "detail": "ADD note text", "table_id": orders.id, "ts_us": 5, "ts_ms": 6}
    batch.append(schema_change_outbox_event(codec, prefix, change, seq=len(batch)))
    pub = KafkaPublisher(kafka_broker, LocalLedgerStore(tmp_path), num_partitions=2)
    pub.publish_batch("seg-avro", batch)
    records = consume_all(kafka_broker, [table_topic(prefix, "shop", "orders"), schema_change_topic(prefix)])
    consumer = AvroCodec(SchemaRegistryClient(registry.url))
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
