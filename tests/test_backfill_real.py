"""Bootstrap on a real Cassandra 5.0 node: tables that held rows before CDC was enabled, loaded by a backfill while
a client keeps writing, then the stream (``handoff.run_handoff``; the session's node, ``real_cassandra``), for
both modes that load live data: ``cql`` (a parallel scan) and ``sstables`` (a snapshot the agent shipped).

What a user would notice, each checked below for both:

* the Delta state equals ``SELECT *`` (every value, also as the driver's own values) and, for the table only
  loaded, each cell's ``WRITETIME()`` and ``TTL()``;
* the first event of every row that existed before CDC is its ``r``, and in Kafka no change is missing or twice:
  per key, the events follow every state the row had from the moment the backfill read it (``event_invariant``);
* segments that arrived during the backfill waited for it (the backfill's batches come first);
* the task log says how far the backfill is: token ranges or SSTables done of the total, rows or bytes, per table.
"""
from __future__ import annotations

import json

import pytest
from event_invariant import canon, check_histories
from handoff import PARTITIONS, ROWS, run_handoff
from sstable_check import differences, state_cell_times

from cdc_lib.agent.snapshot import ship_snapshot
from cdc_lib.cql.tokens import token
from cdc_lib.demo.compare import Comparison, compare_native, compare_table, delta_live_rows, key_json
from cdc_lib.pipeline.backfill import request_backfill
from cdc_lib.pipeline.bootstrap import read_horizons
from cdc_lib.scan.horizon import Horizon
from cdc_lib.sinks.delta import read_outbox, read_state, states_from_rows
from cdc_lib.storage.objects import ObjectStore

SPLITS, PER_BATCH = 4, 4          # cql: token ranges per table, per batch (a table a batch)
TAG = "handoff"                   # sstables: the snapshot


def _request(cluster):
    def cql(config, agent, ks):
        return request_backfill(config, mode="cql", tables=[f"{ks}.t", f"{ks}.types"], splits=SPLITS,
                                splits_per_batch=PER_BATCH, page_size=10, parallelism=2)

    def sstables(config, agent, ks):
        ship_snapshot(agent.config, [f"{ks}.t", f"{ks}.types"], TAG, nodetool=lambda *a: cluster.nodetool(1, *a),
                      data_dirs=[cluster.node(1).dir / "data"])
        return request_backfill(config, mode="sstables", tag=TAG, sstables_per_batch=1)
    return {"cql": cql, "sstables": sstables}


@pytest.fixture(scope="module", params=["cql", "sstables"])
def sc(request, real_cassandra, tmp_path_factory, kafka_broker):
    mode = request.param
    out = run_handoff(real_cassandra, tmp_path_factory.mktemp(f"handoff-{mode}"), kafka_broker, mode,
                      _request(real_cassandra)[mode])
    print(f"\n{mode} handoff: {out.timings}, writes {out.writes}, {len(out.backfill_batches)} backfill batches, "
          f"{len(out.stream_batches)} stream batches")
    return out


def test_the_state_equals_select_star_value_for_value(sc):
    out = Comparison()
    for name, table in sc.tables.items():
        rows = delta_live_rows(str(sc.store), table)
        compare_table(table, sc.final_rows[name], rows, out)
        compare_native(table, sc.final_native[name], rows, out)
    print(out.summary())
    assert out.equal, out.summary()
    assert out.rows_by_table[f"{sc.keyspace}.types"] == 10 and out.rows_by_table[f"{sc.keyspace}.t"] > 250
    assert out.native_cells > 1000


def test_the_pipelines_process_keeps_no_scan_session_open_after_its_batches(sc):
    """Small batches run in the pipeline's own process (an Airflow worker's): once a batch has read its token
    ranges, that process keeps no connection to the cluster, and so no reconnection attempts when a node restarts
    (``scan.reader.close_sessions`` says how many were still open)."""
    from cdc_lib.scan.reader import close_sessions
    assert close_sessions() == 0


def test_loaded_cells_carry_their_real_write_times_and_ttls(sc):
    """WRITETIME() exact and TTL() within 2 s for every simple cell of the table only loaded (the rows of the
    other one were rewritten since)."""
    table = sc.tables["types"]
    parts = states_from_rows(read_state(str(sc.store), table.keyspace, table.name))
    ours = {}
    for pk, state in parts.items():
        ours.update(state_cell_times(table, pk, state, sc.final_now))
    expected = sc.final_times["types"]
    ours = {k: v for k, v in ours.items() if k in expected}
    assert not differences(expected, ours, what="times", ttl_slack=2)
    assert sum(len(v) for v in expected.values()) > 200
    assert any(v[1] for times in expected.values() for v in times.values())         # a TTL was compared
    assert any(v[0] == 1000 for times in expected.values() for v in times.values())  # USING TIMESTAMP 1000


def test_every_row_that_existed_gets_its_read_event_first_and_no_change_is_missing_or_twice(sc):
    records = sc.events("t")
    ids = [r.event_id for r in records]
    assert len(ids) == len(set(ids)), "an event is in Kafka twice"
    events = [(r.key, r.value) for r in records]
    check_histories(events, sc.histories, complete=True, backfilled=True, may_skip=_in_flight_at_its_read(sc))
    first = {}
    for key, value in events:
        first.setdefault(key, value)
    survivors = {k for k in sc.existing if sc.histories[canon(k)][-1] is not None}
    assert survivors <= set(first), "a row that existed before CDC and still exists has no event"
    kinds = {"r": 0, "changed before its read": 0, "written again": 0}
    for key in sc.existing & set(first):
        e = first[key]
        if e["op"] == "r":
            kinds["r"] += 1
        elif e["before"] is not None:
            # changed while its page was being read (its write time after the page was asked for, applied before
            # the read): check_histories proved the before image a state the row had
            kinds["changed before its read"] += 1
        else:           # deleted before the backfill read it; this is the row written again later
            history = sc.histories[canon(key)]
            after = canon(e["after"])
            assert e["op"] == "c" and any(history[j] is None and history[j + 1] == after
                                          for j in range(2, len(history) - 1)), (key, e, history)
            kinds["written again"] += 1
    print(kinds)
    assert len(sc.existing) == PARTITIONS * ROWS and kinds["changed before its read"] < 10
    if sc.keyspace.endswith("sstables"):        # the snapshot was taken before the writer started
        assert kinds["r"] == len(sc.existing)
    else:
        assert kinds["r"] > 250
    ops = {}
    for _, v in events:
        ops[v["op"]] = ops.get(v["op"], 0) + 1
    assert ops.get("u", 0) > 50 and ops.get("d", 0) > 10 and ops.get("c", 0) > 5, ops     # the stream's changes
    assert sc.writes["during"] > 50 and sc.writes["after"] >= 20, sc.writes


def test_the_loaded_tables_events_are_one_read_per_row(sc):
    records = sc.events("types")
    table = sc.tables["types"]
    assert [r.value["op"] for r in records] == ["r"] * 10
    keys = table.partition_key + table.clustering
    assert sorted(r.key for r in records) == sorted(key_json(table, {c.name: row[c.name] for c in keys})
                                                    for row in sc.final_rows["types"])


def test_the_backfill_goes_first_and_segments_that_arrive_meanwhile_wait(sc):
    cql = sc.keyspace.endswith("cql")
    assert len(sc.backfill_batches) == (SPLITS // PER_BATCH * 2 if cql else 2)          # two tables
    assert sc.waited == len(sc.backfill_batches) - 1 > 0
    seqs = [b.batch_seq for b in sc.backfill_batches]
    assert seqs == list(range(1, len(seqs) + 1))
    assert min(b.batch_seq for b in sc.stream_batches) == seqs[-1] + 1
    for b in sc.backfill_batches:
        rows = list(read_outbox(str(sc.store), b.batch_id))
        assert {r["op"] for r in rows} <= {"r", "u"} and b.segments == []
        assert b.steps["transform"]["mode"] == "driver" and b.steps["archive"]["archived"] == 0
    if cql:
        assert sum(b.steps["transform"]["scanned_ranges"] for b in sc.backfill_batches) == 2 * SPLITS
        assert sum(b.steps["transform"]["scanned_rows"] for b in sc.backfill_batches) >= 250
    else:
        assert sum(b.steps["transform"]["sstables"] for b in sc.backfill_batches) == 2
        assert sum(b.steps["transform"]["sstable_bytes"] for b in sc.backfill_batches) > 10_000


def test_the_task_log_shows_the_backfills_progress(sc):
    """Per batch and table: token ranges (cql) or SSTables (sstables) done of the total, this batch's rows or
    bytes and the request's so far; per range or SSTable what it held and its seconds."""
    rid = sc.request["request_id"]
    cql = sc.keyspace.endswith("cql")
    for table in (f"{sc.keyspace}.t", f"{sc.keyspace}.types"):
        done = [line for line in sc.log if line.startswith(f"backfill {rid}: {table}: ")]
        if cql:
            assert [line.split(": ")[2].split(" token")[0] for line in done] == \
                [f"{n} of {SPLITS}" for n in range(PER_BATCH, SPLITS + 1, PER_BATCH)], done
        else:
            assert len(done) == 1 and done[0].split(": ")[2].startswith("1 of 1 SSTables done"), done
    last = sc.backfill_batches[-1].steps["transform"]["loaded"][f"{sc.keyspace}.types"]
    if cql:
        scans = [line for line in sc.log if line.startswith(f"scan {sc.keyspace}.t: token range ")]
        assert len(scans) == SPLITS and all(" rows in " in line for line in scans)
        assert last == {"done": SPLITS, "rows": 10}
        assert any(line.endswith("so far 10 rows)") for line in sc.log if f"{sc.keyspace}.types: " in line)
    else:
        loads = [line for line in sc.log if line.startswith(f"load {sc.keyspace}.t: SSTable ")]
        assert len(loads) == 1 and " partitions, " in loads[0]
        assert last["done"] == 1 and last["bytes"] > 1000


def _in_flight_at_its_read(sc):
    """``check_histories``' ``may_skip`` for ``handoff.t``: whether the writer's statement that made state ``j`` of
    a row was in flight when the ``cql`` scan asked for the page of its partition (sent before that moment, answered
    after it). Its write time can then be before the page's time while the page did not see it: the pipeline merges
    it without an event, and the row's next event shows it (``scan.horizon``; the driver's write times are the
    client's). An ``sstables`` backfill records no horizon: nothing may be skipped."""
    ranges = read_horizons(ObjectStore.from_url(str(sc.store)), sc.config.cluster).get(str(sc.tables["t"].id))
    horizon = Horizon.from_json(ranges) if ranges else None

    k_type = sc.tables["t"].partition_key[0].type       # the key's own codec (cql.types): k int

    def read_at(k: int):
        return horizon.at(token(k_type.encode(k)))
    if sc.keyspace.endswith("cql"):     # the scan read every partition that existed: each has its page's time
        assert horizon is not None and all(read_at(k) is not None for k in range(PARTITIONS))
    assert all(len(sc.windows[key]) == len(states) for key, states in sc.histories.items())

    def may_skip(key: str, j: int) -> bool:     # j indexes a key of sc.histories, whose windows line up (above)
        window = sc.windows[key][j]
        if horizon is None or window is None:
            return False
        at = read_at(json.loads(key)["k"])
        return at is not None and window[0] < at < window[1]
    return may_skip
