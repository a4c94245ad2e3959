"""Change events for each kind of change: creates, updates, deletes, ranges, partitions, statics, TTLs."""
from __future__ import annotations

import copy
import uuid

import pytest

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


def full(c, v=None, s=None, st=None, pk=1):
    return {"pk": pk, "ck": c, "v": v, "s": s, "st": st}


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


def test_several_writes_in_one_batch_give_one_event_each_in_timestamp_order():
    recs = insert(10, 1, 1) + [rec("cell", 12, 1, "v", INT.encode(3)), rec("cell", 11, 1, "v", INT.encode(2))]
    events = apply_batch(TABLE, {}, list(reversed(recs)), NOW)
    assert [(e["op"], e["after"]["v"], e["source"]["ts_us"]) for e in events] == [("c", 1, 10), ("u", 2, 11),
                                                                                  ("u", 3, 12)]
    check_chain(events)


def test_replica_copies_and_same_value_overwrites_emit_nothing():
    states = {}
    recs = insert(10, 1, 5)
    events = apply_batch(TABLE, states, recs + [dict(r, segment="CommitLog-7-2.log") for r in recs], NOW)
    assert len(events) == 1
    assert apply_batch(TABLE, states, recs, NOW) == []
    assert apply_batch(TABLE, states, [rec("cell", 20, 1, "v", INT.encode(5))], NOW) == []


def test_late_write_updates_from_what_consumers_last_saw():
    states = {}
    apply_batch(TABLE, states, insert(10, 1, 5) + [rec("cell", 30, 1, "v", INT.encode(9))], NOW)
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
    recs = insert(10, 1, 5) + [rec("cell", 11, 1, "v", INT.encode(6)), rec("row_deletion", 12, 1, ldt=NOW)]
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
