"""Backfill mode ``replay``: archived batches again, to rebuild a lost state table or re-emit missed events.

What a user would notice: a deleted state table comes back equal to what it was, and the replay's events are
exactly the repair (none when nothing was lost); a re-emit publishes the chosen batches' events again unchanged
(same ids, same bytes, only the chosen tables); nothing is replayed twice when the claim dies half-way; what cannot
be replayed (quarantined or missing segments, pruned outbox rows) is said, never silently dropped.
"""
from __future__ import annotations

import json
import shutil

import pytest
from servers import consume_topic

from cdc_lib import pipeline as P
from cdc_lib.agent.shipper import Agent
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, START_US, Workload, sample_schema, write_cluster_segments
from cdc_lib.errors import ConfigError
from cdc_lib.pipeline.backfill import request_backfill
from cdc_lib.pipeline.replay import request_replay
from cdc_lib.pipeline.requests import REQUEST_KEY
from cdc_lib.settings import AgentConfig
from cdc_lib.sinks.delta import read_outbox, read_state, state_table_uri
from cdc_lib.sinks.kafka import table_topic
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import sha256_bytes

NOW = START_US // 1_000_000 + 3600


@pytest.fixture
def cfg(tmp_path) -> P.PipelineConfig:
    (tmp_path / "schema.cql").write_text(SAMPLE_SCHEMA_CQL)
    (tmp_path / "store").mkdir()
    return P.PipelineConfig(store_url=str(tmp_path / "store"), cluster="c1", schema_file=str(tmp_path / "schema.cql"),
                            now=NOW)


# ------------------------------------------------------------------------------------ selection and claims


def _archived_batch(store, seq: int, names: list, now: int, quarantined: tuple = ()) -> None:
    """A batch as archive leaves it: manifest 'archived', its segments in archived/ (or quarantine)."""
    segs = []
    for node, name in names:
        data = f"{node}/{name}".encode()
        key = Layout.archived("c1", node, name)
        if (node, name) not in quarantined:
            store.put_bytes(key, data, checksum=sha256_bytes(data))
        segs.append({"key": Layout.incoming("c1", node, name), "node": node, "name": name, "size": len(data),
                     "checksum": sha256_bytes(data)})
    q = [{"node": n, "segment": s, "kind": "crc_mismatch", "position": 8, "reason": "x", "key": "k"}
         for n, s in quarantined]
    b = P.Batch(P.batch_id_for(seq), seq, "archived", segs, now, None, steps={"quarantined": q,
                                                                             "publish": {"events": 3}})
    P.save_batch(store, b)
    store.put_json(P.POINTER_KEY, {"batch_seq": seq, "batch_id": b.batch_id})


def test_rebuild_selects_archived_segments_and_says_what_it_skips(cfg):
    store = P.open_store(cfg)
    _archived_batch(store, 1, [("n1", "CommitLog-7-1.log"), ("n2", "CommitLog-7-5.log")], 100)
    _archived_batch(store, 2, [("n1", "CommitLog-7-2.log"), ("n2", "CommitLog-7-6.log")], 200,
                    quarantined=(("n2", "CommitLog-7-6.log"),))
    P.save_batch(store, P.Batch(P.batch_id_for(3), 3, "archived", [], 300, 200, snapshot=True))
    store.put_json(P.POINTER_KEY, {"batch_seq": 3, "batch_id": P.batch_id_for(3)})
    store.delete(Layout.archived("c1", "n1", "CommitLog-7-2.log"))        # archive retention took it

    answer = request_replay(cfg, purpose="rebuild")
    assert answer["batches"] == 3 and answer["items"] == 2
    request = store.get_json(REQUEST_KEY)
    assert [p["key"] for p in request["pending"]] == [Layout.archived("c1", "n1", "CommitLog-7-1.log"),
                                                      Layout.archived("c1", "n2", "CommitLog-7-5.log")]
    assert answer["skipped_quarantined_segments"] == 1 and answer["skipped_batches_without_segments"] == 1
    assert answer["missing_segments"] == [Layout.archived("c1", "n1", "CommitLog-7-2.log")]


def test_rebuild_request_with_nothing_to_replay_is_an_error_that_counts_why(cfg):
    store = P.open_store(cfg)
    _archived_batch(store, 1, [("n1", "CommitLog-7-1.log")], 100, quarantined=(("n1", "CommitLog-7-1.log"),))
    with pytest.raises(ConfigError, match="nothing to replay.*1 batch\\(es\\) matched.*1 quarantined"):
        request_replay(cfg, purpose="rebuild")
    assert not store.exists(REQUEST_KEY)


def test_replay_arguments_are_checked(cfg):
    store = P.open_store(cfg)
    _archived_batch(store, 1, [("n1", "CommitLog-7-1.log")], 100)
    with pytest.raises(ConfigError, match="purpose 'fix'"):
        request_replay(cfg, purpose="fix")
    with pytest.raises(ConfigError, match="tables selects events to re-emit"):
        request_replay(cfg, purpose="rebuild", tables="shop.orders")
    with pytest.raises(ConfigError, match="nodes selects segments"):
        request_replay(cfg, purpose="reemit", nodes=["n1"])
    with pytest.raises(ConfigError, match="batches_from must be a whole number"):
        request_replay(cfg, batches_from="first")
    with pytest.raises(ConfigError, match="mode snapshot takes no purpose"):
        request_backfill(cfg, mode="snapshot", purpose="reemit")
    with pytest.raises(ConfigError, match="mode 'sstable'"):
        request_backfill(cfg, mode="sstable")
    request_backfill(cfg, mode="replay", nodes="n1")
    with pytest.raises(ConfigError, match="still pending with 1 item"):
        request_backfill(cfg, mode="replay")


def test_replay_batches_come_before_new_segments_and_never_twice_after_a_crash(cfg):
    store = P.open_store(cfg)
    _archived_batch(store, 1, [("n1", f"CommitLog-7-{i}.log") for i in range(1, 6)], 100)
    new = b"new segment"
    store.put_bytes(Layout.incoming("c1", "n1", "CommitLog-7-9.log"), new, checksum=sha256_bytes(new))
    request_replay(cfg, purpose="rebuild", nodes="n1")
    cfg.max_segments = 2

    class Crash(Exception):
        pass

    def die_after_pointer(point):
        if point == "claim:pointer_written":
            raise Crash(point)

    # The claim dies after the manifest and the pointer, before it took its share off the request.
    real = P.steps.consume_share
    P.steps.consume_share = lambda store, batch: None
    try:
        with pytest.raises(Crash):
            P.claim(cfg, fault=die_after_pointer)
    finally:
        P.steps.consume_share = real
    first = P.read_batch(store, P.batch_id_for(2))
    assert first.backfill["purpose"] == "rebuild" and [s["name"] for s in first.segments] == \
        ["CommitLog-7-1.log", "CommitLog-7-2.log"]
    assert all(s["key"].startswith("archived/") for s in first.segments)
    assert len(store.get_json(REQUEST_KEY)["pending"]) == 5           # not taken off: the crash

    first.state = "archived"                                                 # (as the rerun would finish it)
    P.save_batch(store, first)
    names = []
    for seq in (3, 4):
        b = P.claim(cfg)
        assert b.batch_seq == seq and b.backfill
        names += [s["name"] for s in b.segments]
        b.state = "archived"
        P.save_batch(store, b)
    assert names == ["CommitLog-7-3.log", "CommitLog-7-4.log", "CommitLog-7-5.log"]   # 1 and 2 not again
    assert not store.exists(REQUEST_KEY)
    stream = P.claim(cfg)                                                    # then the stream goes on
    assert not stream.backfill and [s["name"] for s in stream.segments] == ["CommitLog-7-9.log"]


# ---------------------------------------------------------------------------------- real runs, real Kafka


@pytest.fixture
def processed(tmp_path, cfg, kafka_broker, spark_session):
    """Segments of a 3-replica workload shipped by the agents and run through the pipeline (several batches)."""
    schema = sample_schema()
    cw = write_cluster_segments(tmp_path / "cassandra", schema, 240, seed=11, workload=Workload(schema, seed=11),
                                segment_size=32 * 1024)
    store = P.open_store(cfg)
    for node in sorted(cw.segments):
        Agent(AgentConfig(cdc_raw=tmp_path / "cassandra" / node, store_url=cfg.store_url, cluster="c1", node=node,
                          state_dir=tmp_path / "agent" / node), store=store).run_once()
    cfg.kafka_bootstrap = kafka_broker
    cfg.topic_prefix = f"replay{tmp_path.name[-6:]}"
    cfg.max_segments = 4
    batches = P.run_until_idle(cfg, spark=spark_session)
    assert len(batches) >= 2 and all(b.state == "archived" for b in batches)
    return cfg, batches


def _state(cfg, table) -> list:
    """The state table's rows: values, cells with their timestamps, TTLs and tombstones (not which batch wrote
    them last, ``_cdc_updated_batch``, which a rebuild changes by design)."""
    rows = read_state(P.delta_root(cfg, P.open_store(cfg)), table.keyspace, table.name).to_pylist()
    return sorted(json.dumps({k: v for k, v in r.items() if k != "_cdc_updated_batch"}, sort_keys=True,
                             default=repr) for r in rows)


def _outbox(cfg, batch_id) -> list:
    return list(read_outbox(P.delta_root(cfg, P.open_store(cfg)), batch_id))


def test_rebuild_brings_a_deleted_state_table_back_and_emits_only_the_repair(processed, spark_session):
    cfg, batches = processed
    table = sample_schema().by_name("shop", "orders")
    before = _state(cfg, table)
    assert before
    root = P.delta_root(cfg, P.open_store(cfg))
    shutil.rmtree(state_table_uri(root, table.keyspace, table.name))        # the table is lost

    answer = request_backfill(cfg, mode="replay", purpose="rebuild")
    assert answer["items"] == sum(len(b.segments) for b in batches)
    replayed = P.run_until_idle(cfg, spark=spark_session)
    assert replayed and all(b.backfill["purpose"] == "rebuild" for b in replayed)
    assert _state(cfg, table) == before                                      # the same rows, cells and times
    store = P.open_store(cfg)
    for b in replayed:                                                       # the segments stayed archived
        assert all(store.exists(s["key"]) and s["key"].startswith("archived/") for s in b.segments)
        assert b.steps["archive"]["replayed_segments"] == len(b.segments)
    events = [r for b in replayed for r in _outbox(cfg, b.batch_id)]
    # Only the lost table changed, so only it has events, and they bring its rows back ('c', full rows).
    assert events and {(r["keyspace"], r["table"]) for r in events} == {("shop", "orders")}
    assert {r["op"] for r in events} <= {"c", "u", "d"}

    # Nothing lost: a second rebuild merges into state that already holds every cell and emits nothing.
    request_backfill(cfg, mode="replay", purpose="rebuild")
    again = P.run_until_idle(cfg, spark=spark_session)
    assert again and sum(b.steps["transform"]["events"] for b in again) == 0
    assert _state(cfg, table) == before


def test_reemit_publishes_the_chosen_batches_events_again_unchanged(processed):
    cfg, batches = processed
    source = batches[0]
    original = _outbox(cfg, source.batch_id)
    wanted = {"shop.orders", "shop.sessions"}
    answer = request_backfill(cfg, mode="replay", purpose="reemit", batches_from=source.batch_seq,
                              batches_to=source.batch_seq, tables=",".join(sorted(wanted)))
    assert answer["items"] == 1
    (b,) = P.run_until_idle(cfg)
    assert b.backfill["purpose"] == "reemit" and not b.segments
    copied = _outbox(cfg, b.batch_id)
    kept = [r for r in original if f"{r['keyspace']}.{r['table']}" in wanted]
    assert kept and len(kept) < len(original)
    strip = ("batch_id", "batch_seq", "seq")
    assert [{k: v for k, v in r.items() if k not in strip} for r in copied] == \
        [{k: v for k, v in r.items() if k not in strip} for r in kept]      # same events, same order
    assert b.steps["publish"]["events"] == len(kept)
    # In Kafka: each re-emitted event is there twice (the original and the copy, with the same id and bytes).
    for name in sorted(wanted):
        ks, tn = name.split(".")
        records = consume_topic(cfg.kafka_bootstrap, table_topic(cfg.topic_prefix, ks, tn))
        copies = [r for r in records if r.batch == b.batch_id]
        originals = {r.event_id: r.value for r in records if r.batch == source.batch_id}
        assert copies and all(originals[r.event_id] == r.value for r in copies)


def test_reemit_of_pruned_outbox_rows_is_an_error_naming_the_batch(processed):
    """The maintenance step's outbox retention took the rows of every archived batch older than it keeps."""
    cfg, batches = processed
    source = batches[0]
    cfg.outbox_retention_hours = 1
    cfg.now = NOW + 3601
    assert P.delta_upkeep(cfg)["outbox_rows_deleted"] == sum(b.steps["publish"]["events"] for b in batches)
    assert not _outbox(cfg, source.batch_id)
    request_backfill(cfg, mode="replay", purpose="reemit", batches_from=source.batch_seq,
                     batches_to=source.batch_seq)
    b = P.claim(cfg)
    with pytest.raises(P.PipelineError, match=f"no longer holds the .* events of batch {source.batch_id}"):
        P.transform(cfg, b)
