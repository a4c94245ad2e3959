"""Bounded growth: the tombstone purge after gc_grace_seconds, the outbox's retention and layout, the maintenance step.

The purge is checked against the reference model (which keeps every tombstone and knows nothing of purging): a
purge must change no row and no event, so the state after it, and every event published after it, still equal the
model's. Its one visible consequence, a late write that resurrects, is checked in ``late_write`` (and against a
real Cassandra node in ``test_real_cluster``, as is the TTL rule). The cells of dropped and left-out columns are
purged whatever gc_grace_seconds, the maintenance counters reach ``cassandra-cdc metrics`` (checked with the strict
``prom_text`` reader against counts taken from the state table).
"""
from __future__ import annotations

import dataclasses
import json
import time

import prom_text
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from event_invariant import check_events
from late_write import engine_rows
from reference_model import json_table, published_states
from reference_model import visible_table as model_table

from cdc_lib import pipeline as P
from cdc_lib.celllog.records import mutation_records, records_to_batch
from cdc_lib.celllog.schema import decode_clustering
from cdc_lib.cli.main import main as cli_main
from cdc_lib.commitlog.model import NO_DELETION_TIME, Mutation
from cdc_lib.demo.workload import SAMPLE_SCHEMA_CQL, START_US, Workload, sample_schema
from cdc_lib.errors import ConfigError
from cdc_lib.sinks.delta import (OLDEST_DELETION, OUTBOX_SCHEMA, DeltaRsStateStore, read_outbox, read_state,
                                 run_store_batch, state_arrow_schema, visible_table)

NOW0 = START_US // 1_000_000


def _batch(store, schema, mutations, seq: int, now: int, prev_now) -> None:
    """Batch ``seq``: every mutation as three replicas logged it."""
    recs = []
    for j, m in enumerate(mutations):
        for r in range(3):
            copy = Mutation(m.updates, f"CommitLog-7-{r + 1}{seq:04d}.log", (r + 1) * 10_000 + seq, 64 + 17 * j,
                            mutation_id=m.mutation_id)
            recs += mutation_records(copy, j)
    run_store_batch(store, schema, [records_to_batch(recs)] if recs else [], batch_id=P.batch_id_for(seq),
                    batch_seq=seq, now=now, prev_now=prev_now)


def _exact(root, table, now: int) -> dict:
    """The table at ``now`` recomputed from the stored metadata, keyed as the reference model keys it."""
    rows = visible_table(table, read_state(str(root), table.keyspace, table.name), now)
    return {(pk, None if ck is None else decode_clustering(ck)): row for (pk, ck), row in rows.items()}


def _live_view(root, table) -> list:
    """What ``SELECT <typed columns> WHERE _cdc_live`` shows (the view users query), as sorted JSON."""
    state = read_state(str(root), table.keyspace, table.name)
    names = [n for n in state.column_names if not n.startswith("_cdc_")]
    return sorted(json.dumps(r, sort_keys=True, default=repr) for r in
                  state.filter(state["_cdc_live"]).select(names).to_pylist())


def test_purge_changes_no_row_and_no_event_and_leaves_only_live_data(tmp_path):
    """gc_grace_seconds = 0 everywhere, every kind of write (TTLs, collections, counters, statics, range and partition
    deletes, late timestamps). A purge after the last batch, at a time when more TTLs have run out than that batch
    saw, changes neither the exact state nor the queried view; the next batch still publishes those expiries (the
    purge keeps an expired cell until a batch showed it expired); and once it has, a purge leaves only live data."""
    schema = sample_schema()
    for tid, t in list(schema.tables.items()):
        schema.tables[tid] = dataclasses.replace(t, gc_grace_seconds=0)
    tables = [t for t in schema.tables.values() if t.keyspace == "shop"]
    mutations = list(Workload(schema, seed=5, partitions=8).mutations(90))
    batches = [mutations[:30], mutations[30:60], mutations[60:]]
    nows = [NOW0 + 5, NOW0 + 90, NOW0 + 180]
    store = DeltaRsStateStore(str(tmp_path))
    for i, (batch, now) in enumerate(zip(batches, nows)):
        _batch(store, schema, batch, i + 1, now, nows[i - 1] if i else None)
    tables = [t for t in tables if store.snapshot([t])]
    last = nows[-1]
    exact = {t.name: _exact(tmp_path, t, last) for t in tables}
    assert exact == {t.name: model_table(t, mutations, last) for t in tables}
    view = {t.name: _live_view(tmp_path, t) for t in tables}

    purge_at = NOW0 + 3700            # every TTL (60 s, 3600 s) has run out; those of 3600 s after the last batch
    counts = [store.purge(t, purge_at) for t in tables]
    assert sum(c["deleted"] for c in counts) > 0 and sum(c["rewritten"] for c in counts) > 0
    for t in tables:
        assert _exact(tmp_path, t, last) == exact[t.name], t.name
        assert _live_view(tmp_path, t) == view[t.name], t.name

    _batch(store, schema, [], 4, purge_at + 1, last)        # the sweep of what expired since the last batch
    batches.append([])
    nows.append(purge_at + 1)
    for t in tables:
        replayed: dict = {}
        events = []
        for seq in range(1, 5):
            for r in read_outbox(str(tmp_path), P.batch_id_for(seq)):
                if r["table"] == t.name:
                    after = json.loads(r["event_json"])["after"]
                    if after is None:
                        replayed.pop(r["key_json"], None)
                    else:
                        replayed[r["key_json"]] = after
                    events.append((r["key_json"], json.loads(r["event_json"])))
        assert replayed == json_table(t, model_table(t, mutations, purge_at + 1)), t.name
        check_events(events, published_states(t, batches, nows), complete=True)

    for t in tables:
        store.purge(t, purge_at + 2)
        rows = read_state(str(tmp_path), t.keyspace, t.name)
        assert set(rows[OLDEST_DELETION].to_pylist()) <= {NO_DELETION_TIME}, t.name     # no tombstone, no TTL left
        assert _exact(tmp_path, t, purge_at + 2) == model_table(t, mutations, purge_at + 2), t.name


def test_a_write_older_than_a_purged_tombstone_resurrects_the_row(tmp_path):
    """The documented consequence (as in Cassandra: test_real_cluster runs the same statements on a real node)."""
    rows = engine_rows(tmp_path, NOW0)
    assert rows == {"gc0": ([(1, "late")], ["c"]), "keep": ([], [])}


# ------------------------------------------------------------------------------------ the maintenance step

@pytest.fixture
def cfg(tmp_path) -> P.PipelineConfig:
    cql = SAMPLE_SCHEMA_CQL + "\nALTER TABLE shop.orders WITH gc_grace_seconds = 0;\n"
    (tmp_path / "schema.cql").write_text(cql)
    (tmp_path / "store").mkdir()
    return P.PipelineConfig(store_url=str(tmp_path / "store"), cluster="c1", schema_file=str(tmp_path / "schema.cql"),
                            outbox_retention_hours=1)


def _pipeline_batches(cfg, n: int, step_s: int) -> list:
    """``n`` batches of orders written and deleted, run as the transform runs them, with manifests as archive
    leaves them (``now`` ``step_s`` apart); returns their nows."""
    schema = P.load_schema(cfg)
    orders = schema.by_name("shop", "orders")
    assert orders.gc_grace_seconds == 0 and schema.by_name("shop", "sessions").gc_grace_seconds == 864000
    store = P.open_store(cfg)
    st = DeltaRsStateStore(P.delta_root(cfg, store))
    w = Workload(schema, seed=3, tables=["orders"], partitions=6, ttl_fraction=0)
    nows = []
    for seq in range(1, n + 1):
        now = NOW0 + seq * step_s
        _batch(st, schema, list(w.mutations(30)), seq, now, nows[-1] if nows else None)
        P.save_batch(store, P.Batch(P.batch_id_for(seq), seq, "archived", [], now, nows[-1] if nows else None))
        store.put_json(P.POINTER_KEY, {"batch_seq": seq, "batch_id": P.batch_id_for(seq)})
        nows.append(now)
    return nows


def test_maintenance_purges_trims_the_outbox_and_waits_for_a_half_written_batch(cfg, capsys):
    nows = _pipeline_batches(cfg, 4, 1800)          # half an hour apart; retention 1 h
    store = P.open_store(cfg)
    root = P.delta_root(cfg, store)
    st = DeltaRsStateStore(root)
    tombstones = lambda: sum(1 for r in read_state(root, "shop", "orders").to_pylist()  # noqa: E731
                             if r[OLDEST_DELETION] != NO_DELETION_TIME)
    before = tombstones()
    assert before > 0
    # batch 4 crashed after its outbox commit: it is 'claimed' again; its rerun must find the state it started from
    P.save_batch(store, dataclasses.replace(P.read_batch(store, P.batch_id_for(4)), state="claimed"))
    cfg.now = nows[-1] + 10
    out = skipped = P.delta_upkeep(cfg)
    assert out["purge_skipped"] == 1 and out["purge_examined_records"] == 0 and tombstones() == before
    # retention: batches processed more than an hour before, and archived; batch 4 is not archived
    assert [bool(list(read_outbox(root, P.batch_id_for(s)))) for s in range(1, 5)] == [False, False, True, True]
    assert out["outbox_rows_deleted"] > 0
    assert st.outbox_committed(4)                    # the app transactions stay

    P.save_batch(store, dataclasses.replace(P.read_batch(store, P.batch_id_for(4)), state="archived"))
    records = read_state(root, "shop", "orders").num_rows
    started = time.time()
    out = P.delta_upkeep(cfg)
    assert out["purge_skipped"] == 0 and out["purged_records"] > 0 and tombstones() == 0
    assert P.read_metrics(cfg)["last"]["maintenance"]["purged_records"] == out["purged_records"]

    # what `cassandra-cdc metrics` (and /metrics of `cassandra-cdc status`) shows of the two runs, counted from the
    # state table: every record that held a tombstone was read and either deleted or rewritten
    assert cli_main(["metrics", "--store-url", cfg.store_url, "--cluster", "c1"]) == 0
    m = prom_text.parse(capsys.readouterr().out)
    orders = {"cluster": "c1", "keyspace": "shop", "table": "orders"}
    deleted = records - read_state(root, "shop", "orders").num_rows
    assert deleted > 0
    assert prom_text.value(m, "cassandra_cdc_maintenance_purged_records_total", **orders, kind="deleted") == deleted
    assert prom_text.value(m, "cassandra_cdc_maintenance_purged_records_total", **orders,
                           kind="rewritten") == before - deleted
    assert prom_text.value(m, "cassandra_cdc_maintenance_purge_examined_records_total", **orders) == before
    assert prom_text.value(m, "cassandra_cdc_maintenance_purge_skipped_runs_total") == 1
    assert prom_text.value(m, "cassandra_cdc_maintenance_last_purge_skipped") == 0
    assert prom_text.value(m, "cassandra_cdc_step_duration_seconds_count", step="maintenance") == 2
    assert started <= prom_text.value(m, "cassandra_cdc_last_run_timestamp_seconds", step="maintenance") + 1
    assert prom_text.value(m, "cassandra_cdc_last_run_timestamp_seconds", step="maintenance") <= time.time()
    assert prom_text.value(m, "cassandra_cdc_maintenance_last_duration_seconds") == out["duration_s"]
    assert prom_text.value(m, "cassandra_cdc_maintenance_outbox_rows_deleted_total") == \
        skipped["outbox_rows_deleted"] + out["outbox_rows_deleted"]


def test_an_outbox_partitioned_by_batch_id_keeps_working_and_is_rewritten_once(cfg):
    """What earlier versions wrote: one partition per batch. Appends and reads keep working; the maintenance step
    rewrites it without partitions in one commit that keeps every row and the app transactions."""
    store = P.open_store(cfg)
    st = DeltaRsStateStore(P.delta_root(cfg, store))
    from deltalake import CommitProperties, Transaction

    def rows(seq, n):
        return pa.Table.from_pylist([{"batch_id": P.batch_id_for(seq), "batch_seq": seq, "seq": i, "event_id": f"e{i}",
                                      "keyspace": "shop", "table": "orders", "op": "c", "key_json": "{}",
                                      "event_json": "{}", "ts_us": 1, "ts_ms": 1} for i in range(n)],
                                    schema=OUTBOX_SCHEMA)
    for seq in (1, 2):
        write_deltalake(st.events_uri(), rows(seq, 3), mode="append", partition_by=["batch_id"],
                        commit_properties=CommitProperties(app_transactions=[Transaction(st.app_id, seq)]))
    assert st.write_outbox(3, rows(3, 2), P.batch_id_for(3)) and not st.write_outbox(3, rows(3, 2))
    assert DeltaTable(st.events_uri()).metadata().partition_columns == ["batch_id"]
    assert [len(list(read_outbox(st.root, P.batch_id_for(s)))) for s in (1, 2, 3)] == [3, 3, 2]

    assert st.unpartition_outbox() == 8 and st.unpartition_outbox() == 0
    assert DeltaTable(st.events_uri()).metadata().partition_columns == []
    assert [[r["seq"] for r in read_outbox(st.root, P.batch_id_for(s))] for s in (1, 2, 3)] == \
        [[0, 1, 2], [0, 1, 2], [0, 1]]
    assert st.outbox_committed(3) and not st.outbox_committed(4)
    assert st.write_outbox(4, rows(4, 1), P.batch_id_for(4))
    assert len(list(read_outbox(st.root, P.batch_id_for(4)))) == 1


def test_a_state_table_from_before_the_purge_column_gets_it(tmp_path):
    """A state table written before ``_cdc_oldest_deletion`` existed: the purge adds the column, examines every
    record once (deltalake would skip its files on a filter over the new column), fills it in, and purges what is
    due."""
    schema = sample_schema()
    orders = dataclasses.replace(schema.by_name("shop", "orders"), gc_grace_seconds=0)
    schema.tables[orders.id] = orders
    new_root, old_root = tmp_path / "new", tmp_path / "old"
    w = Workload(schema, seed=8, tables=["orders"], partitions=6, ttl_fraction=0)
    mutations = list(w.mutations(40))
    _batch(DeltaRsStateStore(str(new_root)), schema, mutations, 1, NOW0 + 5, None)
    current = read_state(str(new_root), "shop", "orders")
    old_schema = pa.schema([f for f in state_arrow_schema(orders) if f.name != OLDEST_DELETION])
    write_deltalake(str(old_root / "delta" / "state" / "shop.orders"),
                    current.select(old_schema.names).cast(old_schema))
    st = DeltaRsStateStore(str(old_root))
    counts = st.purge(orders, NOW0 + 10, chunk_rows=5)          # several MERGE commits
    assert counts["examined"] == current.num_rows and counts["deleted"] > 0
    assert None not in read_state(str(old_root), "shop", "orders")[OLDEST_DELETION].to_pylist()
    assert _exact(old_root, orders, NOW0 + 10) == model_table(orders, mutations, NOW0 + 10)
    assert st.purge(orders, NOW0 + 10)["examined"] == 0         # nothing old enough is left to look at


def test_outbox_retention_setting():
    assert P.PipelineConfig().outbox_retention_hours == 168
    assert P.PipelineConfig.from_mapping({"outbox_retention_hours": "none"}).outbox_retention_hours is None
    with pytest.raises(ConfigError, match="outbox_retention_hours must be >= 0"):
        P.PipelineConfig(outbox_retention_hours=-1)


# ------------------------------------------------------------------------------------------ dropped columns

DROPS_DDL = """CREATE KEYSPACE drops WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};
CREATE TABLE drops.t (k int, c int, s text static, v text, m map<text, text>, PRIMARY KEY (k, c))
    WITH cdc = true AND ID = 6c1f7b80-1c2d-11f0-9a1b-0242ac120002;
"""
DROP_TS = 5000


def _write(table, k: int, c, ts: int, *, marker=False, v=None, s=None, m=None) -> Mutation:
    """One statement's mutation: row (k, c) (c None: the static row) with the given values at ``ts`` (``v=""``:
    ``SET v = null``, a cell tombstone; a map replaced whole: its collection deletion at ``ts - 1``, as
    ``SET m = {...}`` writes it)."""
    from cdc_lib.commitlog.model import Cell, DeletionTime, LivenessInfo, PartitionUpdate, Row
    cells = [Cell(col, val.encode(), ts) if val else Cell(col, b"", ts, 0, NOW0, is_tombstone=True)
             for col, val in (("s", s), ("v", v)) if val is not None]
    cells += [Cell("m", val.encode(), ts, path=key.encode()) for key, val in sorted((m or {}).items())]
    row = Row(() if c is None else (c.to_bytes(4, "big"),), liveness=LivenessInfo(ts) if marker else None,
              cells=cells, complex_deletions={"m": DeletionTime(ts - 1, NOW0)} if m else {}, is_static=c is None)
    update = PartitionUpdate(table.id, k.to_bytes(4, "big"), table=table,
                             static_row=row if c is None else None, unfiltereds=[] if c is None else [row])
    key = (ts * 100 + k * 10 + (c or 0)).to_bytes(16, "big")          # one id per statement
    return Mutation([update], "CommitLog-7-1.log", 1, 64 + ts, mutation_id=key)


def _cql_rows(root, table) -> list:
    """``SELECT *`` of drops.t as the state's queried view shows it (the table's current columns)."""
    state = read_state(str(root), "drops", "t")
    return sorted(tuple(r.values()) for r in state.filter(state["_cdc_live"]).select(list(table.columns)).to_pylist())


def test_the_cells_of_a_dropped_column_are_purged_and_so_are_rows_only_they_kept(tmp_path):
    """``ALTER TABLE ... DROP``: Cassandra skips the cells of the column written at or before the drop whenever it
    reads an SSTable, so compaction leaves them out, whatever gc_grace_seconds (default here). The purge removes
    them once (a whole-table pass the first time it sees the drop), and the records that only they kept: a row
    that had no marker and only the column, a static row that had only the dropped static. A row left with only
    a tombstone stays, not visible. The state's view then shows what ``SELECT *`` shows; a column added back under
    the same name shows only newer cells."""
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    before = load_cql_schema(DROPS_DDL)
    after = load_cql_schema(DROPS_DDL + f"ALTER TABLE drops.t DROP (s, m) USING TIMESTAMP {DROP_TS};")
    readded = load_cql_schema(DROPS_DDL + f"ALTER TABLE drops.t DROP (s, m) USING TIMESTAMP {DROP_TS};\n"
                              "ALTER TABLE drops.t ADD m map<text, text>;")
    t0, t1, t2 = (sc.by_name("drops", "t") for sc in (before, after, readded))
    store = DeltaRsStateStore(str(tmp_path))

    def batch(seq, schema, mutations, now):
        recs = [r for i, m in enumerate(mutations) for r in mutation_records(m, i)]
        run_store_batch(store, schema, [records_to_batch(recs)], batch_id=P.batch_id_for(seq), batch_seq=seq,
                        now=now, prev_now=None)

    batch(1, before, [_write(t0, 1, 1, 1000, marker=True, v="a", m={"x": "1"}),   # INSERT
                      _write(t0, 1, 2, 1000, m={"y": "2"}),                        # UPDATE of m only
                      _write(t0, 3, 5, 1000, v="", m={"z": "5"}),                  # m, and v set to null
                      _write(t0, 2, None, 1000, s="static only")], NOW0)
    batch(2, after, [_write(t0, 1, 3, 2000, m={"w": "3"}),          # arrives after the drop, written before it
                     _write(t1, 1, 4, 6000, marker=True, v="b")], NOW0 + 10)
    dropped_cells = lambda: sorted((r["_cdc_partition_key"], r["_cdc_clustering"], c["column"])  # noqa: E731
                                   for r in read_state(str(tmp_path), "drops", "t").to_pylist()
                                   for c in r["_cdc_cells"] if c["column"] in ("s", "m"))
    assert len(dropped_cells()) == 5
    # SELECT * after the drop: k, c, v (rows (1, 2), (1, 3), (3, 5) and partition 2 had only s or m, or a tombstone).
    # Partitions 2 and 3, which no batch wrote since the drop, are still in the view, with their values in the Delta
    # columns s and m
    cql = [(1, 1, "a"), (1, 4, "b")]
    assert _cql_rows(tmp_path, t1) == cql + [(2, None, None), (3, 5, None)]

    counts = store.purge(t1, NOW0 + 20)
    assert counts == {"examined": 6, "rewritten": 2, "deleted": 3}
    assert dropped_cells() == [] and _cql_rows(tmp_path, t1) == cql
    state = read_state(str(tmp_path), "drops", "t")
    assert state["m"].null_count == state.num_rows and state["s"].null_count == state.num_rows
    assert store.purge(t1, NOW0 + 30)["examined"] == 0           # the drop is done: nothing due any more
    assert list(read_outbox(str(tmp_path), P.batch_id_for(3))) == []

    batch(3, readded, [_write(t2, 1, 1, 7000, m={"x2": "new"})], NOW0 + 40)
    assert store.purge(t2, NOW0 + 50) == {"examined": 0, "rewritten": 0, "deleted": 0}
    assert _cql_rows(tmp_path, t2) == [(1, 1, "a", [("x2", "new")]), (1, 4, "b", None)]


def test_the_cells_of_a_left_out_column_are_purged(tmp_path):
    """A column left out by ``exclude_columns`` is a column dropped at the end of time: a state table written
    before the rule (or a cell the rule hid on arrival) loses its cells at the next purge, so no state table keeps
    a value of it."""
    from cdc_lib.cql.capture import CaptureRules
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    full = load_cql_schema(DROPS_DDL)
    ruled = CaptureRules(exclude_columns=("drops.t.v",)).apply(full)
    t0, t1 = full.by_name("drops", "t"), ruled.by_name("drops", "t")
    store = DeltaRsStateStore(str(tmp_path))
    for seq, (schema, table, c) in enumerate([(full, t0, 1), (ruled, t1, 2)], 1):
        recs = mutation_records(_write(table, 1, c, 1000 + seq, marker=True, v=f"secret {c}"), 0)
        run_store_batch(store, schema, [records_to_batch(recs)], batch_id=P.batch_id_for(seq), batch_seq=seq,
                        now=NOW0 + seq, prev_now=None)
    values = lambda: sorted(c["value"] for r in read_state(str(tmp_path), "drops", "t").to_pylist()  # noqa: E731
                            for c in r["_cdc_cells"] if c["column"] == "v")
    assert values() == [b"secret 1", b"secret 2"]         # partition 1 written whole under the rule: kept, hidden
    assert store.purge(t1, NOW0 + 10) == {"examined": 2, "rewritten": 2, "deleted": 0}
    assert values() == [] and _cql_rows(tmp_path, t1) == [(1, 1, None, None), (1, 2, None, None)]
    assert read_state(str(tmp_path), "drops", "t")["v"].null_count == 2
