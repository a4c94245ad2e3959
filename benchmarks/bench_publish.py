"""Benchmark (not a test): the CPU the publish step spends per event, next to the Kafka client's own.

    .venv/bin/python benchmarks/bench_publish.py [--events 200000] [--rounds 3] [--transactions]

An embedded Apache Kafka broker (``demo.servers.run_kafka_broker``, 127.0.0.1) and ``--events`` events shaped as
the pipeline's (a 32-hex event id, a key of about 16 bytes, about 480 bytes of JSON, over ``--topics`` topics of
one partition each, the pipeline's default). Measured in the same run, ``--rounds`` times each, alternating:

* **client**: the same events produced with confluent-kafka as the publisher configures it (idempotent, acks=all,
  one request in flight, the Java client's partitioner), each with its three headers (event id, batch, seq) and a
  delivery report, then flushed: what any producer of these records pays, with no exactly-once bookkeeping;
* **publish_batch**: ``sinks.kafka.KafkaPublisher.publish_batch`` on the same events as ``OutboxEvent`` (a new
  batch id each round): the ledger's intent and record, the produce loop, the delivery reports, the verification
  from the acknowledged offsets. ``--transactions``: each batch one Kafka transaction, as ``kafka_transactions``.

Printed per round: wall seconds, events/s, and CPU time per event of the thread that publishes
(``time.thread_time``: Python and the client's calls on that thread; the client's own I/O threads are not in it)
and of the whole process (``os.times``: with the client's threads). ``publish_batch - client`` is what the
exactly-once publisher adds per event.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdc_lib.demo.servers import run_kafka_broker  # noqa: E402
from cdc_lib.sinks.kafka import (BATCH_HEADER, EVENT_ID_HEADER, SEQ_HEADER, KafkaPublisher,  # noqa: E402
                                 LocalLedgerStore, OutboxEvent, table_topic)


def make_events(n: int, topics: int) -> list:
    """``n`` events over ``topics`` topics, each with a distinct id and key, values of about 480 bytes."""
    names = [table_topic("bench", "shop", f"t{i}") for i in range(topics)]
    out = []
    for i in range(n):
        key = json.dumps({"id": i}).encode()
        row = {"id": i, "n": i % 1000, "v": f"value-{i:012d}", "note": "x" * 40}
        value = json.dumps({"before": row, "after": row, "source": {
            "connector": "cassandra-cdc", "cluster": "bench", "node": "node1", "keyspace": "shop", "table": "t",
            "segment": "CommitLog-7-1.log", "position": i * 97, "ts_us": 1763000001000000 + i, "expired": False,
            "snapshot": False}, "op": "u", "ts_ms": 1763000015000, "id": uuid.uuid4().hex,
            "changed": ["v", "n"]}).encode()
        out.append(OutboxEvent(uuid.uuid4().hex, names[i % topics], key, value, i))
    return out


def client_round(bootstrap: str, events: list) -> tuple:
    """The events through a bare confluent-kafka producer configured as the publisher's: (wall s, thread CPU s)."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "acks": "all",
                  "max.in.flight.requests.per.connection": 1, "partitioner": "murmur2_random"})
    placed = [None] * len(events)

    def on_delivery(i, err, msg):
        if err is None:         # a failed event keeps None: reported after the flush
            placed[i] = (msg.partition(), msg.offset())
    batch = (BATCH_HEADER, f"client-{uuid.uuid4().hex}".encode())
    t0, c0 = time.perf_counter(), time.thread_time()
    for i, e in enumerate(events):
        headers = [(EVENT_ID_HEADER, e.event_id.encode()), batch, (SEQ_HEADER, str(e.seq).encode())]
        while True:
            try:
                p.produce(e.topic, value=e.value, key=e.key, headers=headers,
                          on_delivery=functools.partial(on_delivery, i))
                break
            except BufferError:
                p.poll(0.1)
    if p.flush(60):
        raise RuntimeError("client: events not acknowledged")
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    if None in placed:
        raise RuntimeError("client: an event was not delivered")
    return wall, cpu


def publish_round(publisher: KafkaPublisher, events: list) -> tuple:
    """The events through ``publish_batch`` as a new batch: (wall s, thread CPU s)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    res = publisher.publish_batch(f"bench-{uuid.uuid4().hex}", events)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    if res.produced != len(events):
        raise RuntimeError(f"publish_batch produced {res.produced} of {len(events)} events")
    return wall, cpu


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--topics", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--transactions", action="store_true", help="each batch one Kafka transaction")
    a = p.parse_args(argv)
    events = make_events(a.events, a.topics)
    work = Path(tempfile.mkdtemp(prefix="bench-publish-"))
    results: dict = {"client": [], "publish_batch": []}
    with run_kafka_broker(work / "kafka") as broker:
        publisher = KafkaPublisher(broker.bootstrap, LocalLedgerStore(work / "ledger"),
                                   transactional_id=f"bench-{uuid.uuid4().hex}" if a.transactions else None)
        try:
            publisher.ensure_topics(sorted({e.topic for e in events}))
            publish_round(publisher, events[:1000])      # warm: connections, producer id, topic metadata
            for r in range(a.rounds):
                for name in ("client", "publish_batch"):
                    before = os.times()
                    wall, cpu = (client_round(broker.bootstrap, events) if name == "client"
                                 else publish_round(publisher, events))
                    after = os.times()
                    proc = after.user - before.user + after.system - before.system
                    results[name].append((wall, cpu, proc))
                    print(f"round {r + 1} {name:14s} {wall:6.2f} s {a.events / wall:10,.0f} events/s   CPU per event: "
                          f"{cpu / a.events * 1e6:5.2f} us this thread, {proc / a.events * 1e6:5.2f} us process")
        finally:
            publisher.close()
    print(f"{a.events:,} events of ~{statistics.mean(len(e.value) for e in events[:1000]):.0f} bytes on {a.topics} "
          f"topics{', one transaction per batch' if a.transactions else ''}; medians of {a.rounds} rounds:")
    med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in results.items()}
    for k, (wall, cpu, proc) in med.items():
        print(f"  {k:14s} {a.events / wall:10,.0f} events/s   {cpu / a.events * 1e6:5.2f} us/event this thread   "
              f"{proc / a.events * 1e6:5.2f} us/event process")
    extra = (med["publish_batch"][1] - med["client"][1]) / a.events * 1e6
    print(f"  publish_batch adds {extra:.2f} us of CPU per event on its thread to the client's "
          f"({med['publish_batch'][1] / med['client'][1]:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
