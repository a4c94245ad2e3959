"""The Spark step on real replica segments: the same outbox and state as the Spark-free core (in this process with
delta-rs, and on Spark tasks with delta-spark), damage quarantined, reruns change nothing, and the job runs under
spark-submit too."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from reference_model import visible_table as model_table
from servers import get_local_spark_session

from cdc_lib.celllog.reader import read_cell_log
from cdc_lib.celllog.schema import decode_clustering
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, START_US, sample_schema, write_cluster_segments
from cdc_lib.sinks.delta import (DeltaRsStateStore, read_outbox, read_state, run_store_batch, table_outputs,
                                visible_table)
from cdc_lib.spark.merge_job import run_batch

REPO = Path(__file__).resolve().parents[1]
NOW0 = START_US // 1_000_000


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    s = get_local_spark_session(tmp_path_factory.mktemp("spark"))
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


def _assert_same_outbox_and_state(root, core, schema, batches: int):
    """The stores under ``root`` and ``core`` hold the same outbox rows of batches ``b0``.. and the same state."""
    for i in range(batches):
        assert list(read_outbox(str(root), f"b{i}")) == list(read_outbox(str(core), f"b{i}")), i
    for t in schema.tables.values():
        assert _sorted_state(root, t) == _sorted_state(core, t), t.name


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
    # every event was made by the engine CASSANDRA_CDC_NATIVE picks, in this process or in the Spark tasks (their
    # Python workers run this environment and this venv)
    from cdc_lib.state import native as native_state
    engine = "compiled" if native_state.enabled() else "python"
    assert [r.events_by_engine for r in results] == [{engine: r.events} for r in results]

    # damaged entries of the torn copy are in quarantine, with why
    assert results[1].damaged, "the torn segment must produce damage"
    for key in results[1].damaged:
        assert key.startswith("quarantined/c1/node9/")
        reason = json.loads((root / (key + ".reason.json")).read_text())
        assert reason["batch_id"] == "b1" and reason["kind"] and reason["bytes"] == (root / key).stat().st_size

    # the Spark job and the Spark-free core write the same outbox and the same state
    core = tmp_path / "core"
    _core(core, schema, batches, nows)
    _assert_same_outbox_and_state(root, core, schema, len(batches))
    for t in schema.tables.values():
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


def test_compiled_engine_gives_the_python_engines_outbox_and_state(cluster, tmp_path, monkeypatch):
    """The in-driver batch with the compiled state engine (CASSANDRA_CDC_NATIVE=1) writes byte for byte the outbox
    and state of the Python engine (=0): plain batches, a damaged segment, TTL sweeps without records, a backfill
    (``r`` events: Python on both sides), over chunks cut mid-table."""
    from cdc_lib.spark import merge_job as mb
    from cdc_lib.state import native as native_state
    if not native_state.available():
        pytest.skip("cdc_native without the compiled state engine (API 2): run scripts/setup.sh")
    schema, _, batches = cluster
    ttl_seg = _ttl_segment(tmp_path / "ttl" / "node1", schema, NOW0 + 130)
    runs = [(batches[0], NOW0 + 30, None, "c"), (batches[1], NOW0 + 120, NOW0 + 30, "c"),
            ([ttl_seg], NOW0 + 140, NOW0 + 120, "c"), ([], NOW0 + 4000, NOW0 + 140, "c")]
    monkeypatch.setattr(mb, "CHUNK_PARTITIONS", 7)      # chunks end inside tables and inside input batches
    compiled_calls = []
    monkeypatch.setattr(mb, "table_outputs", lambda *a, **k: compiled_calls.append(a[0]) or table_outputs(*a, **k))
    roots = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("CASSANDRA_CDC_NATIVE", mode)
        compiled_calls.clear()
        roots[mode] = root = tmp_path / f"native{mode}"
        for i, (paths, now, prev, _) in enumerate(runs):
            res = run_batch(None, paths, root=str(root), schema=schema, batch_id=f"b{i}", batch_seq=i + 1, now=now,
                            prev_now=prev, cluster="c1")
            assert res.events_by_engine == ({"compiled" if mode == "1" else "python": res.events} if res.events
                                            else {}), i
        # a backfill of another store: r events, which only the Python engine makes
        n = len(compiled_calls)
        res = run_batch(None, batches[0], root=str(root / "backfill"), schema=schema, batch_id="r0", batch_seq=1,
                        now=NOW0 + 30, cluster="c1", create_op="r")
        assert len(compiled_calls) == n
        assert res.events_by_engine == {"python": res.events}
        assert bool(compiled_calls) == (mode == "1")
    for i in range(len(runs)):
        assert list(read_outbox(str(roots["1"]), f"b{i}")) == list(read_outbox(str(roots["0"]), f"b{i}")), i
    assert list(read_outbox(str(roots["1"] / "backfill"), "r0")) == list(read_outbox(str(roots["0"] / "backfill"),
                                                                                     "r0"))
    assert any(json.loads(r["event_json"])["source"]["expired"] for r in read_outbox(str(roots["1"]), "b3"))
    for t in schema.tables.values():
        assert _sorted_state(roots["1"], t) == _sorted_state(roots["0"], t), t.name
        assert _sorted_state(roots["1"] / "backfill", t) == _sorted_state(roots["0"] / "backfill", t), t.name


def test_a_spark_batch_reconciles_one_key_range_per_core_whatever_the_shuffle_partitions(spark, cluster, tmp_path):
    """Each reconcile task reads the stored rows of its key range, and a state file holds rows of the whole ring, so
    the job cuts a batch into one range per core (``spark.default.parallelism``), not into
    ``spark.sql.shuffle.partitions`` ranges (200 in a session with Spark's defaults, as ``spark-submit`` starts
    one): the outbox gets a file per core, not one per shuffle partition, and the same rows as the core's."""
    from deltalake import DeltaTable
    schema, _, batches = cluster
    cores = spark.sparkContext.defaultParallelism
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(cores * 10))
    try:
        root = tmp_path / "spark"
        res = run_batch(spark, batches[0], root=str(root), schema=schema, batch_id="b0", batch_seq=1,
                        now=NOW0 + 30, cluster="c1")
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    assert res.events > cores * 10         # enough events for every one of the shuffle partitions
    assert 1 <= len(DeltaTable(DeltaRsStateStore(str(root)).events_uri()).file_uris()) <= cores
    core = tmp_path / "core"
    _core(core, schema, batches[:1], [NOW0 + 30])
    _assert_same_outbox_and_state(root, core, schema, 1)


def _count_reads(monkeypatch, mb) -> tuple:
    """Lists that record each read of stored rows asked of a ``ReadAhead`` (the table's name) and each read of the
    store itself (the table's name and the keys read)."""
    asked, reads = [], []
    ask, store_read = mb.ReadAhead.read_state_rows, DeltaRsStateStore.read_state_rows
    monkeypatch.setattr(mb.ReadAhead, "read_state_rows",
                        lambda self, t, keys, *a, **k: asked.append(t.qualified_name) or ask(self, t, keys, *a, **k))
    monkeypatch.setattr(DeltaRsStateStore, "read_state_rows",
                        lambda self, t, keys, *a, **k: reads.append((t.qualified_name, _key_list(keys)))
                        or store_read(self, t, keys, *a, **k))
    return asked, reads


def _key_list(keys) -> list:
    return keys.to_pylist() if hasattr(keys, "to_pylist") else list(keys)


def _each_batch(root, schema, batches, nows, *logs):
    """Run ``batches`` in this process one after the other (the logs cleared before each), yielding each one's
    segment paths after it ran."""
    for i, paths in enumerate(batches):
        for log in logs:
            log.clear()
        run_batch(None, paths, root=str(root), schema=schema, batch_id=f"b{i}", batch_seq=i + 1, now=nows[i],
                  prev_now=nows[i - 1] if i else None, cluster="c1")
        yield paths


def test_the_in_process_transform_reads_each_tables_stored_rows_once(cluster, tmp_path, monkeypatch):
    """Reconcile reads the prior state chunk by chunk, each chunk a token range; a state file holds rows of the
    whole ring, so a read per chunk decoded every file again. In the process, where the whole batch is at hand, each
    table's stored rows are read once for all its chunks, and the outbox and the state are the core's."""
    from cdc_lib.spark import merge_job as mb
    schema, _, batches = cluster
    nows = [NOW0 + 30, NOW0 + 120]
    monkeypatch.setattr(mb, "CHUNK_PARTITIONS", 7)      # several chunks per table
    asked, reads = _count_reads(monkeypatch, mb)
    root = tmp_path / "driver"
    for _ in _each_batch(root, schema, batches, nows, asked, reads):
        read = [t for t, _ in reads]
        assert read and sorted(read) == sorted(set(read)), read          # one read per table
        assert set(asked) == set(read) and len(asked) > len(read), (asked, read)
    core = tmp_path / "core"
    _core(core, schema, batches, nows)
    _assert_same_outbox_and_state(root, core, schema, len(batches))


def test_a_spark_task_reads_each_tables_stored_rows_once_per_window(cluster, tmp_path, monkeypatch):
    """A Spark task's input is a stream, not the whole batch: it reads the stored rows a window of
    ``READ_AHEAD_PARTITIONS`` partitions at a time (each partition's once, in windows of at most that many), not
    once per chunk, and writes the core's outbox and state."""
    from cdc_lib.spark import merge_job as mb
    schema, _, batches = cluster
    nows = [NOW0 + 30, NOW0 + 120]
    monkeypatch.setattr(mb, "CHUNK_PARTITIONS", 7)
    monkeypatch.setattr(mb, "READ_AHEAD_PARTITIONS", 12)        # windows end inside tables, and hold chunks
    task_reconcile = mb._reconcile

    def as_in_a_task(*a, **k):
        rec = task_reconcile(*a, **k)
        return lambda batches, whole=False: rec(batches)      # a Spark task's input is a stream
    monkeypatch.setattr(mb, "_reconcile", as_in_a_task)
    asked, reads = _count_reads(monkeypatch, mb)
    root = tmp_path / "tasks"
    for paths in _each_batch(root, schema, batches, nows, asked, reads):
        partitions = {(f"{ks}.{name}", pk) for c in read_cell_log(paths, schema, on_damage=lambda d: None)
                      for ks, name, pk in zip(*(c.column(n).to_pylist() for n in ("keyspace", "table",
                                                                                   "partition_key")))}
        tables = {t for t, _ in partitions}
        read_once = [(t, k) for t, keys in reads for k in keys]
        # each partition's stored rows read once (those with records, and in the second batch one whose TTL ran out)
        assert len(read_once) == len(set(read_once)) and set(read_once) >= partitions
        assert all(len(keys) <= 12 for _, keys in reads)
        assert len(reads) > len(tables) and len(asked) > len(reads), (len(reads), len(tables), len(asked))
    core = tmp_path / "core"
    _core(core, schema, batches, nows)
    _assert_same_outbox_and_state(root, core, schema, len(batches))


def test_a_spark_task_picks_its_stored_rows_on_its_own_thread(monkeypatch):
    """A Spark task has one core (its sibling tasks have the others): its store reads with one thread, where the
    in-driver transform reads with two."""
    import pyspark

    from cdc_lib.spark import merge_job as mb
    made = []

    class Store:
        def __init__(self, *args, read_threads, **kwargs):
            made.append(read_threads)
    monkeypatch.setattr(mb, "DeltaRsStateStore", Store)
    reconcile = mb._reconcile(None, "", {}, "app", {}, 0, None, "", 1, mb.OP_CREATE, {})
    assert list(reconcile(iter([]))) == []          # the driver: no task
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: object()))
    assert list(reconcile(iter([]))) == []          # inside a task
    assert made == [2, 1]


def test_a_spark_tasks_windows_hold_whole_partitions_within_the_memory_budget(monkeypatch):
    """A task's first window is a chunk; each next one holds as many partitions as ``READ_AHEAD_BYTES`` does at the
    bytes a partition took in the window before, never fewer than a chunk or more than ``READ_AHEAD_PARTITIONS``;
    and the input is cut into windows of exactly those sizes, no partition split between two."""
    import pyarrow as pa

    from cdc_lib.spark import merge_job as mb
    monkeypatch.setattr(mb, "CHUNK_PARTITIONS", 3)
    monkeypatch.setattr(mb, "READ_AHEAD_PARTITIONS", 8)
    monkeypatch.setattr(mb, "READ_AHEAD_BYTES", 6_000)
    sizes = mb._WindowSizes()
    assert sizes.next() == 3
    sizes.held(10, 10 * 1_000)          # 1,000 bytes a partition: 6 fit
    assert sizes.next() == 6
    sizes.held(6, 6 * 10)               # small partitions: no more than READ_AHEAD_PARTITIONS
    assert sizes.next() == 8
    sizes.held(8, 8 * 1_000_000)        # wide partitions: no fewer than a chunk
    assert sizes.next() == 3

    # 30 partitions of 1 to 3 rows, in input batches cut anywhere; the window sizes asked for change between windows
    keys = [bytes([k]) for k in range(30) for _ in range(k % 3 + 1)]
    rows = pa.table({"table_id": ["t"] * len(keys), "partition_key": keys})
    batches = [rows.slice(a, 7).to_batches()[0] for a in range(0, rows.num_rows, 7)]
    asked = iter([4, 1, 9, 5, 100])
    runs = [(pa.Table.from_batches(w), starts) for w, starts in mb._partition_runs(batches, lambda: next(asked))]
    windows = [w.column("partition_key").to_pylist() for w, _ in runs]
    assert [len(set(w)) for w in windows] == [4, 1, 9, 5, 11]
    assert [k for w in windows for k in w] == keys
    assert all(not set(a) & set(b) for a, b in zip(windows, windows[1:]))
    # each window says where its partitions begin, as its rows are numbered; its chunks are whole partitions
    for (w, starts), ks in zip(runs, windows):
        assert starts.tolist() == [i for i, k in enumerate(ks) if i == 0 or k != ks[i - 1]]
        chunks = [c.column("partition_key").to_pylist() for c in mb._chunks(w, starts, 2)]
        assert [k for c in chunks for k in c] == ks
        assert [len(set(c)) for c in chunks] == [2] * (len(set(ks)) // 2) + [1] * (len(set(ks)) % 2)
        assert all(not set(a) & set(b) for a, b in zip(chunks, chunks[1:]))


def test_read_ahead_answers_every_chunk_with_the_stores_own_rows():
    """The read-ahead keeps a table's stored rows sorted by token and hands a chunk (a run of the batch's partitions,
    in order) the slice of its tokens; two partitions that share a token on either side of a chunk's cut, keys in
    another order, keys the batch does not hold, and other columns must still get exactly what the store gives."""
    import types
    import uuid

    import pyarrow as pa
    import pyarrow.compute as pc

    from cdc_lib.spark.merge_job import ReadAhead, _run_of, batch_partitions

    # partitions in publish order (token, then key): tokens 5, 12 and 31 are each two or three partitions'
    tokens = [5, 5, 9, 12, 12, 12, 20, 31, 31, 40, 41, 50]
    keys = [b"k%02d" % i for i in range(len(tokens))]
    # stored rows in no token order, as a state file holds the whole ring: one or two rows a partition, none of
    # k02 and k09 (new partitions), and partitions the batch does not hold, one of them sharing token 12
    stored_rows = []
    for i in [7, 3, 11, 0, 5, 1, 8, 4, 6, 10]:
        for n in range(1 + i % 2):
            stored_rows.append({"_cdc_partition_key": keys[i], "_cdc_token": tokens[i], "_cdc_row_kind": f"row{n}"})
    stored_rows += [{"_cdc_partition_key": b"other", "_cdc_token": 12, "_cdc_row_kind": "row0"},
                    {"_cdc_partition_key": b"far", "_cdc_token": 99, "_cdc_row_kind": "row0"}]
    stored = pa.Table.from_pylist(stored_rows, schema=pa.schema([("_cdc_partition_key", pa.binary()),
                                                                 ("_cdc_token", pa.int64()),
                                                                 ("_cdc_row_kind", pa.string())]))

    def truth(ks):
        return stored.filter(pc.is_in(stored.column("_cdc_partition_key"), value_set=pa.array(ks, pa.binary())))

    class Store:
        reads = 0

        def read_state_rows(self, table, ks, columns=None, tokens=None):
            Store.reads += 1
            return truth(ks).select(columns) if columns else truth(ks)

    table = types.SimpleNamespace(id=uuid.uuid4())
    cells = pa.table({"table_id": [str(table.id)] * len(keys), "partition_key": pa.array(keys, pa.binary()),
                      "token": pa.array(tokens, pa.int64())})
    ahead = ReadAhead(Store(), batch_partitions(cells))

    def rows(t):
        return sorted(zip(t.column("_cdc_partition_key").to_pylist(), t.column("_cdc_row_kind").to_pylist()))

    def check(ks, ts=None):
        want = rows(truth(ks))
        got = ahead.read_state_rows(table, pa.array(ks, pa.binary()),
                                    tokens=None if ts is None else pa.array(ts, pa.int64()))
        assert rows(got) == want, (ks, rows(got), want)

    Store.reads = 0
    batch = batch_partitions(cells)[str(table.id)]
    for i in range(len(keys)):                  # every chunk: each run of partitions in order, found as one
        for j in range(i + 1, len(keys) + 1):
            assert _run_of(batch, pa.array(keys[i:j], pa.binary()), pa.array(tokens[i:j], pa.int64())) == (i, j)
            check(keys[i:j], tokens[i:j])
    assert _run_of(batch, pa.array(keys[1::2], pa.binary()), pa.array(tokens[1::2], pa.int64())) is None
    check(keys[::2], tokens[::2])               # keys of the batch, not one run
    check(keys[::-1], tokens[::-1])
    check(keys[3:6])                            # no tokens given
    assert Store.reads == 1                     # all from the one read of the batch's partitions
    check([b"other"], [12])                     # not the batch's: the store's answer
    check([keys[0], b"far"], [5, 99])
    assert Store.reads == 3
    got = ahead.read_state_rows(table, pa.array(keys[:2], pa.binary()), columns=["_cdc_row_kind"])
    assert got.column_names == ["_cdc_row_kind"] and Store.reads == 4


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


# ------------------------------------------------------------------- both stores, every engine reading them

def _rows_by_engine(spark, uri: str, order: list) -> dict:
    """The rows of the Delta table at ``uri`` as each engine reads it: delta-rs, Spark (delta-spark), Polars and
    DuckDB (over delta-rs's dataset), each sorted by ``order``, as lists of dicts."""
    import duckdb
    import polars as pl
    from deltalake import DeltaTable

    def ordered(rows):
        return sorted(rows, key=lambda r: tuple(repr(r[c]) for c in order))
    dataset = DeltaTable(uri).to_pyarrow_dataset()        # noqa: F841 - the relation DuckDB's SQL names
    duck = duckdb.sql("SELECT * FROM dataset").arrow()
    duck = duck.read_all() if hasattr(duck, "read_all") else duck
    return {
        "delta-rs": ordered(DeltaTable(uri).to_pyarrow_table().to_pylist()),
        "spark": ordered(r.asDict(recursive=True) for r in spark.read.format("delta").load(uri).collect()),
        "polars": ordered(pl.read_delta(uri).to_dicts()),
        "duckdb": ordered(duck.to_pylist()),
    }


def test_both_stores_write_the_same_tables_and_every_engine_reads_them_alike(spark, cluster, tmp_path):
    """The same batches through delta-spark (MERGE INTO in Spark tasks) and through delta-rs (in this process):
    each state table and the outbox hold the same rows, at the same Delta protocol, with the same app transaction,
    whichever engine reads them back."""
    from deltalake import DeltaTable

    from cdc_lib.sinks.delta import events_table_uri, state_table_uri
    schema, _, batches = cluster
    nows = [NOW0 + 30, NOW0 + 120]
    by_spark, by_rs = tmp_path / "delta-spark", tmp_path / "delta-rs"
    for i, paths in enumerate(batches):
        run_batch(spark, paths, root=str(by_spark), schema=schema, batch_id=f"b{i}", batch_seq=i + 1, now=nows[i],
                  prev_now=nows[i - 1] if i else None, cluster="c1")
    _core(by_rs, schema, batches, nows)

    state_order = ["_cdc_token", "_cdc_partition_key", "_cdc_row_kind", "_cdc_clustering"]
    uris = [(events_table_uri(str(by_spark)), events_table_uri(str(by_rs)), ["batch_id", "seq"])]
    uris += [(state_table_uri(str(by_spark), t.keyspace, t.name), state_table_uri(str(by_rs), t.keyspace, t.name),
              state_order) for t in schema.tables.values()]
    for a, b, order in uris:
        read_a, read_b = _rows_by_engine(spark, a, order), _rows_by_engine(spark, b, order)
        assert read_a["delta-rs"], a
        for engine in read_a:
            assert read_a[engine] == read_b[engine], f"{engine} reads {a} and {b} differently"
            assert len(read_a[engine]) == len(read_a["delta-rs"]), engine
        ta, tb = DeltaTable(a), DeltaTable(b)
        assert (ta.protocol().min_reader_version, ta.protocol().min_writer_version) == \
               (tb.protocol().min_reader_version, tb.protocol().min_writer_version), a
        assert ta.transaction_version("cassandra-cdc") == tb.transaction_version("cassandra-cdc") == 2, a
        for t in (ta, tb):          # both writers compress every column of every file with zstd
            assert _codecs(t) == {"ZSTD"}, (t.table_uri, _codecs(t))


def _codecs(dt) -> set:
    """The compression codecs of every column chunk of every file of the Delta table ``dt``."""
    import pyarrow.parquet as pq
    out = set()
    for f in dt.file_uris():
        meta = pq.ParquetFile(f.removeprefix("file://")).metadata
        out |= {meta.row_group(g).column(c).compression for g in range(meta.num_row_groups)
                for c in range(meta.num_columns)}
    return out


# ------------------------------------------------------------------------------ the Spark step killed for real

KILL_SPARK_SCRIPT = """
import os, sys
sys.path[:0] = [{repo!r}, {tests!r}]
from pathlib import Path
from servers import get_local_spark_session
from cdc_lib.demo.workload import sample_schema
from cdc_lib.spark.merge_job import run_batch
committed = []
def hook(kind, name):
    committed.append(name)
    if kind == "state" and len(committed) == 3:      # the outbox and two state tables committed
        os._exit(9)                                  # the driver dies: no cleanup, no exception handler
run_batch(get_local_spark_session(Path(sys.argv[1])), sys.argv[3:], root=sys.argv[2], schema=sample_schema(),
          batch_id="b0", batch_seq=1, now=int({now}), cluster="c1", fail_hook=hook)
"""


def test_spark_driver_killed_between_commits_then_rerun_only_finishes_the_batch(spark, cluster, tmp_path):
    """A Spark driver killed after some Delta commits of a batch: the rerun skips what is committed (the tables'
    app transaction says so: no new Delta version), writes the rest, and the tables equal an uninterrupted run."""
    import subprocess

    from deltalake import DeltaTable

    from cdc_lib.sinks.delta import events_table_uri, state_table_uri
    schema, _, batches = cluster
    root = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-c", KILL_SPARK_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"),
                                                                          now=NOW0 + 30),
                           str(tmp_path / "spark-killed"), str(root), *batches[0]],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 9, proc.stderr[-3000:]
    tables = list(schema.tables.values())
    uris = {t.qualified_name: state_table_uri(str(root), t.keyspace, t.name) for t in tables}
    before = {name: DeltaTable(uri).version() for name, uri in uris.items() if (Path(uri) / "_delta_log").exists()}
    committed = {n for n in before if DeltaTable(uris[n]).transaction_version("cassandra-cdc") == 1}
    assert len(committed) == 2 and len(tables) > 2
    outbox = list(read_outbox(str(root), "b0"))
    outbox_version = DeltaTable(events_table_uri(str(root))).version()

    res = run_batch(spark, batches[0], root=str(root), schema=schema, batch_id="b0", batch_seq=1, now=NOW0 + 30,
                    cluster="c1")
    assert not res.outbox_written and sorted(res.skipped_tables) == sorted(committed)
    assert DeltaTable(events_table_uri(str(root))).version() == outbox_version
    assert list(read_outbox(str(root), "b0")) == outbox
    for name in committed:
        assert DeltaTable(uris[name]).version() == before[name], f"{name} was written again"
    clean = tmp_path / "clean"
    _core(clean, schema, [batches[0]], [NOW0 + 30])
    for t in tables:
        assert _sorted_state(root, t) == _sorted_state(clean, t), t.name


def test_the_partition_order_is_arrows_stable_sort_by_table_token_key_and_index():
    """The in-process transform sorts the cell log and its events into partition order with integer keys; the order
    must be the one Arrow's stable ``sort_indices`` over ``GROUP_ORDER`` (``EVENT_ORDER``) gives: each key with a
    token of its own (as murmur3 gives them: the keys are not compared), one token shared by two keys, tokens shared
    by several keys, keys that are prefixes of others, equal rows kept in their order, and a table id naming two
    tables (the fallback). Reconcile then takes each table's rows of a chunk as they come: one run each, or
    scattered."""
    import random

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from cdc_lib.spark.merge_job import EVENT_ORDER, GROUP_ORDER, _partition_order, _table_runs
    rnd = random.Random(5)
    names = [("ks_b", "t1", "id-3"), ("ks_a", "t2", "id-1"), ("ks_a", "t1", "id-2"), ("ks_a", "t1", "id-0")]
    keys = [b"", b"\x00", b"\x00\x00", b"a", b"ab", b"b", b"\xff"]
    rows = [(*rnd.choice(names), rnd.choice(keys), rnd.choice([-5, 0, 7])) for _ in range(2000)]
    own = {k: 40 - 11 * i for i, k in enumerate(keys)}         # a token per key
    shared = {**own, b"ab": own[b"\x00"]}                      # but two keys with one token
    by_key = [[(*r[:4], tokens[r[3]]) for r in rows] for tokens in (own, shared)]

    def table(rows):
        return pa.table({"keyspace": [r[0] for r in rows], "table": [r[1] for r in rows],
                         "table_id": [r[2] for r in rows], "partition_key": pa.array([r[3] for r in rows], pa.binary()),
                         "token": pa.array([r[4] for r in rows], pa.int64()), "row": list(range(len(rows)))})
    for t in (table(rows), pa.concat_tables([table(rows[:700]), table(rows[700:])]),
              table(rows + [("ks_z", "renamed", "id-2", b"a", 0)]),        # id-2 names two tables: the fallback
              *(table(r) for r in by_key), pa.concat_tables([table(by_key[0][:900]), table(by_key[0][900:])])):
        by_group = [(c, "ascending") for c in GROUP_ORDER]
        assert np.array_equal(np.asarray(_partition_order(t)), pc.sort_indices(t, sort_keys=by_group).to_numpy())
        events = t.rename_columns(["t_keyspace", "t_name", "table_id", "partition_key", "token", "idx"])
        events = events.set_column(5, "idx", pa.array([rnd.randrange(3) for _ in range(t.num_rows)], pa.int32()))
        by_event = [(c, "ascending") for c in EVENT_ORDER]
        assert np.array_equal(np.asarray(_partition_order(events, EVENT_ORDER)),
                              pc.sort_indices(events, sort_keys=by_event).to_numpy())
    for tids in (["b", "b", "a", "c", "c"], ["b", "a", "b"]):
        rows = pa.table({"table_id": tids, "row": list(range(len(tids)))})
        assert [(tid, part.column("row").to_pylist()) for tid, part in _table_runs(rows)] == \
            [(tid, [i for i, x in enumerate(tids) if x == tid]) for tid in dict.fromkeys(tids)]


def test_the_copy_into_partition_order_on_several_threads_is_arrows_take(monkeypatch):
    """The group step's copy of a batch (``_take``: its columns on several threads) is ``Table.take``: every column
    in its place, of every type, from chunked columns, nulls kept; and on one core it is ``Table.take`` itself."""
    import numpy as np
    import pyarrow as pa

    from cdc_lib.spark import merge_job as mb
    n = 100_000
    rng = np.random.default_rng(3)
    half = pa.table({"token": pa.array(rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)),
                     "partition_key": pa.array([i.to_bytes(4, "big") for i in range(n)], pa.binary()),
                     "kind": pa.array(["row" if i % 3 else None for i in range(n)], pa.string()),
                     "ttl": pa.array(rng.integers(0, 99, n, dtype=np.int32)),
                     "is_static": pa.array(rng.integers(0, 2, n).astype(bool))})
    table = pa.concat_tables([half, half.slice(7)])          # chunked columns
    order = rng.permutation(table.num_rows)
    monkeypatch.setattr(mb.os, "cpu_count", lambda: 2)
    assert mb._take(table, order).equals(table.take(order))
    monkeypatch.setattr(mb.os, "cpu_count", lambda: 1)
    assert mb._take(table, order).equals(table.take(order))
