"""The Spark step on real replica segments: the same outbox and state as the Spark-free core (in this process with
delta-rs, and on Spark tasks with delta-spark), damage quarantined, reruns change nothing, and the job runs under
spark-submit too."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from reference_model import visible_table as model_table

from cdc_lib.celllog.reader import read_cell_log
from cdc_lib.celllog.schema import decode_clustering
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, START_US, sample_schema, write_cluster_segments
from cdc_lib.sinks.delta import DeltaRsStateStore, read_outbox, read_state, run_store_batch, visible_table

pytest.importorskip("pyspark")
from cdc_lib.spark.merge_job import run_batch  # noqa: E402
from cdc_lib.spark.session import local_session  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOW0 = START_US // 1_000_000


@pytest.fixture(scope="module")
def spark():
    s = local_session()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two batches of segments from 3 replicas (RF 3), plus a damaged copy of one segment in batch 2."""
    d = tmp_path_factory.mktemp("segments")
    schema = sample_schema()
    cw = write_cluster_segments(d / "incoming", schema, 120, seed=21, segment_size=8 * 1024)
    b1, b2 = [], []
    for node, paths in sorted(cw.segments.items()):
        half = max(1, len(paths) // 2)
        b1 += paths[:half]
        b2 += paths[half:]
    assert b1 and b2
    # a damaged copy of one segment, as a broken disk would give it: one entry's CRC fails
    bad_dir = d / "incoming" / "node9"
    bad_dir.mkdir()
    src = Path(b2[0])
    data = bytearray(src.read_bytes())
    for i in range(300, 364):
        data[i] ^= 0x5A
    bad = bad_dir / src.name
    bad.write_bytes(bytes(data))
    b2.append(str(bad))
    return schema, cw, [b1, b2]


def _core(root, schema, batches, nows):
    store = DeltaRsStateStore(str(root))
    for i, paths in enumerate(batches):
        cells = list(read_cell_log(paths, schema, on_damage=lambda d: None))
        run_store_batch(store, schema, cells, batch_id=f"b{i}", batch_seq=i + 1, now=nows[i],
                        prev_now=nows[i - 1] if i else None, cluster="c1")


def _sorted_state(root, t):
    rows = read_state(str(root), t.keyspace, t.name)
    return rows.sort_by([("_cdc_token", "ascending"), ("_cdc_partition_key", "ascending"),
                         ("_cdc_row_kind", "ascending"), ("_cdc_clustering", "ascending")]).to_pylist()


@pytest.mark.parametrize("mode", ["driver", "tasks"])
def test_spark_batches_equal_the_core_and_the_model(spark, cluster, tmp_path, mode):
    """Both paths of the job: a batch in this process without Spark (delta-rs writes), and on Spark tasks
    (delta-spark writes), give the same outbox and state as the core and the model."""
    from cdc_lib.spark import merge_job as mb
    session = spark if mode == "tasks" else None
    schema, cw, batches = cluster
    nows = [NOW0 + 30, NOW0 + 120]
    root = tmp_path / "spark"
    results = []
    for i, paths in enumerate(batches):
        results.append(run_batch(session, paths, root=str(root), schema=schema, batch_id=f"b{i}", batch_seq=i + 1,
                                 now=nows[i], prev_now=nows[i - 1] if i else None, cluster="c1"))
    assert results[0].events > 0 and results[0].outbox_written and results[0].tables
    assert mb.LAST_TIMINGS["mode"] == ("driver" if mode == "driver" else "spark")

    # damaged entries of the torn copy are in quarantine, with why
    assert results[1].damaged, "the torn segment must produce damage"
    for key in results[1].damaged:
        assert key.startswith("quarantined/c1/node9/")
        reason = json.loads((root / (key + ".reason.json")).read_text())
        assert reason["batch_id"] == "b1" and reason["kind"] and reason["bytes"] == (root / key).stat().st_size

    # the Spark job and the Spark-free core write the same outbox and the same state
    core = tmp_path / "core"
    _core(core, schema, batches, nows)
    for i in range(2):
        assert list(read_outbox(str(root), f"b{i}")) == list(read_outbox(str(core), f"b{i}"))
    for t in schema.tables.values():
        assert _sorted_state(root, t) == _sorted_state(core, t), t.name
        # and it is what Cassandra would show (every mutation reached at least one intact replica)
        got = {(pk, None if k is None else decode_clustering(k)): r
               for (pk, k), r in visible_table(t, read_state(str(root), t.keyspace, t.name), nows[1]).items()}
        assert got == model_table(t, cw.mutations, nows[1]), t.name

    # rerun of the last batch: nothing written
    logs = sorted(p for p in root.rglob("_delta_log/*.json"))
    again = run_batch(session, batches[1], root=str(root), schema=schema, batch_id="b1", batch_seq=2, now=nows[1],
                      prev_now=nows[0], cluster="c1")
    assert not again.outbox_written and not again.tables
    assert sorted(p for p in root.rglob("_delta_log/*.json")) == logs

    # a row written with a 60 s TTL, then a batch without segments after it ran out: only the sweep of
    # stored partitions (marker rows in the Spark job) can produce its expiry event
    ttl_seg = _ttl_segment(tmp_path / "ttl" / "node1", schema, NOW0 + 130)
    later = NOW0 + 4000
    for i, (paths, now, prev) in enumerate([([ttl_seg], NOW0 + 140, nows[1]), ([], later, NOW0 + 140)], 2):
        res = run_batch(session, paths, root=str(root), schema=schema, batch_id=f"b{i}", batch_seq=i + 1,
                        now=now, prev_now=prev, cluster="c1")
        cells = list(read_cell_log(paths, schema, on_damage=lambda d: None))
        run_store_batch(DeltaRsStateStore(str(core)), schema, cells, batch_id=f"b{i}", batch_seq=i + 1, now=now,
                        prev_now=prev, cluster="c1")
    rows = list(read_outbox(str(root), "b3"))
    assert res.events == len(rows) > 0
    events = [json.loads(r["event_json"]) for r in rows]
    assert all(e["source"]["expired"] for e in events)     # (the generated rows' 3600 s TTLs ran out too)
    [ev] = [e for e in events if e["source"]["table"] == "sessions" and e["before"]["user_id"] == 424242]
    assert ev["op"] == "d" and ev["source"]["ts_us"] == (NOW0 + 190) * 1_000_000
    for i in (2, 3):
        assert list(read_outbox(str(root), f"b{i}")) == list(read_outbox(str(core), f"b{i}"))
    for t in schema.tables.values():
        assert _sorted_state(root, t) == _sorted_state(core, t), t.name


def _ttl_segment(directory, schema, at_s):
    """A segment holding one INSERT into shop.sessions with a 60 s TTL, written at ``at_s``."""
    import ipaddress

    from cdc_lib.commitlog.model import Cell, LivenessInfo, Mutation, PartitionUpdate, Row
    from cdc_lib.commitlog.mutation import encode_mutation, finish_update
    from cdc_lib.commitlog.writer import SegmentWriter
    from cdc_lib.cql import types as cqltypes
    table = schema.by_name("shop", "sessions")
    key = cqltypes.composite_encode([c.type for c in table.partition_key], [424242, "watch"])
    ts = at_s * 1_000_000
    ip = table.columns["ip"].type.encode(ipaddress.ip_address("10.9.9.9"))
    row = Row((), LivenessInfo(ts, 60, at_s + 60), cells=[Cell("ip", ip, ts, 60, at_s + 60)])
    m = Mutation([finish_update(PartitionUpdate(table.id, key, table, unfiltereds=[row]))])
    directory.mkdir(parents=True)
    w = SegmentWriter(str(directory), 1_763_009_000_001, version=7, segment_size=64 * 1024)
    w.add(encode_mutation(m, schema))
    w.close()
    return str(w.path)


class Crash(Exception):
    pass


def test_spark_crash_after_outbox_then_rerun(spark, cluster, tmp_path):
    schema, _, batches = cluster
    paths = batches[0]

    def hook(kind, name):
        if kind == "outbox":
            raise Crash()
    root = tmp_path / "r"
    with pytest.raises(Crash):
        run_batch(spark, paths, root=str(root), schema=schema, batch_id="b0", batch_seq=1, now=NOW0 + 30,
                  cluster="c1", fail_hook=hook)
    first = list(read_outbox(str(root), "b0"))
    assert first and not (root / "delta" / "state").exists()
    res = run_batch(spark, paths, root=str(root), schema=schema, batch_id="b0", batch_seq=1, now=NOW0 + 30,
                    cluster="c1")
    assert not res.outbox_written and res.tables
    assert list(read_outbox(str(root), "b0")) == first
    clean = tmp_path / "clean"
    _core(clean, schema, [paths], [NOW0 + 30])
    for t in schema.tables.values():
        assert _sorted_state(root, t) == _sorted_state(clean, t), t.name


def test_spark_submit(cluster, tmp_path):
    """The job file runs under spark-submit (local master) as the pipeline's spark_submit mode starts it, with the
    Delta jars and settings it passes, shipping cdc_lib to its executors."""
    from cdc_lib.settings import PipelineConfig
    from cdc_lib.spark.submit import run_job
    schema, _, batches = cluster
    schema_file = tmp_path / "schema.cql"
    schema_file.write_text(SAMPLE_SCHEMA_CQL)
    root = tmp_path / "submit"
    config = PipelineConfig(store_url=str(root), spark_submit=True,
                            spark_submit_bin=str(Path(sys.executable).parent / "spark-submit"),
                            spark_conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"})
    out = run_job(config, ["--segments", *batches[0], "--root", str(root), "--schema-file", str(schema_file),
                           "--batch-id", "b0", "--batch-seq", "1", "--now", str(NOW0 + 30), "--cluster", "c1"])
    assert out["events"] > 0 and out["outbox_written"]
    core = tmp_path / "core"
    _core(core, schema, [batches[0]], [NOW0 + 30])
    assert list(read_outbox(str(root), "b0")) == list(read_outbox(str(core), "b0"))
    for t in schema.tables.values():
        assert _sorted_state(root, t) == _sorted_state(core, t), t.name
