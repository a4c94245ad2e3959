"""Change events for each kind of change: creates, updates, deletes, ranges, partitions, statics, TTLs."""
from __future__ import annotations

import copy
import json
import uuid

import pytest
from event_invariant import check_events

from cdc_lib.celllog.schema import encode_clustering
from cdc_lib.commitlog.model import NO_DELETION_TIME
from cdc_lib.cql import types as cqltypes
from cdc_lib.cql.schema import CLUSTERING, PARTITION_KEY, REGULAR, STATIC, ColumnMetadata, TableMetadata
from cdc_lib.state.events import apply_batch, expiry_sweep, process

T = cqltypes.parse_type
INT = T("int")
NOW = 1000
PK = INT.encode(1)


def make_table(desc=False, counter=False):
    cols = {"pk": ColumnMetadata("pk", INT, PARTITION_KEY, 0),
            "ck": ColumnMetadata("ck", INT, CLUSTERING, 0, desc)}
    if counter:
        cols["n"] = ColumnMetadata("n", T("counter"), REGULAR)
    else:
        cols["v"] = ColumnMetadata("v", INT, REGULAR)
        cols["s"] = ColumnMetadata("s", T("set<int>"), REGULAR)
        cols["st"] = ColumnMetadata("st", INT, STATIC)
        cols["ss"] = ColumnMetadata("ss", T("set<int>"), STATIC)
    return TableMetadata("ks", "tbl", uuid.UUID(int=7), [cols["pk"]], [cols["ck"]], cols,
                         flags=frozenset({"compound", "counter"} if counter else {"compound"}))


TABLE = make_table()
_pos = [0]


def rec(kind, ts, c=None, column=None, value=None, ttl=0, ldt=NO_DELETION_TIME, path=None, is_static=False,
        end=None, si=None, ei=None, pk=PK, segment="CommitLog-7-1.log"):
    _pos[0] += 1
    return {"kind": kind, "timestamp": ts, "clustering": b"" if c is None else encode_clustering([INT.encode(c)]),
            "column": column, "value": value, "ttl": ttl, "local_deletion_time": ldt, "path": path,
            "is_static": is_static, "clustering_end": end, "start_inclusive": si, "end_inclusive": ei,
            "partition_key": pk, "segment": segment, "segment_id": 1, "position": _pos[0], "entry_index": 0,
            "seq": 0}


def insert(ts, c, v, **kw):
    return [rec("row_liveness", ts, c, **kw), rec("cell", ts, c, "v", INT.encode(v), **kw)]


_mutations = [0]


def mutation(*parts, mid=None):
    """Records (or lists of records) of one commit-log entry: they all get one mutation id, as the cell log
    gives them. Replica copies are the same records with another segment and position."""
    _mutations[0] += 1
    mid = mid if mid is not None else _mutations[0].to_bytes(16, "big")
    out = []
    for p in parts:
        out += p if isinstance(p, list) else [p]
    return [dict(r, mutation_id=mid) for r in out]


def elements(ts, c, *values, column="s", is_static=False):
    """Cells of set elements (``SET s = s + {...}``)."""
    return [rec("cell", ts, c, column, b"", path=INT.encode(v), is_static=is_static) for v in values]


def overwrite(ts, c, *values, column="s", is_static=False):
    """``SET s = {...}`` as Cassandra writes it: the old set deleted at ts - 1, the new elements at ts."""
    return [rec("complex_deletion", ts - 1, c, column, ldt=NOW, is_static=is_static)] + \
        elements(ts, c, *values, column=column, is_static=is_static)


def full(c, v=None, s=None, st=None, pk=1, ss=None):
    return {"pk": pk, "ck": c, "v": v, "s": s, "st": st, "ss": ss}


def check_chain(events):
    last = {}
    for e in events:
        k = tuple(e["key"].items())
        assert e["before"] == last.get(k)
        assert e["before"] != e["after"]
        last[k] = e["after"]


def test_insert_update_delete():
    states = {}
    [c] = apply_batch(TABLE, states, insert(10, 1, 5), NOW)
    assert c["op"] == "c" and c["before"] is None and c["after"] == full(1, 5)
    assert c["key"] == {"pk": 1, "ck": 1}
    assert set(c["changed"]) == {"pk", "ck", "v"}
    src = c["source"]
    assert (src["keyspace"], src["table"], src["ts_us"], src["expired"], src["connector"]) == \
        ("ks", "tbl", 10, False, "cassandra-cdc")
    assert src["segment"] == "CommitLog-7-1.log" and src["position"] > 0
    assert c["ts_ms"] == NOW * 1000
    [u] = apply_batch(TABLE, states, [rec("cell", 11, 1, "v", INT.encode(6))], NOW)
    assert u["op"] == "u" and u["before"] == full(1, 5) and u["after"] == full(1, 6) and u["changed"] == ["v"]
    [d] = apply_batch(TABLE, states, [rec("row_deletion", 12, 1, ldt=NOW)], NOW)
    assert d["op"] == "d" and d["before"] == full(1, 6) and d["after"] is None


def test_several_mutations_in_one_batch_give_one_event_each_in_write_time_order():
    recs = mutation(insert(10, 1, 1)) + mutation(rec("cell", 12, 1, "v", INT.encode(3))) + \
        mutation(rec("cell", 11, 1, "v", INT.encode(2)))
    events = apply_batch(TABLE, {}, list(reversed(recs)), NOW)
    assert [(e["op"], e["after"]["v"], e["source"]["ts_us"]) for e in events] == [("c", 1, 10), ("u", 2, 11),
                                                                                  ("u", 3, 12)]
    check_chain(events)


def test_replica_copies_and_same_value_overwrites_emit_nothing():
    states = {}
    recs = mutation(insert(10, 1, 5))
    events = apply_batch(TABLE, states, recs + [dict(r, segment="CommitLog-7-2.log") for r in recs], NOW)
    assert len(events) == 1
    assert apply_batch(TABLE, states, recs, NOW) == []
    assert apply_batch(TABLE, states, [rec("cell", 20, 1, "v", INT.encode(5))], NOW) == []


def test_late_write_updates_from_what_consumers_last_saw():
    states = {}
    apply_batch(TABLE, states, mutation(insert(10, 1, 5)) + mutation(rec("cell", 30, 1, "v", INT.encode(9))), NOW)
    # an older write to another column arrives late: visible change, before = last seen
    [u] = apply_batch(TABLE, states, [rec("cell", 20, 1, "s", b"", path=INT.encode(4))], NOW)
    assert u["op"] == "u" and u["before"] == full(1, 9) and u["after"] == full(1, 9, s=(4,))
    # a late write that loses to what is there changes nothing
    assert apply_batch(TABLE, states, [rec("cell", 15, 1, "v", INT.encode(1))], NOW) == []


def test_partition_deletion_deletes_every_live_row():
    states = {}
    apply_batch(TABLE, states, insert(10, 1, 1) + insert(10, 2, 2) + insert(10, 3, 3), NOW)
    events = apply_batch(TABLE, states, [rec("partition_deletion", 20, ldt=NOW)], NOW)
    assert [(e["op"], e["key"]["ck"]) for e in events] == [("d", 1), ("d", 2), ("d", 3)]
    assert all(e["after"] is None and e["before"]["v"] == e["key"]["ck"] for e in events)
    # late older writes stay deleted
    assert apply_batch(TABLE, states, insert(15, 4, 4), NOW) == []


@pytest.mark.parametrize("desc", [False, True])
def test_range_deletion_deletes_covered_rows_in_clustering_order(desc):
    table = make_table(desc=desc)
    states = {}
    apply_batch(table, states, [r for i in range(1, 6) for r in insert(10, i, i)], NOW)
    lo, hi = (2, 4) if not desc else (4, 2)
    rt = rec("range_tombstone", 20, lo, end=encode_clustering([INT.encode(hi)]), si=True, ei=False, ldt=NOW)
    events = apply_batch(table, states, [rt], NOW)
    assert [e["key"]["ck"] for e in events] == ([2, 3] if not desc else [4, 3])
    assert {e["op"] for e in events} == {"d"}


def test_static_change_updates_every_row_and_static_only_partitions():
    states = {}
    [c] = apply_batch(TABLE, states, [rec("cell", 5, None, "st", INT.encode(7), is_static=True)], NOW)
    assert c["op"] == "c" and c["key"] == {"pk": 1, "ck": None} and c["after"] == full(None, st=7)
    events = apply_batch(TABLE, states, insert(10, 1, 1) + insert(10, 2, 2), NOW)
    # the static-only row gives way to the clustering rows
    assert [(e["op"], e["key"]["ck"]) for e in events] == [("d", None), ("c", 1), ("c", 2)]
    assert events[1]["after"] == full(1, 1, st=7)
    events = apply_batch(TABLE, states, [rec("cell", 11, None, "st", INT.encode(8), is_static=True)], NOW)
    assert [(e["op"], e["key"]["ck"], e["after"]["st"], e["changed"]) for e in events] == \
        [("u", 1, 8, ["st"]), ("u", 2, 8, ["st"])]
    events = apply_batch(TABLE, states, [rec("row_deletion", 12, 1, ldt=NOW), rec("row_deletion", 12, 2, ldt=NOW)],
                         NOW)
    assert [(e["op"], e["key"]["ck"]) for e in events] == [("c", None), ("d", 1), ("d", 2)]


def test_ttl_expiry_sweep_emits_updates_and_deletes_in_time_order():
    states = {}
    recs = [rec("row_liveness", 10, 1, ttl=100, ldt=NOW + 20), rec("cell", 10, 1, "v", INT.encode(5), ttl=50,
                                                                      ldt=NOW + 10)]
    events = apply_batch(TABLE, states, recs, NOW)
    assert expiry_sweep(TABLE, states, NOW, NOW + 9) == []
    swept = expiry_sweep(TABLE, states, NOW + 9, NOW + 30)
    assert [(e["op"], e["source"]["expired"], e["source"]["ts_us"]) for e in swept] == \
        [("u", True, (NOW + 10) * 1_000_000), ("d", True, (NOW + 20) * 1_000_000)]
    assert swept[0]["before"] == full(1, 5) and swept[0]["after"] == full(1)
    check_chain(events + swept)
    # process() sweeps first, so a later write starts from what consumers saw
    more = process(TABLE, states, insert(40, 1, 6), NOW + 40, NOW + 30)
    assert [e["op"] for e in more] == ["c"]


def test_counter_events_carry_totals():
    table = make_table(counter=True)
    ctx = lambda clock, count: cqltypes.encode_counter_context([(uuid.UUID(int=1), clock, count, "global")])
    states = {}
    [c] = apply_batch(table, states, [rec("cell", 10, 1, "n", ctx(1, 5))], NOW)
    assert c["after"] == {"pk": 1, "ck": 1, "n": 5}
    [u] = apply_batch(table, states, [rec("cell", 11, 1, "n", ctx(2, 8))], NOW)
    assert (u["before"]["n"], u["after"]["n"]) == (5, 8)


def test_event_ids_are_deterministic_and_distinct():
    recs = mutation(insert(10, 1, 5)) + mutation(rec("cell", 11, 1, "v", INT.encode(6))) + \
        mutation(rec("row_deletion", 12, 1, ldt=NOW))
    a = apply_batch(TABLE, {}, copy.deepcopy(recs), NOW)
    b = apply_batch(TABLE, {}, list(reversed(copy.deepcopy(recs))), NOW + 5, ts_ms=123)
    assert [e["id"] for e in a] == [e["id"] for e in b]
    assert len({e["id"] for e in a}) == 3
    # the same value flip-flopping is still a new change each time
    states = {}
    flips = []
    for ts, v in ((10, 1), (11, 2), (12, 1), (13, 2)):
        flips += apply_batch(TABLE, states, [rec("cell", ts, 1, "v", INT.encode(v))], NOW)
    assert len({e["id"] for e in flips}) == 4


def test_snapshot_emits_read_events_for_the_current_table():
    from cdc_lib.state.events import snapshot_events
    states = {}
    apply_batch(TABLE, states, insert(10, 1, 1) + insert(10, 2, 2) + [rec("row_deletion", 11, 2, ldt=NOW)], NOW)
    events = snapshot_events(TABLE, states, NOW)
    assert [(e["op"], e["before"], e["after"]) for e in events] == [("r", None, full(1, 1))]


def test_a_record_of_another_table_is_refused():
    from cdc_lib.state.reconcile import StateError
    r = dict(rec("cell", 1, 1, "v", INT.encode(1)), table_id=str(uuid.UUID(int=8)))
    with pytest.raises(StateError):
        apply_batch(TABLE, {}, [r], NOW)


def _java_hash(values) -> int:
    """hash.txt's checksum: per cell, bytes shifted by 0, 8, 16, 24, ... (mod 32) summed as a Java int."""
    h = 0
    for v in values:
        shift = 0
        for b in v:
            h = (h + ((b & 0xFF) << shift)) & 0xFFFFFFFF
            shift = (shift + 8) & 31
    return h - (1 << 32) if h >= 1 << 31 else h


@pytest.mark.parametrize("version", ["4.0.11", "3.0.29"])
def test_real_commit_log_becomes_one_create_per_row_with_exact_values(corpus, version):
    """Cassandra's own segments, each fed three times (three replicas) in several batches."""
    from cdc_lib.celllog.reader import read_cell_log
    seg = corpus / "commitlog" / version
    truth = dict(line.split("=", 1) for line in (seg / "hash.txt").read_text().splitlines()
                 if "=" in line and not line.startswith("#"))
    damage = []
    recs = [r for b in read_cell_log(sorted(seg.glob("CommitLog-*.log")), schema_from_log=True,
                                     on_damage=damage.append) for r in b.to_pylist()]
    assert recs and {r["table_id"] for r in recs} == {truth["cfid"]}
    table = _table_from_log(seg, truth["cfid"])
    copies = recs * 3
    states, events = {}, []
    for i in range(0, len(copies), 250):
        events += apply_batch(table, states, copies[i:i + 250], 2_000_000_000)
    assert [e["op"] for e in events] == ["c"] * int(truth["cells"])
    events.sort(key=lambda e: e["source"]["position"])
    val = table.columns["val"].type          # blob in 4.0.11's schema, ascii in 3.0.29's (as its log says)
    assert _java_hash(val.encode(e["after"]["val"]) for e in events) == int(truth["hash"])
    assert all(e["after"][table.clustering[0].name] == "name0" for e in events)


def _table_from_log(seg, cfid):
    """The table's metadata as the log's own system_schema mutations describe it."""
    from cdc_lib.commitlog.model import Mutation
    from cdc_lib.commitlog.reader import read_mutations
    for m in read_mutations(sorted(seg.glob("CommitLog-*.log")), schema_from_log=True):
        if isinstance(m, Mutation):
            for u in m.updates:
                if str(u.table_id) == cfid:
                    return u.table
    raise AssertionError("no mutation of the data table")


def test_event_id_does_not_depend_on_the_order_the_state_was_built_in():
    cols = dict(TABLE.columns)
    cols["w"] = ColumnMetadata("w", INT, REGULAR)
    table = TableMetadata("ks", "tbl2", uuid.UUID(int=11), [cols["pk"]], [cols["ck"]], cols)
    v, w = rec("cell", 10, 1, "v", INT.encode(1)), rec("cell", 11, 1, "w", INT.encode(2))
    final = rec("row_liveness", 12, 1)
    a, b = {}, {}
    apply_batch(table, a, [v], NOW)
    apply_batch(table, a, [w], NOW)
    apply_batch(table, b, [w], NOW)
    apply_batch(table, b, [v], NOW)
    assert apply_batch(table, a, [final], NOW) == []          # liveness alone changes nothing visible
    ea = apply_batch(table, a, [rec("cell", 13, 1, "v", INT.encode(5))], NOW)
    eb = apply_batch(table, b, [final, rec("cell", 13, 1, "v", INT.encode(5))], NOW)
    assert len(ea) == len(eb) == 1 and ea[0]["id"] == eb[0]["id"]


# ---------------------------------------------------------------------------------------------------------
# One event per row per mutation: Cassandra applies a mutation to its partition atomically, so no event may show
# a state in the middle of one (event_invariant.check_events states the rule for whole streams).

def test_collection_overwrite_of_a_row_visible_only_through_it_is_one_update():
    """UPDATE SET s = {1, 2}, then UPDATE SET s = {3}: the row never disappeared: one 'u', no 'd' then 'c'."""
    states = {}
    [c] = apply_batch(TABLE, states, mutation(overwrite(10, 1, 1, 2)), NOW)
    assert c["op"] == "c" and c["after"] == full(1, s=(1, 2)) and c["source"]["ts_us"] == 10
    [u] = apply_batch(TABLE, states, mutation(overwrite(20, 1, 3)), NOW)
    assert (u["op"], u["before"], u["after"], u["changed"]) == ("u", full(1, s=(1, 2)), full(1, s=(3,)), ["s"])
    assert u["source"]["ts_us"] == 20          # the mutation's write time, not the deletion's ts - 1
    # the same two writes in one batch: still one event each
    events = apply_batch(TABLE, {}, mutation(overwrite(20, 1, 3)) + mutation(overwrite(10, 1, 1, 2)), NOW)
    assert [(e["op"], e["after"]) for e in events] == [("c", full(1, s=(1, 2))), ("u", full(1, s=(3,)))]
    check_chain(events)


def test_insert_with_a_collection_over_an_existing_row_is_one_update():
    """INSERT (pk, ck, v, s) over a live row: row marker, v and the set overwrite in one mutation."""
    states = {}
    apply_batch(TABLE, states, mutation(insert(10, 1, 5), overwrite(10, 1, 1)), NOW)
    [u] = apply_batch(TABLE, states, mutation(insert(20, 1, 6), overwrite(20, 1, 7)), NOW)
    assert (u["op"], u["before"], u["after"]) == ("u", full(1, 5, s=(1,)), full(1, 6, s=(7,)))
    assert sorted(u["changed"]) == ["s", "v"]
    # INSERT ... s = {} (or null): the collection goes, the row stays
    [u] = apply_batch(TABLE, states, mutation(insert(30, 1, 6), overwrite(30, 1)), NOW)
    assert (u["before"], u["after"]) == (full(1, 6, s=(7,)), full(1, 6))


def test_static_collection_overwrite_updates_every_row_once():
    states = {}
    apply_batch(TABLE, states, mutation(insert(10, 1, 1), insert(10, 2, 2),
                                        overwrite(10, None, 1, column="ss", is_static=True)), NOW)
    events = apply_batch(TABLE, states, mutation(overwrite(20, None, 5, column="ss", is_static=True)), NOW)
    assert [(e["op"], e["key"]["ck"], e["before"]["ss"], e["after"]["ss"]) for e in events] == \
        [("u", 1, (1,), (5,)), ("u", 2, (1,), (5,))]
    # a partition with only static data: its static-only row is updated, not deleted and created
    states = {}
    apply_batch(TABLE, states, mutation(overwrite(10, None, 1, column="ss", is_static=True)), NOW)
    [u] = apply_batch(TABLE, states, mutation(overwrite(20, None, 2, column="ss", is_static=True)), NOW)
    assert (u["op"], u["key"], u["after"]) == ("u", {"pk": 1, "ck": None}, full(None, ss=(2,)))


def test_range_deletion_and_insert_in_one_batch_is_one_change_per_row():
    """BEGIN BATCH DELETE ... WHERE ck >= 1 AND ck <= 3 USING TIMESTAMP 20; INSERT ... (ck 2) USING
    TIMESTAMP 21: row 2 is rewritten, never gone."""
    states = {}
    apply_batch(TABLE, states, mutation([r for i in (1, 2, 3) for r in insert(10, i, i)]), NOW)
    rt = rec("range_tombstone", 20, 1, end=encode_clustering([INT.encode(3)]), si=True, ei=True, ldt=NOW)
    events = apply_batch(TABLE, states, mutation(rt, insert(21, 2, 9)), NOW)
    assert [(e["op"], e["key"]["ck"]) for e in events] == [("d", 1), ("u", 2), ("d", 3)]
    assert events[1]["before"] == full(2, 2) and events[1]["after"] == full(2, 9)
    assert {e["source"]["ts_us"] for e in events} == {21}


def test_partition_deletion_and_insert_in_one_batch():
    states = {}
    apply_batch(TABLE, states, mutation(insert(10, 1, 1), insert(10, 2, 2),
                                        rec("cell", 10, None, "st", INT.encode(7), is_static=True)), NOW)
    # DELETE FROM t WHERE pk = 1 USING TIMESTAMP 20; INSERT ... (ck 1) USING TIMESTAMP 21
    events = apply_batch(TABLE, states, mutation(rec("partition_deletion", 20, ldt=NOW), insert(21, 1, 9)), NOW)
    assert [(e["op"], e["key"]["ck"], e["after"]) for e in events] == [("u", 1, full(1, 9)), ("d", 2, None)]
    # without USING TIMESTAMP both carry the batch's timestamp and the deletion wins the tie: deletes only
    events = apply_batch(TABLE, states, mutation(rec("partition_deletion", 30, ldt=NOW), insert(30, 2, 5)), NOW)
    assert [(e["op"], e["key"]["ck"]) for e in events] == [("d", 1)]


def test_counter_delete_and_increment_in_one_batch():
    table = make_table(counter=True)
    ctx = lambda clock, count: cqltypes.encode_counter_context([(uuid.UUID(int=1), clock, count, "global")])
    states = {}
    apply_batch(table, states, mutation(rec("cell", 10, 1, "n", ctx(1, 5))) +
                mutation(rec("cell", 10, 2, "n", ctx(1, 3))), NOW)
    # BEGIN COUNTER BATCH: DELETE n (ck 1); UPDATE n = n + 1 (ck 1 and ck 2); all at the batch's timestamp
    batch = mutation(rec("cell_tombstone", 20, 1, "n", ldt=NOW), rec("cell", 20, 1, "n", ctx(2, 6)),
                     rec("cell", 20, 2, "n", ctx(2, 4)))
    events = apply_batch(table, states, batch, NOW)
    assert [(e["op"], e["key"]["ck"], e["after"] and e["after"]["n"]) for e in events] == [("d", 1, None), ("u", 2, 4)]


def test_equal_write_times_are_ordered_by_mutation_id_whatever_the_arrival():
    a = mutation(insert(10, 1, 1), mid=b"\x01" * 16)
    b = mutation(overwrite(10, 1, 2), mid=b"\x02" * 16)
    one = apply_batch(TABLE, {}, b + a, NOW)
    two = apply_batch(TABLE, {}, a + b, NOW)
    assert [(e["op"], e["after"]) for e in one] == [("c", full(1, 1)), ("u", full(1, 1, s=(2,)))]
    assert [e["id"] for e in one] == [e["id"] for e in two]


def test_replica_copies_name_the_same_source_whatever_the_order():
    m = mutation(overwrite(10, 1, 1))
    copies = [dict(r, segment="CommitLog-7-2.log", segment_id=2, position=500) for r in m] + \
        [dict(r, segment="CommitLog-7-3.log", segment_id=3, position=40) for r in m]
    for recs in (m + copies, copies + m, list(reversed(copies + m))):
        [c] = apply_batch(TABLE, {}, recs, NOW)
        assert (c["source"]["segment"], c["source"]["position"]) == ("CommitLog-7-1.log", m[0]["position"])


def test_a_late_mutation_between_published_ones_updates_from_what_consumers_saw():
    """A mutation whose replicas' segments came late: its write time (20) lies between two published
    changes (10, 30). History is not rewritten: one update from the last image to the current row."""
    states = {}
    first = apply_batch(TABLE, states, mutation(insert(10, 1, 1)) + mutation(rec("cell", 30, 1, "v", INT.encode(3))),
                        NOW)
    late = mutation(overwrite(20, 1, 4), rec("cell", 20, 1, "v", INT.encode(2)))
    [u] = apply_batch(TABLE, states, late, NOW)
    assert (u["op"], u["before"], u["after"], u["source"]["ts_us"]) == ("u", full(1, 3), full(1, 3, s=(4,)), 20)
    check_chain(first + [u])
    # another replica's copy of it, later still: nothing
    assert apply_batch(TABLE, states, [dict(r, segment="CommitLog-7-9.log") for r in late], NOW) == []


def test_records_without_a_mutation_id_are_one_change():
    """Records not read from a commit-log entry (an SSTable or a scan) carry no history: one change."""
    states = {}
    apply_batch(TABLE, states, mutation(insert(10, 1, 1), overwrite(10, 1, 1)), NOW)
    [u] = apply_batch(TABLE, states, overwrite(20, 1, 2) + [rec("cell", 25, 1, "v", INT.encode(5))], NOW)
    assert (u["op"], u["before"], u["after"], u["source"]["ts_us"]) == ("u", full(1, 1, s=(1,)), full(1, 5, s=(2,)),
                                                                        25)


def test_an_overwrite_read_from_replica_segments_is_one_update(tmp_path):
    """The mutation id comes from the segment bytes: three replicas' copies of UPDATE SET s = {...} are one
    change, through the real reader, the cell log and the batch."""
    from cdc_lib.celllog.reader import read_cell_log
    from cdc_lib.commitlog.model import Cell, DeletionTime, LivenessInfo, Mutation, PartitionUpdate, Row
    from cdc_lib.commitlog.mutation import encode_mutation, finish_update
    from cdc_lib.commitlog.writer import SegmentWriter
    from cdc_lib.cql.schema import Schema
    from cdc_lib.state.batch import process_table
    schema = Schema()
    schema.add(TABLE)
    ck = (INT.encode(1),)

    def entry(ts, values, insert=False):
        cells = [Cell("s", b"", ts, path=INT.encode(v)) for v in values]
        row = Row(ck, LivenessInfo(ts) if insert else None, cells=cells,
                  complex_deletions={"s": DeletionTime(ts - 1, NOW)})
        return encode_mutation(Mutation([finish_update(PartitionUpdate(TABLE.id, PK, TABLE, unfiltereds=[row]))]),
                               schema)
    paths = []
    for node in range(3):
        (tmp_path / f"node{node}").mkdir()
        w = SegmentWriter(str(tmp_path / f"node{node}"), 1_000 + node, version=7, segment_size=64 * 1024)
        for data in (entry(10, [1, 2], insert=True), entry(20, [3])):
            w.add(data)
        w.close()
        paths.append(w.path)
    recs = [r for b in read_cell_log(paths, schema, on_damage=pytest.fail) for r in b.to_pylist()]
    assert len({r["mutation_id"] for r in recs}) == 2 and len(recs) == 3 * 6
    [result] = process_table(TABLE, recs, {}, NOW)
    assert [(e["op"], e["after"]["s"]) for e in result.events] == [("c", (1, 2)), ("u", (3,))]


# ---------------------------------------------------------------------------------------------------------
# The invariant checker itself (tests/event_invariant.py): it must reject what the bug produced.

def _json_states(*tables):
    return [{json.dumps({"pk": 1, "ck": ck}, separators=(",", ":")): row for ck, row in t.items()} for t in tables]


def _ev(op, before, after, ck=1):
    return json.dumps({"pk": 1, "ck": ck}, separators=(",", ":")), {"op": op, "before": before, "after": after}


def test_invariant_accepts_a_history_and_a_subsequence_of_it():
    a, b, c = {"pk": 1, "ck": 1, "s": [1, 2]}, {"pk": 1, "ck": 1, "s": [3]}, {"pk": 1, "ck": 1, "s": [3, 4]}
    states = _json_states({}, {1: a}, {1: b}, {1: c})
    check_events([_ev("c", None, a), _ev("u", a, b), _ev("u", b, c)], states, complete=True)
    check_events([_ev("c", None, a), _ev("u", a, c)], states)          # a state skipped: allowed, not complete
    with pytest.raises(AssertionError, match="skipped"):
        check_events([_ev("c", None, a), _ev("u", a, c)], states, complete=True)


def test_invariant_lets_a_complete_stream_skip_only_the_states_it_is_told_may_be_skipped():
    """``may_skip``: a backfill merges a write that was in flight while its partition was read without an event
    (``scan.horizon``); the checker lets exactly such states be missing from a complete stream."""
    a, b, c = {"pk": 1, "ck": 1, "s": [1, 2]}, {"pk": 1, "ck": 1, "s": [3]}, {"pk": 1, "ck": 1, "s": [3, 4]}
    states = _json_states({}, {1: a}, {1: b}, {1: c})       # the row's history: None, a, b, c
    skipping_b = [_ev("c", None, a), _ev("u", a, c)]
    check_events(skipping_b, states, complete=True, may_skip=lambda key, j: j == 2)
    with pytest.raises(AssertionError, match="skipped"):
        check_events(skipping_b, states, complete=True, may_skip=lambda key, j: j == 3)
    with pytest.raises(AssertionError, match="skipped"):
        check_events([_ev("c", None, c)], states, complete=True, may_skip=lambda key, j: j == 2)


def test_invariant_rejects_what_per_timestamp_events_published():
    a, b = {"pk": 1, "ck": 1, "s": [1, 2]}, {"pk": 1, "ck": 1, "s": [3]}
    states = _json_states({}, {1: a}, {1: b})
    with pytest.raises(AssertionError, match="not a state the row had"):      # the row never disappeared
        check_events([_ev("c", None, a), _ev("d", a, None), _ev("c", None, b)], states)
    emptied = {"pk": 1, "ck": 1, "s": None, "v": 6}
    with_v = _json_states({1: dict(a, v=5)}, {1: dict(b, v=6)})
    with pytest.raises(AssertionError, match="not a state the row had"):      # the ts - 1 deletion's image
        check_events([_ev("u", dict(a, v=5), emptied), _ev("u", emptied, dict(b, v=6))], with_v)
    with pytest.raises(AssertionError, match="previous event's after"):
        check_events([_ev("c", None, a), _ev("u", b, a)], states)
    with pytest.raises(AssertionError, match="op should be"):
        check_events([_ev("u", None, a)], states)
    with pytest.raises(AssertionError, match="not published"):
        check_events([_ev("c", None, a)], states, complete=True)
