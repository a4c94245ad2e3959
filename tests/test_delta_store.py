"""The Delta state and outbox tables: exact against the reference model, replayable, idempotent per batch.

Batches run through ``cdc_lib.batch`` + ``DeltaRsStateStore`` without Spark (``spark_jobs`` has its own test).
"""
from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from event_invariant import check_events
from reference_model import json_table, published_states
from reference_model import visible_table as model_table

from cdc_lib.celllog.records import mutation_records, records_to_batch
from cdc_lib.celllog.schema import decode_clustering
from cdc_lib.commitlog.model import Cell, LivenessInfo, Mutation, PartitionUpdate, Row
from cdc_lib.commitlog.mutation import finish_update
from cdc_lib.cql import types as cqltypes
from cdc_lib.cql.schema import REGULAR, ColumnMetadata, DroppedColumn
from cdc_lib.demo.workload import START_US, Workload, sample_schema
from cdc_lib.sinks.delta import (DeltaRsStateStore, arrow_type, read_outbox, read_state, run_store_batch,
                                 state_arrow_schema, to_arrow_value, visible_rows_query, visible_table)

NOW0 = START_US // 1_000_000
SCHEMA = sample_schema()


def _copies(mutations, rng, replicas=3):
    """Every mutation as each replica logs it (own segment names and positions), in a shuffled arrival order."""
    out = []
    for r in range(replicas):
        for i, m in enumerate(mutations):
            out.append((m, Mutation(m.updates, f"CommitLog-7-{r + 1}{i // 50:04d}.log", (r + 1) * 10_000 + i // 50,
                                    64 + 17 * (i % 50), mutation_id=m.mutation_id)))
    rng.shuffle(out)
    return out


def _state_table(root, table, now):
    try:
        rows = read_state(str(root), table.keyspace, table.name)
    except Exception:  # noqa: BLE001 - a table the batches never touched has no Delta table yet
        return {}
    return {(pk, None if k is None else decode_clustering(k)): row
            for (pk, k), row in visible_table(table, rows, now).items()}


def _run(root, batches, nows=None, start_now=NOW0 + 5, step=(0, 45), rng=None, check=True):
    """Feed batches of replica copies; after each, compare every table with the model.

    ``now`` of batch i is ``nows[i]`` when given, else it moves on by ``step`` (random with ``rng``).
    Returns (store, mutations seen, now of the last batch).
    """
    store = DeltaRsStateStore(str(root))
    seen = []
    now, prev = start_now, None
    for i, batch in enumerate(batches):
        if nows is not None:
            now = nows[i]
        recs = []
        for j, (orig, copy) in enumerate(batch):
            recs += mutation_records(copy, j)
            seen.append(orig)
        run_store_batch(store, SCHEMA, [records_to_batch(recs)] if recs else [], batch_id=f"batch-{i:03d}",
                        batch_seq=i + 1, now=now, prev_now=prev)
        if check:
            for t in SCHEMA.tables.values():
                assert _state_table(root, t, now) == model_table(t, seen, now), f"{t.name} after batch {i}"
        prev, now = now, now + (rng.randint(*step) if rng else step[1])
    return store, seen, prev


def _replay_outbox(root, n_batches):
    """The tables a consumer builds from the outbox: {(keyspace, table): {key json: after json}}."""
    out: dict = {}
    for i in range(n_batches):
        rows = list(read_outbox(str(root), f"batch-{i:03d}"))
        assert [r["seq"] for r in rows] == list(range(len(rows)))
        for r in rows:
            ev = json.loads(r["event_json"])
            assert ev["id"] == r["event_id"] and ev["op"] == r["op"]
            tbl = out.setdefault((r["keyspace"], r["table"]), {})
            if ev["after"] is None:
                tbl.pop(r["key_json"], None)
            else:
                tbl[r["key_json"]] = ev["after"]
    return out


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 2 ** 32))
@example(seed=99154)    # a counter shard with a lower clock but a later timestamp, uncovered by a later row deletion
def test_state_matches_model_and_outbox_replays(tmp_path_factory, seed):
    """Random RF 3 streams cut at arbitrary points: state == model after each batch, outbox replays to it."""
    root = tmp_path_factory.mktemp("delta")
    rng = random.Random(seed)
    w = Workload(SCHEMA, seed=seed, partitions=12)
    mutations = list(w.mutations(rng.randint(40, 110)))
    copies = _copies(mutations, rng)
    cuts = sorted(rng.sample(range(1, len(copies)), rng.randint(2, 4)))
    batches = [copies[a:b] for a, b in zip([0] + cuts, cuts + [len(copies)])]
    # now moves on by 0..90 s (60 s TTLs run out between batches); a last, empty batch comes after every
    # TTL (60 s, 3600 s) has run out, so the outbox must also carry every expiry
    nows = [NOW0 + 5]
    for _ in batches[1:]:
        nows.append(nows[-1] + rng.randint(0, 90))
    batches.append([])
    nows.append(nows[-1] + 4000)
    store, seen, last_now = _run(root, batches, nows)
    assert last_now == nows[-1]
    replayed = _replay_outbox(root, len(batches))
    for t in SCHEMA.tables.values():
        assert replayed.get((t.keyspace, t.name), {}) == json_table(t, model_table(t, seen, last_now)), t.name
    # the outbox shows the model's history exactly: one change per mutation, in write-time order per batch
    for t in SCHEMA.tables.values():
        events = [(r["key_json"], json.loads(r["event_json"])) for i in range(len(batches))
                  for r in read_outbox(str(root), f"batch-{i:03d}")
                  if (r["keyspace"], r["table"]) == (t.keyspace, t.name)]
        history = published_states(t, [[orig for orig, _ in b] for b in batches], nows)
        check_events(events, history, complete=True)


def test_sweep_reaches_partitions_without_new_writes(tmp_path):
    """A TTL running out in a partition the next batch does not touch still yields its expiry event."""
    table = SCHEMA.by_name("shop", "sessions")
    key = cqltypes.composite_encode([c.type for c in table.partition_key], [7, "phone"])
    ts = START_US
    cells = [Cell("ip", table.columns["ip"].type.encode(__import__("ipaddress").ip_address("10.0.0.1")), ts, 60,
                  ts // 1_000_000 + 60)]
    row = Row((), LivenessInfo(ts, 60, ts // 1_000_000 + 60), cells=cells)
    m = Mutation([finish_update(PartitionUpdate(table.id, key, table, unfiltereds=[row]))], "CommitLog-7-1.log", 1, 9)
    store = DeltaRsStateStore(str(tmp_path))
    run_store_batch(store, SCHEMA, [records_to_batch(mutation_records(m))], batch_id="batch-000", batch_seq=1,
                    now=NOW0 + 1)
    assert _state_table(tmp_path, table, NOW0 + 1)
    res = run_store_batch(store, SCHEMA, [], batch_id="batch-001", batch_seq=2, now=NOW0 + 100, prev_now=NOW0 + 1)
    assert res["events"] == 1
    ev = json.loads(next(read_outbox(str(tmp_path), "batch-001"))["event_json"])
    assert ev["op"] == "d" and ev["source"]["expired"] and ev["source"]["ts_us"] == (NOW0 + 60) * 1_000_000
    # the stored row is no longer marked live, so the SQL view agrees
    state = read_state(str(tmp_path), "shop", "sessions")
    assert not any(state["_cdc_live"].to_pylist())


def _batches(seed, n=80, parts=3):
    rng = random.Random(seed)
    copies = _copies(list(Workload(SCHEMA, seed=seed, partitions=10).mutations(n)), rng)
    k = len(copies) // parts
    return [copies[i * k:(i + 1) * k] if i < parts - 1 else copies[i * k:] for i in range(parts)]


def _snapshot(root):
    out = {}
    for p in sorted(Path(root).rglob("_delta_log/*.json")):
        out[str(p.relative_to(root))] = p.read_bytes()
    return out


def test_rerun_of_a_committed_batch_changes_nothing(tmp_path):
    batches = _batches(3)
    store, _, _ = _run(tmp_path, batches, check=False)
    before = _snapshot(tmp_path)
    recs = []
    for j, (_, copy) in enumerate(batches[-1]):
        recs += mutation_records(copy, j)
    res = run_store_batch(store, SCHEMA, [records_to_batch(recs)], batch_id=f"batch-{len(batches) - 1:03d}",
                          batch_seq=len(batches), now=NOW0 + 5 + 45 * (len(batches) - 1), prev_now=NOW0 + 5 + 45 * (len(batches) - 2))
    assert res["outbox_written"] is False and res["tables"] == {}
    assert _snapshot(tmp_path) == before


def test_a_snapshot_is_what_the_store_reads_while_another_batch_commits(tmp_path):
    """``snapshot`` pins a store's reads (the transform reads the state as its batch began): a commit made since,
    here by another store, shows neither in ``is_committed`` at the snapshot's version nor in the rows read."""
    from cdc_lib.sinks.delta import META_COLUMNS
    batches = _batches(5, parts=2)
    store, _, _ = _run(tmp_path, batches[:1], check=False)
    t = SCHEMA.by_name("shop", "orders")
    order = [("_cdc_token", "ascending"), ("_cdc_row_kind", "ascending"), ("_cdc_clustering", "ascending")]
    before = read_state(str(tmp_path), t.keyspace, t.name).select(META_COLUMNS).sort_by(order)
    versions = store.snapshot([t])
    store.versions.update(versions)
    recs = []
    for j, (_, copy) in enumerate(batches[1]):
        recs += mutation_records(copy, j)
    run_store_batch(DeltaRsStateStore(str(tmp_path)), SCHEMA, [records_to_batch(recs)], batch_id="batch-001",
                    batch_seq=2, now=NOW0 + 50, prev_now=NOW0 + 5)
    after = read_state(str(tmp_path), t.keyspace, t.name).select(META_COLUMNS).sort_by(order)
    assert not after.equals(before)                     # the second batch changed the table
    assert store.is_committed(t, 2) and store.is_committed(t, 1, version=versions[store.state_uri(t)])
    assert not store.is_committed(t, 2, version=versions[store.state_uri(t)])
    keys = set(before["_cdc_partition_key"].to_pylist()) | set(after["_cdc_partition_key"].to_pylist())
    assert store.read_state_rows(t, keys).select(META_COLUMNS).sort_by(order).equals(before)


@pytest.mark.parametrize("set_in_scan,read_threads", [(True, 2), (False, 2), (False, 1)],
                         ids=["isin-in-scan", "sorted-lookup", "sorted-lookup-one-thread"])
def test_the_stored_rows_read_are_those_of_the_keys_asked_whatever_their_tokens_share(tmp_path, monkeypatch,
                                                                                     set_in_scan, read_threads):
    """``read_state_rows`` picks the rows of exactly the keys asked for, in the files' order, from a state of
    several files: partitions of several rows; two stored keys sharing a token of which only one is asked for; two
    asked keys sharing a token; keys with no stored row; tokens given out of order, or not at all (murmur3's then).
    Both ways a scan tests tokens (a set in its filter for few partitions, a sorted lookup for many) give the same
    rows, whether the rows are picked on threads beside the scan or on the reading thread (a Spark task's). The
    truth is a plain filter of every stored row by its key."""
    from deltalake import write_deltalake

    from cdc_lib.cql.tokens import token as murmur3_token
    from cdc_lib.sinks import delta as delta_store
    monkeypatch.setattr(delta_store, "SCAN_ISIN_MAX", 10 ** 9 if set_in_scan else 0)
    t = SCHEMA.by_name("shop", "orders")
    store = DeltaRsStateStore(str(tmp_path), read_threads=read_threads)
    rng = random.Random(5)
    keys = [b"k%03d" % i for i in range(300)]
    # real tokens, except that keys 0-9 share the token of key 10 + i (collisions murmur3 could make)
    tok = {k: murmur3_token(k) for k in keys}
    for i in range(10):
        tok[keys[i]] = tok[keys[10 + i]]
    rows = [(tok[k], k, c) for k in keys for c in range(rng.randint(1, 3))]
    rng.shuffle(rows)
    for part in (rows[:200], rows[200:350], rows[350:]):           # three files, each of the whole ring
        write_deltalake(store.state_uri(t), pa.table({
            "_cdc_token": pa.array([r[0] for r in part], pa.int64()),
            "_cdc_partition_key": pa.array([r[1] for r in part], pa.binary()),
            "_cdc_row_kind": pa.array(["row"] * len(part)),
            "_cdc_clustering": pa.array([b"c%d" % r[2] for r in part], pa.binary())}), mode="append")
    everything = store.read_state_rows(t, keys, tokens=pa.array([tok[k] for k in keys], pa.int64()))
    assert everything.num_rows == len(rows)       # every key asked for: every row, as the files hold them
    stored = list(zip(*(everything.column(c).to_pylist() for c in ("_cdc_partition_key", "_cdc_clustering"))))

    def read(asked, tokens):
        got = store.read_state_rows(t, pa.array(asked, pa.binary()), tokens=tokens)
        return list(zip(*(got.column(c).to_pylist() for c in ("_cdc_partition_key", "_cdc_clustering"))))

    # key 3 without key 13 (one token), keys 5 and 15 (both of one token), keys not stored, the rest at random
    asked = [keys[3], keys[5], keys[15], b"absent-1", b"absent-2"] + rng.sample(keys[20:], 60)
    want = [r for r in stored if r[0] in set(asked)]
    assert {r[0] for r in want} == set(asked) - {b"absent-1", b"absent-2"}
    by_token = sorted(asked, key=lambda k: tok.get(k, murmur3_token(k)))
    assert read(by_token, pa.array([tok.get(k, murmur3_token(k)) for k in by_token], pa.int64())) == want
    rng.shuffle(asked)                                       # tokens out of order
    assert read(asked, pa.array([tok.get(k, murmur3_token(k)) for k in asked], pa.int64())) == want
    # no tokens given: murmur3's, under which keys 0-9 (stored under other tokens) are not found
    plain = [k for k in asked if k not in keys[:10]]
    assert read(plain, None) == [r for r in stored if r[0] in set(plain)]
    # only a key whose token another stored key shares
    assert read([keys[13]], pa.array([tok[keys[13]]], pa.int64())) == [r for r in stored if r[0] == keys[13]]


def test_the_scans_batches_are_picked_on_threads_in_order_and_as_they_come():
    """``_mapped_in_order`` (how a read picks the rows of its scan's batches): the results in the items' order
    whatever order the threads finish in, the items taken from their iterator only a few ahead of the results (a
    scan's batches are not all held at once), and a failure raised where its result is due. On one thread (a Spark
    task's read) the items are mapped on the calling thread, one at a time."""
    import threading
    import time

    from cdc_lib.sinks.delta import _mapped_in_order
    taken = []

    def items():
        for i in range(40):
            taken.append(i)
            yield i

    def slow_first(i):
        time.sleep(0.02 if i % 5 == 0 else 0)
        return i * i

    results = _mapped_in_order(slow_first, items(), threads=2, ahead=4)
    assert next(results) == 0 and len(taken) <= 6          # the first result, with at most 6 items taken
    assert list(results) == [i * i for i in range(1, 40)]

    def fails_at_7(i):
        if i == 7:
            raise ValueError("batch 7")
        return i

    got = []
    with pytest.raises(ValueError, match="batch 7"):
        for r in _mapped_in_order(fails_at_7, range(20), threads=2, ahead=4):
            got.append(r)
    assert got == list(range(7))

    taken.clear()
    on_threads = []

    def on_which_thread(i):
        on_threads.append(threading.current_thread())
        return i + 1

    results = _mapped_in_order(on_which_thread, items(), threads=1)
    assert next(results) == 1 and taken == [0]
    assert list(results) == list(range(2, 41))
    assert set(on_threads) == {threading.current_thread()}


class Crash(Exception):
    pass


def test_failure_between_outbox_and_state_then_rerun(tmp_path):
    """Crash after the outbox commit (and after one state table): the rerun completes the batch exactly."""
    batches = _batches(5)
    clean = tmp_path / "clean"
    _run(clean, batches, check=False)

    crashed = tmp_path / "crashed"
    _run(crashed, batches[:-1], check=False)
    recs = []
    for j, (_, copy) in enumerate(batches[-1]):
        recs += mutation_records(copy, j)
    i = len(batches) - 1
    kw = dict(batch_id=f"batch-{i:03d}", batch_seq=i + 1, now=NOW0 + 5 + 45 * i, prev_now=NOW0 + 5 + 45 * (i - 1))
    for crash_after in (1, 2):      # after the outbox; after the outbox and the first state table
        calls = []

        def hook(kind, name):
            calls.append((kind, name))
            if len(calls) == crash_after:
                raise Crash(name)
        with pytest.raises(Crash):
            run_store_batch(DeltaRsStateStore(str(crashed), fail_hook=hook), SCHEMA, [records_to_batch(recs)], **kw)
    run_store_batch(DeltaRsStateStore(str(crashed)), SCHEMA, [records_to_batch(recs)], **kw)

    assert list(read_outbox(str(crashed), kw["batch_id"])) == list(read_outbox(str(clean), kw["batch_id"]))
    for t in SCHEMA.tables.values():
        assert _state_table(crashed, t, kw["now"]) == _state_table(clean, t, kw["now"])
        a = read_state(str(crashed), t.keyspace, t.name).sort_by([("_cdc_token", "ascending"),
                                                                 ("_cdc_row_kind", "ascending"),
                                                                 ("_cdc_clustering", "ascending")])
        b = read_state(str(clean), t.keyspace, t.name).sort_by([("_cdc_token", "ascending"),
                                                               ("_cdc_row_kind", "ascending"),
                                                               ("_cdc_clustering", "ascending")])
        assert a.to_pylist() == b.to_pylist()


def _outbox_files(root) -> list:
    """The Parquet metadata of every file of the outbox under ``root``."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from cdc_lib.sinks.delta import events_table_uri
    files = DeltaTable(events_table_uri(str(root))).file_uris()
    return [pq.ParquetFile(f.removeprefix("file://")).metadata for f in files]


def _column_chunks(meta, name) -> list:
    return [meta.row_group(g).column(c) for g in range(meta.num_row_groups) for c in range(meta.num_columns)
            if meta.row_group(g).column(c).path_in_schema == name]


def test_outbox_files_keep_statistics_to_find_a_batch_and_write_event_strings_plainly(tmp_path):
    """Readers find a batch's outbox rows by ``batch_id`` (file statistics); the strings each event has alone (id,
    key, envelope) are written without a dictionary or min/max statistics, by the append and by compaction."""
    from cdc_lib.sinks.delta import OUTBOX_UNIQUE_COLUMNS
    batches = _batches(3)
    _run(tmp_path, batches, check=False)
    appended = _outbox_files(tmp_path)
    store = DeltaRsStateStore(str(tmp_path))
    assert store.compact_and_vacuum(store.events_uri(), 0)["files_added"] == 1
    compacted = _outbox_files(tmp_path)
    assert len(appended) == len(batches) and len(compacted) == 1
    for meta in appended + compacted:
        for name in ("batch_id", "batch_seq", "seq"):
            assert all(c.is_stats_set and c.statistics.has_min_max for c in _column_chunks(meta, name)), name
        for name in OUTBOX_UNIQUE_COLUMNS:
            chunks = _column_chunks(meta, name)
            assert chunks and not any(c.is_stats_set and c.statistics.has_min_max for c in chunks), name
            assert not any(c.has_dictionary_page for c in chunks), name
    rows = list(read_outbox(str(tmp_path), "batch-001"))
    assert rows and {r["batch_id"] for r in rows} == {"batch-001"}
    assert [r["seq"] for r in rows] == list(range(len(rows)))


# ------------------------------------------------------------------------------------------ types and SQL

def test_every_cql_type_has_a_natural_arrow_column_and_reads_back_from_delta(tmp_path):
    table = SCHEMA.by_name("shop", "all_types")
    w = Workload(SCHEMA, seed=11, tables=["all_types"], partitions=5)
    muts = [m for m in w.mutations(60)]
    store = DeltaRsStateStore(str(tmp_path))
    recs = []
    for i, m in enumerate(muts):
        recs += mutation_records(Mutation(m.updates, "CommitLog-7-1.log", 1, 10 + i), i)
    now = NOW0 + 1
    run_store_batch(store, SCHEMA, [records_to_batch(recs)], batch_id="b", batch_seq=1, now=now)
    schema = state_arrow_schema(table)
    assert schema.field("a_tinyint").type == pa.int8() and schema.field("a_date").type == pa.date32()
    assert schema.field("a_timestamp").type == pa.timestamp("us", tz="UTC")
    assert schema.field("a_duration").type == pa.struct([("months", pa.int32()), ("days", pa.int32()),
                                                         ("nanoseconds", pa.int64())])
    assert pa.types.is_map(schema.field("a_frozen_map").type)
    assert pa.types.is_struct(schema.field("a_udt").type) and schema.field("a_udt").type.names == ["street", "city", "zip"]
    state = read_state(str(tmp_path), "shop", "all_types")
    live = state.filter(state["_cdc_live"])
    expected = model_table(table, muts, now)
    assert live.num_rows == len(expected) > 0
    by_key = {(r["id"], r["ck_text"], r["ck_int"]): r for r in live.to_pylist()}
    for row in expected.values():
        got = by_key[(row["id"], row["ck_text"], row["ck_int"])]
        for col in table.columns.values():
            v = row[col.name]
            want = to_arrow_value(col.type, v)
            # what Delta hands back is the Arrow value of the exact CQL value
            assert pa.array([want], arrow_type(col.type)).to_pylist()[0] == got[col.name], col.name
    # spot checks of the mapping's exactness
    assert to_arrow_value(cqltypes.parse_type("decimal"), decimal.Decimal("1.50")) == "1.50"
    assert to_arrow_value(cqltypes.parse_type("varint"), 10 ** 40) == str(10 ** 40)
    assert to_arrow_value(cqltypes.parse_type("date"), cqltypes.CqlDate(-(2 ** 31))) == -(2 ** 31)
    assert to_arrow_value(cqltypes.parse_type("timestamp"),
                          datetime.datetime(2020, 1, 1, 0, 0, 0, 5000, tzinfo=datetime.timezone.utc)) \
        == 1577836800005000
    assert to_arrow_value(cqltypes.parse_type("frozen<map<frozen<list<int>>, text>>"),
                          cqltypes.CqlPairs([([1, 2], "x")])) == [{"key": [1, 2], "value": "x"}]


def test_duckdb_and_polars_see_the_cql_table(tmp_path):
    import duckdb
    import polars as pl
    batches = _batches(8, n=60, parts=2)
    _, seen, last_now = _run(tmp_path, batches, check=False)
    table = SCHEMA.by_name("shop", "orders")
    expected = model_table(table, seen, last_now)
    from deltalake import DeltaTable

    from cdc_lib.sinks.delta import state_table_uri
    uri = state_table_uri(str(tmp_path), "shop", "orders")
    state = DeltaTable(uri).to_pyarrow_dataset()   # noqa: F841 - the relation DuckDB's SQL names
    got = duckdb.sql(visible_rows_query(table, "state")).arrow()
    got = got.read_all() if hasattr(got, "read_all") else got
    assert got.num_rows == len(expected)
    keys = {(r["customer_id"], r["order_day"], r["order_id"]) for r in got.to_pylist()}

    def text(v):            # a static-only row has null clustering columns
        return None if v is None else str(v)
    assert keys == {(text(r["customer_id"]), r["order_day"], text(r["order_id"])) for r in expected.values()}
    df = pl.scan_delta(uri).filter(pl.col("_cdc_live")).select([c for c in got.column_names]).collect()
    assert df.height == len(expected)
    assert sorted(df["status"].to_list(), key=repr) == sorted((r["status"] for r in expected.values()), key=repr)


# ------------------------------------------------------------------------------------------ schema changes

def _with_column(table, name, type_):
    cols = dict(table.columns)
    cols[name] = ColumnMetadata(name, cqltypes.parse_type(type_), REGULAR)
    return dataclasses.replace(table, columns=cols)


def _dropping(table, name, at_us):
    cols = dict(table.columns)
    col = cols.pop(name)
    dropped = dict(table.dropped)
    dropped[name] = DroppedColumn(name, col.type, at_us)
    return dataclasses.replace(table, columns=cols, dropped=dropped)


def test_added_column_joins_the_delta_table_without_rewrite_and_dropped_column_leaves_the_image(tmp_path):
    schema = sample_schema()
    table = schema.by_name("shop", "sessions")
    key = cqltypes.composite_encode([c.type for c in table.partition_key], [1, "tv"])
    store = DeltaRsStateStore(str(tmp_path))

    def write(tbl, seq, ts, cells, now):
        schema.tables[tbl.id] = tbl
        u = finish_update(PartitionUpdate(tbl.id, key, tbl, unfiltereds=[Row((), LivenessInfo(ts), cells=cells)]))
        m = Mutation([u], "CommitLog-7-1.log", 1, seq * 100)
        return run_store_batch(store, schema, [records_to_batch(mutation_records(m))], batch_id=f"b{seq}",
                               batch_seq=seq, now=now)

    ip = table.columns["ip"].type
    write(table, 1, START_US, [Cell("ip", ip.encode(__import__("ipaddress").ip_address("10.1.1.1")), START_US)],
          NOW0 + 1)
    log = Path(tmp_path) / "delta" / "state" / "shop.sessions" / "_delta_log"
    n_before = len(list(log.glob("*.json")))

    grown = _with_column(table, "referrer", "text")
    txt = cqltypes.parse_type("text")
    write(grown, 2, START_US + 10, [Cell("referrer", txt.encode("news"), START_US + 10)], NOW0 + 2)
    commits = sorted(log.glob("*.json"))[n_before:]
    actions = [[json.loads(line) for line in p.read_text().splitlines()] for p in commits]
    add_column = [a for a in actions if any("metaData" in x for x in a)]
    assert len(add_column) == 1 and not any("add" in x or "remove" in x for x in add_column[0]), \
        "adding a column must be a metadata-only commit"
    state = read_state(str(tmp_path), "shop", "sessions")
    row = state.filter(pc.equal(state["_cdc_row_kind"], "row")).to_pylist()[0]
    assert row["referrer"] == "news" and row["ip"] == "10.1.1.1"

    shrunk = _dropping(grown, "ip", START_US + 20)
    write(shrunk, 3, START_US + 30, [Cell("referrer", txt.encode("ads"), START_US + 30)], NOW0 + 3)
    ev = json.loads(list(read_outbox(str(tmp_path), "b3"))[-1]["event_json"])
    assert ev["after"]["referrer"] == "ads" and "ip" not in ev["after"]
    assert "ip" not in visible_rows_query(shrunk)
    state = read_state(str(tmp_path), "shop", "sessions")
    row = state.filter(pc.equal(state["_cdc_row_kind"], "row")).to_pylist()[0]
    assert row["ip"] is None and row["referrer"] == "ads"


def test_a_udt_field_added_by_alter_type_reaches_the_delta_struct(tmp_path, caplog):
    """ALTER TYPE ... ADD: the new field's values show in the typed columns (a struct, a list of structs) after
    the next batch; inside a map Delta cannot evolve the struct: a warning, and the exact value in _cdc_cells.
    Found by the real-cluster test: the new field was cast away silently."""
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    ddl = ("CREATE TYPE k.addr (a int, b text{});\n"
           "CREATE TABLE k.t (k int PRIMARY KEY, u frozen<addr>, lu frozen<list<frozen<addr>>>, "
           "mu frozen<map<text, frozen<addr>>>) WITH cdc = true AND ID = 5a1c395e-b41f-11e5-9f22-ba0be0483c18;")
    store = DeltaRsStateStore(str(tmp_path))

    def write(schema, seq, values: dict):
        t = schema.by_name("k", "t")
        ts = START_US + seq
        updates = []
        for k, value in values.items():
            cells = [Cell("u", t.columns["u"].type.encode(value), ts),
                     Cell("lu", t.columns["lu"].type.encode([value]), ts),
                     Cell("mu", t.columns["mu"].type.encode({"x": value}), ts)]
            key = t.partition_key[0].type.encode(k)
            updates.append(finish_update(PartitionUpdate(t.id, key, t,
                                                         unfiltereds=[Row((), LivenessInfo(ts), cells=cells)])))
        m = Mutation(updates, "CommitLog-7-1.log", 1, seq * 100)
        run_store_batch(store, schema, [records_to_batch(mutation_records(m))], batch_id=f"b{seq}",
                        batch_seq=seq, now=NOW0 + seq)

    # one data file with rows 1 and 3; batch 2 changes row 1, so the MERGE rewrites that file and copies row 3
    write(load_cql_schema(ddl.format("")), 1, {1: {"a": 1, "b": "old"}, 3: {"a": 3, "b": "kept"}})
    with caplog.at_level("WARNING", logger="cdc_lib.sinks.delta"):
        write(load_cql_schema(ddl.format(", c text")), 2, {1: {"a": 1, "b": "new", "c": "added"},
                                                           2: {"a": 2, "b": "new", "c": "added"}})
    rows = {r["k"]: r for r in read_state(str(tmp_path), "k", "t").filter(pc.field("_cdc_live")).to_pylist()}
    for k in (1, 2):
        assert rows[k]["u"] == {"a": k, "b": "new", "c": "added"}
        assert rows[k]["lu"] == [{"a": k, "b": "new", "c": "added"}]
    assert rows[3]["u"] == {"a": 3, "b": "kept", "c": None}             # written before: the field is null
    assert rows[3]["lu"] == [{"a": 3, "b": "kept", "c": None}]
    assert rows[2]["mu"] == [("x", {"a": 2, "b": "new"})]                # Delta cannot evolve a map's struct
    assert "k.t.mu: the UDT gained fields" in caplog.text and "k.t.u:" not in caplog.text
