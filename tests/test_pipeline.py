"""The pipeline's steps on a local store, without Spark: what gets claimed, resumed, refused and counted.

(The Spark step itself is covered by test_merge_batch.py, the whole chain by test_e2e.py and test_faults.py.)
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from cdc_lib import pipeline as P
from cdc_lib.celllog.records import mutation_records, records_to_batch
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, START_US, Workload, sample_schema
from cdc_lib.errors import ConfigError
from cdc_lib.pipeline import steps
from cdc_lib.sinks.delta import DeltaRsStateStore, read_outbox, run_store_batch
from cdc_lib.storage.layout import Layout
from cdc_lib.storage.objects import ObjectStore, sha256_bytes

NOW = START_US // 1_000_000 + 10


def _segment_name(i: int) -> str:
    return f"CommitLog-7-{1_000 + i}.log"


def _put_segment(store: ObjectStore, node: str, i: int, size: int = 100, complete: bool = True) -> str:
    key = Layout.incoming("c1", node, _segment_name(i))
    data = bytes([i % 251]) * size
    if complete:
        store.put_bytes(key, data, checksum=sha256_bytes(data))
    else:
        store.put_bytes(key, data)          # no sidecar: an upload cut short
    return key


@pytest.fixture
def cfg(tmp_path) -> P.PipelineConfig:
    (tmp_path / "schema.cql").write_text(SAMPLE_SCHEMA_CQL)
    (tmp_path / "store").mkdir()          # made by the agents (the pipeline never creates its store)
    return P.PipelineConfig(store_url=str(tmp_path / "store"), cluster="c1", schema_file=str(tmp_path / "schema.cql"),
                            now=NOW)


def test_claim_takes_complete_segments_oldest_first_per_node_within_limits(cfg):
    store = P.open_store(cfg)
    for i in (3, 1, 2):
        _put_segment(store, "n1", i)
    for i in (12, 11):
        _put_segment(store, "n2", i)
    _put_segment(store, "n2", 10, complete=False)
    cfg.max_segments = 3
    b = P.claim(cfg, "run-1")
    # every node's oldest first, interleaved so no node waits behind another
    assert [(s["node"], s["name"]) for s in b.segments] == [
        ("n1", _segment_name(1)), ("n2", _segment_name(11)), ("n1", _segment_name(2))]
    assert b.batch_seq == 1 and b.state == "claimed" and b.now == NOW
    assert b.steps["claim"]["incomplete_uploads"] == 1 and b.steps["claim"]["pending"] == 2
    stored = P.read_batch(store, b.batch_id)
    assert stored.segments == b.segments and stored.claimed_by == "run-1"


def test_claim_reads_the_sidecars_of_the_segments_it_takes_only(cfg, monkeypatch):
    """One sidecar read per segment of the batch, none of those left waiting; a sidecar gone since the listing
    (no longer complete) leaves that segment and its node's later ones for a later batch."""
    store = P.open_store(cfg)
    for i in (1, 2, 3, 4):
        _put_segment(store, "n1", i)
    for i in (11, 12):
        _put_segment(store, "n2", i)
    read = []
    real = ObjectStore.sidecar
    gone = Layout.incoming("c1", "n1", _segment_name(2))

    def sidecar(self, key):
        read.append(key)
        return (None, {}) if key == gone else real(self, key)
    monkeypatch.setattr(ObjectStore, "sidecar", sidecar)
    cfg.max_segments = 4
    b = P.claim(cfg)
    assert sorted(read) == sorted([Layout.incoming("c1", "n1", _segment_name(i)) for i in (1, 2)]
                                  + [Layout.incoming("c1", "n2", _segment_name(i)) for i in (11, 12)])
    assert [(s["node"], s["name"]) for s in b.segments] == [("n1", _segment_name(1)), ("n2", _segment_name(11)),
                                                             ("n2", _segment_name(12))]
    assert all(s["checksum"] for s in b.segments) and b.steps["claim"]["incomplete_uploads"] == 1


def test_byte_limit_still_takes_one_segment(cfg):
    store = P.open_store(cfg)
    _put_segment(store, "n1", 1, size=5000)
    _put_segment(store, "n1", 2, size=5000)
    cfg.max_bytes = 100
    assert len(P.claim(cfg).segments) == 1


def test_on_a_local_master_a_batch_stays_small_enough_to_run_in_the_process(cfg):
    """Segments that arrive together become batches of at most driver_batch_max_bytes (each runs without Spark),
    unless the batch goes to Spark anyway (driver_batch_max_bytes 0, spark_submit, a cluster master)."""
    store = P.open_store(cfg)
    for i in range(1, 6):
        _put_segment(store, "n1", i, size=1000)
    cfg.driver_batch_max_bytes = 2500
    b = P.claim(cfg)
    assert len(b.segments) == 2 and steps.transform_mode(cfg, b) == "driver"
    for spark in ({"driver_batch_max_bytes": 0}, {"spark_submit": True}, {"spark_master": "spark://m:7077"}):
        assert steps.batch_max_bytes(dataclasses.replace(cfg, **spark)) == cfg.max_bytes, spark


def test_unfinished_batch_is_resumed_not_reclaimed(cfg):
    store = P.open_store(cfg)
    _put_segment(store, "n1", 1)
    first = P.claim(cfg)
    _put_segment(store, "n1", 2)                     # arrives after the crash
    again = P.claim(cfg)
    assert again.batch_id == first.batch_id and again.segments == first.segments and again.resumed
    assert again.now == first.now                    # the same batch, byte for byte: same processing time


def test_manifest_written_but_pointer_not_is_found(cfg):
    store = P.open_store(cfg)
    _put_segment(store, "n1", 1)

    class Crash(Exception):
        pass

    def die(point):
        if point == "claim:manifest_written":
            raise Crash()
    with pytest.raises(Crash):
        P.claim(cfg, fault=die)
    assert not store.exists(P.POINTER_KEY)           # died between the manifest and the pointer
    again = P.claim(cfg)
    assert again.batch_seq == 1 and again.resumed


def test_nothing_new_is_an_empty_batch_and_writes_no_manifest(cfg):
    b = P.claim(cfg)
    assert b.empty and b.steps["claim"]["segments"] == 0
    store = P.open_store(cfg)
    assert store.list("ledger/") == []
    assert P.read_metrics(cfg)["last"]["claim"]["segments"] == 0


def test_archive_refuses_until_published(cfg):
    store = P.open_store(cfg)
    key = _put_segment(store, "n1", 1)
    b = P.claim(cfg)
    with pytest.raises(P.PipelineError):
        P.archive(cfg, b)
    b.state = "transformed"
    P.save_batch(store, b)
    with pytest.raises(P.PipelineError):             # transformed is not published either
        P.archive(cfg, b)
    with pytest.raises(P.PipelineError):             # publish before transform is refused too
        P.publish(cfg, _with_state(store, b, "claimed"))
    assert store.exists(key) and store.list("archived/") == []


def _with_state(store, b, state):
    b = P.Batch.from_dict({**b.to_dict(), "state": state})
    P.save_batch(store, b)
    return b


def _seed_state(cfg, mutations, now):
    """State tables as an earlier batch left them (no Spark: the same core the Spark job runs)."""
    store = P.open_store(cfg)
    recs = []
    for j, m in enumerate(mutations):
        recs += mutation_records(m, j)
    run_store_batch(DeltaRsStateStore(P.delta_root(cfg, store)), sample_schema(), [records_to_batch(recs)],
                    batch_id=P.batch_id_for(1), batch_seq=1, now=now)
    batch = P.Batch(P.batch_id_for(1), 1, "archived", [], now, None)
    P.save_batch(store, batch)
    store.put_json(P.POINTER_KEY, {"batch_seq": 1, "batch_id": batch.batch_id})


def test_sweep_batch_publishes_expiries_when_due(cfg, kafka_broker):
    w = Workload(sample_schema(), seed=7, partitions=10)
    muts = list(w.mutations(300))                    # (this seed has TTL'd visible rows; some seeds have none)
    _seed_state(cfg, muts, NOW)
    cfg.kafka_bootstrap = kafka_broker
    cfg.topic_prefix = "sweep"
    cfg.now = NOW + 30                               # not yet due (sweep_interval_s = 300), nothing requested
    assert P.claim(cfg).empty
    P.request_sweep(cfg)                             # what the maintenance DAG does
    cfg.now = NOW + 4000                             # every TTL of the workload has run out
    b = P.run_once(cfg)
    assert b.sweep and b.segments == [] and b.prev_now == NOW and b.state == "archived"
    assert not P.open_store(cfg).exists(P.SWEEP_REQUEST_KEY)
    rows = list(read_outbox(P.delta_root(cfg, P.open_store(cfg)), b.batch_id))
    assert rows and all(json.loads(r["event_json"])["source"]["expired"] for r in rows)
    assert b.steps["publish"]["events"] == len(rows)


def test_snapshot_batch_is_one_read_event_per_visible_row(cfg, kafka_broker):
    from cdc_lib.sinks.delta import read_state, visible_table
    w = Workload(sample_schema(), seed=4, partitions=10)
    _seed_state(cfg, list(w.mutations(100)), NOW)
    cfg.kafka_bootstrap = kafka_broker
    cfg.topic_prefix = "snap"
    P.request_snapshot(cfg)
    b = P.run_once(cfg)
    assert b.snapshot and b.now == NOW and b.state == "archived"
    rows = list(read_outbox(P.delta_root(cfg, P.open_store(cfg)), b.batch_id))
    assert {r["op"] for r in rows} == {"r"}
    want = 0
    root = P.delta_root(cfg, P.open_store(cfg))
    for t in sample_schema().tables.values():
        if not t.keyspace.startswith("system"):
            want += len(visible_table(t, read_state(root, t.keyspace, t.name), NOW))
    assert len(rows) == want > 0
    assert P.claim(cfg).empty                        # the request was consumed


def test_config_from_mapping_converts_and_rejects_unknown_keys():
    c = P.PipelineConfig.from_mapping({"max_segments": "7", "spark_submit": "true", "now": "12",
                                       "schema_registry_url": "", "cassandra_hosts": "a, b"})
    assert (c.max_segments, c.spark_submit, c.now, c.schema_registry_url, c.cassandra_hosts) == \
        (7, True, 12, None, ["a", "b"])
    # one rule for unknown keys, as for the agent's flags and the YAML file: an error naming the key
    with pytest.raises(ConfigError, match="unknown setting 'bogus' \\(from DAG params\\)"):
        P.PipelineConfig.from_mapping({"max_segments": "7", "bogus": 1})


def test_avro_format_publishes_decodable_envelopes(cfg, kafka_broker):
    """kafka_format='avro' without a registry: Avro single-object encoding, schemas kept in the store."""
    from test_publish import consume_all

    from cdc_lib.sinks.kafka import AvroCodec, table_topic
    w = Workload(sample_schema(), seed=4, partitions=10)
    _seed_state(cfg, list(w.mutations(60)), NOW)
    cfg.kafka_bootstrap = kafka_broker
    cfg.topic_prefix = "avro"
    cfg.kafka_format = "avro"
    P.request_snapshot(cfg)
    b = P.run_once(cfg)
    assert b.state == "archived" and b.steps["publish"]["events"] > 0
    store = P.open_store(cfg)
    rows = list(read_outbox(P.delta_root(cfg, store), b.batch_id))
    topics = sorted({table_topic("avro", r["keyspace"], r["table"]) for r in rows})
    records = consume_all(kafka_broker, topics)
    assert len(records) == len(rows)
    codec = AvroCodec(schema_store=store)            # a consumer resolves writer schemas by fingerprint
    by_id = {r["event_id"]: json.loads(r["event_json"]) for r in rows}
    for rec in records:
        value = codec.decode(rec[4])
        assert value["op"] == "r" and value["before"] is None
        want = by_id[value["id"]]
        assert value["source"]["table"] == want["source"]["table"]
        assert sorted(k for k, v in value["after"].items() if v is not None and not k.startswith("_")) == \
            sorted(k for k, v in want["after"].items() if v is not None)


def test_driver_schema_source_reads_the_cluster_with_credentials(monkeypatch):
    from cdc_lib.cql import schema_from_cluster as sd
    seen = {}

    def fake(hosts, keyspaces=None, *, port=9042, strict=False, **options):
        seen.update(hosts=hosts, port=port, auth=options.get("auth_provider"))
        return sample_schema()
    monkeypatch.setattr(sd, "load_from_cluster", fake)
    cfg = P.PipelineConfig.from_mapping({"schema_source": "driver", "cassandra_hosts": "10.0.0.1, 10.0.0.2",
                                         "cassandra_port": "9142", "cassandra_username": "cdc",
                                         "cassandra_password": "pw"})
    schema = P.load_schema(cfg)
    assert schema.by_name("shop", "orders") is not None
    assert seen["hosts"] == ["10.0.0.1", "10.0.0.2"] and seen["port"] == 9142
    assert seen["auth"].username == "cdc" and seen["auth"].password == "pw"
    with pytest.raises(ConfigError):
        P.load_schema(P.PipelineConfig(schema_source="driver"))


def test_torn_segment_its_whole_entries_become_events_and_the_segment_is_quarantined(cfg, kafka_broker,
                                                                                         spark_session, tmp_path):
    """The only copy of a segment, cut in the middle of its last section (a node that died mid-write): every entry
    before the cut reaches the state and the events, the rest is a torn_tail in quarantine, and the segment goes
    to quarantine with a reason naming the position, not to archived/."""
    from reference_model import json_table
    from reference_model import visible_table as model_table

    from cdc_lib.commitlog.mutation import encode_mutation
    from cdc_lib.commitlog.segment import SegmentReader
    from cdc_lib.demo.workload import write_cluster_segments
    schema = sample_schema()
    cw = write_cluster_segments(tmp_path / "gen", schema, 150, nodes=1, rf=1, seed=5, sync_every=1000)
    [path] = cw.segments["node1"]
    intact = list(SegmentReader(path))
    assert len(intact) == 150
    cut_at = intact[99].position + 40                   # inside the 101st entry
    data = open(path, "rb").read()[:cut_at]
    name = path.rsplit("/", 1)[1]
    store = P.open_store(cfg)
    store.put_bytes(Layout.incoming("c1", "n1", name), data, checksum=sha256_bytes(data))
    cfg.kafka_bootstrap = kafka_broker
    cfg.topic_prefix = "torn"

    b = P.run_once(cfg, spark=spark_session)

    assert b.state == "archived" and b.steps["transform"]["damaged"] == 1
    assert b.steps["archive"]["archived"] == 0 and b.steps["archive"]["quarantined_segments"] == 1
    assert store.list("archived/") == [] and store.exists(Layout.quarantined("c1", "n1", name))
    reason = store.get_json(Layout.reason(Layout.quarantined("c1", "n1", name)))
    assert [(d["kind"], d["position"]) for d in reason["damage"]] == [("torn_tail", intact[100].start)]
    assert store.get_bytes(reason["damage"][0]["entry_key"]) == data[intact[100].start:]
    by_bytes = {encode_mutation(m, schema): m for m in cw.mutations}
    kept = [by_bytes[e.data] for e in intact[:100]]
    root = P.delta_root(cfg, store)
    replayed: dict = {}
    for r in read_outbox(root, b.batch_id):
        event = json.loads(r["event_json"])
        table = replayed.setdefault((r["keyspace"], r["table"]), {})
        if event["after"] is None:
            table.pop(r["key_json"], None)
        else:
            table[r["key_json"]] = event["after"]
    assert b.steps["publish"]["events"] > 0
    for t in schema.tables.values():
        if not t.keyspace.startswith("system"):
            assert replayed.get((t.keyspace, t.name), {}) == json_table(t, model_table(t, kept, NOW)), t.name


def test_remote_segments_are_read_by_their_reader_into_memory_and_checked():
    """No staging through the driver: whoever decodes a segment reads it from the store itself, into memory under
    its file name (which carries its id), checked against the sha256 the batch claimed it with; a local segment is
    read where it is."""
    import uuid

    from cdc_lib.commitlog.segment import SegmentBytes
    from cdc_lib.spark.merge_job import segment_source
    from cdc_lib.storage.objects import VerificationError
    store = ObjectStore.from_url(f"memory://read-{uuid.uuid4().hex}")
    key = _put_segment(store, "n1", 1, size=1000)
    url, checksum = store.url_for(key), store.info(key).checksum
    assert segment_source(url, checksum, {}) == SegmentBytes(_segment_name(1), bytes([1]) * 1000)
    assert segment_source(url, None, {}).data == bytes([1]) * 1000
    with pytest.raises(VerificationError, match=f"{url}.*sha256 {'0' * 64}"):
        segment_source(url, "0" * 64, {})
    assert segment_source("/data/n1/CommitLog-7-1.log", checksum, {}) == "/data/n1/CommitLog-7-1.log"
    assert segment_source("file:///data/n1/CommitLog-7-1.log", None, {}) == "/data/n1/CommitLog-7-1.log"


def test_remote_sstable_files_are_downloaded_side_by_side_into_a_private_checked_directory():
    """An SSTable's reader needs its files side by side on disk, under ``<keyspace>/<table>-<id>/``: each task
    downloads them into a directory of its own (two tasks, or two pipelines on one machine, never share and delete
    each other's copy), each checked against its sha256, and removes it afterwards."""
    import os
    import uuid

    from cdc_lib.spark.merge_job import sstable_directory
    from cdc_lib.storage.objects import VerificationError
    store = ObjectStore.from_url(f"memory://read-{uuid.uuid4().hex}")
    files = []
    for name, data in (("nb-1-big-Data.db", b"data" * 300), ("nb-1-big-Statistics.db", b"stats")):
        key = f"snapshots/n1/ks/t-1234/{name}"
        store.put_bytes(key, data, checksum=sha256_bytes(data))
        files.append({"name": name, "dir": "ks/t-1234", "path": store.url_for(key), "checksum": sha256_bytes(data)})
    src = {"files": files}
    with sstable_directory(src, {}) as first, sstable_directory(src, {}) as second:
        assert first != second
        for path in (first, second):
            assert path.endswith(os.path.join("ks", "t-1234", "nb-1-big-Data.db"))
            assert open(path, "rb").read() == b"data" * 300
            assert open(os.path.join(os.path.dirname(path), "nb-1-big-Statistics.db"), "rb").read() == b"stats"
    assert not os.path.exists(first) and not os.path.exists(second)
    bad = {"files": [files[0], {**files[1], "checksum": "0" * 64}]}
    with pytest.raises(VerificationError, match=f"{files[1]['path']}.*sha256 {'0' * 64}"):
        with sstable_directory(bad, {}):
            pass
