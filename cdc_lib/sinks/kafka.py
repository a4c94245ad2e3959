"""Exactly-once publication of change events to Kafka.

Topics: one per table, ``<prefix>.<keyspace>.<table>`` (``table_topic``), keyed by the primary key, plus
``<prefix>.schema-changes`` (``schema_change_topic``) for schema-change events. The publisher creates missing
topics with the partitions, replication factor and topic configs it is given (``cleanup.policy=compact`` works:
every event carries the full row, and a tombstone can follow each delete; see "Compacted topics" below).

Each batch (the events of one batch, already persisted in the outbox in publication order) goes through this
protocol, each step durable before the next:

1. **done?** If the ledger holds ``<batch>.json``, the batch is skipped whole.
2. **intent.** If the ledger has no ``<batch>.intent.json`` yet, the high watermark of every partition of every
   target topic is read and written to the intent *before anything is produced*. A rerun reuses the stored
   intent, so it always scans from offsets taken before the first attempt produced anything.
3. **scan.** (Only when the intent was there already: an attempt that wrote the intent itself knows nothing of
   the batch can be in Kafka.) Every partition is read from its intent offset up to its high watermark then;
   records whose ``cdc-batch`` header names this batch are the events an earlier attempt already got into Kafka.
   They must form, for every key, a prefix of that key's events in the batch (the producer runs with one request
   in flight, acks=all and idempotence, so a partition can only ever hold a prefix of what was sent to it);
   anything else is a ``PublishOrderError``.
4. **produce** the events not found, in batch order, then **flush** (every delivery acknowledged).
5. **verify** (on by default): check each event id of the batch is there exactly once, in order. What the
   partitions hold since the intent is known without reading it back when every offset up to today's high
   watermark is accounted for: below where the scan stopped the scan read it, above it each offset is one of
   this attempt's events as the broker's delivery report placed it. Only offsets that are neither (another
   producer's records, e.g. a crashed attempt's request landing after the scan; transaction markers) are read,
   so a duplicate is caught exactly as a full rescan catches it, without reading the batch back.
6. **ledger**: write ``<batch>.json`` (``storage.Layout.ledger``). Only then may the segment be archived
   (``is_published``).

**Compacted topics** (``cleanup.policy`` with ``compact``, read from the broker, or the configuration the
publisher creates topics with when it may not read topic configs): the broker removes a key's older records once a
newer record of the key is in a closed segment of the log, which can happen while a batch is being published, or
between a crashed attempt and its rerun. There, a record of the batch found in Kafka also vouches for the key's
earlier events in the batch (they were delivered before it: one request in flight), so the scan and the
verification count them as present instead of reporting them missing or refusing the batch as out of order. The
broker removes a tombstone too, ``delete.retention.ms`` (1 day by default) after compacting it: a key whose
tombstone is gone before a failed batch's rerun gets its delete event and tombstone once more.

A crash at any point leaves either nothing, a per-key prefix, or everything in Kafka; the rerun completes it
without duplicates and in order per key, for every consumer, whatever its isolation level. Per-key order across
batches needs batches published one after another (batch N+1 only once N is in the ledger): the pipeline does.

**With transactions** (``transactional_id``; the pipeline's ``kafka_transactions`` setting) the batch is also
one Kafka transaction: consumers with ``isolation.level=read_committed`` (librdkafka's default, not the Java
client's) see a batch whole or not at all, across all its topics. The transactional id is the pipeline's own and
stable, so ``init_transactions`` at the start of every run fences a zombie producer of a crashed run and aborts
whatever it left open; the scan then reads committed records only, where a batch is all there or not there.
A crashed attempt leaves aborted records in the log: ``read_committed`` consumers never see them, ``read_uncommitted``
ones do. Without transactions, the one window the protocol cannot close is a zombie producer of a crashed process
whose request is still in the broker when the rerun scans; ``verify`` reports such a duplicate
(``PublishVerificationError``) instead of marking the batch published.

Client settings (``client_config``: security, SASL/SSL, compression...) are librdkafka properties passed to the
producer, and, without the producer-only ones, to the consumer and admin client the protocol uses. The settings
exactly-once depends on (idempotence, acks, one request in flight, the transactional id) cannot be overridden.

Serialization (``JsonCodec``, ``AvroCodec``) turns envelope datums into the bytes stored in the outbox. Avro
uses the Confluent wire format (magic 0, 4-byte schema id, Avro body) with a schema registry (confluent-kafka's
``SchemaRegistryClient``: subjects ``<topic>-key`` and ``<topic>-value``), and Avro single-object encoding
(``C3 01``, 8-byte CRC-64-AVRO fingerprint, body) otherwise: both are standard Avro framings that name the writer
schema in every message; without a registry the schemas are written to the ledger store under
``schemas/<fingerprint>.avsc`` so consumers can resolve fingerprints. A schema the registry refuses (incompatible
with the versions a subject holds, under its compatibility level) is a ``SchemaRegistryError`` raised while the
batch is encoded, before anything is produced. ``outbox_events`` turns typed events into OutboxEvents;
``avro_from_json_outbox`` re-encodes an outbox row kept as JSON.

Headers on every record: ``cdc-event-id`` (the event id), ``cdc-batch`` (the batch id), ``cdc-seq`` (its
sequence number in the batch). Consumers that want belt and braces can deduplicate on ``cdc-event-id``.
"""
from __future__ import annotations

import collections
import functools
import io
import json
import logging
import operator
import os
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Protocol

from cdc_lib.errors import CdcError, ConfigError

log = logging.getLogger("cassandra_cdc.kafka")
client_log = logging.getLogger("cassandra_cdc.kafka.client")   # librdkafka's own log lines

EVENT_ID_HEADER = "cdc-event-id"
BATCH_HEADER = "cdc-batch"
SEQ_HEADER = "cdc-seq"
SCHEMA_CHANGE_SUFFIX = "schema-changes"
SCAN_RECORDS_PER_CALL = 10_000     # records a scan takes from the consumer per call


class PublishError(CdcError):
    """Kafka could not be written or read as the protocol needs (timeout, delivery failure, broker error)."""


class PublishOrderError(PublishError):
    """Kafka holds events of a batch that are not a per-key prefix of it: order per key cannot be kept."""


class PublishVerificationError(PublishError):
    """After publishing, an event of the batch is missing from Kafka or present more than once."""


class SchemaRegistryError(CdcError):
    """The schema registry refused a schema (incompatible), a request failed, or it does not know a schema id."""


# What exactly-once depends on: a client setting that changes these is refused (ConfigError).
PROTECTED_PRODUCER_SETTINGS = ("enable.idempotence", "acks", "request.required.acks",
                               "max.in.flight.requests.per.connection", "max.in.flight", "transactional.id",
                               "bootstrap.servers")
# librdkafka properties only a producer has: given to the producer, left out of the consumer and admin client
# (which would warn that they are ignored).
PRODUCER_ONLY_SETTINGS = ("compression.type", "compression.codec", "compression.level", "linger.ms",
                          "queue.buffering.max.ms", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
                          "batch.num.messages", "batch.size", "message.timeout.ms", "delivery.timeout.ms",
                          "request.timeout.ms", "message.send.max.retries", "retries", "retry.backoff.ms",
                          "partitioner", "sticky.partitioning.linger.ms", "transaction.timeout.ms")


def client_settings(client_config: Optional[dict], *, producer: bool) -> dict:
    """The librdkafka properties of ``client_config`` for a producer, or (without the producer-only ones) for a
    consumer or admin client; ConfigError for a setting exactly-once depends on."""
    out = {}
    for key, value in (client_config or {}).items():
        if key in PROTECTED_PRODUCER_SETTINGS:
            raise ConfigError(f"Kafka client setting {key!r} cannot be changed: exactly-once publishing depends on "
                              "it (see cdc_lib.sinks.kafka)")
        if producer or key not in PRODUCER_ONLY_SETTINGS:
            out[key] = value
    return out


def table_topic(prefix: str, keyspace: str, table: str) -> str:
    """The topic of a table's change events."""
    return f"{prefix}.{keyspace}.{table}"


def schema_change_topic(prefix: str) -> str:
    """The topic of schema-change events."""
    return f"{prefix}.{SCHEMA_CHANGE_SUFFIX}"


@dataclass(frozen=True)
class OutboxEvent:
    """One serialized event as the outbox holds it. ``value`` None is a Kafka tombstone."""
    event_id: str
    topic: str
    key: Optional[bytes]
    value: Optional[bytes]
    seq: int


# --------------------------------------------------------------------------------------------- ledger store

class LedgerStore(Protocol):
    """What the publish ledger needs from an object store (``storage.ObjectStore`` has these methods)."""

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes: ...

    def exists(self, key: str) -> bool: ...


class LocalLedgerStore:
    """A directory as a ledger store. Writes are atomic (temp file, fsync, rename) so a crash never leaves
    half an object that a rerun would misread."""

    def __init__(self, root):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ConfigError(f"ledger key must be relative: {key!r}")
        return self.root / key

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def get_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()


# ------------------------------------------------------------------------------------------------ publisher

@dataclass
class PublishResult:
    batch_id: str
    events: int                       # events in the batch
    already_in_kafka: int = 0         # found by the scan (an earlier attempt got them there)
    produced: int = 0                 # produced by this call
    skipped: bool = False             # the ledger already marked the batch published


FaultHook = Callable[..., None]


class KafkaPublisher:
    """Publishes outbox batches to Kafka exactly once (see the module docstring for the protocol).

    ``fault`` is a test hook called as ``fault(point, **info)`` at every step boundary and after each produced
    event; points: ``intent_written``, ``scanned``, ``produced`` (info: ``index``, ``count``), ``delivered``
    (an acknowledgement, during produce or flush; info: ``index``, ``count``), ``before_flush``, ``flushed``,
    ``verified``, ``ledger_written``.
    """

    def __init__(self, bootstrap_servers: str, ledger: LedgerStore, *, ledger_prefix: str = "ledger",
                 num_partitions: int = 1, replication_factor: int = -1, topic_config: Optional[dict] = None,
                 client_config: Optional[dict] = None, transactional_id: Optional[str] = None, verify: bool = True,
                 timeout_s: float = 30.0, fault: Optional[FaultHook] = None):
        from confluent_kafka import Producer  # imported here so serializers work without a Kafka client
        self.bootstrap_servers = bootstrap_servers
        self.ledger = ledger
        self.ledger_prefix = ledger_prefix.rstrip("/")
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor      # -1: the broker's default.replication.factor
        self.topic_config = {k: str(v) for k, v in (topic_config or {}).items()}
        self.transactional_id = transactional_id
        self.verify = verify
        self.timeout_s = timeout_s
        self._fault = fault or (lambda point, **info: None)
        self._per_event_faults = fault is not None
        # What the clients report (a refused login, an unreachable broker): logged, and the last few repeated in
        # our errors, which would otherwise only say "transport failure".
        self._client_errors: collections.deque = collections.deque(maxlen=3)
        common = {"logger": client_log, "error_cb": self._client_errors.append}
        self._client_config = {"bootstrap.servers": bootstrap_servers,
                               **client_settings(client_config, producer=False), **common}
        config = {
            "linger.ms": 5,
            **client_settings(client_config, producer=True),
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            # One request in flight: a partition can then only hold a prefix of what was sent to it, whatever
            # the broker does with producer sequence numbers (the prefix property the rerun relies on).
            "max.in.flight.requests.per.connection": 1,
            **common,
        }
        # The Java client's partitioner, so keys land where Java producers and Kafka Connect put them.
        config.setdefault("partitioner", "murmur2_random")
        if transactional_id:
            config["transactional.id"] = transactional_id
        self._producer = Producer(config)
        self._transactions_ready = False
        self._reader = None         # the consumer of the reads (watermarks, scans): ``_consumer``
        self._known_topics: set = set()
        self._compacted_topics: set = set()

    # ----------------------------------------------------------------------------------------- ledger keys
    def _intent_key(self, batch_id: str) -> str:
        return f"{self.ledger_prefix}/{batch_id}.intent.json"

    def _published_key(self, batch_id: str) -> str:
        # The same key as storage.Layout.ledger(batch_id): the archiver checks it before moving a segment.
        return f"{self.ledger_prefix}/{batch_id}.json"

    def is_published(self, batch_id: str) -> bool:
        """True once every event of the batch is in Kafka: the segment may then be archived."""
        return self.ledger.exists(self._published_key(batch_id))

    # -------------------------------------------------------------------------------------------- publish
    def publish_batch(self, batch_id: str, events: Iterable) -> PublishResult:
        """Publish one batch exactly once. ``cdc_lib.state.events``: OutboxEvent or (event_id, topic, key, value, seq)."""
        if not batch_id or "/" in batch_id or batch_id.startswith("."):
            raise ConfigError(f"batch id must be a non-empty name without '/': {batch_id!r}")
        batch = _as_events(events)
        result = PublishResult(batch_id, len(batch))
        if self.is_published(batch_id):
            result.skipped = True
            return result
        topics = sorted({e.topic for e in batch})
        self.ensure_topics(topics)
        if self.transactional_id and not self._transactions_ready:
            # Fences any earlier producer with this id (a crashed run's zombie) and aborts what it left open.
            self._kafka_call(lambda: self._producer.init_transactions(self.timeout_s), "init_transactions")
            self._transactions_ready = True

        intent_key = self._intent_key(batch_id)
        earlier_attempt = self.ledger.exists(intent_key)
        if earlier_attempt:
            intent = json.loads(self.ledger.get_bytes(intent_key))
        else:
            intent = {"batch_id": batch_id, "events": len(batch), "created_ms": int(time.time() * 1000),
                      "start_offsets": _offsets_to_json(self._end_offsets(topics))}
            self.ledger.put_bytes(intent_key, json.dumps(intent, sort_keys=True).encode())
        self._fault("intent_written")
        start = _offsets_from_json(intent["start_offsets"])

        if earlier_attempt:
            found, scanned_to = self._scan(batch_id, topics, start)
        else:
            # Nothing is produced before the intent is written: no attempt got any of the batch into Kafka yet. What
            # other producers wrote since the start offsets, the verification reads.
            found, scanned_to = [], dict(start)
        self._fault("scanned")
        present = _check_prefix(batch, found, self._compacted_topics)
        if self.transactional_id and present and len(present) != len(batch):
            raise PublishOrderError(f"batch {batch_id}: {len(present)} of its {len(batch)} events are committed in "
                                    "Kafka: a transaction holds a whole batch, so another writer put them there")
        result.already_in_kafka = len(present)

        todo = [e for e in batch if e.event_id not in present] if present else batch
        errors: list = []
        delivered = [0]
        # Where the broker put each event of ``todo`` (its acknowledgement): (partition, offset), by index in todo.
        placed: list = [None] * len(todo)

        per_event = self._per_event_faults     # without a hook, no fault call per event and per acknowledgement

        def on_delivery(index, err, msg):
            if err is not None:
                errors.append(err)
                return
            placed[index] = (msg.partition(), msg.offset())
            if per_event:
                delivered[0] += 1
                self._fault("delivered", index=delivered[0] - 1, count=len(todo))

        in_transaction = bool(self.transactional_id and todo)
        try:
            if in_transaction:
                self._producer.begin_transaction()
            batch_header = (BATCH_HEADER, batch_id.encode())
            produce, fault, count = self._producer.produce, self._fault, len(todo)
            for i, e in enumerate(todo):
                headers = [(EVENT_ID_HEADER, e.event_id.encode()), batch_header, (SEQ_HEADER, str(e.seq).encode())]
                report = functools.partial(on_delivery, i)
                try:
                    produce(e.topic, value=e.value, key=e.key, headers=headers, on_delivery=report)
                except BufferError:
                    self._produce(e, headers, report)
                if per_event:
                    fault("produced", index=i, count=count)
            result.produced = count
            self._fault("before_flush")
            if in_transaction:
                # flushes, then commits: all of the batch becomes visible to read_committed consumers at once
                self._kafka_call(lambda: self._producer.commit_transaction(self.timeout_s),
                                 f"batch {batch_id}: commit_transaction")
            else:
                remaining = self._producer.flush(self.timeout_s)
                if remaining:
                    raise PublishError(f"batch {batch_id}: {remaining} events not acknowledged after "
                                       f"{self.timeout_s}s")
            if errors:
                # A failed event may have later ones of its partition after it in Kafka: the rerun's prefix
                # check then refuses the batch (PublishOrderError) rather than publish out of order.
                raise PublishError(f"batch {batch_id}: delivery failed: {errors[0]}")
        except BaseException:
            if in_transaction:
                # Nothing of an aborted transaction ever reaches read_committed consumers.
                try:
                    self._producer.abort_transaction(self.timeout_s)
                except Exception:  # noqa: BLE001 - fenced or broker gone: the next run's init_transactions aborts
                    self._transactions_ready = False
            else:
                # Drop what is still queued and wait for what is in flight: otherwise this producer would keep
                # delivering after the caller retried with a new publisher, and the retry's scan would miss them.
                self._producer.purge(in_queue=True, in_flight=False)
                self._producer.flush(self.timeout_s)
            raise
        self._fault("flushed")

        if self.verify:
            if None in placed:      # an acknowledgement without its report: nothing to reason from
                self._verify_by_rescan(batch_id, batch, topics, start)
            else:
                self._verify(batch_id, batch, topics, start, found, scanned_to, todo, placed)
            self._fault("verified")
        self.ledger.put_bytes(self._published_key(batch_id), json.dumps({
            "batch_id": batch_id, "events": len(batch), "already_in_kafka": result.already_in_kafka,
            "produced": result.produced, "published_ms": int(time.time() * 1000)}, sort_keys=True).encode())
        self._fault("ledger_written")
        return result

    def _kafka_call(self, call, what: str, client=None):
        """``call()``; a KafkaException becomes a PublishError naming ``what`` and what the clients last reported
        (``client``'s pending reports are served first)."""
        from confluent_kafka import KafkaException
        try:
            return call()
        except KafkaException as e:
            if client is not None:
                client.poll(0.5)
            said = f" (the Kafka client reported: {'; '.join(map(str, self._client_errors))})" \
                if self._client_errors else ""
            raise PublishError(f"{what}: {e.args[0] if e.args else e}{said}") from e

    def _produce(self, e: OutboxEvent, headers, on_delivery) -> None:
        """Produce ``e``, waiting for room in the local queue as long as it is full."""
        while True:
            try:
                self._producer.produce(e.topic, key=e.key, value=e.value, headers=headers, on_delivery=on_delivery)
                return
            except BufferError:
                # Local queue full: let deliveries drain, then retry the same event (order is kept).
                self._producer.poll(0.1)

    def close(self, *, deliver: bool = True) -> None:
        """Deliver anything still queued (nothing, after a successful publish_batch), and close the reads'
        consumer. ``deliver`` False: do not wait for the queue (publish_batch returns once Kafka has every event,
        and a failed one has already purged or aborted what it sent: a flush could only wait on a broker that is
        gone)."""
        try:
            if deliver:
                self._producer.flush(self.timeout_s)
        finally:
            if self._reader is not None:
                reader, self._reader = self._reader, None
                reader.close()

    def __enter__(self) -> "KafkaPublisher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------- kafka reads
    def ensure_topics(self, topics) -> None:
        """Create missing topics with ``num_partitions`` partitions, ``replication_factor`` and ``topic_config``
        (existing topics are left as they are), and learn which of them are compacted."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic
        missing = [t for t in topics if t not in self._known_topics]
        if not missing:
            return
        admin = AdminClient(self._client_config)
        existing = set(self._kafka_call(lambda: admin.list_topics(timeout=self.timeout_s).topics,
                                        f"listing the topics of Kafka at {self.bootstrap_servers}", admin))
        create = [NewTopic(t, num_partitions=self.num_partitions, replication_factor=self.replication_factor,
                           config=self.topic_config)
                  for t in missing if t not in existing]
        if create:
            for name, fut in admin.create_topics(create, request_timeout=self.timeout_s).items():
                try:
                    fut.result(self.timeout_s)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise PublishError(f"cannot create topic {name} ({self.num_partitions} partitions, "
                                           f"replication factor {self.replication_factor}, config "
                                           f"{self.topic_config}): {exc}") from exc
        # Metadata may lag creation: wait until every topic shows its partitions.
        deadline = time.monotonic() + self.timeout_s
        while True:
            md = admin.list_topics(timeout=self.timeout_s).topics
            if all(t in md and md[t].partitions and md[t].error is None
                   and all(p.leader >= 0 for p in md[t].partitions.values()) for t in missing):
                break
            if time.monotonic() > deadline:
                raise PublishError(f"topics not visible after creation: {missing}")
            time.sleep(0.05)
        self._compacted_topics.update(self._compacted_among(admin, missing))
        self._known_topics.update(missing)

    def _compacted_among(self, admin, topics) -> set:
        """The topics among ``topics`` whose ``cleanup.policy`` includes ``compact`` (see the module docstring), as
        the broker describes them; without the permission to read topic configs, as ``topic_config`` says."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource, ResourceType
        try:
            futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics],
                                             request_timeout=self.timeout_s)
            return {resource.name for resource, fut in futures.items()
                    if "compact" in (fut.result(self.timeout_s)["cleanup.policy"].value or "")}
        except KafkaException as exc:
            assumed = "compact" in self.topic_config.get("cleanup.policy", "")
            log.warning("cannot read the cleanup.policy of %s (%s): taken as %s, the topic_config setting's",
                        ", ".join(topics), exc, "compact" if assumed else "delete")
            return set(topics) if assumed else set()

    def _consumer(self):
        """The consumer that reads watermarks and scans partitions, made once per publisher: a new client's first
        request waits for its connection (about 55 ms against a local broker), and a batch reads two or three times
        (the intent's end offsets, the verification's, and with transactions a scan past the commit markers).
        It is only ever assigned partitions (no group membership, nothing committed)."""
        if self._reader is None:
            self._reader = self._new_consumer()
        return self._reader

    def _new_consumer(self):
        from confluent_kafka import Consumer
        return Consumer({
            **self._client_config,
            "group.id": f"cdc-publish-scan-{uuid.uuid4().hex}",   # never committed: offsets are ours
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # With transactions, what counts is what read_committed consumers see.
            "isolation.level": "read_committed" if self.transactional_id else "read_uncommitted",
            # A bounded scan: the broker must not hold an empty fetch for the default 500 ms at the end.
            "fetch.wait.max.ms": 10,
        })

    def _partitions(self, consumer, topics) -> list:
        """[(topic, partition)] of ``topics``, in order, from one metadata request."""
        md = consumer.list_topics(timeout=self.timeout_s).topics
        out = []
        for topic in topics:
            t = md.get(topic)
            if t is None or t.error is not None:
                raise PublishError(f"topic {topic} has no metadata: {None if t is None else t.error}")
            out += [(topic, p) for p in sorted(t.partitions)]
        return out

    def _watermarks(self, consumer, topic: str, partition: int) -> tuple:
        """(low, high) watermarks of a partition, retried while the broker says the error is retriable (a leader
        still being elected right after the topic was created)."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition
        settling = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION}
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self.timeout_s)
            except KafkaException as e:
                err = e.args[0]
                if not (err.retriable() or err.code() in settling) or time.monotonic() > deadline:
                    raise PublishError(f"watermarks of {topic}[{partition}]: {err}") from e
                time.sleep(0.1)

    def _end_offsets(self, topics) -> dict:
        consumer = self._consumer()
        return {(topic, p): self._watermarks(consumer, topic, p)[1] for topic, p in self._partitions(consumer, topics)}

    def _scan(self, batch_id: str, topics, start: dict, only: Optional[set] = None) -> tuple:
        """Records of ``batch_id`` in Kafka from the ``start`` offsets (the intent's):
        ([(event_id, topic, partition, offset)], {(topic, partition): offset the scan read up to}).

        Each partition (of ``topics``, or the ``only`` ones) is read up to its high watermark at the start of the
        scan (the end of what was acknowledged before it). The last offsets of a partition may hold transaction
        markers, which are never delivered: reaching the end of the partition ends its scan too.
        """
        from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
        consumer = self._consumer()
        try:
            assign, end, scanned_to = [], {}, {}
            for topic, p in self._partitions(consumer, topics):
                if only is not None and (topic, p) not in only:
                    continue
                low, high = self._watermarks(consumer, topic, p)
                scanned_to[(topic, p)] = high
                # A partition added after the intent was taken is read from its beginning.
                first = start.get((topic, p), OFFSET_BEGINNING)
                if high > max(low, first if first >= 0 else low):
                    assign.append(TopicPartition(topic, p, first))
                    end[(topic, p)] = high
            found: list = []
            if not assign:
                return found, scanned_to
            consumer.assign(assign)
            pending = set(end)
            deadline = time.monotonic() + self.timeout_s
            want = batch_id.encode()
            while pending:
                if time.monotonic() > deadline:
                    raise PublishError(f"batch {batch_id}: scanning {sorted(pending)} timed out")
                # What the consumer has fetched, many records per call (the scan reads every record of the batch's
                # partitions since the intent); when it has nothing yet, wait for the next one.
                for msg in consumer.consume(SCAN_RECORDS_PER_CALL, 0) or consumer.consume(1, 0.2):
                    where = (msg.topic(), msg.partition())
                    if msg.error() is not None:
                        if msg.error().code() == KafkaError._PARTITION_EOF:
                            pending.discard(where)
                            continue
                        raise PublishError(f"batch {batch_id}: reading {where[0]}[{where[1]}]: {msg.error()}")
                    if where not in pending:
                        continue
                    offset = msg.offset()
                    headers = dict(msg.headers() or ())
                    if headers.get(BATCH_HEADER) == want and EVENT_ID_HEADER in headers:
                        found.append((headers[EVENT_ID_HEADER].decode(), where[0], where[1], offset))
                    if offset + 1 >= end[where]:
                        pending.discard(where)
            return found, scanned_to
        finally:
            consumer.unassign()     # the next scan assigns its own start offsets; what was fetched is dropped

    def _verify(self, batch_id: str, batch: list, topics, start: dict, scanned: list, scanned_to: dict,
                todo: list, placed: list) -> None:
        """Check each event of the batch is in Kafka exactly once, in batch order per key and partition:
        PublishVerificationError (missing or duplicated) or PublishOrderError.

        What Kafka holds since the intent is known without reading it back when every offset is accounted for:
        below ``scanned_to`` the scan read it (``scanned``), above it up to today's high watermark each offset is
        one of this call's acknowledged events (``todo``, each at its ``placed`` (partition, offset): the broker's
        delivery reports). Offsets that are neither (another producer's records, such as a crashed attempt's
        request landing after the scan, or transaction markers) are read, from the first of them on.
        """
        mine: dict = {}
        for e, (partition, offset) in zip(todo, placed):
            mine.setdefault((e.topic, partition), []).append(offset)
        ends = self._end_offsets(topics)
        if not scanned and mine.keys() <= ends.keys() and \
                all(_fills(mine.get(where, []), scanned_to.get(where), high) for where, high in ends.items()):
            # The usual case, a first attempt acknowledged in full: since the intent, each partition holds this
            # call's events there and nothing else, at consecutive offsets in batch order (``todo`` is the batch
            # when nothing was found). That is every event once and in order: what the general check below
            # concludes, without listing and sorting every event again.
            return
        unread: dict = {}           # partition -> first offset that is neither scanned nor ours
        for where, high in ends.items():
            low = scanned_to.get(where)
            offsets = sorted(mine.get(where, ()))
            if low is None or (offsets and (offsets[0] < low or offsets[-1] >= high)):
                # a partition the scan did not see (added since), or an acknowledgement outside what the scan and
                # today's watermark bound: nothing to reason from, read it all again
                return self._verify_by_rescan(batch_id, batch, topics, start)
            if len(offsets) != high - low:
                gaps = (o for o, expected in zip(offsets, range(low, high)) if o != expected)
                unread[where] = next(gaps, low + len(offsets))
        ours = [(e.event_id, e.topic, *where) for e, where in zip(todo, placed)]
        found = scanned + ours
        if unread:
            acknowledged = {(topic, partition, offset) for _, topic, partition, offset in ours}
            extra, _ = self._scan(batch_id, topics, unread, only=set(unread))
            found += [r for r in extra if tuple(r[1:]) not in acknowledged]
        self._check_complete(batch_id, batch, found)

    def _verify_by_rescan(self, batch_id: str, batch: list, topics, start: dict) -> None:
        """``_verify`` by reading every record since the intent again."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            found, _ = self._scan(batch_id, topics, start)
            missing, dupes = _missing_and_duplicated(batch, found, self._compacted_topics)
            # A committed transaction becomes visible to read_committed readers once the coordinator has written
            # its commit markers, a moment after commit_transaction returned (the last stable offset lags).
            if not (missing and not dupes and self.transactional_id and time.monotonic() < deadline):
                break
            time.sleep(0.1)
        self._check_complete(batch_id, batch, found)

    def _check_complete(self, batch_id: str, batch: list, found: list) -> None:
        missing, dupes = _missing_and_duplicated(batch, found, self._compacted_topics)
        if missing or dupes:
            raise PublishVerificationError(
                f"batch {batch_id}: {len(missing)} events missing (first {missing[:3]}), "
                f"{len(dupes)} duplicated (first {dupes[:3]})")
        _check_prefix(batch, found, self._compacted_topics)


def _missing_and_duplicated(batch: list, found: list, compacted: set) -> tuple:
    """([ids of the batch's events not in Kafka], sorted [ids found more than once]) given what was ``found``."""
    counts = collections.Counter(event_id for event_id, *_ in found)
    present = _present(batch, found, compacted)
    missing = [e.event_id for e in batch if e.event_id not in present]
    return missing, sorted(k for k, n in counts.items() if n > 1)


def _as_events(events: Iterable) -> list:
    out = []
    last_seq = None
    seen = set()
    for e in events:
        if not isinstance(e, OutboxEvent):
            e = OutboxEvent(*e)
        if last_seq is not None and e.seq <= last_seq:
            raise ConfigError(f"outbox events must come in increasing seq order: {e.seq} after {last_seq}")
        if e.event_id in seen:
            raise ConfigError(f"event id {e.event_id!r} appears twice in one batch")
        seen.add(e.event_id)
        last_seq = e.seq
        out.append(e)
    return out


def _fills(offsets: list, low: Optional[int], high: int) -> bool:
    """Whether ``offsets`` (in the order their events were produced) are ``low``, ``low + 1``, ... ``high - 1``."""
    if low is None or len(offsets) != high - low:
        return False
    if not offsets:
        return True
    return offsets[0] == low and offsets[-1] == high - 1 and all(map(operator.lt, offsets, offsets[1:]))


def _offsets_from_json(data) -> dict:
    return {(topic, int(p)): off for topic, parts in data.items() for p, off in parts.items()}


def _offsets_to_json(offsets: dict) -> dict:
    out: dict = {}
    for (topic, p), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(p)] = off
    return out


def _events_by_key(batch: Iterable) -> dict:
    by_key: dict = {}
    for e in batch:
        by_key.setdefault((e.topic, e.key), []).append(e.event_id)
    return by_key


def _present(batch: list, found: list, compacted: set) -> set:
    """Ids of the batch's events that are in Kafka: those ``found``, and on ``compacted`` topics every event of a
    key up to the last one found (the broker may have removed the earlier ones: see the module docstring)."""
    present = {event_id for event_id, *_ in found}
    if present and compacted:
        for ids in _events_by_key(e for e in batch if e.topic in compacted).values():
            last = max((i for i, event_id in enumerate(ids) if event_id in present), default=-1)
            present.update(ids[:last + 1])
    return present


def _check_prefix(batch: list, found: list, compacted: set) -> set:
    """Ids of the batch's events in Kafka (``_present``), after checking they are, for every (topic, key), a prefix
    in batch order, and that what was found follows batch order in every partition."""
    if not found:
        return set()        # none of the batch in Kafka: nothing to check (a first attempt)
    present = _present(batch, found, compacted)
    pos = {e.event_id: i for i, e in enumerate(batch)}
    in_batch = present & pos.keys()
    # None of the batch, or all of it: every key's events are then trivially a prefix (a first attempt's scan and
    # a complete verification, the usual cases, need no per-key pass).
    if 0 < len(in_batch) < len(batch):
        for (topic, key), ids in _events_by_key(batch).items():
            flags = [i in present for i in ids]
            n = sum(flags)
            if flags[:n] != [True] * n:
                raise PublishOrderError(f"topic {topic} key {key!r}: events in Kafka are not a prefix of the batch")
    # Order in Kafka of what was found must follow batch order within each partition.
    last: dict = {}
    for event_id, topic, partition, offset in sorted(found, key=operator.itemgetter(1, 2, 3)):
        if event_id not in pos:
            continue
        prev = last.get((topic, partition))
        if prev is not None and pos[event_id] < prev:
            raise PublishOrderError(f"{topic}[{partition}] holds event {event_id} out of batch order")
        last[(topic, partition)] = pos[event_id]
    return in_batch


# -------------------------------------------------------------------------------------------- serialization

CONFLUENT_MAGIC = b"\x00"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"


def confluent_frame(schema_id: int, body: bytes) -> bytes:
    """Confluent wire format: magic byte 0, schema id (4 bytes big-endian), Avro binary body."""
    return CONFLUENT_MAGIC + struct.pack(">I", schema_id) + body


def confluent_unframe(data: bytes) -> tuple:
    """(schema id, Avro body) of a Confluent-framed message; FormatError when it is not one."""
    from cdc_lib.errors import FormatError
    if len(data) < 5 or data[:1] != CONFLUENT_MAGIC:
        raise FormatError("not a Confluent-framed Avro message (magic byte 0 + 4-byte schema id)")
    return struct.unpack(">I", data[1:5])[0], data[5:]


def schema_fingerprint(schema: dict) -> bytes:
    """The 8-byte CRC-64-AVRO fingerprint of a schema's Parsing Canonical Form (little-endian, as the Avro
    single-object encoding writes it)."""
    from fastavro.schema import fingerprint, to_parsing_canonical_form
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def single_object_unframe(data: bytes) -> tuple:
    """(fingerprint, Avro body) of an Avro single-object-encoded message."""
    from cdc_lib.errors import FormatError
    if len(data) < 10 or data[:2] != SINGLE_OBJECT_MAGIC:
        raise FormatError("not an Avro single-object message (C3 01 + 8-byte fingerprint)")
    return data[2:10], data[10:]


def schema_registry_client(url: str, config: Optional[dict] = None):
    """confluent-kafka's ``SchemaRegistryClient`` for the registry at ``url`` (a Confluent Schema Registry, or a
    compatible API such as Apicurio's ``/apis/ccompat/v7``); ``config``: more of its settings
    (``basic.auth.user.info``, ``ssl.ca.location``...)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    return SchemaRegistryClient({"url": url, **(config or {})})


def _registry_failure(e: Exception, what: str) -> SchemaRegistryError:
    """Our error for a failed registry call ``what`` (confluent-kafka's SchemaRegistryError, or a network error)."""
    status = getattr(e, "http_status_code", None)
    detail = getattr(e, "error_message", None) or str(e)
    return SchemaRegistryError(f"{what}: {f'HTTP {status}: ' if status is not None else ''}{detail}")


class JsonCodec:
    """Events as JSON (``sinks.avro.to_json_event``; keys as ``sinks.avro.to_json_key``), UTF-8, strict JSON (no NaN)."""

    format = "json"

    @staticmethod
    def _dump(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()

    def encode_key(self, topic: str, table, key: dict) -> bytes:
        from .avro import to_json_key
        return self._dump(to_json_key(table, key))

    def encode_value(self, topic: str, table, event: dict) -> bytes:
        from .avro import to_json_event
        return self._dump(to_json_event(table, event))

    def encode_schema_change(self, topic: str, change: dict) -> bytes:
        return self._dump(_schema_change_datum(change))


class AvroCodec:
    """Events as Avro: Confluent wire format with ``registry`` (confluent-kafka's ``SchemaRegistryClient``, see
    ``schema_registry_client``), else Avro single-object encoding.

    Without a registry, each writer schema is stored once in ``schema_store`` (any LedgerStore) under
    ``schemas/<fingerprint hex>.avsc`` so consumers can resolve the fingerprint in every message.
    """

    format = "avro"

    def __init__(self, registry=None, *, namespace: str = "cdc", schema_store: Optional[LedgerStore] = None):
        self.registry = registry
        self.namespace = namespace
        self.schema_store = schema_store
        self._tables: dict = {}       # table identity -> (schema dicts, parsed schemas)
        self._by_fingerprint: dict = {}
        self._prefix: dict = {}       # (topic, role, id(schema)) -> frame prefix
        self._change_schema: Optional[dict] = None
        self._change_parsed = None

    def _schemas(self, table):
        from .avro import table_schema_dicts, table_schemas

        # CqlTypes compare by structure (UDT fields included), so an ALTER TYPE gives a new schema too.
        ident = (table.keyspace, table.name, tuple(sorted(((c.name, c.type, c.kind, c.position)
                                                           for c in table.columns.values()), key=lambda x: x[0])))
        got = self._tables.get(ident)
        if got is None:
            got = self._tables[ident] = (table_schema_dicts(table, self.namespace),
                                         table_schemas(table, self.namespace))
        return got

    def _frame(self, topic: str, role: str, schema: dict, parsed, datum) -> bytes:
        import fastavro
        key = (topic, role, id(schema))
        prefix = self._prefix.get(key)
        if prefix is None:
            if self.registry is not None:
                prefix = confluent_frame(self._register(f"{topic}-{role}", schema), b"")
            else:
                fp = schema_fingerprint(schema)
                self._by_fingerprint[fp] = schema
                if self.schema_store is not None:
                    name = f"schemas/{fp.hex()}.avsc"
                    if not self.schema_store.exists(name):
                        self.schema_store.put_bytes(name, json.dumps(schema, indent=1).encode())
                prefix = SINGLE_OBJECT_MAGIC + fp
            self._prefix[key] = prefix
        buf = io.BytesIO()
        buf.write(prefix)
        fastavro.schemaless_writer(buf, parsed, datum)
        return buf.getvalue()

    def _register(self, subject: str, schema: dict) -> int:
        """The registry's id of ``schema`` under ``subject``, registering it as the subject's next version if it is
        new. A schema the registry refuses says why, and under which compatibility level."""
        from confluent_kafka.schema_registry import Schema
        try:
            return self.registry.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
        except Exception as e:  # noqa: BLE001 - confluent-kafka's SchemaRegistryError, or the network
            if getattr(e, "http_status_code", None) == 409:
                raise SchemaRegistryError(
                    f"the schema registry refuses the new schema of subject {subject}: it is incompatible with the "
                    f"versions the subject holds (compatibility {self._compatibility(subject)}): "
                    f"{getattr(e, 'error_message', e)}. Nothing of the batch was published; make the change "
                    "compatible, or change the subject's compatibility level, and run the batch again") from None
            raise _registry_failure(e, f"registering a schema under subject {subject}") from None

    def _compatibility(self, subject: str) -> str:
        for ask in (lambda: self.registry.get_compatibility(subject), lambda: self.registry.get_compatibility()):
            try:
                return str(ask())
            except Exception:  # noqa: BLE001 - no level set at this scope: ask the next one
                continue
        return "unknown"

    def encode_key(self, topic: str, table, key: dict) -> bytes:
        from .avro import to_avro_key
        dicts, parsed = self._schemas(table)
        return self._frame(topic, "key", dicts.key, parsed.key, to_avro_key(table, key))

    def encode_value(self, topic: str, table, event: dict) -> bytes:
        from .avro import to_avro_envelope
        dicts, parsed = self._schemas(table)
        return self._frame(topic, "value", dicts.envelope, parsed.envelope, to_avro_envelope(table, event))

    def encode_schema_change(self, topic: str, change: dict) -> bytes:
        import fastavro

        from .avro import schema_change_schema
        if self._change_schema is None:
            self._change_schema = schema_change_schema(self.namespace)
            self._change_parsed = fastavro.parse_schema(json.loads(json.dumps(self._change_schema)))
        return self._frame(topic, "value", self._change_schema, self._change_parsed, _schema_change_datum(change))

    def writer_schema(self, data: bytes) -> dict:
        """The writer schema a message names (registry id or fingerprint)."""
        if data[:1] == CONFLUENT_MAGIC:
            if self.registry is None:
                raise SchemaRegistryError("a Confluent-framed message needs a schema registry to decode")
            schema_id = confluent_unframe(data)[0]
            try:
                return json.loads(self.registry.get_schema(schema_id).schema_str)
            except Exception as e:  # noqa: BLE001 - unknown id, or the network
                raise _registry_failure(e, f"schema id {schema_id}") from None
        fp, _ = single_object_unframe(data)
        schema = self._by_fingerprint.get(fp)
        if schema is None and self.schema_store is not None and self.schema_store.exists(f"schemas/{fp.hex()}.avsc"):
            schema = self._by_fingerprint[fp] = json.loads(self.schema_store.get_bytes(f"schemas/{fp.hex()}.avsc"))
        if schema is None:
            raise SchemaRegistryError(f"unknown schema fingerprint {fp.hex()}")
        return schema

    def decode(self, data: bytes, reader_schema: Optional[dict] = None) -> dict:
        """The Avro datum in a framed message (read with ``reader_schema`` when given)."""
        import fastavro
        writer = self.writer_schema(data)
        body = confluent_unframe(data)[1] if data[:1] == CONFLUENT_MAGIC else single_object_unframe(data)[1]
        return fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(json.loads(json.dumps(writer))),
                                          None if reader_schema is None else
                                          fastavro.parse_schema(json.loads(json.dumps(reader_schema))))


def _schema_change_datum(change: dict) -> dict:
    return {"id": str(change["id"]), "keyspace": change["keyspace"], "table": change.get("table"),
            "kind": change["kind"], "detail": change.get("detail"),
            "table_id": None if change.get("table_id") is None else str(change["table_id"]),
            "ts_us": change.get("ts_us"), "ts_ms": int(change["ts_ms"])}


def outbox_events(codec, prefix: str, table, events: Iterable, start_seq: int = 0, *,
                  tombstones: bool = False) -> list:
    """Change events of one table -> OutboxEvents in order (``seq`` from ``start_seq``).

    With ``tombstones`` a delete is followed by a Kafka tombstone (same key, null value; id ``<id>.tombstone``)
    so that log compaction can drop the key, as Debezium does.
    """
    from .avro import event_key
    topic = table_topic(prefix, table.keyspace, table.name)
    out = []
    seq = start_seq
    for ev in events:
        key = codec.encode_key(topic, table, event_key(table, ev))
        out.append(OutboxEvent(str(ev["id"]), topic, key, codec.encode_value(topic, table, ev), seq))
        seq += 1
        if tombstones and ev["op"] == "d":
            out.append(OutboxEvent(f"{ev['id']}.tombstone", topic, key, None, seq))
            seq += 1
    return out


def schema_change_outbox_event(codec, prefix: str, change: dict, seq: int) -> OutboxEvent:
    """A schema-change event (dict with id, keyspace, table, kind, detail, table_id, ts_us, ts_ms) for the
    schema-change topic, keyed by ``keyspace.table`` so one table's changes stay in order."""
    topic = schema_change_topic(prefix)
    key = f"{change['keyspace']}.{change.get('table') or ''}".encode()
    return OutboxEvent(str(change["id"]), topic, key, codec.encode_schema_change(topic, change), seq)


def avro_from_json_outbox(codec: "AvroCodec", table, topic: str, key_json: str, event_json: Optional[str]) -> tuple:
    """(key bytes, value bytes) in Avro for an outbox row kept in JSON form (``sinks.avro.to_json_key`` /
    ``sinks.avro.to_json_event``); a None event stays a tombstone."""
    from .avro import from_json_event, from_json_key
    key = codec.encode_key(topic, table, from_json_key(table, json.loads(key_json)))
    if event_json is None:
        return key, None
    return key, codec.encode_value(topic, table, from_json_event(table, json.loads(event_json)))
