"""Crashes, outages and bad input against Apache Kafka and the S3 server (SeaweedFS), on the local path (batches
in the pipeline's own process, Delta written by delta-rs); the Spark cluster path has its own in test_cluster.py.

Exactly once: the pipeline process is killed (``os._exit``: no flush, no cleanup, no exception handler) at every
fault point of every step, publisher points included, one crash after the other across several batches, and
rerun; then each event is in Kafka once, in the outbox's order, and replaying the topics gives exactly the
table the independent reference model computes from the workload. No segment is ever archived before its batch
is published. Outages: the broker killed in the middle of producing and started again on its data, the S3 server
frozen (SIGSTOP) in the middle of a Delta commit: the run fails, nothing is archived or duplicated, the retry
completes. Bad input: a damaged segment and an unknown table are quarantined with reasons while the rest of the
batch is published, and the counters say so. Compacted topics: what the broker keeps after compacting replays to the
same table, deleted keys gone.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from forked_runs import killed_runs
from servers import run_kafka_broker, run_s3_server

from reference_model import json_table
from reference_model import visible_table as model_table

from cdc_lib import pipeline as P
from cdc_lib.agent.shipper import Agent
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, START_US, Workload, sample_schema, write_cluster_segments
from cdc_lib.pipeline import steps
from cdc_lib.settings import AgentConfig
from cdc_lib.sinks.delta import read_outbox
from cdc_lib.storage.layout import Layout

NOW = START_US // 1_000_000 + 3600


def _config(tmp_path, s3, bootstrap, bucket, **kw) -> P.PipelineConfig:
    schema_file = tmp_path / "schema.cql"
    if not schema_file.exists():
        schema_file.write_text(SAMPLE_SCHEMA_CQL)
    settings = dict(store_url=f"s3://{bucket}/cdc", s3_endpoint_url=s3.endpoint_url,
                    s3_access_key=s3.access_key, s3_secret_key=s3.secret_key, cluster="c1",
                    schema_file=str(schema_file), kafka_bootstrap=bootstrap, now=NOW,
                    topic_prefix=f"t{uuid.uuid4().hex[:8]}", kafka_timeout_s=10)
    return P.PipelineConfig(**{**settings, **kw})


def _ship(raw: Path, cfg: P.PipelineConfig, state: Path) -> int:
    store = P.open_store(cfg)
    n = 0
    for node_dir in sorted(p for p in raw.iterdir() if p.is_dir()):
        agent = Agent(AgentConfig(cdc_raw=node_dir, store_url=cfg.store_url, cluster=cfg.cluster,
                                  node=node_dir.name, state_dir=state / node_dir.name), store=store)
        n += agent.run_once()
    return n


def _consume(bootstrap: str, prefix: str) -> dict:
    """{topic: [(event id, key, value)]} of every topic of the prefix, in partition order."""
    from confluent_kafka.admin import AdminClient
    topics = sorted(t for t in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
                    if t.startswith(prefix + "."))
    out = {}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 10,
                  "isolation.level": "read_committed"})
    try:
        for topic in topics:
            c.assign([TopicPartition(topic, 0, 0)])
            recs = []
            while True:
                m = c.poll(5)
                assert m is not None, f"no end of partition from {topic}"
                if m.error():
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    break
                headers = dict(m.headers() or [])
                recs.append((headers["cdc-event-id"].decode(), m.key(), m.value()))
            out[topic] = recs
    finally:
        c.close()
    return out


def _outbox_by_topic(cfg: P.PipelineConfig) -> dict:
    """{topic: [event ids]} in publish order over every batch the ledger knows, in batch order."""
    from cdc_lib.sinks.kafka import table_topic
    store = P.open_store(cfg)
    out: dict = {}
    for key in store.list("ledger/batches/"):
        b = P.Batch.from_dict(store.get_json(key))
        for r in read_outbox(P.delta_root(cfg, store), b.batch_id, cfg.delta_options()):
            out.setdefault(table_topic(cfg.topic_prefix, r["keyspace"], r["table"]), []).append(r["event_id"])
    return out


def _assert_nothing_archived_unpublished(cfg: P.PipelineConfig) -> None:
    store = P.open_store(cfg)
    archived = set(store.list(Layout.area_prefix(Layout.ARCHIVED, cfg.cluster)))
    for key in store.list("ledger/batches/"):
        b = P.Batch.from_dict(store.get_json(key))
        moved = [s for s in b.segments if Layout.archived(cfg.cluster, s["node"], s["name"]) in archived]
        if moved:
            assert store.exists(Layout.ledger(b.batch_id)), f"{b.batch_id}: archived before published"


def _assert_each_segment_in_one_batch(cfg: P.PipelineConfig) -> list:
    """Every archived segment was taken by exactly one batch (overlapping batches never share one); returns the
    batches."""
    store = P.open_store(cfg)
    batches = [P.Batch.from_dict(store.get_json(k)) for k in store.list("ledger/batches/")]
    taken = [s["key"] for b in batches for s in b.segments]
    assert len(taken) == len(set(taken)) == len(store.list(Layout.area_prefix(Layout.ARCHIVED, cfg.cluster)))
    return batches


def _assert_exactly_once_in_order(cfg: P.PipelineConfig) -> int:
    got = _consume(cfg.kafka_bootstrap, cfg.topic_prefix)
    want = _outbox_by_topic(cfg)
    assert sorted(got) == sorted(want)
    for topic, ids in want.items():
        in_kafka = [r[0] for r in got[topic]]
        assert len(in_kafka) == len(set(in_kafka)), f"{topic}: an event is in Kafka twice"
        assert in_kafka == ids, f"{topic}: Kafka does not hold the outbox once, in order"
    return sum(len(v) for v in want.values())


@pytest.fixture(scope="module")
def segments(tmp_path_factory):
    """Three replicas' segments (RF 3), a few per node so the pipeline needs several batches; and what was
    written (``cw.mutations``, the reference model's input)."""
    d = tmp_path_factory.mktemp("raw")
    cw = write_cluster_segments(d, sample_schema(), 240, seed=11, segment_size=16 * 1024)
    assert all(len(v) >= 3 for v in cw.segments.values())
    return d, cw


def _fresh_raw(segments, tmp_path: Path) -> Path:
    """A private copy of the generated cdc_raw dirs (the agent deletes what it shipped)."""
    import shutil
    raw = tmp_path / "raw"
    shutil.copytree(segments[0], raw)
    return raw


def _assert_topics_replay_to_the_model(cfg: P.PipelineConfig, mutations) -> None:
    """Each table's topic, replayed in order (the latest ``after`` per key), is the table the reference model says
    Cassandra shows at the batches' processing time."""
    from cdc_lib.sinks.kafka import table_topic
    got = _consume(cfg.kafka_bootstrap, cfg.topic_prefix)
    for t in sample_schema().tables.values():
        if t.keyspace.startswith("system"):
            continue
        replayed: dict = {}
        for _, key, value in got.get(table_topic(cfg.topic_prefix, t.keyspace, t.name), []):
            after = None if value is None else json.loads(value)["after"]       # None: a tombstone
            if after is None:
                replayed.pop(key.decode(), None)
            else:
                replayed[key.decode()] = after
        assert replayed == json_table(t, model_table(t, mutations, cfg.now)), t.name


# ------------------------------------------------------------------------------------------------ crashes

# Every fault point of every step (cdc_lib.pipeline.FAULT_POINTS, the publisher's points as publish:<point>), in
# the order a batch passes them, each with the how-manieth time it is reached (counted from the run's start).
KILL_PLAN = [
    ("claim:manifest_written", 1), ("claim:pointer_written", 1),
    ("transform:before", 1), ("transform:outbox", 1),      # the outbox committed, no state table yet
    ("transform:state", 2),                                # two state tables committed, or more (at once)
    ("transform:done", 1),
    ("publish:before", 1), ("publish:intent_written", 1), ("publish:scanned", 1),
    ("publish:produced", 7),                               # 7 events handed to the producer, none flushed
    ("publish:delivered", 3),                              # 3 acknowledged, the rest in flight
    ("publish:before_flush", 1), ("publish:flushed", 1), ("publish:verified", 1), ("publish:ledger_written", 1),
    ("publish:done", 1),
    ("archive:before", 1), ("archive:segment", 1),         # one segment moved, the others not
    ("archive:done", 1),
    ("claim:manifest_written", 1), ("publish:produced", 3),   # the next batch dies early, then mid-produce
]



@pytest.mark.parametrize("transactions", [False, True], ids=["idempotent", "transactions"])
def test_pipeline_killed_at_every_fault_point_then_rerun_publishes_each_event_once(segments, tmp_path, s3_server,
                                                                                  s3_bucket, kafka_broker,
                                                                                  transactions, monkeypatch):
    """Without transactions (the default) the runs die at every fault point in turn. With Kafka transactions, at
    every publisher point (claim, transform and archive do not depend on the producer's mode), and the check
    reads as read_committed (librdkafka's default): a killed run's open transaction is aborted by the rerun's
    producer (same transactional id) and never seen."""
    assert {p.split(":")[0] for p, _ in KILL_PLAN} == {p.split(":")[0] for p in P.FAULT_POINTS}
    plan = [(point, nth) for point, nth in KILL_PLAN if not transactions or point.startswith("publish:")]
    # A short Delta writer lease: a run killed inside the transform leaves it behind, and the next run waits for
    # its expiry (60 s by default) before it may write.
    cfg = _config(tmp_path, s3_server, kafka_broker, s3_bucket, max_segments=3, kafka_transactions=transactions,
                  delta_lock_ttl_s=5)
    assert _ship(_fresh_raw(segments, tmp_path), cfg, tmp_path / "agent") >= 6
    with killed_runs(tmp_path) as runs:
        for point, nth in plan:
            status, log = runs.run(dataclasses.asdict(cfg), point, nth)
            assert status == 9, f"{point} #{nth} never reached (exit {status}):\n{log}"
            _assert_nothing_archived_unpublished(cfg)
    made = []           # the publishers the rerun makes: one serves all its batches (their rerun too)
    publisher_for = steps.publisher_for
    monkeypatch.setattr(steps, "publisher_for", lambda *a, **k: made.append(publisher_for(*a, **k)) or made[-1])
    done = P.run_until_idle(cfg)                       # the rerun: resumes the crashed batch, then the rest
    assert len(done) >= 2 and len(made) == 1
    store = P.open_store(cfg)
    assert store.list(Layout.area_prefix(Layout.INCOMING, cfg.cluster)) == []
    _assert_nothing_archived_unpublished(cfg)
    events = _assert_exactly_once_in_order(cfg)
    assert events > 100
    _assert_topics_replay_to_the_model(cfg, segments[1].mutations)
    metrics = P.read_metrics(cfg)
    assert metrics["totals"]["claim.resumed"] >= 5          # the crashed batches were resumed, not re-claimed


# Kills while batches overlap (run_until_idle: a batch published and archived on the second thread while the next
# is claimed and transformed); the nth time either thread reaches the point. Which step the other thread is in
# then varies from run to run: each kill must leave what the rerun finishes exactly once.
OVERLAP_KILL_PLAN = [("transform:done", 2), ("publish:produced", 30), ("claim:pointer_written", 1),
                     ("archive:segment", 2)]


def test_overlapping_batches_killed_then_rerun_publishes_each_event_once_from_segments_of_one_batch_each(
        segments, tmp_path, s3_server, s3_bucket, kafka_broker):
    cfg = _config(tmp_path, s3_server, kafka_broker, s3_bucket, max_segments=3, delta_lock_ttl_s=5)
    assert cfg.overlap_batches
    assert _ship(_fresh_raw(segments, tmp_path), cfg, tmp_path / "agent") >= 12
    with killed_runs(tmp_path) as runs:
        for point, nth in OVERLAP_KILL_PLAN:
            status, log = runs.run(dataclasses.asdict(cfg), point, nth, loop="run_until_idle")
            assert status == 9, f"{point} #{nth} never reached (exit {status}):\n{log}"
            _assert_nothing_archived_unpublished(cfg)
    assert P.run_until_idle(cfg)                       # the rerun: resumes what the kills left, then the rest
    store = P.open_store(cfg)
    assert store.list(Layout.area_prefix(Layout.INCOMING, cfg.cluster)) == []
    assert {b.state for b in _assert_each_segment_in_one_batch(cfg)} == {"archived"}
    assert _assert_exactly_once_in_order(cfg) > 100
    _assert_topics_replay_to_the_model(cfg, segments[1].mutations)


class FakeTime:
    """A monotonic clock that only ``sleep`` (and the test) moves; ``on_sleep`` runs at the first sleep."""

    def __init__(self, on_sleep=None):
        self.now, self.sleeps, self.on_sleep = 0.0, [], on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        if self.on_sleep is not None and not self.sleeps:
            self.on_sleep()
        self.sleeps.append(seconds)
        self.now += seconds


def test_run_for_takes_what_arrives_overlaps_batches_stops_at_its_end_and_a_crash_resumes_the_older_batch_first(
        segments, tmp_path, s3_server, s3_bucket, kafka_broker, monkeypatch):
    """The follow task's loop (steps.run_for): segments shipped while it waits are taken at the next poll; a batch is
    published while the next one is claimed and transformed (overlap_batches), each on segments of its own; a crash
    then leaves two unfinished batches, and the next window resumes the older one first, then the newer, each
    published once and in order; no batch starts after the window, those in flight finish; an idle window claims
    once, then only lists incoming/."""
    from cdc_lib.pipeline import steps
    claims = []
    real_claim = steps.claim
    on_claim = [lambda batch: None]

    def claim(*a, **kw):
        claims.append(real_claim(*a, **kw))
        on_claim[0](claims[-1])
        return claims[-1]
    monkeypatch.setattr(steps, "claim", claim)
    cfg = _config(tmp_path, s3_server, kafka_broker, s3_bucket, max_segments=3, follow_poll_s=2)
    assert cfg.overlap_batches                                  # the default
    raw = _fresh_raw(segments, tmp_path)
    store = P.open_store(cfg)
    incoming = Layout.area_prefix(Layout.INCOMING, cfg.cluster)

    class Crash(Exception):
        pass

    second_transformed = threading.Event()

    def crash_publishing_the_first_batch_once_the_second_is_transformed(point):
        if point == "transform:done" and sum(not b.empty for b in claims) == 2:
            second_transformed.set()
        if point == "publish:produced":           # batch 1's publish, on the second thread
            assert second_transformed.wait(120), "the second batch was not transformed while the first published"
            raise Crash()
    arrive = FakeTime(on_sleep=lambda: _ship(raw, cfg, tmp_path / "agent"))
    with pytest.raises(Crash):
        P.run_for(cfg, 60, "run-1", fault=crash_publishing_the_first_batch_once_the_second_is_transformed,
                  clock=arrive.clock, sleep=arrive.sleep)
    assert claims[0].empty and arrive.sleeps == [2]          # nothing yet: it waited one poll, then the segments
    assert [b.batch_seq for b in claims[1:]] == [1, 2]
    assert [P.read_batch(store, b.batch_id).state for b in claims[1:]] == ["transformed", "transformed"]
    _assert_nothing_archived_unpublished(cfg)

    late = FakeTime()

    def window_ends(batch):                       # the window ends once the second unfinished batch is resumed
        if batch.batch_seq == 2:
            late.now = 31
    claims.clear()
    on_claim[0] = window_ends
    done = P.run_for(cfg, 30, "run-2", clock=late.clock, sleep=late.sleep)
    assert [(b.batch_seq, b.resumed) for b in claims] == [(1, True), (2, True)]     # the older one first
    assert [(b.batch_seq, b.state) for b in done] == [(1, "archived"), (2, "archived")]
    assert store.list(incoming) and late.sleeps == []        # segments left for the next window

    claims.clear()
    on_claim[0] = lambda batch: None
    idle = FakeTime()
    done = P.run_for(cfg, 30, "run-3", clock=idle.clock, sleep=idle.sleep)
    assert done and done[0].batch_seq == 3 and store.list(incoming) == []
    assert [b.state for b in done] == ["archived"] * len(done)
    # the first claim that finds nothing waits for the batch in flight; the next poll's claim finds nothing either,
    # then 14 polls only list
    assert len(claims) == len(done) + 2 and claims[-1].empty and claims[-2].empty
    assert idle.now == 30 and len(idle.sleeps) == 15
    assert {b.claimed_by for b in done} == {"run-3"}
    _assert_each_segment_in_one_batch(cfg)
    assert _assert_exactly_once_in_order(cfg) > 100
    _assert_topics_replay_to_the_model(cfg, segments[1].mutations)
    assert P.read_metrics(cfg)["totals"]["claim.resumed"] == 2
    assert P.run_for(cfg, 0) == []                              # a window of 0: no batch


# ------------------------------------------------------------------------------------------------ outages

def test_broker_killed_mid_publish_run_fails_nothing_archived_then_retry_on_its_data(segments, tmp_path, s3_server,
                                                                                    s3_bucket):
    with run_kafka_broker(tmp_path / "kafka") as broker:
        cfg = _config(tmp_path, s3_server, broker.bootstrap, s3_bucket, max_segments=100, kafka_timeout_s=5)
        _ship(_fresh_raw(segments, tmp_path), cfg, tmp_path / "agent")
        batch = P.transform(cfg, P.claim(cfg))
        assert batch.steps["transform"]["events"] > 40
        produced = [0]

        def fault(point):
            if point == "publish:produced":
                produced[0] += 1
                if produced[0] == 20:
                    os.kill(broker.pid, signal.SIGKILL)     # the broker dies with 20 events on their way
        with pytest.raises(Exception) as err:
            P.publish(cfg, batch, fault=fault)
    assert "not acknowledged" in str(err.value) or "delivery failed" in str(err.value), err.value
    store = P.open_store(cfg)
    assert store.list(Layout.area_prefix(Layout.ARCHIVED, cfg.cluster)) == []
    assert P.read_batch(store, batch.batch_id).state == "transformed"
    with pytest.raises(P.PipelineError):
        P.archive(cfg, batch)
    with run_kafka_broker(tmp_path / "kafka") as again:  # the same broker back, with what it had acknowledged
        assert again.bootstrap == cfg.kafka_bootstrap
        first = P.run_once(cfg)
        assert first.batch_id == batch.batch_id and first.state == "archived"
        P.run_until_idle(cfg)
        _assert_exactly_once_in_order(cfg)
        _assert_topics_replay_to_the_model(cfg, segments[1].mutations)


def test_s3_frozen_mid_commit_run_fails_nothing_lost_then_retry(segments, tmp_path, kafka_broker):
    with run_s3_server(tmp_path / "weed", bucket="cdc") as s3:
        # a short lease: the frozen transform cannot release the Delta writer lock, the retry takes it over
        cfg = _config(tmp_path, s3, kafka_broker, "cdc", max_segments=100, s3_timeout_s=2, delta_lock_ttl_s=3)
        _ship(_fresh_raw(segments, tmp_path), cfg, tmp_path / "agent")
        frozen = threading.Event()

        def fault(point):
            if point == "transform:outbox":        # the state tables' MERGEs start now: freeze in the middle
                threading.Timer(0.05, lambda: (os.kill(s3.pid, signal.SIGSTOP), frozen.set())).start()
        try:
            with pytest.raises(Exception):
                P.transform(cfg, P.claim(cfg), fault=fault)
            assert frozen.is_set()
        finally:
            os.kill(s3.pid, signal.SIGCONT)
        store = P.open_store(cfg)
        [key] = store.list("ledger/batches/")
        batch = P.Batch.from_dict(store.get_json(key))
        assert batch.state == "claimed" and not store.exists(Layout.ledger(batch.batch_id))
        assert store.list(Layout.area_prefix(Layout.ARCHIVED, cfg.cluster)) == []
        again = P.run_once(cfg)                      # the retry finishes the batch (the outbox is not rewritten)
        assert again.batch_id == batch.batch_id and again.state == "archived"
        P.run_until_idle(cfg)
        _assert_exactly_once_in_order(cfg)
        _assert_topics_replay_to_the_model(cfg, segments[1].mutations)
        assert store.list(Layout.area_prefix(Layout.INCOMING, cfg.cluster)) == []


def test_s3_down_archive_and_claim_fail_nothing_archived_then_retry(segments, tmp_path, kafka_broker):
    with run_s3_server(tmp_path / "weed", bucket="cdc") as s3:
        cfg = _config(tmp_path, s3, kafka_broker, "cdc", max_segments=100, s3_timeout_s=2)
        _ship(_fresh_raw(segments, tmp_path), cfg, tmp_path / "agent")
        batch = P.publish(cfg, P.transform(cfg, P.claim(cfg)))
        P.open_store(cfg).fs.retries = 1             # s3fs's own retries (5) would only make the test slow
        os.kill(s3.pid, signal.SIGSTOP)              # the store stops answering
        try:
            with pytest.raises(Exception):
                P.archive(cfg, batch)
            with pytest.raises(Exception):
                P.claim(cfg)
        finally:
            os.kill(s3.pid, signal.SIGCONT)
        store = P.open_store(cfg)
        assert store.list(Layout.area_prefix(Layout.ARCHIVED, cfg.cluster)) == []
        assert P.read_batch(store, batch.batch_id).state == "published"
        again = P.run_once(cfg)                      # the retry finishes the batch
        assert again.batch_id == batch.batch_id and again.state == "archived"
        P.run_until_idle(cfg)
        _assert_exactly_once_in_order(cfg)
        assert store.list(Layout.area_prefix(Layout.INCOMING, cfg.cluster)) == []


# ------------------------------------------------------------------------------------------------ bad input

def test_damaged_segment_and_unknown_table_are_quarantined_rest_published(tmp_path, s3_server, s3_bucket,
                                                                         kafka_broker):
    schema = sample_schema()
    raw = tmp_path / "raw"
    write_cluster_segments(raw, schema, 150, seed=5, segment_size=32 * 1024, nodes=3, rf=3,
                           workload=Workload(schema, seed=5))
    # a damaged copy of one segment, as a broken disk gives it: bytes flipped in the middle
    src = sorted((raw / "node1").glob("CommitLog-*.log"))[0]
    bad_dir = raw / "node9"
    bad_dir.mkdir()
    data = bytearray(src.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 48):
        data[i] ^= 0xA5
    (bad_dir / src.name).write_bytes(bytes(data))
    (bad_dir / (src.stem + "_cdc.idx")).write_text(f"{len(data)}\nCOMPLETED")
    # the pipeline's schema does not know shop.page_views: its mutations are unknown-table entries
    cql = SAMPLE_SCHEMA_CQL
    start = cql.index("CREATE TABLE shop.page_views")
    end = cql.index(";", start) + 1
    (tmp_path / "schema.cql").write_text(cql[:start] + cql[end:])
    cfg = _config(tmp_path, s3_server, kafka_broker, s3_bucket, max_segments=100)
    assert _ship(raw, cfg, tmp_path / "agent") >= 4
    batch = P.run_once(cfg)
    t = batch.steps["transform"]
    assert t["damaged"] >= 1 and t["damaged_segments"] == 1
    assert t["unknown_table_entries"] > 0
    store = P.open_store(cfg)
    # the damaged segment is in quarantine with a reason naming the damage, not archived
    qkey = Layout.quarantined(cfg.cluster, "node9", src.name)
    reason = store.get_json(Layout.reason(qkey))
    assert reason["damage"] and all(d["kind"] for d in reason["damage"])
    assert not store.exists(Layout.archived(cfg.cluster, "node9", src.name))
    # every quarantined entry has its bytes and a reason
    entries = [q for q in batch.steps["quarantined"]]
    assert {q["kind"] for q in entries} >= {"unknown_table"}
    for q in entries:
        assert store.exists(q["key"]) and store.get_json(Layout.reason(q["key"]))["reason"]
    # the rest of the batch went through: events of the known tables, none of page_views
    got = _consume(cfg.kafka_bootstrap, cfg.topic_prefix)
    assert got and not any(t.endswith(".page_views") for t in got)
    assert sum(len(v) for v in got.values()) == batch.steps["publish"]["events"] > 0
    _assert_exactly_once_in_order(cfg)
    # what a user reads: the counters file
    m = P.read_metrics(cfg)
    assert m["totals"]["transform.unknown_table_entries"] == t["unknown_table_entries"]
    assert m["totals"]["archive.quarantined_segments"] == 1


# ------------------------------------------------------------------------------------------ compacted topics

# Topics the broker compacts as soon as it can: every append after 100 ms rolls the log, any closed segment makes
# the log cleanable (the test broker's cleaner looks every second), and a tombstone goes at the pass after the one
# that compacted it.
FAST_COMPACTION = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
                   "delete.retention.ms": "0"}


def test_compacted_topics_keep_each_keys_latest_row_and_drop_deleted_keys(segments, tmp_path, s3_server, s3_bucket,
                                                                          kafka_broker):
    """Topics with ``cleanup.policy=compact`` (a tombstone follows each delete event by default there): after the
    broker compacted what several batches published, what it kept still replays to the table the reference model
    says Cassandra shows (each key's latest event carries the whole row), superseded events are gone, and so are
    some deleted keys altogether (their delete event, then their tombstone)."""
    from cdc_lib.sinks.kafka import table_topic
    cfg = _config(tmp_path, s3_server, kafka_broker, s3_bucket, max_segments=5, kafka_topic_config=FAST_COMPACTION)
    assert cfg.publishes_tombstones
    assert _ship(_fresh_raw(segments, tmp_path), cfg, tmp_path / "agent") >= 6
    # Each batch's first record rolls the log over the batch before, which the cleaner then compacts; a third
    # batch's lets it drop the tombstones of the first. The batches run one at a time with a pause longer than
    # the cleaner's look between them: run_until_idle overlaps them, and two batches published within one look
    # are compacted in one pass, which leaves their tombstones (a pass after theirs removes them).
    batches = []
    while not (batch := P.run_once(cfg)).empty:
        batches.append(batch)
        time.sleep(2.5)
    assert len(batches) >= 3
    store = P.open_store(cfg)
    published: dict = {}          # topic -> [(key, op)] in publish order, a tombstone after each delete
    for b in batches:
        for r in read_outbox(P.delta_root(cfg, store), b.batch_id, cfg.delta_options()):
            events = published.setdefault(table_topic(cfg.topic_prefix, r["keyspace"], r["table"]), [])
            events += [(r["key_json"], r["op"])] + ([(r["key_json"], "tombstone")] if r["op"] == "d" else [])
    ops = [op for events in published.values() for _, op in events]
    assert {"c", "u", "d", "tombstone"} <= set(ops), "inserts, updates and deletes, each delete with its tombstone"
    deleted = {(topic, key) for topic, events in published.items()
               for key in {k for k, _ in events} if [op for k, op in events if k == key][-1] == "tombstone"}
    deadline = time.monotonic() + 60
    while True:
        kept = _consume(cfg.kafka_bootstrap, cfg.topic_prefix)
        gone = {(topic, key) for topic, key in deleted
                if not any(k.decode() == key for _, k, _ in kept.get(topic, []))}
        if gone or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert gone, "no deleted key was compacted away"
    assert sum(map(len, kept.values())) < len(ops), "nothing was compacted"
    for topic, records in kept.items():
        ids = [event_id for event_id, _, _ in records]
        assert len(ids) == len(set(ids)), f"{topic}: an event is in Kafka twice"
        for key in {k for k, _ in published.get(topic, [])}:
            left = [(k.decode(), "tombstone" if v is None else json.loads(v)["op"]) for _, k, v in records
                    if k.decode() == key]
            mine = [e for e in published[topic] if e[0] == key]
            assert not left or left[-1] == mine[-1], f"{topic} {key}: the latest record is not the one kept last"
    _assert_topics_replay_to_the_model(cfg, segments[1].mutations)
