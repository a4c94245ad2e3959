"""Bootstrap on a real Cassandra 5.0 node: tables that held rows before CDC was enabled, loaded by a backfill while
a client keeps writing, then the stream (``handoff.run_handoff``; the session's node, ``real_cassandra``).

What a user would notice, each checked below:

* the Delta state equals ``SELECT *`` (every value, also as the driver's own values) and, for the table only
  loaded, each cell's ``WRITETIME()`` and ``TTL()``;
* the first event of every row that existed before CDC is its ``r``, and in Kafka no change is missing or twice:
  per key, the events follow every state the row had from the moment the backfill read it (``event_invariant``);
* segments that arrived during the backfill waited for it (the backfill's batches come first);
* the task log says how far the backfill is: token ranges done of the total and rows, per table.
"""
from __future__ import annotations

import pytest
from event_invariant import canon, check_histories
from handoff import PARTITIONS, ROWS, run_handoff
from sstable_check import differences, state_cell_times

from cdc_lib.demo.compare import Comparison, compare_native, compare_table, delta_live_rows, key_json
from cdc_lib.pipeline.backfill import request_backfill
from cdc_lib.sinks.delta import read_outbox, read_state, states_from_rows

SPLITS, PER_BATCH = 4, 2


@pytest.fixture(scope="module")
def cql(real_cassandra, tmp_path_factory, kafka_broker):
    def request(config, agent):
        return request_backfill(config, mode="cql", tables=["handoff_cql.t", "handoff_cql.types"], splits=SPLITS,
                                splits_per_batch=PER_BATCH, page_size=10, parallelism=2)
    sc = run_handoff(real_cassandra, tmp_path_factory.mktemp("handoff-cql"), kafka_broker, "cql", request)
    print(f"\ncql handoff: {sc.timings}, writes {sc.writes}, {len(sc.backfill_batches)} backfill batches, "
          f"{len(sc.stream_batches)} stream batches")
    return sc


def test_the_state_equals_select_star_value_for_value(cql):
    out = Comparison()
    for name, table in cql.tables.items():
        rows = delta_live_rows(str(cql.store), table)
        compare_table(table, cql.final_rows[name], rows, out)
        compare_native(table, cql.final_native[name], rows, out)
    print(out.summary())
    assert out.equal, out.summary()
    assert out.rows_by_table["handoff_cql.types"] == 10 and out.rows_by_table["handoff_cql.t"] > 250
    assert out.native_cells > 1000


def test_loaded_cells_carry_their_real_write_times_and_ttls(cql):
    """WRITETIME() exact and TTL() within 2 s for every simple cell of the table only loaded (the rows of the
    other one were rewritten since)."""
    table = cql.tables["types"]
    parts = states_from_rows(read_state(str(cql.store), table.keyspace, table.name))
    ours = {}
    for pk, state in parts.items():
        ours.update(state_cell_times(table, pk, state, cql.final_now))
    expected = cql.final_times["types"]
    ours = {k: v for k, v in ours.items() if k in expected}
    assert not differences(expected, ours, what="times", ttl_slack=2)
    assert sum(len(v) for v in expected.values()) > 200
    assert any(v[1] for times in expected.values() for v in times.values())         # a TTL was compared
    assert any(v[0] == 1000 for times in expected.values() for v in times.values())  # USING TIMESTAMP 1000


def test_every_row_that_existed_gets_its_read_event_first_and_no_change_is_missing_or_twice(cql):
    records = cql.events("t")
    ids = [r.event_id for r in records]
    assert len(ids) == len(set(ids)), "an event is in Kafka twice"
    events = [(r.key, r.value) for r in records]
    check_histories(events, cql.histories, complete=True, backfilled=True)
    first = {}
    for key, value in events:
        first.setdefault(key, value)
    survivors = {k for k in cql.existing if cql.histories[canon(k)][-1] is not None}
    assert cql.existing & survivors <= set(first), "a row that existed before CDC and still exists has no event"
    kinds = {"r": 0, "changed before its read": 0, "written again": 0}
    for key in cql.existing & set(first):
        e = first[key]
        if e["op"] == "r":
            kinds["r"] += 1
        elif e["before"] is not None:
            # changed while its page was being read (its write time after the page was asked for, applied before
            # the read): check_events proved the before image a state the row had
            kinds["changed before its read"] += 1
        else:           # deleted before the backfill read it; this is the row written again later
            history = cql.histories[canon(key)]
            after = canon(e["after"])
            assert e["op"] == "c" and any(history[j] is None and history[j + 1] == after
                                          for j in range(2, len(history) - 1)), (key, e, history)
            kinds["written again"] += 1
    print(kinds)
    assert kinds["r"] > 250 and kinds["changed before its read"] < 10 and len(cql.existing) == PARTITIONS * ROWS
    ops = {}
    for _, v in events:
        ops[v["op"]] = ops.get(v["op"], 0) + 1
    assert ops.get("u", 0) > 50 and ops.get("d", 0) > 10 and ops.get("c", 0) > 5, ops     # the stream's changes
    assert cql.writes["during"] > 50 and cql.writes["after"] >= 20, cql.writes


def test_the_loaded_tables_events_are_one_read_per_row(cql):
    records = cql.events("types")
    table = cql.tables["types"]
    assert [r.value["op"] for r in records] == ["r"] * 10
    keys = table.partition_key + table.clustering
    assert sorted(r.key for r in records) == sorted(key_json(table, {c.name: row[c.name] for c in keys})
                                                    for row in cql.final_rows["types"])


def test_the_backfill_goes_first_and_segments_that_arrive_meanwhile_wait(cql):
    assert len(cql.backfill_batches) == SPLITS // PER_BATCH * 2            # two tables
    assert cql.waited == len(cql.backfill_batches) - 1 > 0
    seqs = [b.batch_seq for b in cql.backfill_batches]
    assert seqs == list(range(1, len(seqs) + 1))
    assert min(b.batch_seq for b in cql.stream_batches) == seqs[-1] + 1
    for b in cql.backfill_batches:
        rows = list(read_outbox(str(cql.store), b.batch_id))
        assert {r["op"] for r in rows} <= {"r", "u"} and b.segments == []
        assert b.steps["transform"]["mode"] == "driver" and b.steps["archive"]["archived"] == 0
    assert sum(b.steps["transform"]["scanned_ranges"] for b in cql.backfill_batches) == 2 * SPLITS
    assert sum(b.steps["transform"]["scanned_rows"] for b in cql.backfill_batches) >= 250


def test_the_task_log_shows_the_backfills_progress(cql):
    """Per batch and table: token ranges done of the total, the batch's rows and the rows so far; per range its
    rows and seconds."""
    rid = cql.request["request_id"]
    for table, rows in (("handoff_cql.t", None), ("handoff_cql.types", 10)):
        done = [line for line in cql.log if line.startswith(f"backfill {rid}: {table}: ")]
        assert [line.split(": ")[2].split(" token")[0] for line in done] == \
            [f"{n} of {SPLITS}" for n in range(PER_BATCH, SPLITS + 1, PER_BATCH)], done
        if rows is not None:
            assert done[-1].endswith(f"so far {rows} rows)"), done[-1]
    scans = [line for line in cql.log if line.startswith("scan handoff_cql.t: token range ")]
    assert len(scans) == SPLITS and all(" rows in " in line for line in scans)
    assert cql.backfill_batches[-1].steps["transform"]["scanned"]["handoff_cql.types"] == {"ranges": SPLITS,
                                                                                           "rows": 10}
